// hostcheck runs the scalar helpers of common.cuh on the CPU (they are
// __host__ __device__) against independent sources: the NVIDIA conversion
// tables in cuda/testdata (CUDA's own host conversion code), CUDA's host
// conversion functions over large sweeps, the E2M1 rounding rules of
// reference/CONTRACTS.md §2 and the swizzle formula of §5 computed by
// hand. It needs nvcc (the helpers use CUDA types) but no GPU.
//
//   make kernels-hostcheck      (builds build/hostcheck and runs it)
#include "../common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

static int failures = 0;
static long checks = 0;

#define CHECK(cond, ...)                              \
    do {                                              \
        ++checks;                                     \
        if (!(cond)) {                                \
            if (++failures <= 40) {                   \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
                fprintf(stderr, __VA_ARGS__);         \
                fprintf(stderr, "\n");                \
            }                                         \
        }                                             \
    } while (0)

static std::vector<std::vector<std::string>> read_csv(const char* dir, const char* name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE* f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    std::vector<std::vector<std::string>> rows;
    char line[1024];
    bool header = true;
    while (fgets(line, sizeof line, f)) {
        if (header) {
            header = false;
            continue;
        }
        std::vector<std::string> cols;
        char* save = nullptr;
        for (char* tok = strtok_r(line, ",\r\n", &save); tok; tok = strtok_r(nullptr, ",\r\n", &save))
            cols.push_back(tok);
        if (!cols.empty()) rows.push_back(cols);
    }
    fclose(f);
    return rows;
}

static uint32_t hex(const std::string& s) { return (uint32_t)strtoul(s.c_str(), nullptr, 16); }

static void check_fp8_tables(const char* dir) {
    for (auto& r : read_csv(dir, "fp8_decode.csv")) {
        const uint8_t code = (uint8_t)hex(r[0]);
        const float got = kc_e4m3_decode(code);
        if (r[1] == "nan" || r[1] == "-nan") {
            CHECK(isnan(got), "e4m3 decode 0x%02x: want NaN, got %g", code, got);
        } else {
            const double want = strtod(r[1].c_str(), nullptr);
            CHECK((double)got == want, "e4m3 decode 0x%02x: want %.9g, got %.9g", code, want, got);
        }
    }
    for (auto& r : read_csv(dir, "fp8_encode.csv")) {
        const float x = kc_u2f(hex(r[0]));
        const uint8_t sat = kc_e4m3_encode(x, true), nosat = kc_e4m3_encode(x, false);
        CHECK(sat == hex(r[2]), "e4m3 satfinite of %s (%s): want %s, got 0x%02x", r[0].c_str(), r[1].c_str(), r[2].c_str(), sat);
        CHECK(nosat == hex(r[3]), "e4m3 nosat of %s (%s): want %s, got 0x%02x", r[0].c_str(), r[1].c_str(), r[3].c_str(), nosat);
    }
}

// CUDA's host __nv_cvt_float_to_fp8 is an independent implementation (it
// goes through double and integer rounding); compare every float of the
// binades around E4M3's range, both modes, and a stride over all patterns.
static void check_fp8_sweep() {
    long mism = 0;
    auto one = [&](uint32_t u) {
        const float x = kc_u2f(u);
        for (int sat = 0; sat < 2; ++sat) {
            const uint8_t want = __nv_cvt_float_to_fp8(x, sat ? __NV_SATFINITE : __NV_NOSAT, __NV_E4M3);
            const uint8_t got = kc_e4m3_encode(x, sat != 0);
            ++checks;
            if (want != got && ++mism <= 10)
                fprintf(stderr, "FAIL e4m3 sweep 0x%08x (%g) sat=%d: cuda 0x%02x, kc 0x%02x\n", u, x, sat, want, got);
        }
    };
    for (uint32_t e = 100; e <= 140; ++e)
        for (uint32_t m = 0; m < (1u << 23); m += (e >= 113 && e <= 136) ? 1 : 97) one((e << 23) | m);
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) one((uint32_t)u);
    one(0x7f800000u); one(0xff800000u); one(0x7fc00000u); one(0xffc00000u); one(0x00000001u); one(0x80000001u);
    if (mism) failures += (int)mism;
}

