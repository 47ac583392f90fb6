// cuda_fp16.h for the cuda-emu build: the subset of CUDA's fp16 API that the
// kernels in cuda/ use, computed on the CPU. Conversions round to nearest
// even with IEEE binary16 overflow to infinity, as cvt.rn.f16.f32 does.
#pragma once
#include <stdint.h>
#include <string.h>

struct __half {
    uint16_t __x;
};
struct __align__(4) __half2 {
    __half x, y;
};

// kc_emu_f2h_bits rounds an fp32 to binary16, nearest even. The value is
// rounded once from the fp32 bits (no double rounding through another format).
static inline uint16_t kc_emu_f2h_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return sign | 0x7e00u;        // NaN (quiet)
    if (au >= 0x477ff000u) return sign | 0x7c00u;       // >= 65520 rounds to inf
    if (au < 0x38800000u) {                             // below 2^-14: subnormal half
        if (au < 0x33000000u) return sign;              // below 2^-25: rounds to 0 (2^-25 itself ties to even 0)
        const uint32_t exp = au >> 23, mant = (au & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - exp;              // 14 + (113 - exp) ... value = mant * 2^(exp-150)
        // half subnormal quantum 2^-24: q = mant * 2^(exp - 150 + 24) = mant >> (126 - exp)
        const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        uint32_t r = q + ((rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u);
        return sign | (uint16_t)r;
    }
    // normal: rebias 127 -> 15 and round the mantissa from 23 to 10 bits
    uint32_t v = au - ((127u - 15u) << 23);
    v += 0xfffu + ((v >> 13) & 1u);
    return sign | (uint16_t)(v >> 13);
}

static inline float kc_emu_h2f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        float f = (float)m * 0x1p-24f;  // exact
        memcpy(&u, &f, 4);
        u |= sign;
    } else {
        u = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline __half __float2half_rn(float f) { return __half{kc_emu_f2h_bits(f)}; }
static inline float __half2float(__half h) { return kc_emu_h2f(h.__x); }
static inline __half2 __floats2half2_rn(float lo, float hi) { return __half2{__float2half_rn(lo), __float2half_rn(hi)}; }
