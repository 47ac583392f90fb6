# kcheck build. `make test` is the test command the README and CI use;
# `make demo` is the newcomer's main job on the shipped example captures.

GO      ?= go
PKGS    ?= ./...
FUZZTIME ?= 10s

.PHONY: all build test demo fixtures fixtures-check bench fuzz-short cuda-vet ci clean

all: build

build:
	$(GO) build -o bin/kcheck ./cmd/kcheck

# The test command: vet, then every test under the race detector.
test:
	$(GO) vet $(PKGS)
	$(GO) test -race $(PKGS)

# The main job: check every shipped example capture (some are planted
# faults, so kcheck exits 1 by design) and diagnose the faulty pipeline.
demo:
	@$(GO) run ./cmd/kcheck check fixtures/examples; \
	  echo "(kcheck exited $$?: 0 all pass, 1 a planted fault was found, as expected here)"

# Regenerate the golden fixtures bit-identically (a test fails when they drift).
fixtures:
	$(GO) run ./fixtures/gen -out fixtures

# Short fuzzing of every fuzz target, for CI (make fuzz-short FUZZTIME=10m
# for a campaign). -fuzzminimizetime keeps a short run from spending its
# time shrinking each new input.
FUZZ_TARGETS ?= ./internal/safetensors:FuzzParse ./internal/npy:FuzzRead \
	./internal/npy:FuzzReadZip ./internal/kernel:FuzzParams ./cases:FuzzParse \
	./internal/check:FuzzKernel ./internal/check:FuzzPipeline ./internal/check:FuzzEngines
fuzz-short:
	@for spec in $(FUZZ_TARGETS); do \
	  pkg=$${spec%%:*}; target=$${spec##*:}; \
	  echo "fuzz $$pkg $$target ($(FUZZTIME))"; \
	  $(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 2s $$pkg || exit 1; \
	done

# Go references against numpy float64 on the real sizes (internal/bench/RESULTS.md);
# make bench BENCHFLAGS=-quick for reduced sizes, BENCHFLAGS=-md FILE for markdown.
bench:
	$(GO) run ./internal/bench/cmd/benchtable $(BENCHFLAGS)

clean:
	rm -rf bin build cuda/ptx

-include cuda/kernels.mk

# What CI runs (.ci/run): the test command, the kernels, the cuda-tagged Go
# code compiled without a GPU, and a short fuzz of every target.
ci: test kernels cuda-vet fuzz-short
