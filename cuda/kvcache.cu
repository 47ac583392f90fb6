// kvcache.cu: paged latent-cache write and gather (contracts kv_cache_write,
// kv_cache_gather: reference/CONTRACTS.md §3.4 and §3.5).
//
// kcheck:precision kv_cache_write acc=f32 p=none kv_dequant=none fp8_saturate=true
//   fp8_e4m3: e4m3(fl(x / k_scale)), the quotient one IEEE division (as vLLM's
//   scaled_convert), then round-to-nearest-even into E4M3, saturating unless
//   the call says fp8_saturate=false. fp8_ds_mla: tile scale fl(amax / 448)
//   then max(., FLT_MIN) (amax) or the next power of two of max(., 1e-4)
//   (pow2, computed exactly from the fp32 bits); codes e4m3_sat(fl(x / scale)).
//   bf16 and k_pe are copied bit for bit.
// kcheck:precision kv_cache_gather acc=f32 p=none kv_dequant=f32 fp8_saturate=true
//   fp8 entries decode to fl(e4m3 * scale) in fp32, then one rounding to the
//   output dtype; bf16 entries are widened or copied exactly.
//
// Layouts (per token, D = L + R):
//   bf16        [NB, P, D] bf16: kv_c (L) | k_pe (R)
//   fp8_e4m3    [NB, P, D] bytes
//   fp8_ds_mla  [NB, P, 656] bytes: 512 E4M3 kv_c | 4 f32 tile scales | 64 bf16 k_pe
#include "common.cuh"
#include <float.h>

#define DS_L 512
#define DS_R 64
#define DS_ENTRY 656
#define DS_SCALE_OFF 512
#define DS_PE_OFF 528

// One warp per token; WARPS tokens a CTA.
#define KV_WARPS 8

// ---------------------------------------------------------------------------
// Write.

// kv_cache_write_bf16 copies kv_c and k_pe into the slot's entry. vec: L and
// R are multiples of 8, so every row and entry is 16-byte aligned and the
// copy moves 16-byte vectors; otherwise it moves 2-byte elements.
extern "C" __global__ void __launch_bounds__(KV_WARPS * 32) kv_cache_write_bf16(
    const uint16_t* __restrict__ kv_c, const uint16_t* __restrict__ k_pe,
    const int64_t* __restrict__ slots, uint16_t* __restrict__ cache, int T, int L, int R,
    int64_t num_slots) {
    const int tok = blockIdx.x * KV_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (tok >= T) return;
    const int64_t slot = slots[tok];
    if (slot < 0 || slot >= num_slots) return;  // negative: skip (contract); beyond: refuse to write
    const int D = L + R;
    uint16_t* dst = cache + slot * D;
    const uint16_t* src_c = kv_c + (int64_t)tok * L;
    const uint16_t* src_p = k_pe + (int64_t)tok * R;
    if ((L & 7) == 0 && (R & 7) == 0) {
        for (int c = lane; c < D / 8; c += 32) {
            const int e = c * 8;
            const uint4 v = e < L ? *reinterpret_cast<const uint4*>(src_c + e)
                                  : *reinterpret_cast<const uint4*>(src_p + (e - L));
            *reinterpret_cast<uint4*>(dst + e) = v;
        }
    } else {
        for (int e = lane; e < D; e += 32) dst[e] = e < L ? src_c[e] : src_p[e - L];
    }
}

// kv_cache_write_fp8 stores e4m3(x / k_scale) for both parts.
extern "C" __global__ void __launch_bounds__(KV_WARPS * 32) kv_cache_write_fp8(
    const uint16_t* __restrict__ kv_c, const uint16_t* __restrict__ k_pe,
    const int64_t* __restrict__ slots, uint8_t* __restrict__ cache,
    const float* __restrict__ k_scale, int T, int L, int R, int64_t num_slots, int saturate) {
    const int tok = blockIdx.x * KV_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (tok >= T) return;
    const int64_t slot = slots[tok];
    if (slot < 0 || slot >= num_slots) return;
    const int D = L + R;
    const float ks = k_scale[0];
    const bool sat = saturate != 0;
    uint8_t* dst = cache + slot * D;
    const uint16_t* src_c = kv_c + (int64_t)tok * L;
    const uint16_t* src_p = k_pe + (int64_t)tok * R;
    if ((L & 7) == 0 && (R & 7) == 0) {
        for (int c = lane; c < D / 8; c += 32) {
            const int e = c * 8;
            const uint4 v = e < L ? *reinterpret_cast<const uint4*>(src_c + e)
                                  : *reinterpret_cast<const uint4*>(src_p + (e - L));
            const uint16_t* h = reinterpret_cast<const uint16_t*>(&v);
            uint32_t w[2] = {0, 0};
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const uint8_t q = kc_e4m3_encode(__fdiv_rn(kc_bf16_to_f(h[j]), ks), sat);
                w[j >> 2] |= (uint32_t)q << (8 * (j & 3));
            }
            *reinterpret_cast<uint2*>(dst + e) = make_uint2(w[0], w[1]);
        }
    } else {
        for (int e = lane; e < D; e += 32) {
            const uint16_t h = e < L ? src_c[e] : src_p[e - L];
            dst[e] = kc_e4m3_encode(__fdiv_rn(kc_bf16_to_f(h), ks), sat);
        }
    }
}

