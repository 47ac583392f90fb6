// mla_decode.cu: absorbed MLA decode over a paged latent cache, split-K, and
// the split-K combine (contracts mla_decode, mla_decode_sparse,
// splitk_combine: reference/CONTRACTS.md §3.6-§3.8).
//
// kcheck:precision mla_decode acc=f32 p=bf16 kv_dequant=bf16 fp8_saturate=true softmax_block=32
// kcheck:precision mla_decode_sparse acc=f32 p=bf16 kv_dequant=bf16 fp8_saturate=true softmax_block=32
//   Scores q.k over D = 576 on bf16 tensor cores with fp32 accumulation,
//   scaled by softmax_scale*log2(e) in fp32; online softmax in base 2 with
//   ex2.approx over tiles of MLA_BN = 32 tokens (softmax_block: the running
//   max is updated every 32 tokens, FlashMLA's every 64); P rounded to bf16
//   before the PV product (fp32 accumulation);
//   the row sum l accumulates the fp32 P (before rounding), as FlashAttention
//   and FlashMLA do; out = O * fl(1/l), rounded to bf16; lse = (m + log2 l)
//   times ln 2 for lse_base=e. FP8 cache entries are dequantized to
//   bf16(fl(e4m3 * scale)) when loaded. Split partials are the per-split
//   normalized O (fp32) and per-split lse in the file's lse_base.
// kcheck:precision splitk_combine acc=f32 p=none kv_dequant=none fp8_saturate=true
//   w_s = ex2.approx((lse_s - m) * log2 e) (base e) or ex2.approx(lse_s - m)
//   (base 2), out = sum_s fl(w_s / sum w) * o_s in fp32, lse = m + log(sum w).
//
// Decode layout. A CTA owns 16*MT query rows of one request (rows are
// (q_pos, head) pairs, heads fastest: the FlashMLA "heads as MMA rows"
// packing) and one split of its tokens, and walks that split in tiles of 32
// tokens. 4*MT warps: warp (wm, wn) computes the scores of m-tile wm against
// tokens [8wn, 8wn+8) of the tile over all of D, and owns output columns
// [128wn, 128wn+128) of m-tile wm. Row max and row sum are exchanged through
// shared memory (4 partials per row, summed in a fixed order), P goes
// through shared memory as bf16 so every warp can use all 32 tokens as the
// k of its PV product. K tiles arrive by cp.async, STAGES deep; FP8 tiles
// are staged raw and converted to a bf16 tile before the products.
#include "common.cuh"

#define MLA_D 576
#define MLA_L 512
#define MLA_R 64
#define MLA_BN 32          // tokens a tile
#define MLA_ROW_PAD 8      // bf16 elements of padding a shared row (bank spread)
#define MLA_QK_STRIDE (MLA_D + MLA_ROW_PAD)   // 584 bf16 = 1168 bytes
#define MLA_P_STRIDE (MLA_BN + MLA_ROW_PAD)   // 40 bf16 = 80 bytes
#define DS_ENTRY 656
#define DS_SCALE_OFF 512
#define DS_PE_OFF 528

#define LOG2E_F 1.4426950408889634f
#define LN2_F 0.6931471805599453f

// Cache kinds.
#define CACHE_BF16 0
#define CACHE_FP8 1
#define CACHE_DS 2

template <int CACHE>
struct CacheGeom {
    // bytes of one token entry in global memory and in the raw staging tile
    static constexpr int entry = CACHE == CACHE_BF16 ? MLA_D * 2 : CACHE == CACHE_FP8 ? MLA_D : DS_ENTRY;
    static constexpr int chunks = entry / 16;  // 16-byte cp.async chunks a token
};

