// common.cuh: the device helpers every kcheck kernel shares.
//
// Everything here is written for the sm_80 baseline (cp.async, ldmatrix,
// mma.sync m16n8k16 bf16) so that one PTX for compute_80 runs on sm_80,
// sm_90 and sm_120 by driver JIT. Paths that only exist on newer parts
// (hardware e2m1/e4m3 conversions, the block-scaled FP4 MMA) sit behind
// __CUDA_ARCH__ and feature-macro guards and have a portable twin that
// produces the same bits.
//
// The scalar conversions are __host__ __device__ so that hostcheck.cu can
// test them on a machine without a GPU against the NVIDIA tables in
// shared/data and the OCP rules restated in reference/CONTRACTS.md §2.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <float.h>
#ifndef __CUDA_ARCH__
#include <string.h>
#include <math.h>
#endif

#define KC_HD static __host__ __device__ __forceinline__
#define KC_D static __device__ __forceinline__

// ---------------------------------------------------------------------------
// Architecture features.
//
// KC_HW_FP4_CVT: cvt.rn.satfinite.e2m1x2.f32 (sm_100a/sm_103a/sm_120a/sm_121a
// and the 'f' family targets of nvcc >= 12.9).
// KC_HW_FP4_MMA: mma.sync ... kind::mxf4nvf4.block_scale (sm_120a/sm_121a).
// Neither is ever defined by the compute_80 PTX build; both need nvcc >= 12.8.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000 &&                        \
    (defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL) || \
     defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL) || \
     (defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000))
#define KC_HW_FP4_CVT 1
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200 &&                        \
    (defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL) || \
     (defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ == 1200))
#define KC_HW_FP4_MMA 1
#endif

// ---------------------------------------------------------------------------
// Bit casts.

KC_HD uint32_t kc_f2u(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

KC_HD float kc_u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

KC_HD float kc_nan() { return kc_u2f(0x7fffffffu); }
KC_HD float kc_inf() { return kc_u2f(0x7f800000u); }

// ---------------------------------------------------------------------------
// Approximate reciprocal and exponential, as the engines use them.

// kc_rcp_approx is PTX rcp.approx.ftz.f32 (vLLM reciprocal_approximate_ftz);
// the host twin is exact division and exists only so hostcheck links.
KC_HD float kc_rcp_approx(float a) {
#ifdef __CUDA_ARCH__
    float b;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(b) : "f"(a));
    return b;
#else
    return 1.0f / a;
#endif
}

// kc_ex2 is ex2.approx.ftz.f32 (what exp2f compiles to under fast math, and
// what FlashAttention/FlashMLA use for the softmax numerators).
KC_D float kc_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---------------------------------------------------------------------------
// BF16.

// kc_bf16_rn rounds to bf16 (nearest even; NaN stays NaN) and returns the bits.
KC_HD uint16_t kc_bf16_rn(float f) {
#ifdef __CUDA_ARCH__
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    uint32_t u = kc_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
#endif
}

KC_HD float kc_bf16_to_f(uint16_t b) { return kc_u2f((uint32_t)b << 16); }

// kc_pack_bf16x2 rounds lo and hi to bf16 and packs lo into the low half
// (the lower k index of an mma fragment register).
KC_D uint32_t kc_pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// ---------------------------------------------------------------------------
// E4M3FN (reference/CONTRACTS.md §2): 1-4-3, bias 7, max 448 (0x7E), NaN 0x7F/0xFF.

// kc_e4m3_decode is exact: the 7 magnitude bits are placed at the top of an
// fp32 mantissa/exponent and the exponent bias difference (127 - 7 = 120) is
// applied by an exact multiply by 2^120, which also turns the fp32
// subnormals of code exponent 0 into the E4M3 subnormals m * 2^-9.
KC_HD float kc_e4m3_decode(uint8_t c) {
    uint32_t mag = c & 0x7fu;
    float v;
    if (mag == 0x7fu) {
        v = kc_nan();
    } else {
        v = kc_u2f(mag << 20) * 0x1p120f;
    }
    return (c & 0x80u) ? -v : v;
}

