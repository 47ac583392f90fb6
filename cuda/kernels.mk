# cuda/kernels.mk: the CUDA kernels and the `cuda`-tagged Go code.
# Included by the top-level Makefile (-include cuda/kernels.mk).
#
#   make cuda-toolchain     nvcc 13.0 and its headers from PyPI's pinned wheels
#                           into build/cuda-toolchain (cuda/toolchain/), plus
#                           a libcuda link stub; nothing system-wide
#   make kernels            cuda/*.cu -> cuda/ptx/NAME.ptx (compute_80, JIT to
#                           sm_80/sm_90/sm_120) and cuda/ptx/NAME.sm_90a.cubin,
#                           .sm_100a.cubin, .sm_120a.cubin (the sm_120a GEMM on
#                           the block-scaled FP4 MMA); build/kernels.log keeps
#                           ptxas -v of every kernel for every architecture and
#                           the table of registers, spills and shared memory,
#                           which also goes to stdout; fails on a spill or a
#                           kernel that does not fit (cuda/ptxasreport)
#   make kernels-sass       the sm_120a GEMMs' SASS holds the block-scaled FP4
#                           MMA (OMMA.SF...E2M1...UE4M3.4X), the sm_90a ones do not
#   make kernels-hostcheck  the conversion helpers of common.cuh, on the CPU,
#                           against NVIDIA's own conversion code (no GPU)
#   make cuda-vet           go vet -tags cuda ./..., and compile (not run) the
#                           tagged test binaries and the worker (no GPU)
#   make gpu-bundle         build/gpu/: everything a GPU machine with a driver
#                           but no Go needs, and gpu-check.sh to run it
#
# NVCC=/path/to/nvcc uses another toolkit (a GPU machine's); then nothing
# is installed, and cgo finds cuda.h and libcuda where cuda/cgo.go looks.
# PTX and cubins are generated, never committed (cuda/README.md says why).

GO        ?= go
CUDA_TOOLCHAIN ?= build/cuda-toolchain
CUDA_TOOLCHAIN_NVCC := $(CUDA_TOOLCHAIN)/nvidia/cu13/bin/nvcc
NVCC      ?= $(CUDA_TOOLCHAIN_NVCC)
PTXAS     ?= $(dir $(NVCC))ptxas
NVDISASM  ?= $(dir $(NVCC))nvdisasm
# No -lineinfo by default (ptxas 11.8 segfaulted on mla_decode.cu for sm_90
# with it); add it for compute-sanitizer line numbers.
NVCCFLAGS ?= -O3 -std=c++17
CUDA_ARCH_PTX ?= compute_80
# The architectures the PTX is JIT-compiled for on the parts kcheck targets
# (ptxas -v of the PTX itself: what the driver's JIT will do) and the
# arch-specific cubins the worker prefers where they match the GPU.
CUDA_JIT_ARCHS   ?= sm_80 sm_90 sm_120
CUDA_CUBIN_ARCHS ?= sm_90a sm_100a sm_120a

# The default nvcc is the pinned wheel toolchain: install it on demand. cgo
# then takes CUDA 12.9's cuda.h from it (gorgonia.org/cu v0.9.6 does not
# compile against CUDA 13's) and links against its libcuda stub.
ifeq ($(NVCC),$(CUDA_TOOLCHAIN_NVCC))
CUDA_TOOLCHAIN_DEP := $(CUDA_TOOLCHAIN)/.installed
CUDA_CGO_ENV := CGO_CFLAGS="-O2 -g -I$(abspath $(CUDA_TOOLCHAIN))/nvidia/cuda_runtime/include" \
	CGO_LDFLAGS="-O2 -g -L$(abspath $(CUDA_TOOLCHAIN))/stubs"
# The wheel puts the CUDA runtime's link libraries (libcudart_static,
# libcudadevrt) in nvidia/cu13/lib, where its nvcc.profile does not look
# (it names targets/x86_64-linux/lib64, a toolkit's layout): a machine with
# no system toolkit (CI) cannot link the host check without this.
CUDA_HOST_LDFLAGS := -L$(abspath $(CUDA_TOOLCHAIN))/nvidia/cu13/lib
endif

