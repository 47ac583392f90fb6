# kcheck build. `make test` is the test command the README and CI use;
# `make demo` is the newcomer's main job on the shipped example captures.

GO      ?= go
PKGS    ?= ./...
FUZZTIME ?=

.PHONY: all build test demo fixtures bench bench-checks bench-clean fuzz-short ci gpu-check clean

all: build

# The revision kcheck --version and reports name, passed in as well, since
# the toolchain stamps none in a git worktree or under -buildvcs=false.
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
MODIFIED ?= $(shell git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true)
REVISION_TIME ?= $(shell git log -1 --format=%cI 2>/dev/null)
VERSION_PKG := github.com/kcheck-dev/kcheck/internal/version
LDFLAGS ?= -X $(VERSION_PKG).revision=$(REVISION) -X $(VERSION_PKG).modified=$(MODIFIED) -X $(VERSION_PKG).revisionTime=$(REVISION_TIME)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/kcheck ./cmd/kcheck

# The test command, in two passes: vet, then every test under the race
# detector at its short size (-short leaves out what only does arithmetic on
# one goroutine at a time, where the detector finds nothing and costs
# 15-100x), then, without the detector, the packages whose tests skip or
# shrink under it or under -short (each says so with testing.Short() or a
# raceEnabled constant; FULL_PKGS finds them): the catalog-wide property
# that the declared-precision reference passes, the tests that measure a
# process's memory (the detector's shadow memory counts in RSS), the
# documented examples (internal/docs: whole kcheck runs the detector would
# slow past four minutes). A package with neither ran whole in the first
# pass, so the second leaves it out. Catalog cases tagged long run only with
# KCHECK_TEST_LONG=1, as kcheck run leaves them out without --long.
FULL_PKGS = $(addprefix ./,$(patsubst %/,%,$(sort $(dir $(shell grep -rlE 'testing\.Short\(\)|raceEnabled' --include='*.go' cases cmd cuda internal reference)))))
TEST_FULL_PKGS ?= $(if $(filter ./...,$(PKGS)),$(FULL_PKGS),$(PKGS))
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -short $(PKGS)
	$(GO) test $(TEST_FULL_PKGS)

# The main job: check every shipped example capture (most carry planted
# faults, so kcheck exits 1 by design), then lay out the evidence for one
# faulty decode step.
demo:
	@$(GO) build -ldflags "$(LDFLAGS)" -o bin/kcheck ./cmd/kcheck
	@echo '$$ kcheck check --quiet fixtures/examples'
	@bin/kcheck check --quiet fixtures/examples; \
	  echo "(exit $$?: 0 all pass, 1 a fault was found, as planted here)"; echo
	@echo '$$ kcheck diagnose fixtures/examples/pipeline_cache_page_off_by_one.safetensors'
	@bin/kcheck diagnose fixtures/examples/pipeline_cache_page_off_by_one.safetensors; \
	  echo "(exit $$?)"

# Regenerate the golden fixtures bit-identically (a test fails when they drift).
fixtures:
	$(GO) run ./fixtures/gen -out fixtures

# Short fuzzing of every fuzz target, for CI: each for a number of
# executions (about 8 s each on an idle 2-core machine, measured in .ci/run's
# log of 2026-12-02), not a duration, because
# Go 1.26's fuzz coordinator can fail a duration-bounded run with "context
# deadline exceeded" when the deadline catches a busy worker
# (golang/go#75804, fixed in Go 1.27). make fuzz-short FUZZTIME=10m runs a
# campaign of that duration a target instead. -fuzzminimizetime keeps a short
# run from spending its time shrinking each new input.
FUZZ_TARGETS ?= ./internal/safetensors:FuzzParse:90000x ./internal/npy:FuzzRead:150000x \
	./internal/npy:FuzzReadZip:60000x ./internal/kernel:FuzzParams:130000x ./cases:FuzzParse:100000x \
	./internal/check:FuzzKernel:1000x ./internal/check:FuzzPipeline:200x ./internal/check:FuzzEngines:2000x \
	./internal/check:FuzzStages:5000x ./internal/report:FuzzLoad:4000x
