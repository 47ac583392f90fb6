// kc_emu.h: the CUDA built-ins for the cuda-emu build, force-included (g++
// -include) before every kernel source of cuda/. With it, the unmodified .cu
// files compile for the CPU: each CUDA thread of a block is a fiber of the
// runtime (runtime/emu.cc), __syncthreads is a barrier over the block's
// fibers, warp shuffles and the inline PTX (cp.async, ldmatrix, mma.sync, the
// approximate rcp/ex2, trap) are warp collectives computed from the PTX ISA's
// definitions. The inline `asm` statements reach the runtime through
// kc_emu::ptx, into which the build's source preparation turns each one
// (cuda/emu/prepare.go); nothing else of the sources is changed.
//
// What this cannot reproduce, and says wherever it reports: the bits of the
// hardware's ex2.approx/rcp.approx (computed here as the nearest float), the
// tensor cores' accumulation order (each mma here sums its products exactly
// and rounds once to fp32), nvcc's choice of fused multiply-adds, and timing.
#pragma once

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <initializer_list>
#include <type_traits>
#include <utility>

#ifndef __CUDA_ARCH__
#error "kc_emu.h: the emulation build defines __CUDA_ARCH__ (800 or 1200) on the command line"
#endif
#define __CUDACC__ 1
#define KC_EMU 1

// Function and variable qualifiers. __shared__ variables are per block: the
// runtime runs one block at a time on an OS thread, so thread_local storage
// (static storage for a block-scope declaration, valid after `extern` for
// the dynamic shared array) is exactly one copy a running block.
#define __host__
#define __device__
#ifdef KC_EMU_SCAN
#define __global__ KC_EMU_GLOBAL_MARK
#else
#define __global__
#endif
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ thread_local
#define __align__(n) __attribute__((aligned(n)))
#define __constant__

// Vector types, with CUDA's sizes and alignments.
struct __attribute__((aligned(8))) uint2 { unsigned int x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };
static inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

#include "cuda_bf16.h"
#include "cuda_fp16.h"

// Dynamic shared memory: one array an OS thread, the `extern __shared__`
// array of the kernels (mla_decode.cu names it smem). It is defined here,
// ahead of the kernels, so that their block-scope extern declaration sees a
// constant-initialized variable (no TLS wrapper call). Its size is the
// largest opt-in of any emulated architecture (sm_90's 227 KB); a launch may
// use only what it asked for (the rest is poisoned under ASan).
#define KC_EMU_MAX_DYN_SMEM (227 * 1024)
__attribute__((visibility("hidden"))) alignas(128) thread_local uint8_t smem[KC_EMU_MAX_DYN_SMEM];

namespace kc_emu __attribute__((visibility("hidden"))) {

// PtxOperand is one operand of an inline asm statement: an output (its
// address), or an input (its value, widened to 64 bits).
struct PtxOperand {
    char kind;      // the constraint letter: f r l h n
    bool out;       // "=x" or "+x"
    bool inout;     // "+x"
    void* ptr;      // outputs
    uint64_t value; // inputs and the initial value of "+x"
    int size;       // bytes of the C++ object
};

template <class T>
inline PtxOperand op_out(const char* c, T& ref) {
    PtxOperand o{};
    o.out = true;
    o.inout = c[0] == '+';
    o.kind = c[1];
    o.ptr = (void*)&ref;
    o.size = (int)sizeof(T);
    if (o.inout) memcpy(&o.value, &ref, sizeof(T) < 8 ? sizeof(T) : 8);
    return o;
}
inline PtxOperand op_in_bits(const char* c, uint64_t bits, int size) {
    PtxOperand o{};
    o.kind = c[0];
    o.value = bits;
    o.size = size;
    return o;
}
inline PtxOperand op_in(const char* c, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return op_in_bits(c, u, 4);
}
inline PtxOperand op_in(const char* c, uint32_t v) { return op_in_bits(c, v, 4); }
inline PtxOperand op_in(const char* c, int v) { return op_in_bits(c, (uint32_t)v, 4); }
inline PtxOperand op_in(const char* c, uint16_t v) { return op_in_bits(c, v, 2); }
inline PtxOperand op_in(const char* c, uint64_t v) { return op_in_bits(c, v, 8); }
inline PtxOperand op_in(const char* c, long long v) { return op_in_bits(c, (uint64_t)v, 8); }
inline PtxOperand op_in(const char* c, const void* p) { return op_in_bits(c, (uint64_t)(uintptr_t)p, 8); }

// ptx runs one inline asm statement (its template text as written in the
// source) on this thread's operands.
void ptx(const char* tmpl, const char* file, int line, std::initializer_list<PtxOperand> ops);

// The running thread's coordinates and its block's.
struct ThreadCoords {
    uint3 tid;
};
extern thread_local ThreadCoords* tcur;
extern thread_local uint3 block_idx;
extern thread_local dim3 block_dim, grid_dim;

void syncthreads();
uint32_t shfl(uint32_t mask, uint32_t v, int src, int width, int mode);  // mode 0 idx, 1 xor, 2 up, 3 down
uint32_t shared_addr(const void* p);
[[noreturn]] void fail(const char* kind, const char* fmt, ...);

}  // namespace kc_emu

