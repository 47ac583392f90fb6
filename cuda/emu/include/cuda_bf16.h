// cuda_bf16.h for the cuda-emu build: the subset of CUDA's bf16 API that the
// kernels in cuda/ use, computed on the CPU. Conversions round to nearest
// even, as the device's cvt.rn.bf16.f32 does; NaN stays NaN (quiet).
#pragma once
#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t __x;
};
struct __align__(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline uint16_t kc_emu_f2bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{kc_emu_f2bf16_bits(f)}; }
static inline float __bfloat162float(__nv_bfloat16 b) {
    uint32_t u = (uint32_t)b.__x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }
// The low half holds lo (CUDA: .x is the low 16 bits).
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
