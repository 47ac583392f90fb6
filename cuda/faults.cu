// faults.cu: deliberately broken kernels. They exist to prove, on a real
// GPU, that the cuda backend survives what a buggy kernel does: an
// out-of-bounds write (CUDA_ERROR_ILLEGAL_ADDRESS), a trap
// (CUDA_ERROR_LAUNCH_FAILED or ..._ILLEGAL_INSTRUCTION), and a kernel that
// never finishes. The worker runs them instead of the real kernel when
// $KCHECK_GPU_FAULT is set (a test hook; see cmd/kcheck-gpu).
#include "common.cuh"

// fault_oob writes far past the end of a one-element buffer.
extern "C" __global__ void fault_oob(float* p, long long stride) {
    p[(long long)(threadIdx.x + 1) * stride] = 1.0f;
}

// fault_trap aborts the kernel.
extern "C" __global__ void fault_trap(int* p) {
    if (threadIdx.x == 0) p[0] = 1;
    asm volatile("trap;");
}

// fault_hang spins until *flag becomes nonzero, which nobody ever writes.
extern "C" __global__ void fault_hang(volatile int* flag, int* out) {
    int n = 0;
    while (*flag == 0) ++n;
    out[0] = n;
}