// kc_e4m3_encode rounds to nearest even. saturate: |x| beyond 448 goes to
// ±448 (__NV_SATFINITE); otherwise |x| > 464 (448 plus half an ulp) becomes
// NaN (__NV_NOSAT: E4M3FN has no infinity) and 464 itself rounds to 448.
// NaN becomes 0x7F whatever its sign (CUDA canonicalizes NaN first).
KC_HD uint8_t kc_e4m3_encode(float x, bool saturate) {
    uint32_t u = kc_f2u(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return 0x7fu;  // NaN: canonical positive, as CUDA's conversion
    float a = kc_u2f(au);
    if (a > 464.0f) return sign | (saturate ? 0x7eu : 0x7fu);  // includes inf
    if (a < 0x1p-6f) {
        // Subnormal range: the quantum is 2^-9 and a * 512 is exact, so
        // rounding it to an integer (nearest even) is the E4M3 rounding. The
        // result 8 is the smallest normal, whose code is also 8.
#ifdef __CUDA_ARCH__
        uint32_t q = (uint32_t)__float2uint_rn(a * 512.0f);
#else
        uint32_t q = (uint32_t)nearbyintf(a * 512.0f);
#endif
        return sign | (uint8_t)q;
    }
    // Normal: round the fp32 mantissa to 3 bits, nearest even, by adding
    // just under half of the dropped part plus the kept lowest bit. A carry
    // into the exponent is the correct result (1.111b rounds to 10.000b).
    au += 0x7ffffu + ((au >> 20) & 1u);
    uint32_t e = (au >> 23) - 127u + 7u;
    uint32_t m = (au >> 20) & 7u;
    return sign | (uint8_t)((e << 3) | m);  // a <= 464 keeps this <= 0x7E
}

// ---------------------------------------------------------------------------
// E2M1 (FP4): bit 3 sign, bits 2..0 magnitude code for 0, .5, 1, 1.5, 2, 3, 4, 6.

// kc_e2m1_encode rounds to nearest even and saturates at ±6. The thresholds
// are the midpoints; at a midpoint the even code wins (0.25->0, 0.75->1,
// 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4), hence the alternating > and >=.
// NaN encodes as ±0 here; the sm_100+ instruction saturates it. Neither
// happens for finite activations, and the contract has no NaN in FP4.
KC_HD uint32_t kc_e2m1_encode(float x) {
    float a = fabsf(x);
    uint32_t m = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) +
                 (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
    return m | ((kc_f2u(x) >> 28) & 8u);
}

// kc_e2m1x8 converts v[0..7] to eight codes packed with v[0] in bits 0..3
// (element 2i in the low nibble of byte i: the contract's packing).
KC_D uint32_t kc_e2m1x8(const float (&v)[8]) {
#if defined(KC_HW_FP4_CVT)
    uint32_t r;
    // cvt.rn.satfinite.e2m1x2.f32 d, a, b puts a in the HIGH nibble.
    asm("{\n"
        ".reg .b8 b0, b1, b2, b3;\n"
        "cvt.rn.satfinite.e2m1x2.f32 b0, %2, %1;\n"
        "cvt.rn.satfinite.e2m1x2.f32 b1, %4, %3;\n"
        "cvt.rn.satfinite.e2m1x2.f32 b2, %6, %5;\n"
        "cvt.rn.satfinite.e2m1x2.f32 b3, %8, %7;\n"
        "mov.b32 %0, {b0, b1, b2, b3};\n"
        "}"
        : "=r"(r)
        : "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "f"(v[4]), "f"(v[5]), "f"(v[6]), "f"(v[7]));
    return r;
#else
    uint32_t r = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) r |= kc_e2m1_encode(v[i]) << (4 * i);
    return r;
#endif
}

// kc_e2m1_decode_host is the plain table (hostcheck and documentation).
KC_HD float kc_e2m1_decode(uint32_t code) {
    // 2*|value| for the magnitude codes: 0 1 2 3 4 6 8 12.
    const uint32_t twice = (code & 7u) < 4u ? (code & 7u) : (code & 7u) == 4u ? 4u
                         : (code & 7u) == 5u ? 6u : (code & 7u) == 6u ? 8u : 12u;
    float v = 0.5f * (float)twice;
    return (code & 8u) ? -v : v;
}

KC_HD uint32_t kc_byte_perm(uint32_t x, uint32_t y, uint32_t sel) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, sel);
#else
    // prmt.b32 default mode, selector nibbles without the sign-replicate bit.
    const uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= (uint32_t)((v >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
#endif
}

// kc_e2m1_pair_scaled decodes the two codes of one packed byte and
// multiplies both by s. The magnitudes come from a byte table with prmt:
// bytes 0..7 of {lut_lo, lut_hi} hold 2*|value| = 0 1 2 3 4 6 8 12, the
// selector picks the low code into byte 0 and the high code into byte 1.
// The int-to-float step is the 2^23 magic-number trick (exact for bytes).
// With s an E4M3 value, |e2m1| * s has at most 6 significant bits and lies
// in [2^-10, 2688], so the product is exact in fp32 and in bf16.
KC_HD void kc_e2m1_pair_scaled(uint32_t byte, float s, float& lo, float& hi) {
    const uint32_t lut_lo = 0x03020100u, lut_hi = 0x0c080604u;
    const uint32_t sel = (byte & 7u) | (byte & 0x70u);
    const uint32_t mags = kc_byte_perm(lut_lo, lut_hi, sel);
    const float half_s = 0.5f * s;
    const float mlo = kc_u2f(0x4b000000u | (mags & 0xffu)) - 8388608.0f;
    const float mhi = kc_u2f(0x4b000000u | ((mags >> 8) & 0xffu)) - 8388608.0f;
    lo = kc_u2f(kc_f2u(mlo * half_s) ^ ((byte & 0x08u) << 28));
    hi = kc_u2f(kc_f2u(mhi * half_s) ^ ((byte & 0x80u) << 24));
}

// ---------------------------------------------------------------------------
// The fp8_ds_mla tile scale (reference/CONTRACTS.md §3.4).

// kc_ds_tile_scale is the fp8_ds_mla tile scale for a tile whose largest
// magnitude is amax. pow2: the smallest power of two >= max(amax/448, 1e-4),
// read from the bits (exact: no log2 approximation).
KC_HD float kc_ds_tile_scale(float amax, bool pow2) {
    const float s = amax / 448.0f;
    if (!pow2) return fmaxf(s, FLT_MIN);
    const float v = fmaxf(s, 1e-4f);
    const uint32_t u = kc_f2u(v);
    if ((u & 0x007fffffu) == 0) return v;  // already a power of two (v is normal)
    return kc_u2f((u & 0x7f800000u) + 0x00800000u);
}

// ---------------------------------------------------------------------------
// The swizzled 128x4 scale layout (reference/CONTRACTS.md §5).

KC_HD int64_t kc_sf_offset_128x4(int m, int k, int num_k_tiles) {
    return ((int64_t)(m >> 7) * num_k_tiles + (k >> 2)) * 512 + (m & 31) * 16 +
           ((m & 127) >> 5) * 4 + (k & 3);
}

// ---------------------------------------------------------------------------
// Asynchronous copies, ldmatrix and the bf16 tensor-core MMA (sm_80).

KC_D uint32_t kc_smem_addr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// kc_cp_async16 copies 16 bytes global->shared, or writes 16 zero bytes when
// pred is false (src-size 0: nothing is read, so src may be any mapped
// address; callers pass a valid base pointer anyway).
KC_D void kc_cp_async16(void* smem, const void* gmem, bool pred) {
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(kc_smem_addr(smem)),
                 "l"(gmem), "r"(n));
}

KC_D void kc_cp_async8(void* smem, const void* gmem, bool pred) {
    int n = pred ? 8 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(kc_smem_addr(smem)),
                 "l"(gmem), "r"(n));
}

KC_D void kc_cp_async4(void* smem, const void* gmem, bool pred) {
    int n = pred ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(kc_smem_addr(smem)),
                 "l"(gmem), "r"(n));
}

KC_D void kc_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
KC_D void kc_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

KC_D void kc_ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(kc_smem_addr(smem)));
}

KC_D void kc_ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(kc_smem_addr(smem)));
}

// kc_mma_bf16 is D = A*B + D for one m16n8k16 tile: bf16 inputs, fp32
// accumulation (products are exact in fp32; the sums are rounded to fp32).
KC_D void kc_mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

KC_D float kc_warp_max_xor(float v, int width) {
    for (int o = width / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