// kv_cache_write_ds_mla: lane l quantizes kv_c[16l, 16l+16) (tile l/8), the
// 8 lanes of a tile agree on its amax with three shuffles; lanes 0..7 copy
// k_pe (128 bytes) and the first lane of each tile stores its scale. Needs
// L = 512 and R = 64 (the 656-byte entry).
extern "C" __global__ void __launch_bounds__(KV_WARPS * 32) kv_cache_write_ds_mla(
    const uint16_t* __restrict__ kv_c, const uint16_t* __restrict__ k_pe,
    const int64_t* __restrict__ slots, uint8_t* __restrict__ cache, int T, int64_t num_slots,
    int pow2) {
    const int tok = blockIdx.x * KV_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (tok >= T) return;  // warp-uniform
    const int64_t slot = slots[tok];
    if (slot < 0 || slot >= num_slots) return;  // warp-uniform
    uint8_t* dst = cache + slot * DS_ENTRY;
    const uint16_t* src = kv_c + (int64_t)tok * DS_L + lane * 16;
    const uint4 v0 = *reinterpret_cast<const uint4*>(src);
    const uint4 v1 = *reinterpret_cast<const uint4*>(src + 8);
    float x[16];
    {
        const uint16_t* h0 = reinterpret_cast<const uint16_t*>(&v0);
        const uint16_t* h1 = reinterpret_cast<const uint16_t*>(&v1);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            x[j] = kc_bf16_to_f(h0[j]);
            x[8 + j] = kc_bf16_to_f(h1[j]);
        }
    }
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) amax = fmaxf(amax, fabsf(x[j]));
    amax = kc_warp_max_xor(amax, 8);  // xor 4, 2, 1 stays inside the 8-lane tile
    const float scale = kc_ds_tile_scale(amax, pow2 != 0);
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const uint8_t q = kc_e4m3_encode(__fdiv_rn(x[j], scale), true);
        w[j >> 2] |= (uint32_t)q << (8 * (j & 3));
    }
    *reinterpret_cast<uint4*>(dst + lane * 16) = make_uint4(w[0], w[1], w[2], w[3]);
    if ((lane & 7) == 0) *reinterpret_cast<float*>(dst + DS_SCALE_OFF + 4 * (lane >> 3)) = scale;
    if (lane < 8) {
        const uint4 p = *reinterpret_cast<const uint4*>(k_pe + (int64_t)tok * DS_R + lane * 8);
        *reinterpret_cast<uint4*>(dst + DS_PE_OFF + lane * 16) = p;
    }
}

// ---------------------------------------------------------------------------
// Gather: gathered[cu[b] + t] = dequant(cache[block_table[b, t / P], t % P]).
// Grid (ceil(max_seq / KV_WARPS), B); one warp per token, 8 elements a lane
// a step where the row allows it (16-byte loads of bf16). A block id outside
// [0, NB) (which the launcher refuses before launching) writes NaN rather
// than reading outside the cache.

