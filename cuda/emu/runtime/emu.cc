// emu.cc: the cuda-emu runtime, compiled into every emulated kernel module
// (the build's generated translation unit includes it after the kernels).
//
// A launch runs its blocks one after the other on the calling OS thread. The
// threads of a block are fibers with their own stacks; the scheduler runs a
// warp's lanes until each blocks (at __syncthreads, a warp collective or
// its exit), then the next warp: warps advance separately between barriers,
// so a read that a missing __syncthreads leaves unordered sees stale data.
// Warp collectives (shuffles, ldmatrix, mma.sync) complete when every lane
// of the mask has arrived, and the last lane computes them for the warp from
// the PTX ISA's fragment layouts. cp.async copies land at issue (early) or
// only at the issuing thread's wait_group (late). Errors a GPU would report
// (a misaligned or non-shared cp.async, a dynamic shared size above the
// limit) and ones it would hang or corrupt on (a barrier deadlock, lanes
// diverging at a collective) end the launch with a CUDA error name.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <math.h>
#include <string>
#include <vector>
#include <unordered_map>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define KC_EMU_ASAN 1
#endif

#define KC_EMU_API extern "C" __attribute__((visibility("default")))

namespace kc_emu __attribute__((visibility("hidden"))) {

thread_local ThreadCoords* tcur;
thread_local uint3 block_idx;
thread_local dim3 block_dim, grid_dim;

// ---------------------------------------------------------------------------
// Context switching: x86-64 System V callee-saved registers, MXCSR and the
// x87 control word. A new fiber starts in kc_emu_fiber_entry with its
// function in r13 and argument in r12.
extern "C" void kc_emu_switch(void** save_sp, void* new_sp);
extern "C" void kc_emu_fiber_entry();
asm(R"(
.text
.p2align 4
.hidden kc_emu_switch
.globl kc_emu_switch
.type kc_emu_switch,@function
kc_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size kc_emu_switch,.-kc_emu_switch
.p2align 4
.hidden kc_emu_fiber_entry
.globl kc_emu_fiber_entry
.type kc_emu_fiber_entry,@function
kc_emu_fiber_entry:
    movq %r12, %rdi
    callq *%r13
    ud2
.size kc_emu_fiber_entry,.-kc_emu_fiber_entry
)");

enum FiberState { RUN, AT_BARRIER, AT_WARP, DONE };

struct Copy {
    uint8_t* dst;
    const uint8_t* src;
    int size, src_size;
};

enum CollectiveKind { C_SHFL = 1, C_LDMATRIX, C_MMA_BF16, C_MMA_FP4 };

struct Fiber {
    void* sp = nullptr;
    uint8_t* stack = nullptr;
    size_t stack_size = 0;
    ThreadCoords coords{};
    int index = 0, warp = 0, lane = 0;
    FiberState state = RUN;
    // The collective this lane waits at, its inputs and outputs.
    int op_kind = 0;
    const void* op_tag = nullptr;
    uint32_t op_mask = 0;
    uint64_t in[24];
    uint64_t out[8];
    // cp.async groups: committed (oldest first) and the open one.
    std::vector<std::vector<Copy>> groups;
    std::vector<Copy> open;
#ifdef KC_EMU_ASAN
    void* fake_stack = nullptr;
#endif
};

struct Warp {
    uint32_t arrived = 0;
    uint32_t live = 0;  // lanes that exist and have not exited
};

struct Launch {
    KernelCall call = nullptr;
    const uint64_t* args = nullptr;
    int nthreads = 0;
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    int at_barrier = 0, done = 0;
    int cur_warp = 0;
    bool late = true;       // cp.async lands at wait_group (else at issue)
    bool reverse = false;   // run warps from the last to the first
    size_t dyn_smem = 0;
    void* sched_sp = nullptr;
    Fiber* cur = nullptr;
    Fiber* blame = nullptr;  // the lane an error in a collective is about
    bool failed = false;
    std::string err_name, err_msg;
#ifdef KC_EMU_ASAN
    const void* sched_stack_bottom = nullptr;
    size_t sched_stack_size = 0;
#endif
};

static thread_local Launch* L;

static void switch_to_fiber(Fiber* f) {
    L->cur = f;
    tcur = &f->coords;
#ifdef KC_EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, f->stack_size);
#endif
    kc_emu_switch(&L->sched_sp, f->sp);
#ifdef KC_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    L->cur = nullptr;
}

// yield returns from the running fiber to the scheduler.
static void yield() {
    Fiber* f = L->cur;
#ifdef KC_EMU_ASAN
    __sanitizer_start_switch_fiber(f->state == DONE ? nullptr : &f->fake_stack, L->sched_stack_bottom,
                                   L->sched_stack_size);
#endif
    kc_emu_switch(&f->sp, L->sched_sp);
#ifdef KC_EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake_stack, nullptr, nullptr);
#endif
}

static std::string where() {
    char b[160];
    if (L && (L->blame || L->cur)) {
        const Fiber* f = L->blame ? L->blame : L->cur;
        snprintf(b, sizeof b, "block (%u,%u,%u) thread %d (warp %d lane %d)", block_idx.x, block_idx.y, block_idx.z,
                 f->index, f->warp, f->lane);
    } else {
        snprintf(b, sizeof b, "block (%u,%u,%u)", block_idx.x, block_idx.y, block_idx.z);
    }
    return b;
}

// fail ends the launch from inside a fiber with a CUDA error name.
void fail(const char* kind, const char* fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!L || !L->cur) {
        fprintf(stderr, "kc_emu: %s: %s (outside a launch)\n", kind, msg);
        abort();
    }
    if (!L->failed) {
        L->failed = true;
        L->err_name = kind;
        L->err_msg = std::string(msg) + " at " + where();
    }
    for (;;) yield();  // the scheduler never resumes a failed launch
}