#define threadIdx (kc_emu::tcur->tid)
#define blockIdx (kc_emu::block_idx)
#define blockDim (kc_emu::block_dim)
#define gridDim (kc_emu::grid_dim)
#define warpSize 32

static inline void __syncthreads() { kc_emu::syncthreads(); }

template <class T>
static inline T kc_emu_shfl_t(unsigned mask, T v, int src, int width, int mode) {
    static_assert(sizeof(T) == 4, "kc_emu: 32-bit shuffles only");
    uint32_t u;
    memcpy(&u, &v, 4);
    u = kc_emu::shfl(mask, u, src, width, mode);
    memcpy(&v, &u, 4);
    return v;
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) { return kc_emu_shfl_t(mask, v, lane_mask, width, 1); }
template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) { return kc_emu_shfl_t(mask, v, src, width, 0); }
template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) { return kc_emu_shfl_t(mask, v, (int)d, width, 2); }
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) { return kc_emu_shfl_t(mask, v, (int)d, width, 3); }

// Intrinsics: the IEEE operations they name (the host's SSE arithmetic is
// IEEE binary32 with no excess precision).
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
// cvt.rni.sat.u32.f32: nearest even, NaN and negatives to 0, saturating.
static inline unsigned int __float2uint_rn(float x) {
    if (!(x > 0.0f)) return 0u;
    if (x >= 4294967295.0f) return 0xffffffffu;
    return (unsigned int)nearbyintf(x);
}
// prmt.b32 in its default mode: selector nibble i picks byte (sel_i & 7) of
// {y, x}, and its bit 3 replicates that byte's sign bit.
static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned int r = 0;
    for (int i = 0; i < 4; ++i) {
        const unsigned int sel = (s >> (4 * i)) & 0xfu;
        unsigned int b = (unsigned int)(v >> (8 * (sel & 7u))) & 0xffu;
        if (sel & 8u) b = (b & 0x80u) ? 0xffu : 0u;
        r |= b << (8 * i);
    }
    return r;
}
static inline size_t __cvta_generic_to_shared(const void* p) { return kc_emu::shared_addr(p); }

// CUDA's global min/max overloads.
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

// The kernel registry of a module: the build's generated file lists every
// extern "C" __global__ function with KC_EMU_KERNEL, and the runtime calls
// them through a trampoline that unpacks the launch's 64-bit argument slots
// (the cuda launcher's layout: pointers whole, 32-bit values in the low bytes).
namespace kc_emu __attribute__((visibility("hidden"))) {
typedef void (*KernelCall)(const uint64_t* slots);
struct KernelEntry {
    const char* name;
    KernelCall call;
    int arity;
    const int* param_sizes;
};

template <class T>
inline T from_slot(uint64_t v) {
    if constexpr (std::is_pointer<T>::value) {
        return (T)(uintptr_t)v;
    } else {
        static_assert(sizeof(T) == 4 || sizeof(T) == 8, "kc_emu: kernel parameters are pointers or 32/64-bit scalars");
        T t;
        memcpy(&t, &v, sizeof(T));  // little-endian: the low bytes
        return t;
    }
}

template <class F>
struct Trampoline;
template <class... A>
struct Trampoline<void (*)(A...)> {
    static constexpr int arity = (int)sizeof...(A);
    static constexpr int sizes[sizeof...(A) + 1] = {(int)sizeof(A)..., 0};
    template <void (*F)(A...), size_t... I>
    static void unpack(const uint64_t* s, std::index_sequence<I...>) {
        F(from_slot<A>(s[I])...);
    }
    template <void (*F)(A...)>
    static void call(const uint64_t* s) {
        unpack<F>(s, std::index_sequence_for<A...>{});
    }
};
}  // namespace kc_emu

#define KC_EMU_KERNEL(fn)                                                                      \
    {#fn, &kc_emu::Trampoline<decltype(&fn)>::template call<&fn>, kc_emu::Trampoline<decltype(&fn)>::arity, \
     kc_emu::Trampoline<decltype(&fn)>::sizes},