template <int CACHE, int OUT>  // CACHE 0 bf16, 1 fp8_e4m3, 2 fp8_ds_mla; OUT 0 f32, 1 bf16
__device__ void kv_gather_impl(const uint8_t* __restrict__ cache,
                               const int* __restrict__ block_table,
                               const int* __restrict__ seq_lens,
                               const int64_t* __restrict__ cu_seq_lens,
                               const float* __restrict__ k_scale, void* __restrict__ out,
                               int max_blocks, int P, int L, int R, int NB) {
    const int b = blockIdx.y;
    const int t = blockIdx.x * KV_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (t >= seq_lens[b]) return;
    const int D = L + R;
    const int64_t row = cu_seq_lens[b] + t;
    const int blk = block_table[(int64_t)b * max_blocks + t / P];
    const bool ok = blk >= 0 && blk < NB;
    const int64_t slot = (int64_t)blk * P + t % P;
    const float ks = (CACHE == 1) ? k_scale[0] : 1.0f;
    // Vector path: with D a multiple of 8 every row starts 16-byte aligned
    // (bf16) or 8-byte aligned (fp8), so a lane moves 8 elements at a time:
    // one 16-byte (bf16) or 8-byte (fp8) load and 16 or 32 bytes of output.
    // Each element gets the same conversion as the scalar loop below.
    if ((D & 7) == 0 && ok && (CACHE != 2 || (L == DS_L && R == DS_R))) {
        for (int e0 = lane * 8; e0 < D; e0 += 32 * 8) {
            float v[8];
            if (CACHE == 0) {
                const uint4 raw = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint16_t*>(cache) + slot * D + e0);
                const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int j = 0; j < 8; ++j) v[j] = kc_bf16_to_f((uint16_t)(w[j >> 1] >> (16 * (j & 1))));
            } else if (CACHE == 1 || e0 < DS_L) {
                const uint8_t* src = CACHE == 1 ? cache + slot * D + e0 : cache + slot * DS_ENTRY + e0;
                const float s = CACHE == 1 ? ks : *reinterpret_cast<const float*>(cache + slot * DS_ENTRY + DS_SCALE_OFF + 4 * (e0 >> 7));
                const uint2 raw = *reinterpret_cast<const uint2*>(src);
#pragma unroll
                for (int j = 0; j < 8; ++j) v[j] = __fmul_rn(kc_e4m3_decode((uint8_t)(((j < 4 ? raw.x : raw.y) >> (8 * (j & 3))) & 0xffu)), s);
            } else {
                const uint4 raw = *reinterpret_cast<const uint4*>(cache + slot * DS_ENTRY + DS_PE_OFF + 2 * (e0 - DS_L));
                const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int j = 0; j < 8; ++j) v[j] = kc_bf16_to_f((uint16_t)(w[j >> 1] >> (16 * (j & 1))));
            }
            if (OUT == 0) {
                float4* o = reinterpret_cast<float4*>(static_cast<float*>(out) + row * D + e0);
                o[0] = make_float4(v[0], v[1], v[2], v[3]);
                o[1] = make_float4(v[4], v[5], v[6], v[7]);
            } else {
                uint32_t w[4];
#pragma unroll
                for (int q = 0; q < 4; ++q) w[q] = (uint32_t)kc_bf16_rn(v[2 * q]) | (uint32_t)kc_bf16_rn(v[2 * q + 1]) << 16;
                *reinterpret_cast<uint4*>(static_cast<uint16_t*>(out) + row * D + e0) = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
        return;
    }
    for (int e = lane; e < D; e += 32) {
        float v;
        if (!ok) {
            v = kc_nan();
        } else if (CACHE == 0) {
            v = kc_bf16_to_f(reinterpret_cast<const uint16_t*>(cache)[slot * D + e]);
        } else if (CACHE == 1) {
            v = __fmul_rn(kc_e4m3_decode(cache[slot * D + e]), ks);
        } else {
            const uint8_t* ent = cache + slot * DS_ENTRY;
            if (e < DS_L) {
                const float s = *reinterpret_cast<const float*>(ent + DS_SCALE_OFF + 4 * (e >> 7));
                v = __fmul_rn(kc_e4m3_decode(ent[e]), s);
            } else {
                v = kc_bf16_to_f(*reinterpret_cast<const uint16_t*>(ent + DS_PE_OFF + 2 * (e - DS_L)));
            }
        }
        if (OUT == 0) {
            static_cast<float*>(out)[row * D + e] = v;
        } else {
            static_cast<uint16_t*>(out)[row * D + e] = kc_bf16_rn(v);
        }
    }
}

#define KC_GATHER(name, CACHE, OUT)                                                              \
    extern "C" __global__ void __launch_bounds__(KV_WARPS * 32)                                 \
        name(const uint8_t* cache, const int* block_table, const int* seq_lens,                 \
             const int64_t* cu_seq_lens, const float* k_scale, void* out, int max_blocks, int P, \
             int L, int R, int NB) {                                                            \
        kv_gather_impl<CACHE, OUT>(cache, block_table, seq_lens, cu_seq_lens, k_scale, out,     \
                                   max_blocks, P, L, R, NB);                                     \
    }
KC_GATHER(kv_cache_gather_bf16_f32, 0, 0)
KC_GATHER(kv_cache_gather_bf16_bf16, 0, 1)
KC_GATHER(kv_cache_gather_fp8_f32, 1, 0)
KC_GATHER(kv_cache_gather_fp8_bf16, 1, 1)
KC_GATHER(kv_cache_gather_ds_mla_f32, 2, 0)
KC_GATHER(kv_cache_gather_ds_mla_bf16, 2, 1)