CUDA_SRCS := $(wildcard cuda/*.cu)
CUDA_HDRS := $(wildcard cuda/*.cuh)
CUDA_NAMES := $(patsubst cuda/%.cu,%,$(CUDA_SRCS))
CUDA_PTX  := $(patsubst %,cuda/ptx/%.ptx,$(CUDA_NAMES))
CUDA_CUBINS := $(foreach a,$(CUDA_CUBIN_ARCHS),$(patsubst %,cuda/ptx/%.$(a).cubin,$(CUDA_NAMES)))
CUDA_JIT_LOGS := $(foreach a,$(CUDA_JIT_ARCHS),$(patsubst %,build/ptxas/%.$(a).log,$(CUDA_NAMES)))
CUDA_PTXAS_LOGS := $(CUDA_JIT_LOGS) $(foreach a,$(CUDA_CUBIN_ARCHS),$(patsubst %,build/ptxas/%.$(a).log,$(CUDA_NAMES)))

# cgo for the tagged packages: a C compiler and libcuda at link time (the
# wheel toolchain's stub, or a toolkit's, which cuda/cgo.go adds to the
# search path).
CUDA_CC  ?= $(or $(shell command -v gcc 2>/dev/null),$(shell command -v gcc-11 2>/dev/null),gcc)
CUDA_GO  := $(CUDA_CGO_ENV) CGO_ENABLED=1 CC=$(CUDA_CC) $(GO)
CUDA_TEST_PKGS := ./cuda ./cmd/kcheck-gpu

.PHONY: cuda-toolchain kernels kernels-sass kernels-hostcheck cuda-vet gpu-bundle ptxasreport-testdata ptxasreport-testdata-check

cuda-toolchain: $(CUDA_TOOLCHAIN_DEP)

$(CUDA_TOOLCHAIN)/.installed: cuda/toolchain/requirements.txt cuda/toolchain/install.sh
	rm -rf $(CUDA_TOOLCHAIN)
	CC=$(CUDA_CC) cuda/toolchain/install.sh $(CUDA_TOOLCHAIN)
	touch $@

kernels: $(CUDA_PTX) $(CUDA_CUBINS) build/kernels.log

cuda/ptx/%.ptx: cuda/%.cu $(CUDA_HDRS) | $(CUDA_TOOLCHAIN_DEP)
	@mkdir -p cuda/ptx
	$(NVCC) $(NVCCFLAGS) -ptx -arch=$(CUDA_ARCH_PTX) -o $@ $<

# One rule an architecture: the cubin, with ptxas -v kept for the table
# (shown at once when the build fails).
define kc_cubin_rule
cuda/ptx/%.$(1).cubin: cuda/%.cu $$(CUDA_HDRS) | $$(CUDA_TOOLCHAIN_DEP)
	@mkdir -p cuda/ptx build/ptxas
	$$(NVCC) $$(NVCCFLAGS) -cubin -gencode arch=$$(subst sm_,compute_,$(1)),code=$(1) -Xptxas -v -o $$@ $$< \
	  2> build/ptxas/$$*.$(1).log || { cat build/ptxas/$$*.$(1).log; exit 1; }
build/ptxas/%.$(1).log: cuda/ptx/%.$(1).cubin ;
endef
$(foreach a,$(CUDA_CUBIN_ARCHS),$(eval $(call kc_cubin_rule,$(a))))

# What the driver's JIT does with the PTX on each part, by ptxas itself.
define kc_jit_rule
build/ptxas/%.$(1).log: cuda/ptx/%.ptx | $$(CUDA_TOOLCHAIN_DEP)
	@mkdir -p build/ptxas build/cubin
	$$(PTXAS) -v -arch=$(1) -o build/cubin/$$*.$(1).cubin $$< 2> $$@.tmp || { cat $$@.tmp; exit 1; }
	@mv $$@.tmp $$@
endef
$(foreach a,$(CUDA_JIT_ARCHS),$(eval $(call kc_jit_rule,$(a))))

build/ptxasreport: $(wildcard cuda/ptxasreport/*.go)
	@mkdir -p build
	CGO_ENABLED=0 $(GO) build -o $@ ./cuda/ptxasreport

# The ptxas report of every kernel on every architecture, and its table
# (printed, so it is in CI's log). Written only when every row passes.
build/kernels.log: $(CUDA_PTXAS_LOGS) $(CUDA_PTX) build/ptxasreport
	@{ echo "# ptxas -v: $$($(NVCC) --version | tail -n 2 | head -n 1); PTX $$(grep -h -m1 '^\.version' $(CUDA_PTX) | sort -u | tr '\n' ' ')"; \
	  for f in $(CUDA_PTXAS_LOGS); do echo "## $$f"; cat $$f; done; } > build/ptxas-all.log
	@build/ptxasreport -log build/ptxas-all.log -ptx cuda/ptx -src cuda > build/kernels-table.md; rc=$$?; \
	  echo "--- ptxas: registers, spills and shared memory per kernel and architecture"; \
	  cat build/kernels-table.md; [ $$rc -eq 0 ] || exit $$rc
	@{ cat build/ptxas-all.log; echo; cat build/kernels-table.md; } > $@

# The FP4 path must really be the block-scaled MMA: count the instruction
# in each GEMM's SASS (nvdisasm, per .text section). The sm_90a GEMMs,
# which dequantize to bf16 for HMMA, must have none: the same grep has to
# be able to say no.
CUDA_GEMMS := nvfp4_gemm_128x128 nvfp4_gemm_64x128 nvfp4_gemm_16x64
CUDA_FP4_MMA := OMMA\.SF\.16864\.F32\.E2M1\.E2M1\.UE4M3\.4X
kernels-sass: cuda/ptx/nvfp4.sm_120a.cubin cuda/ptx/nvfp4.sm_90a.cubin
	@mkdir -p build
	@for a in sm_120a sm_90a; do \
	  $(NVDISASM) -c cuda/ptx/nvfp4.$$a.cubin > build/nvfp4.$$a.sass || exit 1; \
	  for f in $(CUDA_GEMMS); do \
	    n=$$(awk -v fn="$$f" '/^\.text\.[A-Za-z0-9_]+:/ { cur = substr($$1, 7); sub(/:$$/, "", cur) } \
	      cur == fn && /$(CUDA_FP4_MMA)/ { n++ } END { print n + 0 }' build/nvfp4.$$a.sass); \
	    echo "kernels-sass: $$a $$f: $$n x OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X"; \
	    if [ $$a = sm_120a ] && [ $$n -eq 0 ]; then echo "kernels-sass: the sm_120a $$f has no block-scaled FP4 MMA (build/nvfp4.$$a.sass)"; exit 1; fi; \
	    if [ $$a = sm_90a ] && [ $$n -ne 0 ]; then echo "kernels-sass: the sm_90a $$f has the sm_120a FP4 MMA"; exit 1; fi; \
	  done; \
	done

build/hostcheck: cuda/hostcheck/hostcheck.cu $(CUDA_HDRS) | $(CUDA_TOOLCHAIN_DEP)
	@mkdir -p build
	$(NVCC) -O2 -std=c++17 -arch=sm_80 $(CUDA_HOST_LDFLAGS) -o $@ $<

# cuda/ptxasreport/testdata/mla.ptx is an excerpt of the PTX nvcc makes of
# cuda/mla_decode.cu (testdata/excerpt.sh says which part), and
# mla-sm_120.log an excerpt of ptxas -v on that PTX for sm_120
# (testdata/mlalog.sh): regenerate them, and in CI fail when a tracked copy
# no longer matches the kernel. testdata/small.ptx is hand-written input,
# not generated; the check runs this toolchain's ptxas (13.0) on it and
# fails when its report differs from the recorded ptxas-13.0.log, compile
# times aside. ptxas-11.8.log and spill-13.0.log are recorded output of a
# ptxas (11.8) and a kernel source this repository does not hold.
PTXAS_TESTDATA := cuda/ptxasreport/testdata
ptxasreport-testdata: cuda/ptx/mla_decode.ptx
	sh $(PTXAS_TESTDATA)/excerpt.sh $< > $(PTXAS_TESTDATA)/mla.ptx
	$(PTXAS) -v -arch=sm_120 -o /dev/null $< 2>&1 | sh $(PTXAS_TESTDATA)/mlalog.sh > $(PTXAS_TESTDATA)/mla-sm_120.log
ptxasreport-testdata-check: cuda/ptx/mla_decode.ptx
	sh $(PTXAS_TESTDATA)/excerpt.sh $< | diff -u $(PTXAS_TESTDATA)/mla.ptx - || \
	  { echo "$(PTXAS_TESTDATA)/mla.ptx differs from cuda/mla_decode.cu's PTX: run make ptxasreport-testdata"; exit 1; }
	$(PTXAS) -v -arch=sm_120 -o /dev/null $< 2>&1 | sh $(PTXAS_TESTDATA)/mlalog.sh | diff -u $(PTXAS_TESTDATA)/mla-sm_120.log - || \
	  { echo "$(PTXAS_TESTDATA)/mla-sm_120.log differs from ptxas on cuda/mla_decode.cu's PTX: run make ptxasreport-testdata"; exit 1; }
	@mkdir -p build
	grep -v 'Compile time' $(PTXAS_TESTDATA)/ptxas-13.0.log > build/ptxas-13.0.recorded
	$(PTXAS) -v -arch=sm_120a -o /dev/null $(PTXAS_TESTDATA)/small.ptx 2>&1 | grep -v 'Compile time' | diff -u build/ptxas-13.0.recorded - || \
	  { echo "ptxas $$($(PTXAS) --version | tail -1) on $(PTXAS_TESTDATA)/small.ptx no longer reports what ptxas-13.0.log recorded"; exit 1; }

kernels-hostcheck: build/hostcheck
	./build/hostcheck cuda/testdata

cuda-vet: | $(CUDA_TOOLCHAIN_DEP)
	$(CUDA_GO) vet -tags cuda ./...
	@mkdir -p build/cuda-tests
	$(CUDA_GO) test -c -tags cuda -o build/cuda-tests/ $(CUDA_TEST_PKGS)
	$(CUDA_GO) build -tags cuda -o build/kcheck-gpu ./cmd/kcheck-gpu

# The bundle for a GPU machine with the NVIDIA driver (and maybe nvcc) but no
# Go: the tagged test binaries, the worker, a pure-Go kcheck, the PTX and
# cubins, the kernel sources (gpu-check.sh rebuilds them for the local GPU
# when nvcc is there), ptxasreport for the local ptxas table, and the
# script. The cgo binaries need glibc >= 2.34 on that machine.
gpu-bundle: kernels | $(CUDA_TOOLCHAIN_DEP)
	rm -rf build/gpu
	mkdir -p build/gpu/ptx build/gpu/src/hostcheck build/gpu/src/testdata
	$(CUDA_GO) test -c -tags cuda -o build/gpu/cuda.test ./cuda
	$(CUDA_GO) test -c -tags cuda -o build/gpu/kcheck-gpu.test ./cmd/kcheck-gpu
	$(CUDA_GO) build -tags cuda -o build/gpu/kcheck-gpu ./cmd/kcheck-gpu
	CGO_ENABLED=0 $(GO) build -o build/gpu/kcheck ./cmd/kcheck
	CGO_ENABLED=0 $(GO) build -o build/gpu/ptxasreport ./cuda/ptxasreport
	cp cuda/ptx/* build/gpu/ptx/
	cp $(CUDA_SRCS) $(CUDA_HDRS) build/gpu/src/
	cp cuda/hostcheck/hostcheck.cu build/gpu/src/hostcheck/
	cp cuda/testdata/* build/gpu/src/testdata/
	cp build/kernels.log build/gpu/
	cp cuda/gpu-check.sh build/gpu/
	@du -sh build/gpu