// Shared memory layout (bytes), computed the same way for the kernel and,
// through the exported *_smem constants, for the launcher.
template <int MT, int STAGES, int CACHE>
struct MlaSmem {
    static constexpr int rows = 16 * MT;
    static constexpr int q_bytes = rows * MLA_QK_STRIDE * 2;
    static constexpr int k_tile_bytes = MLA_BN * MLA_QK_STRIDE * 2;
    // bf16 caches are staged straight into padded bf16 tiles; fp8 caches
    // into raw tiles (entry bytes a token) plus one converted bf16 tile.
    static constexpr int raw_tile_bytes = CACHE == CACHE_BF16 ? k_tile_bytes : MLA_BN * CacheGeom<CACHE>::entry;
    static constexpr int stage_bytes = raw_tile_bytes;
    static constexpr int conv_bytes = CACHE == CACHE_BF16 ? 0 : k_tile_bytes;
    static constexpr int p_bytes = rows * MLA_P_STRIDE * 2;
    static constexpr int red_bytes = 2 * 4 * rows * 4;   // max and sum partials, 4 warps a row
    static constexpr int valid_bytes = STAGES * MLA_BN * 4;
    static constexpr int off_q = 0;
    static constexpr int off_stage = off_q + q_bytes;
    static constexpr int off_conv = off_stage + STAGES * stage_bytes;
    static constexpr int off_p = off_conv + conv_bytes;
    static constexpr int off_red = off_p + p_bytes;
    static constexpr int off_valid = off_red + red_bytes;
    static constexpr int total = off_valid + valid_bytes;
    static_assert(q_bytes % 16 == 0 && stage_bytes % 16 == 0 && conv_bytes % 16 == 0 && p_bytes % 16 == 0,
                  "shared regions must stay 16-byte aligned");
};

struct MlaParams {
    const uint16_t* q;          // [B, s_q, H, D] bf16
    const uint8_t* kv;          // cache bytes
    const int* block_table;     // [B, max_blocks] (dense)
    const int* seq_lens;        // [B] (dense)
    const int* indices;         // [B, s_q, topk] (sparse)
    const float* k_scale;       // [] (fp8_e4m3)
    uint16_t* out;              // [B, s_q, H, L] bf16
    float* lse;                 // [B, H, s_q]
    float* part_out;            // [B, s_q, H, S, L] (S > 1)
    float* part_lse;            // [B, s_q, H, S]
    int* split_bounds;          // [B, S + 1] (dense, S > 1)
};