// ---------------------------------------------------------------------------
// Barriers and collectives.

static void release_barrier() {
    for (auto& f : L->fibers)
        if (f.state == AT_BARRIER) f.state = RUN;
    L->at_barrier = 0;
}

void syncthreads() {
    Fiber* f = L->cur;
    f->state = AT_BARRIER;
    L->at_barrier++;
    if (L->at_barrier + L->done == L->nthreads) {
        release_barrier();
        return;
    }
    yield();
}

typedef void (*CollectiveFn)(Fiber* lanes[32], uint32_t mask, const void* tag);

// collective parks this lane at a warp-wide operation; the last lane of the
// mask to arrive runs fn for all of them.
static void collective(int kind, const void* tag, uint32_t mask, CollectiveFn fn) {
    Fiber* f = L->cur;
    Warp& w = L->warps[f->warp];
    if (!(mask >> f->lane & 1u)) fail("CUDA_ERROR_LAUNCH_FAILED", "warp collective with mask %08x does not include the calling lane %d", mask, f->lane);
    if ((mask & w.live) != mask)
        fail("CUDA_ERROR_LAUNCH_FAILED", "warp collective with mask %08x, but lanes %08x of the warp have exited or do not exist", mask, mask & ~w.live);
    f->op_kind = kind;
    f->op_tag = tag;
    f->op_mask = mask;
    f->state = AT_WARP;
    w.arrived |= 1u << f->lane;
    if ((w.arrived & mask) == mask) {
        Fiber* lanes[32] = {};
        Fiber* base = &L->fibers[(size_t)f->warp * 32];
        for (int l = 0; l < 32; ++l) {
            if (!(mask >> l & 1u)) continue;
            lanes[l] = base + l;
            if (lanes[l]->op_kind != kind || lanes[l]->op_tag != tag || lanes[l]->op_mask != mask)
                fail("CUDA_ERROR_LAUNCH_FAILED", "warp divergence: lane %d reached a different collective (kind %d) than lane %d (kind %d)", l,
                     lanes[l]->op_kind, f->lane, kind);
        }
        fn(lanes, mask, tag);
        for (int l = 0; l < 32; ++l) {
            if (!lanes[l]) continue;
            lanes[l]->state = RUN;
            lanes[l]->op_kind = 0;
        }
        w.arrived &= ~mask;
        return;
    }
    yield();
}

static void shfl_fn(Fiber* lanes[32], uint32_t mask, const void*) {
    for (int l = 0; l < 32; ++l) {
        if (!lanes[l]) continue;
        const int mode = (int)lanes[l]->in[2], width = (int)lanes[l]->in[3], arg = (int)lanes[l]->in[1];
        // CUDA C Programming Guide, warp shuffle functions.
        const int seg = l & ~(width - 1);
        int src = l;
        switch (mode) {
        case 0: src = seg + (arg & (width - 1)); break;
        case 1: src = l ^ arg; if (src >= seg + width) src = l; break;
        case 2: src = l - arg; if (src < seg) src = l; break;
        case 3: src = l + arg; if (src >= seg + width) src = l; break;
        }
        if (!(mask >> src & 1u)) fail("CUDA_ERROR_LAUNCH_FAILED", "shuffle reads lane %d outside its mask %08x", src, mask);
        lanes[l]->out[0] = lanes[src]->in[0];
    }
}

uint32_t shfl(uint32_t mask, uint32_t v, int arg, int width, int mode) {
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("CUDA_ERROR_LAUNCH_FAILED", "shuffle width %d is not a power of two in [1, 32]", width);
    Fiber* f = L->cur;
    f->in[0] = v;
    f->in[1] = (uint64_t)(int64_t)arg;
    f->in[2] = (uint64_t)mode;
    f->in[3] = (uint64_t)width;
    collective(C_SHFL, nullptr, mask, shfl_fn);
    return (uint32_t)f->out[0];
}

// ---------------------------------------------------------------------------
// Shared memory addresses. A shared-window address is the offset of a
// pointer from this OS thread's dynamic shared array; static __shared__
// variables are thread_local too, so they sit in the same TLS block and the
// offset fits in 32 bits.

static intptr_t smem_base() { return (intptr_t)&smem[0]; }

uint32_t shared_addr(const void* p) {
    const intptr_t off = (intptr_t)p - smem_base();
    if (off < INT32_MIN || off > INT32_MAX)
        fail("CUDA_ERROR_ILLEGAL_ADDRESS", "__cvta_generic_to_shared of %p, which is not shared memory", p);
    if (off >= 0 && off < (intptr_t)KC_EMU_MAX_DYN_SMEM && (size_t)off >= L->dyn_smem)
        fail("CUDA_ERROR_ILLEGAL_ADDRESS", "shared address %ld is past the launch's %zu bytes of dynamic shared memory", (long)off, L->dyn_smem);
    return (uint32_t)(int32_t)off;
}

