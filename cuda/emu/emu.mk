# cuda/emu/emu.mk: the cuda-emu backend (the .cu kernels on the CPU).
# Included by the top-level Makefile (-include cuda/emu/emu.mk). Needs g++
# (C++17) and cgo; no GPU and no CUDA toolkit.
#
#   make emu           build/emu/*.emu.so (compute_80 and sm_120a builds of
#                      every .cu) and bin/kcheck-gpu-emu, the emulated worker
#   make emu-asan      the same modules under AddressSanitizer, build/emu-asan
#   make emu-test      the emulation's own tests: the worker
#                      protocol (a crashing and a hanging kernel), the
#                      planted kernel bugs that must fail
#   make emu-test-asan the same on the ASan modules (what CI runs)
#   make emu-ci        the catalog subset CI runs (every kernel variant and
#                      edge family, under ASan): cuda/emu/testdata/ci-cases.txt
#   make emu-catalog   the whole catalog (cases/catalog.json) on cuda-emu;
#                      results in build/emu-catalog.json, counts on stderr

EMU_CXX  ?= g++
EMU_GO   := CGO_ENABLED=1 $(GO)
EMU_DEPS := $(filter-out %_test.go,$(wildcard cuda/*.cu cuda/*.cuh cuda/emu/include/*.h cuda/emu/runtime/*.cc cuda/emu/*.go cuda/emu/cmd/kcheck-emu-build/*.go))
EMU_TIMEOUT ?= 15m

.PHONY: emu emu-asan emu-test emu-test-asan emu-ci emu-catalog

emu: build/emu/.built bin/kcheck-gpu-emu bin/kcheck

emu-asan: build/emu-asan/.built bin/kcheck-gpu-emu bin/kcheck

build/emu/.built: $(EMU_DEPS)
	CXX=$(EMU_CXX) $(GO) run ./cuda/emu/cmd/kcheck-emu-build -src cuda -out build/emu
	@touch $@

build/emu-asan/.built: $(EMU_DEPS)
	CXX=$(EMU_CXX) $(GO) run ./cuda/emu/cmd/kcheck-emu-build -src cuda -out build/emu-asan -asan
	@touch $@

bin/kcheck-gpu-emu: $(wildcard cuda/*.go cmd/kcheck-gpu/*.go internal/*/*.go reference/*/*.go)
	$(EMU_GO) build -tags cudaemu -o $@ ./cmd/kcheck-gpu

bin/kcheck: $(wildcard cmd/kcheck/*.go internal/*/*.go reference/*/*.go cases/*)
	$(GO) build -o $@ ./cmd/kcheck

emu-test: emu
	$(EMU_GO) test -tags cudaemu -count=1 -timeout 40m -v ./cuda/emu/...

# CI's variant: everything on the ASan modules that emu-ci builds anyway.
emu-test-asan: emu-asan
	KCHECK_EMU_TEST_ASAN=1 $(EMU_GO) test -tags cudaemu -count=1 -timeout 40m -v ./cuda/emu/...

emu-ci: emu-asan
	@mkdir -p build
	cuda/emu/run-cases.sh cuda/emu/testdata/ci-cases.txt build/emu-ci.json asan

# Every catalog case with a CUDA kernel (dsa_indexer has none), on the
# default emulated device (sm_90), then the GEMM and quantize cases again on
# sm_120, where the sm_120a modules take the block-scaled FP4 and hardware
# e2m1 paths.
emu-catalog: emu
	@mkdir -p build
	bin/kcheck cases | grep -v '^dsa_indexer/' | awk '{print "sm_90", $$1}' > build/emu-catalog.txt
	bin/kcheck cases | grep -E '^nvfp4_(gemm|quantize)/' | awk '{print "sm_120", $$1}' >> build/emu-catalog.txt
	cuda/emu/run-cases.sh build/emu-catalog.txt build/emu-catalog.json