template <int MT, int STAGES, int CACHE, bool SPARSE>
__device__ void mla_decode_impl(const MlaParams p, int B, int s_q, int H, int max_blocks, int P,
                                int NB, int topk, int S, float scale_log2, int causal,
                                int lse_base2, int lse_empty_pos) {
    using SM = MlaSmem<MT, STAGES, CACHE>;
    using G = CacheGeom<CACHE>;
    constexpr int NT = 128 * MT;
    constexpr int BM = 16 * MT;
    extern __shared__ __align__(16) uint8_t smem[];
    uint16_t* sQ = reinterpret_cast<uint16_t*>(smem + SM::off_q);
    uint8_t* sStage = smem + SM::off_stage;
    uint16_t* sConv = reinterpret_cast<uint16_t*>(smem + SM::off_conv);
    uint16_t* sP = reinterpret_cast<uint16_t*>(smem + SM::off_p);
    float* sMax = reinterpret_cast<float*>(smem + SM::off_red);   // [4][BM]
    float* sSum = sMax + 4 * BM;                                   // [4][BM]
    int* sValid = reinterpret_cast<int*>(smem + SM::off_valid);    // [STAGES][BN]: token index or -1

    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;

    // Which request, which rows, which tokens.
    int b, rows_total, n_tok, q_fixed;
    int64_t q_row0;  // flat row index (b, q_pos, head) of this CTA's row 0
    if (SPARSE) {
        const int bi = blockIdx.y;  // (b, q_pos)
        b = bi / s_q;
        q_fixed = bi % s_q;
        rows_total = H;
        n_tok = topk;
        q_row0 = (int64_t)bi * H;
    } else {
        b = blockIdx.y;
        q_fixed = 0;
        rows_total = s_q * H;
        n_tok = p.seq_lens[b];
        q_row0 = (int64_t)b * s_q * H;
    }
    const int row0 = blockIdx.x * BM;
    const int split = blockIdx.z;
    const int per_split = (n_tok + S - 1) / S;
    const int t_begin = min(n_tok, split * per_split);
    int t_end = min(n_tok, t_begin + per_split);
    if (!SPARSE && S > 1 && p.split_bounds != nullptr && blockIdx.x == 0 && tid == 0) {
        p.split_bounds[(int64_t)b * (S + 1) + split] = t_begin;
        if (split == S - 1) p.split_bounds[(int64_t)b * (S + 1) + S] = n_tok;
    }
    // Causal (dense, s_q > 1): query i sees tokens < n_tok - s_q + 1 + i, so
    // this CTA needs nothing past the limit of its last row.
    const bool is_causal = !SPARSE && causal && s_q > 1;
    if (is_causal) {
        const int last_row = min(rows_total, row0 + BM) - 1;
        t_end = min(t_end, n_tok - s_q + 1 + last_row / H);
    }
    const int n_tiles = t_end > t_begin ? (t_end - t_begin + MLA_BN - 1) / MLA_BN : 0;
    const int64_t num_slots = (int64_t)NB * P;

    // Stage tile j (tokens t_begin + 32j ...) into stage slot st.
    auto load_tile = [&](int j, int st) {
        uint8_t* dst = sStage + st * SM::stage_bytes;
        constexpr int TPT = NT / MLA_BN;  // threads a token
        const int tt = tid / TPT, part0 = tid % TPT;
        const int tok = t_begin + j * MLA_BN + tt;
        int64_t slot = -1;
        if (tok < t_end) {
            if (SPARSE) {
                const int64_t s = p.indices[((int64_t)blockIdx.y) * topk + tok];
                if (s >= 0 && s < num_slots) slot = s;
            } else {
                const int blk = p.block_table[(int64_t)b * max_blocks + tok / P];
                if (blk >= 0 && blk < NB) slot = (int64_t)blk * P + tok % P;
            }
        }
        if (part0 == 0) sValid[st * MLA_BN + tt] = slot >= 0 ? tok : -1;
        const uint8_t* src = p.kv + (slot >= 0 ? slot : 0) * (int64_t)G::entry;
        for (int c = part0; c < G::chunks; c += TPT) {
            uint8_t* d = CACHE == CACHE_BF16 ? dst + tt * (MLA_QK_STRIDE * 2) + c * 16
                                             : dst + tt * G::entry + c * 16;
            kc_cp_async16(d, src + c * 16, slot >= 0);
        }
    };

    // Q rows (zero past rows_total), part of the first commit group.
    for (int c = tid; c < BM * (MLA_D / 8); c += NT) {
        const int r = c / (MLA_D / 8), part = c % (MLA_D / 8);
        const bool ok = row0 + r < rows_total;
        const uint16_t* src = p.q + (ok ? (q_row0 + row0 + r) * MLA_D + part * 8 : 0);
        kc_cp_async16(sQ + r * MLA_QK_STRIDE + part * 8, src, ok);
    }
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_tiles) load_tile(s, s);
        kc_cp_async_commit();
    }

    // Per-thread state for rows g and g+8 of m-tile wm.
    const int lr0 = wm * 16 + g, lr1 = lr0 + 8;  // local rows
    int limit0 = t_end, limit1 = t_end;
    if (is_causal) {
        limit0 = n_tok - s_q + 1 + (row0 + lr0) / H;
        limit1 = n_tok - s_q + 1 + (row0 + lr1) / H;
    }
    float m_run[2] = {-kc_inf(), -kc_inf()};
    float l_run[2] = {0.0f, 0.0f};
    float acc_o[16][4];
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc_o[j][q] = 0.0f;

    for (int j = 0; j < n_tiles; ++j) {
        kc_cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int st = j % STAGES;
        {
            const int nj = j + STAGES - 1;
            if (nj < n_tiles) load_tile(nj, nj % STAGES);
            kc_cp_async_commit();
        }
        const uint16_t* sK;
        if (CACHE == CACHE_BF16) {
            sK = reinterpret_cast<const uint16_t*>(sStage + st * SM::stage_bytes);
        } else {
            // Convert the raw tile to bf16: 72 groups of 8 values a token.
            const uint8_t* raw = sStage + st * SM::stage_bytes;
            const float ks = CACHE == CACHE_FP8 ? p.k_scale[0] : 1.0f;
            for (int c = tid; c < MLA_BN * (MLA_D / 8); c += NT) {
                const int tt = c / (MLA_D / 8), part = c % (MLA_D / 8);
                const uint8_t* e = raw + tt * G::entry;
                uint4 outv;
                if (CACHE == CACHE_DS && part >= MLA_L / 8) {
                    outv = *reinterpret_cast<const uint4*>(e + DS_PE_OFF + (part - MLA_L / 8) * 16);
                } else {
                    const float s = CACHE == CACHE_FP8 ? ks
                                  : *reinterpret_cast<const float*>(e + DS_SCALE_OFF + 4 * (part >> 4));
                    const uint2 bytes = *reinterpret_cast<const uint2*>(e + part * 8);
                    uint32_t w[4];
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const uint32_t word = q < 2 ? bytes.x : bytes.y;
                        const uint8_t c0 = (word >> (16 * (q & 1))) & 0xffu;
                        const uint8_t c1 = (word >> (16 * (q & 1) + 8)) & 0xffu;
                        w[q] = kc_pack_bf16x2(__fmul_rn(kc_e4m3_decode(c0), s),
                                              __fmul_rn(kc_e4m3_decode(c1), s));
                    }
                    outv = make_uint4(w[0], w[1], w[2], w[3]);
                }
                *reinterpret_cast<uint4*>(sConv + tt * MLA_QK_STRIDE + part * 8) = outv;
            }
            __syncthreads();
            sK = sConv;
        }

        // S = Q K^T for rows of m-tile wm, tokens [8wn, 8wn+8).
        float acc_s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        {
            const uint16_t* qa = sQ + (wm * 16 + (lane & 15)) * MLA_QK_STRIDE + (lane >> 4) * 8;
            const uint16_t* kb = sK + (wn * 8 + (lane & 7)) * MLA_QK_STRIDE + (lane >> 3) * 8;
#pragma unroll 6
            for (int ks = 0; ks < MLA_D / 16; ks += 2) {
                uint32_t a0[4], a1[4], bb[4];
                kc_ldmatrix_x4(a0, qa + ks * 16);
                kc_ldmatrix_x4(a1, qa + (ks + 1) * 16);
                kc_ldmatrix_x4(bb, kb + ks * 16);  // k [16ks, 16ks+32) of 8 tokens
                kc_mma_bf16(acc_s, a0, bb[0], bb[1]);
                kc_mma_bf16(acc_s, a1, bb[2], bb[3]);
            }
        }

        // Scale to log2 units and mask. Element e of the fragment: row
        // (e < 2 ? g : g+8), token 8wn + 2t4 + (e & 1).
        const int* valid = sValid + st * MLA_BN;
        float sc[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int tok = valid[wn * 8 + 2 * t4 + (e & 1)];
            const int lim = e < 2 ? limit0 : limit1;
            sc[e] = (tok >= 0 && tok < lim) ? acc_s[e] * scale_log2 : -kc_inf();
        }
        // Row max over this warp's 8 tokens (the quad), then over the 4 warps.
        float mx0 = fmaxf(sc[0], sc[1]), mx1 = fmaxf(sc[2], sc[3]);
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        if (t4 == 0) {
            sMax[wn * BM + lr0] = mx0;
            sMax[wn * BM + lr1] = mx1;
        }
        __syncthreads();
        float m_new[2], alpha[2], m_use[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int lr = h ? lr1 : lr0;
            const float tmax = fmaxf(fmaxf(sMax[lr], sMax[BM + lr]), fmaxf(sMax[2 * BM + lr], sMax[3 * BM + lr]));
            m_new[h] = fmaxf(m_run[h], tmax);
            // A row that has seen no token keeps m = -inf; use 0 as the
            // offset so that exp2(-inf - offset) = 0 instead of NaN.
            m_use[h] = m_new[h] == -kc_inf() ? 0.0f : m_new[h];
            alpha[h] = kc_ex2(m_run[h] - m_use[h]);
            m_run[h] = m_new[h];
        }
        float pr[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) pr[e] = kc_ex2(sc[e] - m_use[e >> 1]);
        float sm0 = pr[0] + pr[1], sm1 = pr[2] + pr[3];
        sm0 += __shfl_xor_sync(0xffffffffu, sm0, 1);
        sm0 += __shfl_xor_sync(0xffffffffu, sm0, 2);
        sm1 += __shfl_xor_sync(0xffffffffu, sm1, 1);
        sm1 += __shfl_xor_sync(0xffffffffu, sm1, 2);
        if (t4 == 0) {
            sSum[wn * BM + lr0] = sm0;
            sSum[wn * BM + lr1] = sm1;
        }
        // P as bf16 into the shared P tile.
        *reinterpret_cast<uint32_t*>(sP + lr0 * MLA_P_STRIDE + wn * 8 + 2 * t4) = kc_pack_bf16x2(pr[0], pr[1]);
        *reinterpret_cast<uint32_t*>(sP + lr1 * MLA_P_STRIDE + wn * 8 + 2 * t4) = kc_pack_bf16x2(pr[2], pr[3]);