static uint8_t* shared_ptr(uint32_t a, int size, const char* what) {
    const intptr_t off = (intptr_t)(int32_t)a;
    if (off >= 0 && off < (intptr_t)KC_EMU_MAX_DYN_SMEM && (size_t)(off + size) > L->dyn_smem)
        fail("CUDA_ERROR_ILLEGAL_ADDRESS", "%s at shared address %ld (+%d bytes) is past the launch's %zu bytes of dynamic shared memory", what, (long)off,
             size, L->dyn_smem);
    if ((a & (uint32_t)(size - 1)) != 0 && (size & (size - 1)) == 0)
        fail("CUDA_ERROR_MISALIGNED_ADDRESS", "%s at shared address %ld is not %d-byte aligned", what, (long)off, size);
    return (uint8_t*)(smem_base() + off);
}

// ---------------------------------------------------------------------------
// cp.async.

static void land(std::vector<Copy>& g) {
    for (const Copy& c : g) {
        if (c.src_size > 0) memcpy(c.dst, c.src, (size_t)c.src_size);
        if (c.src_size < c.size) memset(c.dst + c.src_size, 0, (size_t)(c.size - c.src_size));
    }
    g.clear();
}

static void cp_async(uint32_t dst, uint64_t src, int size, int src_size, bool cg) {
    if (cg && size != 16) fail("CUDA_ERROR_ILLEGAL_INSTRUCTION", "cp.async.cg with cp-size %d (only 16)", size);
    if (size != 4 && size != 8 && size != 16) fail("CUDA_ERROR_ILLEGAL_INSTRUCTION", "cp.async cp-size %d", size);
    if (src_size < 0 || src_size > size) fail("CUDA_ERROR_ILLEGAL_INSTRUCTION", "cp.async src-size %d with cp-size %d", src_size, size);
    uint8_t* d = shared_ptr(dst, size, "cp.async destination");
    if (src % (uint64_t)size != 0) fail("CUDA_ERROR_MISALIGNED_ADDRESS", "cp.async source %p is not %d-byte aligned", (void*)src, size);
    Copy c{d, (const uint8_t*)(uintptr_t)src, size, src_size};
    Fiber* f = L->cur;
    if (!L->late) {
        std::vector<Copy> one{c};
        land(one);
    }
    f->open.push_back(c);  // early: kept only for the group count (already landed)
}

static void cp_commit() {
    Fiber* f = L->cur;
    f->groups.push_back(std::move(f->open));
    f->open.clear();
}

static void cp_wait(int n) {
    Fiber* f = L->cur;
    while ((int)f->groups.size() > n) {
        if (L->late) land(f->groups.front());
        f->groups.erase(f->groups.begin());
    }
}

static void cp_drain(Fiber* f) {  // at thread exit every copy completes
    if (L->late) {
        for (auto& g : f->groups) land(g);
        land(f->open);
    }
    f->groups.clear();
    f->open.clear();
}

// ---------------------------------------------------------------------------
// Number formats of the PTX instructions.

static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float ftz(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }
static float bf16_to_f(uint32_t h) { return u2f((h & 0xffffu) << 16); }

// e2m1 magnitudes by code (PTX ISA, alternate floating point data formats).
static const double e2m1_mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
static double e2m1_value(uint32_t code) { return (code & 8u) ? -e2m1_mag[code & 7u] : e2m1_mag[code & 7u]; }

// e2m1 of x: nearest, ties to the even code, finite results saturating at
// 6 (.satfinite; a NaN becomes +6, the largest finite value).
static uint32_t e2m1_rn_satfinite(float x) {
    if (isnan(x)) return 7u;
    const uint32_t sign = signbit(x) ? 8u : 0u;
    const double a = fabs((double)x);
    uint32_t best = 0;
    for (uint32_t c = 1; c < 8; ++c) {
        const double dc = fabs(a - e2m1_mag[c]), db = fabs(a - e2m1_mag[best]);
        if (dc < db || (dc == db && (c & 1u) == 0)) best = c;
    }
    return sign | best;
}

// ue4m3 (the unsigned E4M3 of the block scales): bias 7, 0x7F is NaN.
static double ue4m3_value(uint32_t c) {
    c &= 0x7fu;
    if (c == 0x7fu) return NAN;
    const uint32_t e = c >> 3, m = c & 7u;
    return e == 0 ? ldexp((double)m, -9) : ldexp(1.0 + m / 8.0, (int)e - 7);
}

// ---------------------------------------------------------------------------
// Warp-level matrix instructions (PTX ISA 9.7.14, "matrix fragments").

