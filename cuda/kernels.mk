# cuda/kernels.mk: the CUDA kernels and the `cuda`-tagged Go code.
# Included by the top-level Makefile (-include cuda/kernels.mk).
#
#   make kernels            cuda/*.cu -> cuda/ptx/NAME.ptx (compute_80, JIT to
#                           sm_80/sm_90/sm_120); build/kernels.log keeps the
#                           ptxas -v report (registers, spills, shared memory)
#                           for sm_80 and sm_90; with nvcc >= 12.8 also
#                           cuda/ptx/NAME.sm_120a.cubin (the FP4 block-scale MMA)
#   make kernels-hostcheck  the conversion helpers of common.cuh, on the CPU,
#                           against NVIDIA's own conversion code (no GPU)
#   make cuda-vet           go vet -tags cuda ./..., and compile (not run) the
#                           tagged test binaries and the worker (no GPU)
#   make gpu-bundle         build/gpu/: everything a GPU machine with a driver
#                           but no Go needs, and gpu-check.sh to run it
#
# PTX is generated, never committed (cuda/README.md says why).

GO        ?= go
NVCC      ?= nvcc
# No -lineinfo by default: ptxas 11.8 segfaults on mla_decode.cu for sm_90 with
# it. Add it for compute-sanitizer line numbers with a newer nvcc.
NVCCFLAGS ?= -O3 -std=c++17
CUDA_ARCH_PTX ?= compute_80
CUDA_LOG_ARCHS ?= sm_80 sm_90

CUDA_SRCS := $(wildcard cuda/*.cu)
CUDA_HDRS := $(wildcard cuda/*.cuh)
CUDA_PTX  := $(patsubst cuda/%.cu,cuda/ptx/%.ptx,$(CUDA_SRCS))

# nvcc >= 12.8 knows sm_120a (and the mxf4nvf4 block-scale MMA).
NVCC_VERSION := $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
NVCC_SM120A  := $(shell echo "$(NVCC_VERSION)" | awk -F. '{ if ($$1 > 12 || ($$1 == 12 && $$2 >= 8)) print "yes"; else print "no" }')
CUDA_SM120A_CUBINS := $(if $(filter yes,$(NVCC_SM120A)),$(patsubst cuda/%.cu,cuda/ptx/%.sm_120a.cubin,$(CUDA_SRCS)))

# cgo for the tagged packages: a C compiler (Debian's nvidia-cuda-toolkit
# brings gcc-11 even where gcc is absent) and libcuda at link time (the
# driver's, or the toolkit's stub in .../stubs, which cuda/cgo.go adds to the
# search path).
CUDA_CC  ?= $(or $(shell command -v gcc 2>/dev/null),$(shell command -v gcc-11 2>/dev/null),gcc)
CUDA_GO  := CGO_ENABLED=1 CC=$(CUDA_CC) $(GO)
CUDA_TEST_PKGS := ./cuda ./cmd/kcheck-gpu

.PHONY: kernels kernels-hostcheck cuda-vet gpu-bundle

kernels: $(CUDA_PTX) $(CUDA_SM120A_CUBINS) build/kernels.log

cuda/ptx/%.ptx: cuda/%.cu $(CUDA_HDRS)
	@mkdir -p cuda/ptx
	$(NVCC) $(NVCCFLAGS) -ptx -arch=$(CUDA_ARCH_PTX) -o $@ $<

# Written only where nvcc >= 12.8; the worker prefers it on an sm_120 GPU.
cuda/ptx/%.sm_120a.cubin: cuda/%.cu $(CUDA_HDRS)
	@mkdir -p cuda/ptx
	$(NVCC) $(NVCCFLAGS) -cubin -gencode arch=compute_120a,code=sm_120a -o $@ $<

# The ptxas report of every kernel for the architectures a GPU run meets.
build/kernels.log: $(CUDA_SRCS) $(CUDA_HDRS)
	@mkdir -p build/cubin
	@{ echo "# ptxas -v: $$($(NVCC) --version | tail -n 2 | head -n 1)"; \
	  for arch in $(CUDA_LOG_ARCHS); do \
	    for src in $(CUDA_SRCS); do \
	      echo "## $$src $$arch"; \
	      $(NVCC) $(NVCCFLAGS) -cubin -arch=$$arch -Xptxas -v -o build/cubin/$$(basename $$src .cu).$$arch.cubin $$src 2>&1 || exit 1; \
	    done; \
	  done; } > $@.tmp && mv $@.tmp $@
	@grep -h "spill" $@ | grep -v " 0 bytes spill stores, 0 bytes spill loads" || echo "kernels: no register spills (see $@)"

build/hostcheck: cuda/hostcheck/hostcheck.cu $(CUDA_HDRS)
	@mkdir -p build
	$(NVCC) -O2 -std=c++17 -arch=sm_80 -o $@ $<

kernels-hostcheck: build/hostcheck
	./build/hostcheck cuda/testdata

cuda-vet:
	$(CUDA_GO) vet -tags cuda ./...
	@mkdir -p build/cuda-tests
	$(CUDA_GO) test -c -tags cuda -o build/cuda-tests/ $(CUDA_TEST_PKGS)
	$(CUDA_GO) build -tags cuda -o build/kcheck-gpu ./cmd/kcheck-gpu

# The bundle for a GPU machine with the NVIDIA driver (and maybe nvcc) but no
# Go: the tagged test binaries, the worker, a pure-Go kcheck, the PTX, the
# kernel sources (gpu-check.sh rebuilds them for the local GPU when nvcc is
# there) and the script. The binaries need glibc >= 2.34 on that machine.
gpu-bundle: kernels
	rm -rf build/gpu
	mkdir -p build/gpu/ptx build/gpu/src/hostcheck build/gpu/src/testdata
	$(CUDA_GO) test -c -tags cuda -o build/gpu/cuda.test ./cuda
	$(CUDA_GO) test -c -tags cuda -o build/gpu/kcheck-gpu.test ./cmd/kcheck-gpu
	$(CUDA_GO) build -tags cuda -o build/gpu/kcheck-gpu ./cmd/kcheck-gpu
	CGO_ENABLED=0 $(GO) build -o build/gpu/kcheck ./cmd/kcheck
	cp cuda/ptx/* build/gpu/ptx/
	cp $(CUDA_SRCS) $(CUDA_HDRS) build/gpu/src/
	cp cuda/hostcheck/hostcheck.cu build/gpu/src/hostcheck/
	cp cuda/testdata/* build/gpu/src/testdata/
	cp build/kernels.log build/gpu/
	cp cuda/gpu-check.sh build/gpu/
	@du -sh build/gpu