#pragma unroll
        for (int jn = 0; jn < 16; ++jn) {
            acc_o[jn][0] *= alpha[0];
            acc_o[jn][1] *= alpha[0];
            acc_o[jn][2] *= alpha[1];
            acc_o[jn][3] *= alpha[1];
        }
        __syncthreads();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int lr = h ? lr1 : lr0;
            const float tsum = ((sSum[lr] + sSum[BM + lr]) + sSum[2 * BM + lr]) + sSum[3 * BM + lr];
            l_run[h] = l_run[h] * alpha[h] + tsum;
        }

        // O[m-tile wm, cols 128wn..] += P[16, 32] V[32, 128].
        {
            const uint16_t* pa = sP + (wm * 16 + (lane & 15)) * MLA_P_STRIDE + (lane >> 4) * 8;
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
                uint32_t a[4];
                kc_ldmatrix_x4(a, pa + kk * 16);
                const uint16_t* vb = sK + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * MLA_QK_STRIDE +
                                     wn * 128 + (lane >> 4) * 8;
#pragma unroll
                for (int jn = 0; jn < 16; jn += 2) {
                    uint32_t bb[4];
                    kc_ldmatrix_x4_trans(bb, vb + jn * 8);
                    kc_mma_bf16(acc_o[jn], a, bb[0], bb[1]);
                    kc_mma_bf16(acc_o[jn + 1], a, bb[2], bb[3]);
                }
            }
        }
    }
    kc_cp_async_wait<0>();

    // Epilogue. Row r (local lr) is flat row q_row0 + row0 + lr; its
    // (q_pos, head) give the lse index [B, H, s_q].
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int lr = h ? lr1 : lr0;
        const int r = row0 + lr;
        if (r >= rows_total) continue;
        const int64_t frow = q_row0 + r;  // (b, q_pos, head) flattened
        const int qpos = SPARSE ? q_fixed : r / H;
        const int head = SPARSE ? r : r % H;
        const float l = l_run[h];
        const bool empty = !(l > 0.0f);
        const float inv = empty ? 0.0f : __fdiv_rn(1.0f, l);
        float lse2 = empty ? -kc_inf() : m_run[h] + log2f(l);
        float lse_v = lse_base2 ? lse2 : lse2 * LN2_F;
        if (S > 1) {
            float* po = p.part_out + (frow * S + split) * MLA_L + wn * 128 + 2 * t4;
#pragma unroll
            for (int jn = 0; jn < 16; ++jn)
                *reinterpret_cast<float2*>(po + jn * 8) =
                    make_float2(acc_o[jn][2 * h] * inv, acc_o[jn][2 * h + 1] * inv);
            if (wn == 0 && t4 == 0) p.part_lse[frow * S + split] = empty ? -kc_inf() : lse_v;
        } else {
            uint16_t* o = p.out + frow * MLA_L + wn * 128 + 2 * t4;
#pragma unroll
            for (int jn = 0; jn < 16; ++jn)
                *reinterpret_cast<uint32_t*>(o + jn * 8) =
                    kc_pack_bf16x2(acc_o[jn][2 * h] * inv, acc_o[jn][2 * h + 1] * inv);
            if (wn == 0 && t4 == 0) {
                if (empty) lse_v = lse_empty_pos ? kc_inf() : -kc_inf();
                p.lse[((int64_t)b * H + head) * s_q + qpos] = lse_v;
            }
        }
    }
}