static void check_bf16(const char* dir) {
    for (auto& r : read_csv(dir, "f32_to_bf16_fp16.csv")) {
        const float x = kc_u2f(hex(r[0]));
        const uint16_t got = kc_bf16_rn(x);
        if (isnan(x)) {
            CHECK((got & 0x7fffu) > 0x7f80u, "bf16 of NaN %s: got 0x%04x, not NaN", r[0].c_str(), got);
        } else {
            CHECK(got == hex(r[1]), "bf16 of %s: want %s, got 0x%04x", r[0].c_str(), r[1].c_str(), got);
        }
    }
    long mism = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 997) {
        const float x = kc_u2f((uint32_t)u);
        if (isnan(x)) continue;
        const __nv_bfloat16 w = __float2bfloat16_rn(x);
        uint16_t want;
        memcpy(&want, &w, 2);
        ++checks;
        if (kc_bf16_rn(x) != want && ++mism <= 10)
            fprintf(stderr, "FAIL bf16 sweep 0x%08x: cuda 0x%04x, kc 0x%04x\n", (uint32_t)u, want, kc_bf16_rn(x));
    }
    failures += (int)mism;
}

// E2M1 values by code, from reference/CONTRACTS.md §2.
static const float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// nearest_e2m1 is an independent formulation: the magnitude code at the
// smallest distance, ties to the even code, saturating at 6.
static uint32_t nearest_e2m1(float x) {
    const float a = fabsf(x);
    uint32_t best = 0;
    float bd = INFINITY;
    for (uint32_t c = 0; c < 8; ++c) {
        const float d = fabsf(a - kE2M1[c]);
        if (d < bd || (d == bd && (c & 1u) == 0)) {
            bd = d;
            best = c;
        }
    }
    return best | (signbit(x) ? 8u : 0u);
}

static void check_e2m1() {
    // The contract's ties: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
    const struct { float x; uint32_t code; } ties[] = {
        {0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6},
        {6.0f, 7}, {7.0f, 7}, {1e30f, 7}, {-0.3f, 9}, {-0.1f, 8}, {-5.0f, 14}, {0.0f, 0}, {-0.0f, 8},
        {0.2500001f, 1}, {0.7499999f, 1}, {5.0000005f, 7}, {INFINITY, 7}, {-INFINITY, 15},
    };
    for (auto& t : ties) CHECK(kc_e2m1_encode(t.x) == t.code, "e2m1(%a): want code %u, got %u", t.x, t.code, kc_e2m1_encode(t.x));
    for (int i = -9000; i <= 9000; ++i) {
        const float x = (float)i / 1024.0f;
        CHECK(kc_e2m1_encode(x) == nearest_e2m1(x), "e2m1(%a): nearest is %u, got %u", x, nearest_e2m1(x), kc_e2m1_encode(x));
    }
    // one ulp either side of every midpoint
    for (int c = 0; c < 7; ++c) {
        const float mid = 0.5f * (kE2M1[c] + kE2M1[c + 1]);
        for (float x : {nextafterf(mid, 0.0f), mid, nextafterf(mid, 100.0f)}) {
            CHECK(kc_e2m1_encode(x) == nearest_e2m1(x), "e2m1(%a) near midpoint: nearest %u, got %u", x, nearest_e2m1(x), kc_e2m1_encode(x));
            CHECK(kc_e2m1_encode(-x) == nearest_e2m1(-x), "e2m1(%a) near midpoint: nearest %u, got %u", -x, nearest_e2m1(-x), kc_e2m1_encode(-x));
        }
    }
    for (uint32_t c = 0; c < 16; ++c) {
        const float want = (c & 8u) ? -kE2M1[c & 7u] : kE2M1[c & 7u];
        CHECK(kc_e2m1_decode(c) == want && signbit(kc_e2m1_decode(c)) == signbit(want), "e2m1 decode %u", c);
    }
}

// Every packed byte times every finite positive E4M3 scale: the prmt table
// path must give table[code] * s exactly, with the contract's nibble order
// (element 2i low), and the product must be exact in bf16.
static void check_pair_scaled() {
    for (uint32_t sc = 1; sc < 0x7f; ++sc) {
        const float s = kc_e4m3_decode((uint8_t)sc);
        for (uint32_t byte = 0; byte < 256; ++byte) {
            float lo, hi;
            kc_e2m1_pair_scaled(byte, s, lo, hi);
            const uint32_t cl = byte & 15u, ch = byte >> 4;
            const float wl = ((cl & 8u) ? -kE2M1[cl & 7u] : kE2M1[cl & 7u]) * s;
            const float wh = ((ch & 8u) ? -kE2M1[ch & 7u] : kE2M1[ch & 7u]) * s;
            CHECK(lo == wl && signbit(lo) == signbit(wl), "pair byte 0x%02x s=%g: low %g want %g", byte, s, lo, wl);
            CHECK(hi == wh && signbit(hi) == signbit(wh), "pair byte 0x%02x s=%g: high %g want %g", byte, s, hi, wh);
            CHECK(kc_bf16_to_f(kc_bf16_rn(lo)) == lo, "e2m1*s not exact in bf16: %g", lo);
            CHECK(kc_bf16_to_f(kc_bf16_rn(hi)) == hi, "e2m1*s not exact in bf16: %g", hi);
        }
    }
}