static void ldmatrix_fn(Fiber* lanes[32], uint32_t, const void* tag) {
    const int num = (int)lanes[0]->in[1];
    const bool trans = lanes[0]->in[2] != 0;
    // Lanes 8j..8j+7 give the row addresses of matrix j.
    uint8_t* rows[32];
    for (int i = 0; i < 8 * num; ++i) {
        L->blame = lanes[i];  // errors name the lane whose address is bad
        rows[i] = shared_ptr((uint32_t)lanes[i]->in[0], 16, "ldmatrix row");
    }
    L->blame = nullptr;
    for (int l = 0; l < 32; ++l) {
        for (int j = 0; j < num; ++j) {
            uint16_t e[2];
            for (int h = 0; h < 2; ++h) {
                // Without .trans lane l holds row l/4, columns 2(l%4)+h of
                // each 8x8 matrix; with .trans the element of the transpose.
                const int r = trans ? 2 * (l % 4) + h : l / 4;
                const int c = trans ? l / 4 : 2 * (l % 4) + h;
                memcpy(&e[h], rows[8 * j + r] + 2 * c, 2);
            }
            lanes[l]->out[j] = (uint64_t)e[0] | (uint64_t)e[1] << 16;
        }
    }
    (void)tag;
}

// mma.m16n8k16 .row.col .f32.bf16.bf16.f32. Fragments (groupID g = lane/4,
// threadID_in_group t = lane%4): A reg i holds row g + 8(i&1), columns
// 2t + 8(i>>1) + {0,1}; B reg i holds rows (k) 2t + 8i + {0,1} of column g;
// C/D element i is row g + 8(i>>1), column 2t + (i&1). Each D element is the
// exact sum of its 16 products and C, rounded once to fp32.
static void mma_bf16_fn(Fiber* lanes[32], uint32_t, const void*) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const uint64_t* in = lanes[l]->in;
        for (int i = 0; i < 4; ++i) {
            const uint32_t r = (uint32_t)in[i];
            const int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
            A[row][col] = bf16_to_f(r);
            A[row][col + 1] = bf16_to_f(r >> 16);
        }
        for (int i = 0; i < 2; ++i) {
            const uint32_t r = (uint32_t)in[4 + i];
            B[2 * t + 8 * i][g] = bf16_to_f(r);
            B[2 * t + 8 * i + 1][g] = bf16_to_f(r >> 16);
        }
        for (int i = 0; i < 4; ++i) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = u2f((uint32_t)in[6 + i]);
    }
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; ++i) {
            const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
            double s = C[row][col];
            for (int k = 0; k < 16; ++k) s += (double)A[row][k] * (double)B[k][col];
            lanes[l]->out[i] = f2u((float)s);
        }
    }
}

// mma.m16n8k64 .row.col .kind::mxf4nvf4 .block_scale .scale_vec::4X
// .f32.e2m1.e2m1.f32.ue4m3. Fragments: A reg i holds row g + 8(i&1), k
// 8t + 32(i>>1) + 0..7 (element n in bits 4n..4n+3); B reg i holds k 8t +
// 32i + 0..7 of column g; C/D as m16n8k16. Scales (selectors 0): lanes with
// t in {0,1} give scale_A of row g + 8t, byte j the scale of k block j
// (16 k each); lanes with t = 0 give scale_B of column g. These are the
// layouts CUTLASS encodes as SFALayout ((2,2,8),64):((8,0,1),16) and
// SFBLayout ((4,8),64):((0,1),8) for SM120_16x8x64_TN_VS.
static void mma_fp4_fn(Fiber* lanes[32], uint32_t, const void*) {
    for (int l = 0; l < 32; ++l) {
        const uint64_t* in = lanes[l]->in;
        for (int s = 10; s < 14; ++s)
            if (in[s] != 0) {
                L->blame = lanes[l];
                fail("CUDA_ERROR_NOT_SUPPORTED", "mma block_scale byte-id/thread-id selector %llu: only 0 is emulated", (unsigned long long)in[s]);
            }
    }
    double A[16][64], B[64][8], C[16][8], SA[16][4], SB[8][4];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const uint64_t* in = lanes[l]->in;
        for (int i = 0; i < 4; ++i)
            for (int n = 0; n < 8; ++n) A[g + 8 * (i & 1)][8 * t + 32 * (i >> 1) + n] = e2m1_value((uint32_t)(in[i] >> (4 * n)) & 0xfu);
        for (int i = 0; i < 2; ++i)
            for (int n = 0; n < 8; ++n) B[8 * t + 32 * i + n][g] = e2m1_value((uint32_t)(in[4 + i] >> (4 * n)) & 0xfu);
        for (int i = 0; i < 4; ++i) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = u2f((uint32_t)in[6 + i]);
        if (t < 2)
            for (int j = 0; j < 4; ++j) SA[g + 8 * t][j] = ue4m3_value((uint32_t)(in[14] >> (8 * j)) & 0xffu);
        if (t == 0)
            for (int j = 0; j < 4; ++j) SB[g][j] = ue4m3_value((uint32_t)(in[15] >> (8 * j)) & 0xffu);
    }
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; ++i) {
            const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
            double s = C[row][col];
            for (int k = 0; k < 64; ++k) s += (A[row][k] * SA[row][k / 16]) * (B[k][col] * SB[col][k / 16]);
            lanes[l]->out[i] = f2u((float)s);
        }
    }
}

// ---------------------------------------------------------------------------
// Inline PTX: a template is parsed once into statements, then interpreted
// with this thread's operands.

struct Arg {
    enum { OPND, LOCAL, IMM, MEM, VEC } type;
    int n = 0;            // operand number, local index, or immediate
    std::vector<Arg> vec; // {a, b, ...}
};
struct Stmt {
    std::string op;
    std::vector<Arg> args;
};
struct Program {
    std::vector<Stmt> stmts;
    int nlocals = 0;
};