#define KC_MLA(name, MT, STAGES, CACHE, SPARSE)                                                   \
    extern "C" __device__ int name##_smem = MlaSmem<MT, STAGES, CACHE>::total;            \
    extern "C" __global__ void __launch_bounds__(128 * MT, 1)                                    \
        name(const uint16_t* q, const uint8_t* kv, const int* block_table, const int* seq_lens,  \
             const int* indices, const float* k_scale, uint16_t* out, float* lse,                \
             float* part_out, float* part_lse, int* split_bounds, int B, int s_q, int H,         \
             int max_blocks, int P, int NB, int topk, int S, float scale_log2, int causal,      \
             int lse_base2, int lse_empty_pos) {                                                 \
        const MlaParams p{q, kv, block_table, seq_lens, indices, k_scale, out, lse, part_out,    \
                          part_lse, split_bounds};                                               \
        mla_decode_impl<MT, STAGES, CACHE, SPARSE>(p, B, s_q, H, max_blocks, P, NB, topk, S,     \
                                                   scale_log2, causal, lse_base2, lse_empty_pos); \
    }

// m1: 16 rows (TP-sharded heads), fits the 99 KB of sm_86/89/120 with two
// stages. m4: 64 rows (full heads, s_q * H >= 64), two stages for sm_80,
// three for sm_90's 227 KB.
#define KC_MLA_ALL(cache_name, CACHE)                                        \
    KC_MLA(mla_decode_##cache_name##_m1_s2, 1, 2, CACHE, false)              \
    KC_MLA(mla_decode_##cache_name##_m4_s2, 4, 2, CACHE, false)              \
    KC_MLA(mla_decode_##cache_name##_m4_s3, 4, 3, CACHE, false)              \
    KC_MLA(mla_decode_sparse_##cache_name##_m1_s2, 1, 2, CACHE, true)        \
    KC_MLA(mla_decode_sparse_##cache_name##_m4_s2, 4, 2, CACHE, true)        \
    KC_MLA(mla_decode_sparse_##cache_name##_m4_s3, 4, 3, CACHE, true)
KC_MLA_ALL(bf16, CACHE_BF16)
KC_MLA_ALL(fp8, CACHE_FP8)
KC_MLA_ALL(ds_mla, CACHE_DS)

// The opt-in shared memory a block may use: 99 KB on sm_86/89/120, 163 KB on
// sm_80, 227 KB on sm_90. Each variant must fit the parts it is meant for.
#define KC_SMEM_FITS(MT, ST, LIMIT)                                                       \
    static_assert(MlaSmem<MT, ST, CACHE_BF16>::total <= LIMIT &&                          \
                      MlaSmem<MT, ST, CACHE_FP8>::total <= LIMIT &&                       \
                      MlaSmem<MT, ST, CACHE_DS>::total <= LIMIT,                          \
                  "MLA decode variant exceeds its shared memory budget")
KC_SMEM_FITS(1, 2, 101376);
KC_SMEM_FITS(4, 2, 166912);
KC_SMEM_FITS(4, 3, 232448);

// ---------------------------------------------------------------------------
// Split-K combine. One CTA a row, each thread 4 columns a pass. lse_layout
// 1 writes lse at the mla_decode position [B, H, s_q] of flat row n =
// (b, q_pos, head); 0 writes lse[n]. The weights fl(ex2(.) * inv) depend on
// the row only: for up to COMBINE_SHARED_W splits (every split count the
// decode launcher chooses) the block computes each once into shared memory;
// beyond that every thread recomputes them per column. Both paths evaluate
// the same expressions in the same order, so their outputs are identical.
#define COMBINE_SHARED_W 64

template <int OUT>  // 0 f32, 1 bf16
__device__ void splitk_combine_impl(const float* __restrict__ part_out,
                                    const float* __restrict__ part_lse, void* __restrict__ out,
                                    float* __restrict__ lse, int N, int S, int L, int lse_base2,
                                    int lse_empty_pos, int lse_layout, int s_q, int H) {
    __shared__ float sW[COMBINE_SHARED_W];  // a split's weight, or -1 for an empty split
    const int64_t n = blockIdx.x;
    if (n >= N) return;
    const float* pl = part_lse + n * S;
    float m = -kc_inf();
    for (int s = 0; s < S; ++s) m = fmaxf(m, pl[s]);
    int64_t lse_idx = n;
    if (lse_layout == 1) {
        const int64_t b = n / ((int64_t)s_q * H);
        const int i = (int)((n / H) % s_q), h = (int)(n % H);
        lse_idx = (b * H + h) * s_q + i;
    }
    const bool all_empty = m == -kc_inf();
    float wsum = 0.0f;
    if (!all_empty) {
        for (int s = 0; s < S; ++s) {
            const float d = pl[s] - m;
            wsum += pl[s] == -kc_inf() ? 0.0f : kc_ex2(lse_base2 ? d : d * LOG2E_F);
        }
    }
    const float inv = all_empty ? 0.0f : __fdiv_rn(1.0f, wsum);
    const bool shared_w = S <= COMBINE_SHARED_W;
    if (shared_w) {
        for (int s = threadIdx.x; s < S; s += blockDim.x) {
            const float d = pl[s] - m;
            sW[s] = pl[s] == -kc_inf() ? -1.0f : kc_ex2(lse_base2 ? d : d * LOG2E_F) * inv;
        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < L; c += blockDim.x) {
        float acc = 0.0f;
        if (!all_empty) {
            for (int s = 0; s < S; ++s) {
                float w;
                if (shared_w) {
                    w = sW[s];
                    if (w < 0.0f) continue;  // empty split: its o is never read
                } else {
                    if (pl[s] == -kc_inf()) continue;
                    const float d = pl[s] - m;
                    w = kc_ex2(lse_base2 ? d : d * LOG2E_F) * inv;
                }
                acc = fmaf(w, part_out[(n * S + s) * L + c], acc);
            }
        }
        if (OUT == 0) {
            static_cast<float*>(out)[n * L + c] = acc;
        } else {
            static_cast<uint16_t*>(out)[n * L + c] = kc_bf16_rn(acc);
        }
    }
    if (threadIdx.x == 0) {
        float v;
        if (all_empty) {
            v = lse_empty_pos ? kc_inf() : -kc_inf();
        } else {
            v = lse_base2 ? m + log2f(wsum) : m + logf(wsum);
        }
        lse[lse_idx] = v;
    }
}

#define KC_COMBINE(name, OUT)                                                                     \
    extern "C" __global__ void __launch_bounds__(128)                                            \
        name(const float* part_out, const float* part_lse, void* out, float* lse, int N, int S,  \
             int L, int lse_base2, int lse_empty_pos, int lse_layout, int s_q, int H) {          \
        splitk_combine_impl<OUT>(part_out, part_lse, out, lse, N, S, L, lse_base2,              \
                                 lse_empty_pos, lse_layout, s_q, H);                            \
    }
KC_COMBINE(splitk_combine_f32, 0)
KC_COMBINE(splitk_combine_bf16, 1)