static void check_swizzle() {
    // Hand-computed from the formula of reference/CONTRACTS.md §5.
    CHECK(kc_sf_offset_128x4(0, 0, 2) == 0, "swizzle (0,0)");
    CHECK(kc_sf_offset_128x4(0, 1, 2) == 1, "swizzle (0,1)");
    CHECK(kc_sf_offset_128x4(1, 0, 2) == 16, "swizzle (1,0)");
    CHECK(kc_sf_offset_128x4(32, 0, 2) == 4, "swizzle (32,0)");
    CHECK(kc_sf_offset_128x4(0, 4, 2) == 512, "swizzle (0,4)");
    CHECK(kc_sf_offset_128x4(128, 0, 2) == 1024, "swizzle (128,0)");
    // 37 = 32 + 5; k 6 = tile 1, col 2: 512 + 5*16 + 1*4 + 2 = 598.
    CHECK(kc_sf_offset_128x4(37, 6, 2) == 598, "swizzle (37,6) = %lld", (long long)kc_sf_offset_128x4(37, 6, 2));
    // A bijection of the padded [256, 12] grid onto [0, 3072).
    std::vector<int> seen(256 * 12, 0);
    for (int m = 0; m < 256; ++m)
        for (int k = 0; k < 12; ++k) {
            const int64_t o = kc_sf_offset_128x4(m, k, 3);
            CHECK(o >= 0 && o < 256 * 12, "swizzle (%d,%d) = %lld out of range", m, k, (long long)o);
            if (o >= 0 && o < 256 * 12) seen[o]++;
        }
    for (int i = 0; i < 256 * 12; ++i) CHECK(seen[i] == 1, "swizzle offset %d hit %d times", i, seen[i]);
}

static void check_ds_scale() {
    // amax convention: max(amax / 448, FLT_MIN); pow2: 2^ceil(log2(max(amax/448, 1e-4))).
    CHECK(kc_ds_tile_scale(448.0f, false) == 1.0f, "ds amax 448");
    CHECK(kc_ds_tile_scale(0.0f, false) == FLT_MIN, "ds amax 0");
    CHECK(kc_ds_tile_scale(449.0f, false) == 449.0f / 448.0f, "ds amax 449");
    CHECK(kc_ds_tile_scale(448.0f, true) == 1.0f, "ds pow2 448 -> 1");
    CHECK(kc_ds_tile_scale(449.0f, true) == 2.0f, "ds pow2 449 -> 2");
    CHECK(kc_ds_tile_scale(300.0f, true) == 1.0f, "ds pow2 300 -> 1");
    CHECK(kc_ds_tile_scale(224.0f, true) == 0.5f, "ds pow2 224 -> 0.5");
    CHECK(kc_ds_tile_scale(0.0f, true) == 0x1p-13f, "ds pow2 0 -> 2^-13 (1e-4 <= 2^-13)");
    // against log2/ceil in double for a sweep
    for (int i = 0; i < 100000; ++i) {
        const float amax = (float)i * 0.01f;
        const double v = fmax((double)(amax / 448.0f), 1e-4);
        const double want = exp2(ceil(log2(v)));
        CHECK((double)kc_ds_tile_scale(amax, true) == want, "ds pow2 amax %g: want %g got %g", amax, want, kc_ds_tile_scale(amax, true));
    }
}

int main(int argc, char** argv) {
    const char* dir = argc > 1 ? argv[1] : "cuda/testdata";
    check_fp8_tables(dir);
    check_bf16(dir);
    check_e2m1();
    check_pair_scaled();
    check_swizzle();
    check_ds_scale();
    check_fp8_sweep();
    if (failures) {
        fprintf(stderr, "hostcheck: %d of %ld checks failed\n", failures, checks);
        return 1;
    }
    printf("hostcheck: all %ld checks passed\n", checks);
    return 0;
}