static std::string trim(const std::string& s) {
    size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

static std::vector<std::string> split_top(const std::string& s) {
    std::vector<std::string> out;
    int depth = 0;
    std::string cur;
    for (char c : s) {
        if (c == '{' || c == '[') depth++;
        if (c == '}' || c == ']') depth--;
        if (c == ',' && depth == 0) {
            out.push_back(trim(cur));
            cur.clear();
        } else {
            cur += c;
        }
    }
    if (!trim(cur).empty()) out.push_back(trim(cur));
    return out;
}

static bool parse_arg(const std::string& t, std::unordered_map<std::string, int>& locals, Arg& a) {
    if (t.empty()) return false;
    if (t[0] == '{') {
        a.type = Arg::VEC;
        for (const std::string& e : split_top(t.substr(1, t.size() - 2))) {
            Arg x;
            if (!parse_arg(e, locals, x)) return false;
            a.vec.push_back(x);
        }
        return true;
    }
    if (t[0] == '[') {
        Arg x;
        if (!parse_arg(trim(t.substr(1, t.size() - 2)), locals, x) || x.type != Arg::OPND) return false;
        a.type = Arg::MEM;
        a.n = x.n;
        return true;
    }
    if (t[0] == '%') {
        a.type = Arg::OPND;
        a.n = atoi(t.c_str() + 1);
        return true;
    }
    if (isdigit((unsigned char)t[0]) || t[0] == '-') {
        a.type = Arg::IMM;
        a.n = atoi(t.c_str());
        return true;
    }
    auto it = locals.find(t);
    if (it == locals.end()) return false;
    a.type = Arg::LOCAL;
    a.n = it->second;
    return true;
}

static Program* parse(const char* tmpl, const char* file, int line) {
    Program* p = new Program;
    std::unordered_map<std::string, int> locals;
    std::string text;
    for (const char* c = tmpl; *c; ++c) text += (*c == '{' && (c == tmpl || c[-1] == '\n' || c[1] == '\n')) ? ' ' : *c;
    // The outer scope braces of a multi-statement template are blanks now;
    // a closing one stands alone on its line.
    size_t pos = 0;
    while (pos < text.size()) {
        size_t semi = text.find(';', pos);
        std::string st = trim(text.substr(pos, semi == std::string::npos ? std::string::npos : semi - pos));
        pos = semi == std::string::npos ? text.size() : semi + 1;
        if (st == "}" || st.empty()) continue;
        if (st[0] == '}') st = trim(st.substr(1));
        if (st.empty()) continue;
        if (st.rfind(".reg", 0) == 0) {
            size_t sp = st.find(' ', 5);
            for (const std::string& name : split_top(st.substr(sp + 1))) locals[name] = p->nlocals++;
            continue;
        }
        Stmt s;
        size_t ws = st.find_first_of(" \t\n");
        s.op = st.substr(0, ws);
        if (ws != std::string::npos)
            for (const std::string& a : split_top(st.substr(ws + 1))) {
                Arg x;
                if (!parse_arg(a, locals, x)) fail("CUDA_ERROR_NOT_SUPPORTED", "PTX operand '%s' of '%s' (%s:%d) is not emulated", a.c_str(), s.op.c_str(), file, line);
                s.args.push_back(x);
            }
        p->stmts.push_back(s);
    }
    return p;
}

static std::unordered_map<const char*, Program*>& programs() {
    static std::unordered_map<const char*, Program*> m;
    return m;
}

struct Exec {
    const PtxOperand* ops;
    int nops;
    uint64_t locals[16];
    const char* file;
    int line;
};

static uint64_t rd(Exec& x, const Arg& a) {
    switch (a.type) {
    case Arg::OPND:
        if (a.n >= x.nops) fail("CUDA_ERROR_NOT_SUPPORTED", "PTX operand %%%d of %d (%s:%d)", a.n, x.nops, x.file, x.line);
        return x.ops[a.n].value;
    case Arg::LOCAL: return x.locals[a.n];
    case Arg::IMM: return (uint64_t)(int64_t)a.n;
    default: fail("CUDA_ERROR_NOT_SUPPORTED", "PTX operand kind (%s:%d)", x.file, x.line);
    }
}

static void wr(Exec& x, const Arg& a, uint64_t v) {
    if (a.type == Arg::LOCAL) {
        x.locals[a.n] = v;
        return;
    }
    if (a.type != Arg::OPND || a.n >= x.nops || !x.ops[a.n].out)
        fail("CUDA_ERROR_NOT_SUPPORTED", "PTX destination is not an output operand (%s:%d)", x.file, x.line);
    PtxOperand& o = const_cast<PtxOperand&>(x.ops[a.n]);
    memcpy(o.ptr, &v, (size_t)o.size);
    o.value = v;
}

static bool has_qual(const std::string& op, const char* q) { return op.find(q) != std::string::npos; }

static void exec_stmt(Exec& x, const Stmt& s, const void* tag) {
    const std::string& op = s.op;
    Fiber* f = L->cur;
    auto need = [&](size_t n) {
        if (s.args.size() != n) fail("CUDA_ERROR_NOT_SUPPORTED", "PTX '%s' with %zu operands (%s:%d)", op.c_str(), s.args.size(), x.file, x.line);
    };
    if (op == "rcp.approx.ftz.f32") {
        // The nearest float to 1/a (the hardware's approximation differs by
        // up to 1 ulp), with subnormal inputs and results flushed to zero.
        need(2);
        wr(x, s.args[0], f2u(ftz(1.0f / ftz(u2f((uint32_t)rd(x, s.args[1]))))));
    } else if (op == "ex2.approx.ftz.f32") {
        need(2);
        const float a = ftz(u2f((uint32_t)rd(x, s.args[1])));
        wr(x, s.args[0], f2u(ftz((float)exp2((double)a))));
    } else if (op == "cvt.rn.satfinite.e2m1x2.f32") {
        // d = {cvt(a) in the high nibble, cvt(b) in the low one}.
        need(3);
        const uint32_t hi = e2m1_rn_satfinite(u2f((uint32_t)rd(x, s.args[1])));
        const uint32_t lo = e2m1_rn_satfinite(u2f((uint32_t)rd(x, s.args[2])));
        wr(x, s.args[0], hi << 4 | lo);
    } else if (op == "mov.b32") {
        need(2);
        if (s.args[1].type == Arg::VEC) {
            if (s.args[1].vec.size() != 4) fail("CUDA_ERROR_NOT_SUPPORTED", "mov.b32 of a %zu-vector (%s:%d)", s.args[1].vec.size(), x.file, x.line);
            uint32_t v = 0;
            for (int i = 0; i < 4; ++i) v |= ((uint32_t)rd(x, s.args[1].vec[i]) & 0xffu) << (8 * i);
            wr(x, s.args[0], v);
        } else {
            wr(x, s.args[0], (uint32_t)rd(x, s.args[1]));
        }
    } else if (op == "cp.async.cg.shared.global" || op == "cp.async.ca.shared.global") {
        if (s.args.size() != 3 && s.args.size() != 4) need(4);
        if (s.args[0].type != Arg::MEM || s.args[1].type != Arg::MEM) fail("CUDA_ERROR_NOT_SUPPORTED", "cp.async operands (%s:%d)", x.file, x.line);
        const int size = (int)rd(x, s.args[2]);
        const int src_size = s.args.size() == 4 ? (int)rd(x, s.args[3]) : size;
        cp_async((uint32_t)x.ops[s.args[0].n].value, x.ops[s.args[1].n].value, size, src_size, op == "cp.async.cg.shared.global");
    } else if (op == "cp.async.commit_group") {
        cp_commit();
    } else if (op == "cp.async.wait_group") {
        need(1);
        cp_wait((int)rd(x, s.args[0]));
    } else if (op == "cp.async.wait_all") {
        cp_commit();
        cp_wait(0);
    } else if (op.rfind("ldmatrix.sync.aligned.m8n8.", 0) == 0 && has_qual(op, ".shared.b16")) {
        need(2);
        const int num = has_qual(op, ".x4") ? 4 : has_qual(op, ".x2") ? 2 : 1;
        if (s.args[0].type != Arg::VEC || (int)s.args[0].vec.size() != num || s.args[1].type != Arg::MEM)
            fail("CUDA_ERROR_NOT_SUPPORTED", "ldmatrix operands (%s:%d)", x.file, x.line);
        f->in[0] = x.ops[s.args[1].n].value;
        f->in[1] = (uint64_t)num;
        f->in[2] = has_qual(op, ".trans") ? 1 : 0;
        collective(C_LDMATRIX, tag, 0xffffffffu, ldmatrix_fn);
        for (int j = 0; j < num; ++j) wr(x, s.args[0].vec[j], f->out[j]);
    } else if (op == "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") {
        need(4);
        const Arg &d = s.args[0], &a = s.args[1], &b = s.args[2], &c = s.args[3];
        if (d.vec.size() != 4 || a.vec.size() != 4 || b.vec.size() != 2 || c.vec.size() != 4)
            fail("CUDA_ERROR_NOT_SUPPORTED", "mma m16n8k16 operands (%s:%d)", x.file, x.line);
        for (int i = 0; i < 4; ++i) f->in[i] = rd(x, a.vec[i]);
        for (int i = 0; i < 2; ++i) f->in[4 + i] = rd(x, b.vec[i]);
        for (int i = 0; i < 4; ++i) f->in[6 + i] = rd(x, c.vec[i]);
        collective(C_MMA_BF16, tag, 0xffffffffu, mma_bf16_fn);
        for (int i = 0; i < 4; ++i) wr(x, d.vec[i], f->out[i]);
    } else if (op == "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3") {
        // d, a, b, c, scale-a, {byte-id-a, thread-id-a}, scale-b, {byte-id-b, thread-id-b}
        need(8);
        const Arg &d = s.args[0], &a = s.args[1], &b = s.args[2], &c = s.args[3];
        if (d.vec.size() != 4 || a.vec.size() != 4 || b.vec.size() != 2 || c.vec.size() != 4 || s.args[5].vec.size() != 2 ||
            s.args[7].vec.size() != 2)
            fail("CUDA_ERROR_NOT_SUPPORTED", "mma m16n8k64 block_scale operands (%s:%d)", x.file, x.line);
        for (int i = 0; i < 4; ++i) f->in[i] = rd(x, a.vec[i]);
        for (int i = 0; i < 2; ++i) f->in[4 + i] = rd(x, b.vec[i]);
        for (int i = 0; i < 4; ++i) f->in[6 + i] = rd(x, c.vec[i]);
        f->in[10] = rd(x, s.args[5].vec[0]) & 0xffffu;
        f->in[11] = rd(x, s.args[5].vec[1]) & 0xffffu;
        f->in[12] = rd(x, s.args[7].vec[0]) & 0xffffu;
        f->in[13] = rd(x, s.args[7].vec[1]) & 0xffffu;
        f->in[14] = rd(x, s.args[4]) & 0xffffffffu;
        f->in[15] = rd(x, s.args[6]) & 0xffffffffu;
        collective(C_MMA_FP4, tag, 0xffffffffu, mma_fp4_fn);
        for (int i = 0; i < 4; ++i) wr(x, d.vec[i], f->out[i]);
    } else if (op == "trap") {
        fail("CUDA_ERROR_ILLEGAL_INSTRUCTION", "trap (%s:%d)", x.file, x.line);
    } else {
        fail("CUDA_ERROR_NOT_SUPPORTED", "PTX instruction '%s' is not emulated (%s:%d)", op.c_str(), x.file, x.line);
    }
}

void ptx(const char* tmpl, const char* file, int line, std::initializer_list<PtxOperand> ops) {
    auto& m = programs();
    auto it = m.find(tmpl);
    Program* p = it != m.end() ? it->second : (m[tmpl] = parse(tmpl, file, line));
    Exec x;
    x.ops = ops.begin();
    x.nops = (int)ops.size();
    x.file = file;
    x.line = line;
    memset(x.locals, 0, sizeof x.locals);
    if (p->nlocals > 16) fail("CUDA_ERROR_NOT_SUPPORTED", "more than 16 PTX registers (%s:%d)", file, line);
    for (const Stmt& s : p->stmts) exec_stmt(x, s, &s);
}

// ---------------------------------------------------------------------------
// Fibers and the launch.

static void fiber_main(void* arg) {
    Fiber* f = (Fiber*)arg;
#ifdef KC_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &L->sched_stack_bottom, &L->sched_stack_size);
#endif
    L->call(L->args);
    cp_drain(f);
    f->state = DONE;
    L->done++;
    L->warps[f->warp].live &= ~(1u << f->lane);
    if (L->at_barrier > 0 && L->at_barrier + L->done == L->nthreads) release_barrier();
    for (;;) yield();
}

static const size_t kStack = 256 << 10;

static void init_fiber(Fiber& f) {
    // Initial frame for kc_emu_switch: mxcsr/fpucw, r15, r14, r13 (fn),
    // r12 (arg), rbx, rbp, return address (kc_emu_fiber_entry).
    uintptr_t top = ((uintptr_t)f.stack + f.stack_size) & ~(uintptr_t)15;
    uint64_t* sp = (uint64_t*)top - 8;
    uint32_t csr[2];
    asm volatile("stmxcsr %0" : "=m"(csr[0]));
    asm volatile("fnstcw %0" : "=m"(*(uint16_t*)&csr[1]));
    memcpy(&sp[0], csr, 8);
    sp[1] = 0;                          // r15
    sp[2] = 0;                          // r14
    sp[3] = (uint64_t)(uintptr_t)&fiber_main;  // r13
    sp[4] = (uint64_t)(uintptr_t)&f;    // r12
    sp[5] = 0;                          // rbx
    sp[6] = 0;                          // rbp
    sp[7] = (uint64_t)(uintptr_t)&kc_emu_fiber_entry;
    f.sp = sp;
    f.state = RUN;
    f.op_kind = 0;
    f.groups.clear();
    f.open.clear();
}

static Fiber* pick() {
    const int nw = (int)L->warps.size();
    for (int k = 0; k < nw; ++k) {
        const int w = L->reverse ? (L->cur_warp - k + nw) % nw : (L->cur_warp + k) % nw;
        const int lo = w * 32, hi = std::min(lo + 32, L->nthreads);
        for (int i = lo; i < hi; ++i)
            if (L->fibers[i].state == RUN) {
                L->cur_warp = w;
                return &L->fibers[i];
            }
    }
    return nullptr;
}

static bool run_block() {
    for (auto& f : L->fibers) init_fiber(f);
    L->at_barrier = L->done = 0;
    L->cur_warp = L->reverse ? (int)L->warps.size() - 1 : 0;
    for (size_t w = 0; w < L->warps.size(); ++w) {
        const int n = std::min(32, L->nthreads - (int)w * 32);
        L->warps[w].live = n == 32 ? 0xffffffffu : ((1u << n) - 1u);
        L->warps[w].arrived = 0;
    }
    while (L->done < L->nthreads) {
        Fiber* f = pick();
        if (!f) {
            int bar = 0, warp = 0;
            for (auto& x : L->fibers) bar += x.state == AT_BARRIER, warp += x.state == AT_WARP;
            L->failed = true;
            L->err_name = "CUDA_ERROR_LAUNCH_FAILED";
            char b[256];
            snprintf(b, sizeof b, "deadlock: %d threads wait at __syncthreads and %d at a warp collective while %d have exited", bar, warp, L->done);
            L->err_msg = std::string(b) + " in " + where();
            return false;
        }
        switch_to_fiber(f);
        if (L->failed) return false;
    }
    return true;
}

}  // namespace kc_emu