fuzz-short:
	@for spec in $(FUZZ_TARGETS); do \
	  pkg=$${spec%%:*}; rest=$${spec#*:}; target=$${rest%%:*}; budget=$${rest#*:}; \
	  [ -z "$(FUZZTIME)" ] || budget="$(FUZZTIME)"; \
	  echo "fuzz $$pkg $$target ($$budget)"; \
	  $(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $$budget -fuzzminimizetime 2s $$pkg || exit 1; \
	done

# Go references against numpy float64 on the real sizes (internal/bench/RESULTS.md);
# make bench BENCHFLAGS=-quick for reduced sizes, BENCHFLAGS=-md FILE for markdown.
# Then the whole-check table (issue 17): the kcheck check binary on each
# kernel's real-size capture beside the numpy check a user would write
# (internal/bench/numpy_checks.py) and the read limit of the same file, with
# peak RSS. Captures are made once under build/bench (about 8 GB at the full
# sizes, after a disk check) and reused; CHECKFLAGS=-quick for tens of MB,
# CHECKFLAGS="-before main" to time main's kcheck beside this tree's.
# make bench-clean removes them.
CHECKFLAGS ?= $(filter -quick,$(BENCHFLAGS))
bench:
	$(GO) run ./internal/bench/cmd/benchtable $(BENCHFLAGS)
	$(GO) run ./internal/bench/cmd/wholetable $(CHECKFLAGS)

bench-checks:
	$(GO) run ./internal/bench/cmd/wholetable $(CHECKFLAGS)

bench-clean:
	$(GO) run ./internal/bench/cmd/wholetable -clean

clean:
	rm -rf bin build cuda/ptx

-include cuda/kernels.mk
-include cuda/emu/emu.mk

# What CI runs (.ci/run): the test command, the kernels (nvcc 13 from PyPI,
# the ptxas table, the sm_120a SASS check), the cuda-tagged Go
# code compiled without a GPU, and a short fuzz of every target.
ci: test kernels kernels-sass kernels-hostcheck cuda-vet fuzz-short

# Everything a GPU machine with the driver and nvcc but no Go needs, in
# build/gpu/: the cuda-tagged test binaries, the worker, the PTX and
# gpu-check.sh, which runs them in under 5 minutes and writes JSON and
# Markdown results into the folder it is given.
gpu-check: gpu-bundle
	@echo "copy build/gpu/ to the GPU machine and run: build/gpu/gpu-check.sh RESULTS_DIR"

# --- Python side (python/): engine workers, interop and format cross-checks.
# make test stays Go-only; these need make python-setup first (pinned
# versions from python/requirements.lock into python/.venv).
PYVENV ?= python/.venv
.PHONY: python-setup python-test python-vectors engines-ci engines-full corpus corpus-committed corpus-today
python-setup:
	python/setup.sh

# vLLM's compiled op library (vllm._C_stable_libtorch, which the capture
# tests import for vLLM's op schemas) links the CUDA driver, libcuda.so.1.
# A machine without a driver (CI) gets the CUDA toolchain's link stub
# (make cuda-toolchain: every function returns CUDA_ERROR_STUB_LIBRARY) on
# the loader path; nothing the CPU tests run calls it. A machine with a
# driver keeps its own.
HAVE_LIBCUDA := $(shell ldconfig -p 2>/dev/null | grep -qF 'libcuda.so.1 ' && echo yes)
LIBCUDA_STUB_DIR := $(CURDIR)/build/libcuda-stub
python-test: build $(if $(HAVE_LIBCUDA),,cuda-toolchain)
	$(if $(HAVE_LIBCUDA),,mkdir -p $(LIBCUDA_STUB_DIR) && ln -sf $(CURDIR)/$(CUDA_TOOLCHAIN)/stubs/libcuda.so $(LIBCUDA_STUB_DIR)/libcuda.so.1)
	cd python && $(if $(HAVE_LIBCUDA),,LD_LIBRARY_PATH=$(LIBCUDA_STUB_DIR)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}) KCHECK=$(CURDIR)/bin/kcheck TRITON_INTERPRET=1 .venv/bin/python -m pytest -q tests

# Regenerate internal/safetensors/testdata/torch_formats.safetensors (torch
# and ml_dtypes vectors the Go test cross-checks reference/formats with).
python-vectors:
	$(PYVENV)/bin/python python/tests/gen_format_vectors.py

# Each engine worker over a catalog subset (engines-ci, what CI runs) or
# every case its kernel maps to (engines-full: hours on two cores).
engines-ci: build
	KCHECK_PYTHON=$(CURDIR)/$(PYVENV)/bin/python TRITON_INTERPRET=1 $(PYVENV)/bin/python -m kcheck.catalog --subset ci --jobs 2 --kcheck bin/kcheck
engines-full: build
	KCHECK_PYTHON=$(CURDIR)/$(PYVENV)/bin/python TRITON_INTERPRET=1 $(PYVENV)/bin/python -m kcheck.catalog --subset full --kcheck bin/kcheck --md python/kcheck/worker/RESULTS.md

# The issue-16 engine-capture corpus (python/kcheck/corpus): every capture
# with its planted-fault twin and build/corpus/manifest.json (about 15 min
# on two cores, most of it Triton's interpreter); corpus-committed rewrites
# the small subset kept in fixtures/engines/; corpus-today runs this kcheck
# over build/corpus and records its verdicts.
CORPUS ?= build/corpus
corpus:
	PYTHONPATH=$(CURDIR)/python TRITON_INTERPRET=1 $(PYVENV)/bin/python -m kcheck.corpus --out $(CORPUS)
corpus-committed:
	PYTHONPATH=$(CURDIR)/python TRITON_INTERPRET=1 $(PYVENV)/bin/python -m kcheck.corpus --committed --out fixtures/engines/corpus
corpus-today: build
	PYTHONPATH=$(CURDIR)/python $(PYVENV)/bin/python -m kcheck.corpus.today --kcheck bin/kcheck $(CORPUS)