using namespace kc_emu;

// The module's C interface (dlsym'd by the Go emulated device).
extern const KernelEntry kc_emu_kernels[];
extern const int kc_emu_num_kernels;

KC_EMU_API int kc_emu_abi() { return 1; }
KC_EMU_API int kc_emu_arch() { return __CUDA_ARCH__; }
KC_EMU_API int kc_emu_kernel_count() { return kc_emu_num_kernels; }
KC_EMU_API const char* kc_emu_kernel_name(int i) { return kc_emu_kernels[i].name; }
KC_EMU_API int kc_emu_kernel_arity(int i) { return kc_emu_kernels[i].arity; }
KC_EMU_API int kc_emu_max_dyn_smem() { return KC_EMU_MAX_DYN_SMEM; }

struct KcEmuConfig {
    int late;     // cp.async lands at wait_group
    int reverse;  // warps run last to first
    int smem_limit;
    int poison;   // fill shared memory with 0xFF before each block
};

// kc_emu_launch runs kernel name over grid x block with dyn_smem bytes of
// dynamic shared memory. It returns 0, or 1 with "CUDA_ERROR_NAME: detail" in err.
KC_EMU_API int kc_emu_launch(const char* name, const int* grid, const int* block, int dyn_smem, const uint64_t* args,
                             int nargs, const KcEmuConfig* cfg, char* err, int errlen) {
    auto bad = [&](const char* kind, const std::string& msg) {
        snprintf(err, (size_t)errlen, "%s: %s", kind, msg.c_str());
        return 1;
    };
    const KernelEntry* k = nullptr;
    for (int i = 0; i < kc_emu_num_kernels; ++i)
        if (strcmp(kc_emu_kernels[i].name, name) == 0) k = &kc_emu_kernels[i];
    if (!k) return bad("CUDA_ERROR_NOT_FOUND", std::string("no kernel ") + name + " in this module");
    if (nargs != k->arity)
        return bad("CUDA_ERROR_INVALID_VALUE", std::string(name) + " takes " + std::to_string(k->arity) + " parameters, the launch passed " + std::to_string(nargs));
    const long nthreads = (long)block[0] * block[1] * block[2];
    if (nthreads < 1 || nthreads > 1024 || block[2] > 64 || grid[0] < 1 || grid[1] < 1 || grid[2] < 1 || grid[1] > 65535 || grid[2] > 65535)
        return bad("CUDA_ERROR_INVALID_VALUE", "launch dimensions out of range");
    if (dyn_smem < 0 || dyn_smem > cfg->smem_limit || dyn_smem > KC_EMU_MAX_DYN_SMEM)
        return bad("CUDA_ERROR_INVALID_VALUE", std::to_string(dyn_smem) + " bytes of dynamic shared memory, the device allows " + std::to_string(cfg->smem_limit));

    Launch launch;
    L = &launch;
    launch.call = k->call;
    launch.args = args;
    launch.nthreads = (int)nthreads;
    launch.late = cfg->late != 0;
    launch.reverse = cfg->reverse != 0;
    launch.dyn_smem = (size_t)dyn_smem;
    launch.fibers.resize((size_t)nthreads);
    launch.warps.resize((size_t)((nthreads + 31) / 32));
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t per = kStack + page;  // a guard page below each stack
    uint8_t* stacks = (uint8_t*)mmap(nullptr, per * (size_t)nthreads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) return bad("CUDA_ERROR_OUT_OF_MEMORY", "fiber stacks");
    for (long i = 0; i < nthreads; ++i) {
        Fiber& f = launch.fibers[(size_t)i];
        mprotect(stacks + per * (size_t)i, page, PROT_NONE);
        f.stack = stacks + per * (size_t)i + page;
        f.stack_size = kStack;
        f.index = (int)i;
        f.warp = (int)(i / 32);
        f.lane = (int)(i % 32);
        f.coords.tid = uint3{(unsigned)(i % block[0]), (unsigned)(i / block[0] % block[1]), (unsigned)(i / ((long)block[0] * block[1]))};
    }
    block_dim = dim3{(unsigned)block[0], (unsigned)block[1], (unsigned)block[2]};
    grid_dim = dim3{(unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2]};
#ifdef KC_EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(smem, KC_EMU_MAX_DYN_SMEM);
    ASAN_POISON_MEMORY_REGION(smem + dyn_smem, KC_EMU_MAX_DYN_SMEM - dyn_smem);
#endif
    bool ok = true;
    for (int z = 0; z < grid[2] && ok; ++z)
        for (int y = 0; y < grid[1] && ok; ++y)
            for (int x = 0; x < grid[0] && ok; ++x) {
                block_idx = uint3{(unsigned)x, (unsigned)y, (unsigned)z};
                if (cfg->poison) memset(smem, 0xff, (size_t)dyn_smem);
                ok = run_block();
            }
#ifdef KC_EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(smem, KC_EMU_MAX_DYN_SMEM);
#endif
    munmap(stacks, per * (size_t)nthreads);
    L = nullptr;
    tcur = nullptr;
    if (!ok) return bad(launch.err_name.c_str(), launch.err_msg);
    return 0;
}
