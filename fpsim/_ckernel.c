/* The rounding kernel of fpsim/rounding.py, one element at a time in C (a single pass over memory).
 *
 * It is the same algorithm, step for step, as the NumPy reference `_kernel` in rounding.py, which
 * stays as the fallback and as the reference this kernel is tested against. Driven by the plan's
 * numbers; the common formats (bf16, fp16, fp8 e4m3/e5m2 in a float32 carrier, RNE/RTZ/SR, either
 * overflow policy) also have copies of the same code with the plan's numbers as compile-time constants
 * (`SPECS` below), chosen only when every number of the plan equals the copy's; RNE/RTZ of those into
 * large outputs also have a non-temporal-store loop (`spec_nt`).
 *
 * One call may share the array among threads (static partition given by the caller: bits never depend
 * on the thread count; a pool of worker threads kept between calls) with the GIL released; SR's random
 * words come from a buffer, from NumPy bit generators (`bitgen_t` capsules) or from PCG64 stepped here
 * from its state, always in element order: the words `rounding._random_words` would give.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "_csink.h"
#ifndef _WIN32
#include <pthread.h>
#define HAVE_THREADS 1
#include "_cpool.h" /* the worker threads kept between calls (shared with _cgemm.c) */
#else
#define HAVE_THREADS 0
#endif

enum { RNE = 0, RNA, RTZ, RUP, RDN, RTO, SR };

/* GCC turns a constant 1 in (1 << d) - 1 into an idiom it cannot vectorize for 64-bit lanes;
 * reading the 1 from a volatile keeps the plain shift (and the float64 loop vectorized). */
static volatile int opaque_one = 1;

/* Blocks small enough for L1 (SR's random words for one block are drawn into a buffer of this size). */
#define BLK 2048
#define MAX_JOBS 64 /* threads of one call */
#if MAX_JOBS > FPSIM_SINK_JOBS
#error "a sink keeps FPSIM_SINK_JOBS accumulators: one per job"
#endif

/* numpy/random/bitgen.h (NumPy's documented C API for bit generators, capsule name "BitGenerator") */
typedef struct {
    void *state;
    uint64_t (*next_uint64)(void *st);
    uint32_t (*next_uint32)(void *st);
    double (*next_double)(void *st);
    uint64_t (*next_raw)(void *st);
} bitgen_t;

typedef struct {
    int M, B, W;            /* carrier: mantissa bits, bias, width */
    int d0;                 /* bits dropped for normal results */
    int need_tiny;          /* target min normal above the carrier's: fixed subnormal grid below it */
    int qexp;               /* exponent of the target's subnormal quantum, emin - mbits */
    int mode, saturate, ftz, has_inf, has_nan, signed_zero, is_signed, has_zero;
    int sr_bits;            /* 0: exact stochastic rounding */
    uint64_t tiny_bits, max_bits, minsub_bits, inf_bits, nan_bits, hq_bits;
    double q;               /* the subnormal quantum as a double */
} plan_t;

/* x86-64-v4 (AVX-512 F/BW/DQ/VL) about halves the compute of the subnormal and SR paths where the CPU has
 * it; GCC >= 11 knows the name. Integer and float32 additions only: the same bits in every clone. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && __GNUC__ >= 11
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#elif defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* Pass 1, branch-free so that it vectorizes: every element by the bit trick, with the number of dropped
 * bits d growing by one per binade below the target's min normal (clamped to M); deep underflow,
 * overflow, inf and NaN are blended in with masks. Its arguments are the plan's numbers: the generic
 * copies pass them from the plan, the specialised ones as constants (folded by the compiler). */
#define DEFINE_CORE(NAME, UT)                                                                     \
static inline __attribute__((always_inline)) void NAME##_core(                                    \
    const UT *in, UT *out, Py_ssize_t n, const UT *rand, const int MODE, const int WW, const int M,  \
    const int d0, const int tinyE, const int srb, const UT hi, const UT maxb, const UT zs,         \
    const UT hqb, const UT qb, const UT nanb, const UT infr, const UT nsat)                        \
{                                                                                                 \
    const UT SIGN = (UT)1 << (WW - 1);                                                            \
    const UT one = (UT)opaque_one;                                                                \
    /* SR below the subnormals: bits of probability resolution, as in the reference kernel */     \
    const UT bits = (UT)(srb ? srb : (WW < 53 ? WW : 53)), rshift = (UT)WW - bits;                \
    const UT top = bits == (UT)WW ? (UT)0 : ((UT)1 << bits), mmask = ((UT)1 << M) - 1;           \
    for (Py_ssize_t i = 0; i < n; i++) {                                                          \
        /* written with masks instead of ternaries so that the 64-bit loop if-converts too */       \
        UT b = in[i], s = b & SIGN, u = b ^ s, r;                                                 \
        UT sm = (UT)0 - (UT)(s != 0);                    /* all ones for negative inputs */       \
        UT ef = u >> M, eff = ef + (UT)(ef == 0);                                                 \
        UT gt = (UT)0 - (UT)((UT)tinyE > eff);                /* never when tinyE is 1 */        \
        UT d = tinyE > 1 ? (UT)d0 + (((UT)tinyE - eff) & gt) : (UT)d0;                            \
        UT over = (UT)0 - (UT)(d > (UT)M);                                                        \
        UT deep = over & ((UT)0 - (UT)(u != 0));                                                  \
        const UT draw = d;                                                                        \
        d = (d & ~over) | ((UT)M & over);                                                         \
        UT mask = (one << d) - one, keep = ~mask;                                                 \
        UT atm = (UT)0 - (UT)(d == (UT)M);                                                        \
        UT lsb = (((u >> d) & one) & ~atm) | ((UT)(ef != 0) & atm);                               \
        switch (MODE) {                                                                           \
        case RNE: r = (u + (mask >> 1) + lsb) & keep; break;                                      \
        case RNA: r = (u + (mask >> 1) + one) & keep; break;                                      \
        case RTZ: r = u & keep; break;                                                            \
        case RUP: r = (u + (mask & ~sm)) & keep; break;                                           \
        case RDN: r = (u + (mask & sm)) & keep; break;                                            \
        case RTO: r = (u & keep) | (((UT)((u & mask) != 0) & (lsb ^ one)) << d); break;           \
        default: {                                                                                \
            UT big = (UT)0 - ((UT)(srb != 0) & (UT)(d > (UT)srb));                                \
            UT k = (d - (UT)srb) & big;                                                           \
            UT rk = (rand[i] >> (WW - d + k)) << k;                                               \
            r = (((u >> k) << k) + rk) & keep;                                                    \
        }                                                                                         \
        }                                                                                         \
        /* below half the smallest subnormal: 0 or q, decided by one comparison (not for SR) */   \
        if (MODE != SR) {                                                                         \
            UT upd;                                                                               \
            switch (MODE) {                                                                       \
            case RNE: upd = (UT)0 - (UT)(u > hqb); break;                                         \
            case RNA: upd = (UT)0 - (UT)(u >= hqb); break;                                        \
            case RTZ: upd = 0; break;                                                             \
            case RUP: upd = ~sm; break;                                                           \
            case RDN: upd = sm; break;                                                            \
            default: upd = ~(UT)0;                                                                \
            }                                                                                     \
            r = (r & ~deep) | (qb & upd & deep);                                                  \
        }                                                                                         \
        if (MODE == SR) {                                                                         \
            /* below half the smallest subnormal: up with probability x/q, from the exact */        \
            /* significand (the same sums as the reference kernel: floor(x/q * 2^bits) + bits */     \
            /* random bits >= 2^bits)                                                         */     \
            UT m = (u & mmask) | ((UT)(ef != 0) << M);                                            \
            UT rs = (UT)0 - (UT)(draw >= bits);                  /* shift right?          */      \
            UT shr = (draw - bits) & rs, shl = (bits - draw) & ~rs;                               \
            UT gone = (UT)0 - (UT)(shr > (UT)M);                 /* shifted out entirely  */      \
            shr = (shr & ~gone) | ((UT)M & gone);                                                 \
            UT frac = ((m >> shr) & rs & ~gone) | ((m << shl) & ~rs);                             \
            UT rr = rand[i] >> rshift;                                                            \
            UT lim = top - frac;                                                                  \
            UT upd = (UT)0 - ((UT)(frac != 0) & (UT)(rr >= lim));                                 \
            r = (r & ~deep) | (qb & upd & deep);                                                  \
        }                                                                                         \
        /* overflow and infinite inputs (r > max), NaN inputs (u > inf) */                        \
        UT ovf = (UT)0 - (UT)(r > maxb);                                                          \
        UT toinf;                                                                                 \
        switch (MODE) {                                                                           \
        case RTZ: case RTO: toinf = 0; break;                                                     \
        case RUP: toinf = ~sm; break;                                                             \
        case RDN: toinf = sm; break;                                                              \
        default: toinf = ~(UT)0;                                                                  \
        }                                                                                         \
        toinf = (toinf | ((UT)0 - (UT)(u == hi))) & nsat;                                         \
        r = (r & ~ovf) | (ovf & ((infr & toinf) | (maxb & ~toinf)));                              \
        UT isnan = (UT)0 - (UT)(u > hi);                                                          \
        r = (r & ~isnan) | (nanb & isnan);                                                        \
        UT keep_s = (((UT)0 - (UT)(r != 0)) | zs) & ((UT)0 - (UT)(r <= hi));                      \
        out[i] = r | (s & keep_s);                                                                \
    }                                                                                             \
}

/* The core's arguments derived from a plan (the specialised copies are chosen by comparing these). */
typedef struct {
    int mode, W, M, d0, tinyE, srb;
    uint64_t hi, maxb, zs, hqb, qb, nanb, infr, nsat;
} core_args_t;

static void core_args(const plan_t *p, core_args_t *a)
{
    uint64_t ones = p->W == 32 ? 0xffffffffULL : ~0ULL;
    a->mode = p->mode; a->W = p->W; a->M = p->M; a->d0 = p->d0;
    a->tinyE = p->need_tiny ? p->qexp + p->M - p->d0 + p->B : 1; /* carrier field of min normal */
    a->srb = p->sr_bits;
    a->hi = p->inf_bits; a->maxb = p->max_bits; a->zs = p->signed_zero ? ones : 0;
    a->hqb = p->hq_bits; a->qb = p->minsub_bits; a->nanb = p->nan_bits;
    a->infr = p->has_inf ? p->inf_bits : p->has_nan ? p->nan_bits : p->max_bits;
    a->nsat = p->saturate ? 0 : ones;
}

#define DEFINE_PASS1(NAME, UT, MODE_)                                                             \
CLONES __attribute__((noinline)) static void NAME##_pass1_##MODE_(                                \
    const UT *in, UT *out, Py_ssize_t n, const core_args_t *a, const UT *rand)                   \
{                                                                                                 \
    NAME##_core(in, out, n, rand, MODE_, a->W, a->M, a->d0, a->tinyE, a->srb, (UT)a->hi,         \
                (UT)a->maxb, (UT)a->zs, (UT)a->hqb, (UT)a->qb, (UT)a->nanb, (UT)a->infr,         \
                (UT)a->nsat);                                                                     \
}

/* The general per-element path for what pass 1 does not cover (unsigned formats, flush to zero,
 * formats at least as wide as the carrier): the reference kernel's steps one by one. */
#define DEFINE_SLOW(NAME, UT, FT)                                                                 \
static inline __attribute__((always_inline)) void NAME##_slow_body(                               \
    const UT *in, UT *out, Py_ssize_t n, const plan_t *p, const UT *rand, const int MODE)        \
{                                                                                                 \
    const UT SIGN = (UT)1 << (p->W - 1);                                                          \
    const int M = p->M;                                                                           \
    const UT one = (UT)opaque_one;                                                                \
    for (Py_ssize_t i = 0; i < n; i++) {                                                          \
        UT b = in[i], s = b & SIGN, u = b ^ s, r;                                                 \
        int neg = s != 0;                                                                         \
        int d = p->d0;                                                                            \
        if (p->need_tiny && u < (UT)p->tiny_bits && u != 0) {                                     \
            int ef = (int)(u >> M);                                                               \
            int eff = ef ? ef : 1;                                                                \
            d = p->qexp - (eff - p->B - M);                                                       \
        }                                                                                         \
        if (u > (UT)p->inf_bits) {                                                                \
            r = u; /* NaN: fixed below */                                                         \
        } else if (d <= 0) {                                                                      \
            r = u;                                                                                \
        } else if (d > M) {                                                                       \
            /* |x| below the smallest subnormal q: the result is 0 or q */                        \
            int up;                                                                               \
            switch (MODE) {                                                                       \
            case RNE: up = u > (UT)p->hq_bits; break;                                             \
            case RNA: up = u >= (UT)p->hq_bits; break;                                            \
            case RTZ: up = 0; break;                                                              \
            case RUP: up = !neg; break;                                                           \
            case RDN: up = neg; break;                                                            \
            case RTO: up = 1; break;                                                              \
            default: {                                                                            \
                int bits = p->sr_bits ? p->sr_bits : (p->W < 53 ? p->W : 53);                     \
                FT fx; memcpy(&fx, &u, sizeof fx);                                                \
                double frac = floor(ldexp((double)fx / p->q, bits));                              \
                double rr = (double)(rand[i] >> (p->W - bits));                                   \
                up = frac + rr >= ldexp(1.0, bits);                                               \
            }                                                                                     \
            }                                                                                     \
            r = up ? (UT)p->minsub_bits : 0;                                                      \
        } else {                                                                                  \
            UT mask = (one << d) - one, keep = ~mask;                                             \
            UT lsb = d < M ? (u >> d) & one : ((u >> d) ? one : 0);                               \
            switch (MODE) {                                                                       \
            case RNE: r = (u + ((one << (d - 1)) - one) + lsb) & keep; break;                     \
            case RNA: r = (u + (one << (d - 1))) & keep; break;                                   \
            case RTZ: r = u & keep; break;                                                        \
            case RUP: r = (u + (neg ? 0 : mask)) & keep; break;                                   \
            case RDN: r = (u + (neg ? mask : 0)) & keep; break;                                   \
            case RTO: r = (u & keep) | ((((u & mask) != 0) & (lsb ^ one)) << d); break;           \
            default: {                                                                            \
                int k = (p->sr_bits && d > p->sr_bits) ? d - p->sr_bits : 0;                      \
                UT ut = (u >> k) << k;                                                            \
                r = (ut + ((rand[i] >> (p->W - d + k)) << k)) & keep;                             \
            }                                                                                     \
            }                                                                                     \
        }                                                                                         \
        if (r > (UT)p->max_bits) {                                                                \
            if (u > (UT)p->inf_bits) {                                                            \
                r = (UT)p->nan_bits;                                                              \
            } else {                                                                              \
                int to_inf;                                                                       \
                if (p->saturate) to_inf = 0;                                                      \
                else {                                                                            \
                    switch (MODE) {                                                               \
                    case RTZ: case RTO: to_inf = 0; break;                                        \
                    case RUP: to_inf = !neg; break;                                               \
                    case RDN: to_inf = neg; break;                                                \
                    default: to_inf = 1;                                                          \
                    }                                                                             \
                    if (u == (UT)p->inf_bits) to_inf = 1;                                         \
                }                                                                                 \
                if (to_inf)                                                                       \
                    r = p->has_inf ? (UT)p->inf_bits : p->has_nan ? (UT)p->nan_bits : (UT)p->max_bits; \
                else                                                                              \
                    r = (UT)p->max_bits;                                                          \
            }                                                                                     \
        }                                                                                         \
        if (p->ftz && r < (UT)p->tiny_bits) r = 0;                                                \
        if (!p->is_signed) {                                                                      \
            if (p->has_zero) {                                                                    \
                /* rounded as if signed; a negative nonzero result is out of range (IEEE 754   */ \
                /* 5.8's rule for unsigned integers): NaN. -0 is +0.                           */ \
                out[i] = (neg && r != 0) ? (UT)p->nan_bits : r;                                   \
                continue;                                                                         \
            }                                                                                     \
            if (r == 0 && u != 0) r = (UT)p->tiny_bits;                                           \
            if ((neg && u != 0) || u == 0) r = (UT)p->nan_bits;                                   \
            out[i] = r;                                                                           \
            continue;                                                                             \
        }                                                                                         \
        if (r > (UT)p->inf_bits) { r = (UT)p->nan_bits; s = 0; }                                  \
        if (!p->signed_zero && r == 0) s = 0;                                                     \
        out[i] = r | s;                                                                           \
    }                                                                                             \
}

#define DEFINE_SLOW_MODE(NAME, UT, MODE_)                                                         \
CLONES __attribute__((noinline)) static void NAME##_slow_##MODE_(                                 \
    const UT *in, UT *out, Py_ssize_t n, const plan_t *p, const UT *rand)                        \
{                                                                                                 \
    NAME##_slow_body(in, out, n, p, rand, MODE_);                                                 \
}

#define DEFINE_ALL(NAME, UT, FT)                                                                  \
    DEFINE_CORE(NAME, UT)                                                                         \
    DEFINE_PASS1(NAME, UT, RNE) DEFINE_PASS1(NAME, UT, RNA) DEFINE_PASS1(NAME, UT, RTZ)          \
    DEFINE_PASS1(NAME, UT, RUP) DEFINE_PASS1(NAME, UT, RDN) DEFINE_PASS1(NAME, UT, RTO)          \
    DEFINE_PASS1(NAME, UT, SR)                                                                    \
    DEFINE_SLOW(NAME, UT, FT)                                                                     \
    DEFINE_SLOW_MODE(NAME, UT, RNE) DEFINE_SLOW_MODE(NAME, UT, RNA) DEFINE_SLOW_MODE(NAME, UT, RTZ) \
    DEFINE_SLOW_MODE(NAME, UT, RUP) DEFINE_SLOW_MODE(NAME, UT, RDN) DEFINE_SLOW_MODE(NAME, UT, RTO) \
    DEFINE_SLOW_MODE(NAME, UT, SR)

DEFINE_ALL(kernel32, uint32_t, float)
DEFINE_ALL(kernel64, uint64_t, double)

/* ---- Specialised copies: float32 carrier, the core with every plan number a constant.
 * SPEC(tag, mode, d0, tinyE, maxb, qb, hqb, infr, nsat): signed formats with signed zero, subnormals kept,
 * exact SR (sr_bits 0); hi = +inf, nanb = the canonical NaN (0x7fc00000). */
#define SPECS(X)                                                                                  \
    X(bf16_rne, RNE, 16, 1, 0x7f7f0000u, 0x00010000u, 0x00008000u, 0x7f800000u, 0xffffffffu)     \
    X(bf16_rtz, RTZ, 16, 1, 0x7f7f0000u, 0x00010000u, 0x00008000u, 0x7f800000u, 0xffffffffu)     \
    X(bf16_sr,  SR,  16, 1, 0x7f7f0000u, 0x00010000u, 0x00008000u, 0x7f800000u, 0xffffffffu)     \
    X(fp16_rne, RNE, 13, 113, 0x477fe000u, 0x33800000u, 0x33000000u, 0x7f800000u, 0xffffffffu)   \
    X(fp16_rtz, RTZ, 13, 113, 0x477fe000u, 0x33800000u, 0x33000000u, 0x7f800000u, 0xffffffffu)   \
    X(fp16_sr,  SR,  13, 113, 0x477fe000u, 0x33800000u, 0x33000000u, 0x7f800000u, 0xffffffffu)   \
    X(e4m3_rne, RNE, 20, 121, 0x43e00000u, 0x3b000000u, 0x3a800000u, 0x7fc00000u, 0xffffffffu)   \
    X(e4m3_rtz, RTZ, 20, 121, 0x43e00000u, 0x3b000000u, 0x3a800000u, 0x7fc00000u, 0xffffffffu)   \
    X(e4m3_sr,  SR,  20, 121, 0x43e00000u, 0x3b000000u, 0x3a800000u, 0x7fc00000u, 0xffffffffu)   \
    X(e4m3_rne_sat, RNE, 20, 121, 0x43e00000u, 0x3b000000u, 0x3a800000u, 0x7fc00000u, 0u)        \
    X(e4m3_sr_sat,  SR,  20, 121, 0x43e00000u, 0x3b000000u, 0x3a800000u, 0x7fc00000u, 0u)        \
    X(e5m2_rne, RNE, 21, 113, 0x47600000u, 0x37800000u, 0x37000000u, 0x7f800000u, 0xffffffffu)   \
    X(e5m2_rtz, RTZ, 21, 113, 0x47600000u, 0x37800000u, 0x37000000u, 0x7f800000u, 0xffffffffu)   \
    X(e5m2_sr,  SR,  21, 113, 0x47600000u, 0x37800000u, 0x37000000u, 0x7f800000u, 0xffffffffu)   \
    X(e5m2_rne_sat, RNE, 21, 113, 0x47600000u, 0x37800000u, 0x37000000u, 0x7f800000u, 0u)        \
    X(e5m2_sr_sat,  SR,  21, 113, 0x47600000u, 0x37800000u, 0x37000000u, 0x7f800000u, 0u)

/* RNE and RTZ with a subnormal grid above the carrier's (tinyE > 1): the normal results by the bit trick
 * with the constant d0; magnitudes below the target's min normal by float arithmetic on the fixed grid
 * of the quantum q: (x + C) - C with C = q * 2**23 (ulp(C) = q, x + C < 2C: one correctly rounded float32
 * addition, under the IEEE environment the caller runs in), one step of q down where that rounded up for
 * RTZ. The same results as the core's variable d (the identity tests check all 2**16 high halves). */
static inline __attribute__((always_inline)) void spec32_tiny(
    const uint32_t *in, uint32_t *out, Py_ssize_t n, const int MODE, const int d0, const uint32_t tinyb,
    const float C, const float Q, const uint32_t maxb, const uint32_t infr, const uint32_t nsat)
{
    const uint32_t SIGN = 0x80000000u, hi = 0x7f800000u, nanb = 0x7fc00000u;
    const uint32_t maskc = (1u << d0) - 1u;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t b = in[i], s = b & SIGN, u = b ^ s, r, rt;
        if (MODE == RNE)
            r = (u + (maskc >> 1) + ((u >> d0) & 1u)) & ~maskc;
        else
            r = u & ~maskc;
        float f, t;
        memcpy(&f, &u, 4);
        t = (f + C) - C;
        if (MODE == RTZ)
            t = t > f ? t - Q : t;
        memcpy(&rt, &t, 4);
        uint32_t tiny = 0u - (uint32_t)(u < tinyb);
        r = (r & ~tiny) | (rt & tiny);
        uint32_t ovf = 0u - (uint32_t)(r > maxb);
        uint32_t toinf = (MODE == RTZ ? 0u : ~0u);
        toinf = (toinf | (0u - (uint32_t)(u == hi))) & nsat;
        r = (r & ~ovf) | (ovf & ((infr & toinf) | (maxb & ~toinf)));
        uint32_t isnan = 0u - (uint32_t)(u > hi);
        r = (r & ~isnan) | (nanb & isnan);
        out[i] = r | (s & (0u - (uint32_t)(r <= hi)));
    }
}

/* SR (exact, sr_bits 0) with a subnormal grid above the carrier's: normal results by the bit trick with
 * the constant d0; below the target's min normal, with t = x/q (exact: a power-of-two scaling), k = floor(t)
 * and F = floor((t - k) * 2**32) (the remainder below the grid; every step exact in float32), the result is
 * (k + 1) q iff F + rand >= 2**32, else k q. That is the reference kernel's rule in both of its cases:
 * adding rand >> (32 - d) to the d dropped bits carries iff (those bits << (32 - d)) + rand >= 2**32, and
 * below q, floor(x/q * 2**32) + rand >= 2**32. */
static inline __attribute__((always_inline)) void spec32_sr_tiny(
    const uint32_t *in, uint32_t *out, Py_ssize_t n, const uint32_t *rand, const int d0, const uint32_t tinyb,
    const float Qinv, const float Q, const uint32_t maxb, const uint32_t infr, const uint32_t nsat)
{
    const uint32_t SIGN = 0x80000000u, hi = 0x7f800000u, nanb = 0x7fc00000u;
    const uint32_t maskc = (1u << d0) - 1u;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t b = in[i], s = b & SIGN, u = b ^ s, rw = rand[i], r, rt;
        r = (u + (rw >> (32 - d0))) & ~maskc;
        uint32_t tiny = 0u - (uint32_t)(u < tinyb);
        uint32_t ut = u & tiny; /* the float steps see only the magnitudes they serve: t < 2**mbits */
        float f, t, kf, fr;
        memcpy(&f, &ut, 4);
        t = f * Qinv;
        kf = (float)(int32_t)t;
        fr = t - kf;
        /* F in two 16-bit halves: signed conversions only (they vectorize without AVX-512) */
        float f16 = fr * 65536.0f, h = (float)(int32_t)f16;
        uint32_t F = ((uint32_t)(int32_t)h << 16) | (uint32_t)(int32_t)((f16 - h) * 65536.0f);
        int32_t up = (int32_t)((uint32_t)(F != 0) & (uint32_t)(rw >= 0u - F));
        float res = (kf + (float)up) * Q;
        memcpy(&rt, &res, 4);
        r = (r & ~tiny) | (rt & tiny);
        uint32_t ovf = 0u - (uint32_t)(r > maxb);
        uint32_t toinf = (~0u | (0u - (uint32_t)(u == hi))) & nsat;
        r = (r & ~ovf) | (ovf & ((infr & toinf) | (maxb & ~toinf)));
        uint32_t isnan = 0u - (uint32_t)(u > hi);
        r = (r & ~isnan) | (nanb & isnan);
        out[i] = r | (s & (0u - (uint32_t)(r <= hi)));
    }
}

/* The same rule in AVX2 integer steps, eight elements at a time (n a multiple of 8), branch-free: with
 * d = d0 + max(tinyE - max(ef, 1), 0) dropped bits, up to 23 the bit trick with that d ((u + (rand >> (32 - d)))
 * & ~(2^d - 1): the reference kernel's sum, written with 32 - d); beyond (|x| < q), F = floor(x/q * 2**32) =
 * (m << 8) >> (126 + qexp - ef) (m the significand; the count is at least 0 there), up iff F + rand carries
 * out of 32 bits. Variable shifts instead of the float steps above: about half the instructions (a branch
 * around the |x| < q lanes cost more in mispredictions than it saved on inputs that have some). Float32
 * subnormal inputs (ef = 0) get m's implicit bit too; they are shifted out entirely, as they must be
 * (x/q < 2**-32), where qexp >= -93. */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_SR_AVX2 1
__attribute__((target("avx2"), noinline)) static void sr_tiny_avx2(
    const uint32_t *in, uint32_t *out, Py_ssize_t n, const uint32_t *rand, const int d0, const int tinyE,
    const int qexp, const uint32_t qb, const uint32_t maxb, const uint32_t ovfr)
{
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u), mag = _mm256_set1_epi32(0x7fffffff);
    const __m256i ones = _mm256_set1_epi32(-1), c9 = _mm256_set1_epi32(9);
    const __m256i vsh = _mm256_set1_epi32(32 - tinyE - d0), vshn = _mm256_set1_epi32(32 - d0);
    const __m256i vs0 = _mm256_set1_epi32(126 + qexp), vq = _mm256_set1_epi32((int)qb);
    const __m256i vmax = _mm256_set1_epi32((int)maxb), vovf = _mm256_set1_epi32((int)ovfr);
    const __m256i inf = _mm256_set1_epi32(0x7f800000), nan = _mm256_set1_epi32(0x7fc00000);
    const int ovf_nan = ovfr > 0x7f800000u;
    for (Py_ssize_t i = 0; i < n; i += 8) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(in + i)), rw = _mm256_loadu_si256((const __m256i *)(rand + i));
        __m256i s = _mm256_and_si256(b, sign), u = _mm256_and_si256(b, mag);
        __m256i ef = _mm256_srli_epi32(u, 23);
        /* sh = 32 - d, d = d0 + max(tinyE - ef, 0) (ef = 0 instead of 1: those lanes are |x| < q either way) */
        __m256i sh = _mm256_min_epi32(_mm256_add_epi32(ef, vsh), vshn);
        __m256i r = _mm256_add_epi32(u, _mm256_srlv_epi32(rw, sh));
        r = _mm256_andnot_si256(_mm256_srlv_epi32(ones, sh), r); /* sh < 9 (d > 23) lanes: replaced below */
        /* |x| < q: m << 8 (the significand, its implicit bit set: float32 subnormal inputs, ef = 0, are
         * shifted out entirely, see the caller), F = m << 8 >> (126 + qexp - ef) */
        __m256i F = _mm256_srlv_epi32(_mm256_or_si256(_mm256_slli_epi32(u, 8), sign), _mm256_sub_epi32(vs0, ef));
        __m256i sum = _mm256_add_epi32(F, rw); /* carries iff sum < rw (F = 0: never) */
        __m256i up = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_max_epu32(sum, rw), sum), vq);
        r = _mm256_blendv_epi8(r, up, _mm256_cmpgt_epi32(c9, sh));
        /* beyond max: inf (or max when saturating); NaN inputs: NaN; the sign unless NaN */
        r = _mm256_blendv_epi8(r, vovf, _mm256_cmpgt_epi32(r, vmax));
        if (ovf_nan) { /* overflow gives NaN (e4m3): its sign goes too */
            r = _mm256_blendv_epi8(r, nan, _mm256_cmpgt_epi32(u, inf));
            r = _mm256_or_si256(r, _mm256_andnot_si256(_mm256_cmpgt_epi32(r, inf), s));
        } else { /* every result but a NaN input's is at most inf: the sign, then NaN inputs */
            r = _mm256_blendv_epi8(_mm256_or_si256(r, s), nan, _mm256_cmpgt_epi32(u, inf));
        }
        _mm256_storeu_si256((__m256i *)(out + i), r);
    }
}
#else
#define HAVE_SR_AVX2 0
static void sr_tiny_avx2(const uint32_t *in, uint32_t *out, Py_ssize_t n, const uint32_t *rand, const int d0,
                         const int tinyE, const int qexp, const uint32_t qb, const uint32_t maxb, const uint32_t ovfr)
{
    (void)in; (void)out; (void)n; (void)rand; (void)d0; (void)tinyE; (void)qexp; (void)qb; (void)maxb; (void)ovfr;
}
#endif
#if defined(__GNUC__) && defined(__x86_64__)
/* The widest loop the CPU (and its OS) runs: 2 AVX-512F, 1 AVX2, 0 neither. */
static int cpu_loop_level(void)
{
    return __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
}
#else
static int cpu_loop_level(void) { return 0; }
#endif
/* A loop switch (sr_loop, phx_loop): 0 the scalar loop, 1 AVX2, 2 AVX-512; -1 the widest that both the build
 * (have: the widest it compiled) and the CPU have. */
static inline int loop_on(int flag, int have)
{
    int l = flag < 0 ? cpu_loop_level() : flag;
    return l < have ? l : have;
}
static int sr_loop = -1; /* SR below the min normal: 1 sr_tiny_avx2, 0 the scalar loop (see loop_on) */

#define SPEC_FN(TAG, MODE_, D0, TINYE, MAXB, QB, HQB, INFR, NSAT)                                 \
CLONES __attribute__((noinline)) static void spec_##TAG(                                          \
    const uint32_t *in, uint32_t *out, Py_ssize_t n, const core_args_t *a, const uint32_t *rand) \
{                                                                                                 \
    (void)a;                                                                                      \
    if ((MODE_ == RNE || MODE_ == RTZ) && TINYE > 1) {                                            \
        /* C = q * 2**23: q's exponent field + 23, from the bits of q (a float32 normal here) */   \
        const uint32_t cb = (QB) + (23u << 23); float C, Q; const uint32_t qb = (QB);              \
        memcpy(&C, &cb, 4); memcpy(&Q, &qb, 4);                                                   \
        spec32_tiny(in, out, n, MODE_, D0, (uint32_t)(TINYE) << 23, C, Q, MAXB, INFR, NSAT);     \
        return;                                                                                   \
    }                                                                                             \
    if (MODE_ == SR && TINYE > 1) {                                                               \
        /* 1/q: the exponent field of q negated about the bias (q, 1/q float32 normals here) */    \
        const uint32_t qb = (QB), ib = (uint32_t)(254u - ((QB) >> 23)) << 23; float Q, Qi;         \
        memcpy(&Q, &qb, 4); memcpy(&Qi, &ib, 4);                                                  \
        Py_ssize_t v = 0;                                                                         \
        if (HAVE_SR_AVX2 && (int)((QB) >> 23) - 127 >= -93 && loop_on(sr_loop, HAVE_SR_AVX2)) {      \
            v = n & ~(Py_ssize_t)7;                                                               \
            sr_tiny_avx2(in, out, v, rand, D0, TINYE, (int)((QB) >> 23) - 127, QB, MAXB,          \
                         (NSAT) ? (INFR) : (MAXB));                                               \
        }                                                                                         \
        spec32_sr_tiny(in + v, out + v, n - v, rand + v, D0, (uint32_t)(TINYE) << 23, Qi, Q, MAXB, \
                       INFR, NSAT);                                                               \
        return;                                                                                   \
    }                                                                                             \
    kernel32_core(in, out, n, rand, MODE_, 32, 23, D0, TINYE, 0, 0x7f800000u, MAXB, 0xffffffffu, \
                  HQB, QB, 0x7fc00000u, INFR, NSAT);                                              \
}
SPECS(SPEC_FN)

typedef void (*fn32_t)(const uint32_t *, uint32_t *, Py_ssize_t, const core_args_t *, const uint32_t *);
typedef struct { const char *tag; fn32_t fn; core_args_t a; } spec_t;
#define SPEC_ROW(TAG, MODE_, D0, TINYE, MAXB, QB, HQB, INFR, NSAT)                                \
    {#TAG, spec_##TAG, {MODE_, 32, 23, D0, TINYE, 0, 0x7f800000u, MAXB, 0xffffffffu, HQB, QB,     \
                        0x7fc00000u, INFR, NSAT}},
static const spec_t spec_table[] = {SPECS(SPEC_ROW)};
#define N_SPECS ((int)(sizeof spec_table / sizeof spec_table[0]))

static int same_args(const core_args_t *x, const core_args_t *y)
{
    return x->mode == y->mode && x->W == y->W && x->M == y->M && x->d0 == y->d0 && x->tinyE == y->tinyE &&
           x->srb == y->srb && x->hi == y->hi && x->maxb == y->maxb && x->zs == y->zs && x->hqb == y->hqb &&
           x->qb == y->qb && x->nanb == y->nanb && x->infr == y->infr && x->nsat == y->nsat;
}

/* Which specialised copy serves the plan (index into spec_table), -1: the generic code. Pass 1 serves
 * signed formats without flush to zero that drop at least one bit. */
static int fast_ok(const plan_t *p) { return p->is_signed && !p->ftz && p->d0 >= 1; }

static int find_spec(const plan_t *p, const core_args_t *a)
{
    if (!fast_ok(p) || p->W != 32)
        return -1;
    for (int k = 0; k < N_SPECS; k++)
        if (same_args(a, &spec_table[k].a))
            return k;
    return -1;
}

/* ---- PCG64 (NumPy's default bit generator, XSL-RR 128/64) inline, from the state its `state` property
 * gives: the same next_uint64 words (step, then output), four interleaved lanes so that the 128-bit
 * multiplications do not wait on each other, and any thread's start reached by jumping ahead
 * (s -> A s + C, Brown's algorithm, as PCG64.advance). */
#if defined(__SIZEOF_INT128__)
#define HAVE_PCG64 1
typedef unsigned __int128 u128;
#define PCG_MULT (((u128)0x2360ED051FC65DA4ULL << 64) | (u128)0x4385DF649FCCF645ULL)
typedef struct { u128 inc, a[4], c[4]; } pcg_jumps_t; /* a[j], c[j]: j + 1 steps */

static void lcg_jump(u128 delta, u128 mult, u128 plus, u128 *am, u128 *ap)
{
    u128 acc_mult = 1, acc_plus = 0;
    while (delta > 0) {
        if (delta & 1) {
            acc_mult *= mult;
            acc_plus = acc_plus * mult + plus;
        }
        plus = (mult + 1) * plus;
        mult *= mult;
        delta >>= 1;
    }
    *am = acc_mult;
    *ap = acc_plus;
}

static inline uint64_t pcg_out(u128 s)
{
    uint64_t v = (uint64_t)(s >> 64) ^ (uint64_t)s;
    unsigned r = (unsigned)(s >> 122);
    return (v >> r) | (v << ((-r) & 63u));
}

static void pcg_fill(u128 *state, uint64_t *out, Py_ssize_t k, const pcg_jumps_t *J)
{
    u128 st = *state;
    Py_ssize_t w = 0;
    if (k >= 4) {
        u128 l0 = J->a[0] * st + J->c[0], l1 = J->a[1] * st + J->c[1];
        u128 l2 = J->a[2] * st + J->c[2], l3 = J->a[3] * st + J->c[3];
        for (; w + 4 <= k; w += 4) {
            out[w] = pcg_out(l0); out[w + 1] = pcg_out(l1); out[w + 2] = pcg_out(l2); out[w + 3] = pcg_out(l3);
            st = l3;
            l0 = J->a[3] * l0 + J->c[3]; l1 = J->a[3] * l1 + J->c[3];
            l2 = J->a[3] * l2 + J->c[3]; l3 = J->a[3] * l3 + J->c[3];
        }
    }
    for (; w < k; w++) {
        st = PCG_MULT * st + J->inc;
        out[w] = pcg_out(st);
    }
    *state = st;
}
#else
#define HAVE_PCG64 0
#endif

/* ---- Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11; the generator of cuRAND's Philox and Random123),
 * counter-based: 32-bit word t of the stream is word t % 4 of the block Philox(key, counter = t / 4), so
 * any thread computes any element's words with no state to jump: the bits never depend on the split.
 * fpsim.random.Philox holds the key and the stream position; its NumPy twin (philox_words) is the
 * reference, Random123's known-answer vectors the oracle (tests/test_philox.py). */
#define PHX_M0 0xD2511F53u
#define PHX_M1 0xCD9E8D57u
#define PHX_W0 0x9E3779B9u
#define PHX_W1 0xBB67AE85u
#define PHX_NB 8

/* Blocks b0 .. b0 + nb - 1 (nb a multiple of PHX_NB) into out, four words per block: the reference loop. */
static void philox_blocks_scalar(uint32_t k0, uint32_t k1, uint64_t b0, uint32_t *out, Py_ssize_t nb)
{
    for (Py_ssize_t i = 0; i < nb; i++) {
        uint64_t b = b0 + (uint64_t)i;
        uint32_t c0 = (uint32_t)b, c1 = (uint32_t)(b >> 32), c2 = 0, c3 = 0, x0 = k0, x1 = k1;
        for (int r = 0; r < 10; r++) {
            uint64_t p0 = (uint64_t)PHX_M0 * c0, p1 = (uint64_t)PHX_M1 * c2;
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ x0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ x1;
            c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
            x0 += PHX_W0; x1 += PHX_W1;
        }
        uint32_t *o = out + 4 * i;
        o[0] = c0; o[1] = c1; o[2] = c2; o[3] = c3;
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_PHX_AVX2 1
/* The same blocks, eight at a time in AVX2: each word of four blocks in the low halves of 64-bit lanes, so
 * that _mm256_mul_epu32 gives the 32x32->64 products directly (the high halves it ignores may hold garbage:
 * only the low halves are ever stored), then transposed back to four words per block. About 3x the loop above
 * (gcc's own vectorisation of it gained little: it shuffles 32-bit lanes in and out of every product). */
__attribute__((target("avx2"))) static void philox_blocks_avx2(uint32_t k0, uint32_t k1, uint64_t b0, uint32_t *out,
                                                               Py_ssize_t nb)
{
    const __m256i M0 = _mm256_set1_epi64x(PHX_M0), M1 = _mm256_set1_epi64x(PHX_M1);
    for (Py_ssize_t g = 0; g < nb; g += 8) {
        __m256i bA = _mm256_add_epi64(_mm256_set1_epi64x((long long)(b0 + (uint64_t)g)), _mm256_set_epi64x(3, 2, 1, 0));
        __m256i bB = _mm256_add_epi64(bA, _mm256_set1_epi64x(4));
        __m256i a0 = bA, a1 = _mm256_srli_epi64(bA, 32), a2 = _mm256_setzero_si256(), a3 = a2;
        __m256i e0 = bB, e1 = _mm256_srli_epi64(bB, 32), e2 = a2, e3 = a2;
        uint32_t x0 = k0, x1 = k1;
        for (int r = 0; r < 10; r++) {
            __m256i K0 = _mm256_set1_epi64x(x0), K1 = _mm256_set1_epi64x(x1);
            __m256i p0 = _mm256_mul_epu32(a0, M0), p1 = _mm256_mul_epu32(a2, M1);
            __m256i q0 = _mm256_mul_epu32(e0, M0), q1 = _mm256_mul_epu32(e2, M1);
            a0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), a1), K0);
            a2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), a3), K1);
            a1 = p1; a3 = p0;
            e0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(q1, 32), e1), K0);
            e2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(q0, 32), e3), K1);
            e1 = q1; e3 = q0;
            x0 += PHX_W0; x1 += PHX_W1;
        }
        /* lane l of (w0 | w1 << 32, w2 | w3 << 32) is block l's two halves: interleave the two into memory order */
        __m256i A01 = _mm256_blend_epi32(a0, _mm256_slli_epi64(a1, 32), 0xaa);
        __m256i A23 = _mm256_blend_epi32(a2, _mm256_slli_epi64(a3, 32), 0xaa);
        __m256i E01 = _mm256_blend_epi32(e0, _mm256_slli_epi64(e1, 32), 0xaa);
        __m256i E23 = _mm256_blend_epi32(e2, _mm256_slli_epi64(e3, 32), 0xaa);
        __m256i l = _mm256_unpacklo_epi64(A01, A23), h = _mm256_unpackhi_epi64(A01, A23);
        _mm256_storeu_si256((__m256i *)(out + 4 * g), _mm256_permute2x128_si256(l, h, 0x20));
        _mm256_storeu_si256((__m256i *)(out + 4 * g + 8), _mm256_permute2x128_si256(l, h, 0x31));
        l = _mm256_unpacklo_epi64(E01, E23); h = _mm256_unpackhi_epi64(E01, E23);
        _mm256_storeu_si256((__m256i *)(out + 4 * g + 16), _mm256_permute2x128_si256(l, h, 0x20));
        _mm256_storeu_si256((__m256i *)(out + 4 * g + 24), _mm256_permute2x128_si256(l, h, 0x31));
    }
}
#define HAVE_PHX_AVX512 1
/* The same blocks in AVX-512 (8 per zmm, as above), the two three-way XORs of a round one vpternlogq each;
 * four vectors per step keep the multipliers busy (on Zen 4, per 10M words: AVX2 5.9 ms, one zmm 4.1, four 3.4).
 * V zmm vectors of eight blocks each: blocks b .. b + 8V - 1 into out. */
__attribute__((target("avx512f"), always_inline)) static inline void phx512_group(uint32_t k0, uint32_t k1, uint64_t b,
                                                                                    uint32_t *out, const int V)
{
    const __m512i M0 = _mm512_set1_epi64(PHX_M0), M1 = _mm512_set1_epi64(PHX_M1);
    __m512i c0[4], c1[4], c2[4], c3[4];
    _Pragma("GCC unroll 4")
    for (int v = 0; v < V; v++) {
        c0[v] = _mm512_add_epi64(_mm512_set1_epi64((long long)(b + 8u * (unsigned)v)),
                                 _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
        c1[v] = _mm512_srli_epi64(c0[v], 32);
        c2[v] = c3[v] = _mm512_setzero_si512();
    }
    uint32_t x0 = k0, x1 = k1;
    _Pragma("GCC unroll 10")
    for (int r = 0; r < 10; r++) {
        const __m512i K0 = _mm512_set1_epi64(x0), K1 = _mm512_set1_epi64(x1);
        _Pragma("GCC unroll 4")
        for (int v = 0; v < V; v++) {
            __m512i p0 = _mm512_mul_epu32(c0[v], M0), p1 = _mm512_mul_epu32(c2[v], M1);
            c0[v] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), c1[v], K0, 0x96);
            c2[v] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), c3[v], K1, 0x96);
            c1[v] = p1; c3[v] = p0;
        }
        x0 += PHX_W0; x1 += PHX_W1;
    }
    const __m512i I01 = _mm512_set_epi32(30, 14, 28, 12, 26, 10, 24, 8, 22, 6, 20, 4, 18, 2, 16, 0);
    const __m512i LO = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0), HI = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
    _Pragma("GCC unroll 4")
    for (int v = 0; v < V; v++) {
        __m512i A01 = _mm512_permutex2var_epi32(c0[v], I01, c1[v]), A23 = _mm512_permutex2var_epi32(c2[v], I01, c3[v]);
        _mm512_storeu_si512(out + 32 * v, _mm512_permutex2var_epi64(A01, LO, A23));
        _mm512_storeu_si512(out + 32 * v + 16, _mm512_permutex2var_epi64(A01, HI, A23));
    }
}
__attribute__((target("avx512f"))) static void philox_blocks_avx512(uint32_t k0, uint32_t k1, uint64_t b0,
                                                                   uint32_t *out, Py_ssize_t nb)
{
    Py_ssize_t g = 0;
    for (; g + 32 <= nb; g += 32)
        phx512_group(k0, k1, b0 + (uint64_t)g, out + 4 * g, 4);
    for (; g < nb; g += 8)
        phx512_group(k0, k1, b0 + (uint64_t)g, out + 4 * g, 1);
}
#else
#define HAVE_PHX_AVX2 0
#define HAVE_PHX_AVX512 0
#endif

static int phx_loop = -1; /* the Philox loop (see loop_on): 2 AVX-512, 1 AVX2, 0 scalar, -1 the best the CPU has */

static const char *const loop_names[] = {"scalar", "avx2", "avx512"};

/* The loop a switch selects: "scalar", "avx2", "avx512" (where the build has it) or "auto" (-1: the widest the
 * CPU has); returns the one in use (tests: each loop gives the reference's bits). */
static PyObject *impl_switch(PyObject *args, int *flag, int have, const char *name)
{
    const char *which = NULL;
    if (!PyArg_ParseTuple(args, "|s", &which))
        return NULL;
    if (which) {
        int l = -2;
        if (strcmp(which, "auto") == 0)
            l = -1;
        for (int i = 0; i <= 2; i++)
            if (strcmp(which, loop_names[i]) == 0)
                l = i;
        if (l == -2 || l > have) {
            PyErr_Format(PyExc_ValueError, "%s: %s is not one of 'auto', 'scalar'%s%s", name, which,
                         have >= 1 ? ", 'avx2'" : "", have >= 2 ? ", 'avx512'" : "");
            return NULL;
        }
        if (l > cpu_loop_level()) {
            PyErr_Format(PyExc_ValueError, "%s: this CPU has no %s", name, l == 2 ? "AVX-512F" : "AVX2");
            return NULL;
        }
        *flag = l;
    }
    return PyUnicode_FromString(loop_names[loop_on(*flag, have)]);
}

#define PHX_HAVE (HAVE_PHX_AVX512 ? 2 : HAVE_PHX_AVX2)

/* philox_impl(which): the Philox loop in use; sr_impl(which): the loop of exact SR below the min normal. */
static PyObject *philox_impl(PyObject *self, PyObject *args)
{
    (void)self;
    return impl_switch(args, &phx_loop, PHX_HAVE, "philox_impl");
}

static PyObject *sr_impl(PyObject *self, PyObject *args)
{
    (void)self;
    return impl_switch(args, &sr_loop, HAVE_SR_AVX2, "sr_impl");
}

static void philox_blocks(uint32_t k0, uint32_t k1, uint64_t b0, uint32_t *out, Py_ssize_t nb)
{
    switch (loop_on(phx_loop, PHX_HAVE)) {
#if HAVE_PHX_AVX512
    case 2:
        philox_blocks_avx512(k0, k1, b0, out, nb);
        return;
#endif
#if HAVE_PHX_AVX2
    case 1:
        philox_blocks_avx2(k0, k1, b0, out, nb);
        return;
#endif
    default:
        philox_blocks_scalar(k0, k1, b0, out, nb);
    }
}

/* Stream words t0 .. t0 + n - 1 into out (any start, any length). */
static void philox_fill(uint32_t k0, uint32_t k1, uint64_t t0, uint32_t *out, Py_ssize_t n)
{
    uint32_t tmp[4 * PHX_NB];
    while (n > 0) {
        Py_ssize_t skip = (Py_ssize_t)(t0 % (4 * PHX_NB));
        if (skip == 0 && n >= 4 * PHX_NB) { /* whole groups straight into out */
            Py_ssize_t nb = (n / (4 * PHX_NB)) * PHX_NB;
            philox_blocks(k0, k1, t0 / 4, out, nb);
            out += 4 * nb; t0 += (uint64_t)(4 * nb); n -= 4 * nb;
            continue;
        }
        philox_blocks(k0, k1, (t0 - (uint64_t)skip) / 4, tmp, PHX_NB);
        Py_ssize_t k = 4 * PHX_NB - skip < n ? 4 * PHX_NB - skip : n;
        memcpy(out, tmp + skip, (size_t)k * sizeof(uint32_t));
        out += k; t0 += (uint64_t)k; n -= k;
    }
}

/* ---- One job: a contiguous range of elements, block by block. */
typedef struct {
    const plan_t *p;
    const core_args_t *a;
    int spec;
    const void *in;
    void *out;
    Py_ssize_t n;
    const void *rand;   /* random words for these elements, or NULL */
    bitgen_t *bg;       /* or draw them from here (element order), or NULL */
#if HAVE_PCG64
    int pcg;            /* or from this PCG64 state (the state before this job's first word) */
    u128 pst;
    const pcg_jumps_t *J;
#endif
    int phx;            /* or from Philox4x32-10 with this key, from stream word pw on: 1 one word per element
                           (float64: two), 2 half a word (float32 rounding that reads at most 16 bits) */
    uint32_t pk0, pk1;
    uint64_t pw;
    int nt;             /* RNE/RTZ of a specialised format by spec_nt (non-temporal stores) */
    fpsim_sink_t *sink; /* or NULL: each rounded block goes to this sink instead of out (see _csink.h) */
    int jid;            /* this job's index, for the sink */
    Py_ssize_t lo;      /* this job's first element within the call, for the sink */
} job_t;

typedef void (*fn64_t)(const uint64_t *, uint64_t *, Py_ssize_t, const core_args_t *, const uint64_t *);

/* ---- RNE/RTZ of the specialised formats with non-temporal stores, for outputs too large for the cache:
 * the result goes straight to memory instead of first reading each output line in (about 20% less memory
 * traffic than a plain store, and than np.copyto). The same steps as spec_* (the core's constants; below
 * the min normal, the (x + C) - C of spec32_tiny), in AVX-512 where the CPU has it; out 64-byte aligned,
 * n a multiple of 16 (the caller does the ends with the plain copy). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && __GNUC__ >= 11
#include <immintrin.h>
#define HAVE_NT 1
__attribute__((target("avx512f"))) static void spec_nt(const uint32_t *in, uint32_t *out, Py_ssize_t n,
                                                       const core_args_t *a)
{
    const int rne = a->mode == RNE, tiny = a->tinyE > 1;
    const uint32_t maskc = (1u << a->d0) - 1u, cb = (uint32_t)a->qb + (23u << 23);
    const __m128i d0 = _mm_cvtsi32_si128(a->d0);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u), mag = _mm512_set1_epi32(0x7fffffff);
    const __m512i half = _mm512_set1_epi32((int)(maskc >> 1)), one = _mm512_set1_epi32(1);
    const __m512i keep = _mm512_set1_epi32((int)~maskc), maxb = _mm512_set1_epi32((int)a->maxb);
    const __m512i inf = _mm512_set1_epi32(0x7f800000), nan = _mm512_set1_epi32((int)a->nanb);
    const __m512i infr = _mm512_set1_epi32((int)a->infr), tinyb = _mm512_set1_epi32((int)((uint32_t)a->tinyE << 23));
    const __m512 C = _mm512_castsi512_ps(_mm512_set1_epi32((int)cb));
    const __m512 Q = _mm512_castsi512_ps(_mm512_set1_epi32((int)a->qb));
    const int sat = a->nsat == 0;
    for (Py_ssize_t i = 0; i < n; i += 16) {
        __m512i b = _mm512_loadu_si512((const void *)(in + i));
        __m512i u = _mm512_and_si512(b, mag), s = _mm512_and_si512(b, sign), r;
        if (rne)
            r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, half),
                                                  _mm512_and_si512(_mm512_srl_epi32(u, d0), one)), keep);
        else
            r = _mm512_and_si512(u, keep);
        if (tiny) {
            __m512 f = _mm512_castsi512_ps(u), t = _mm512_sub_ps(_mm512_add_ps(f, C), C);
            if (!rne)
                t = _mm512_mask_sub_ps(t, _mm512_cmp_ps_mask(t, f, _CMP_GT_OQ), t, Q);
            r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epu32_mask(u, tinyb), _mm512_castps_si512(t));
        }
        /* r > max: infinity or NaN (RNE; RTZ only for an infinite input; never when saturating), else
         * max; u > inf: NaN; the sign unless NaN */
        __mmask16 ovf = _mm512_cmpgt_epu32_mask(r, maxb);
        r = _mm512_mask_mov_epi32(r, ovf, maxb);
        if (!sat)
            r = _mm512_mask_mov_epi32(r, rne ? ovf : (__mmask16)(ovf & _mm512_cmpeq_epi32_mask(u, inf)), infr);
        r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(u, inf), nan);
        r = _mm512_or_si512(r, _mm512_maskz_mov_epi32(_mm512_cmple_epu32_mask(r, inf), s));
        _mm512_stream_si512((void *)(out + i), r);
    }
    _mm_sfence();
}
#else
#define HAVE_NT 0
#endif
/* Outputs of at least this many bytes take the non-temporal path (where there is one). */
static Py_ssize_t nt_min_bytes = (Py_ssize_t)16 << 20; /* beyond a typical L3 share */
typedef void (*slow32_t)(const uint32_t *, uint32_t *, Py_ssize_t, const plan_t *, const uint32_t *);
typedef void (*slow64_t)(const uint64_t *, uint64_t *, Py_ssize_t, const plan_t *, const uint64_t *);

#if HAVE_PCG64
#define PCG_ON(j) ((j)->pcg)
#else
#define PCG_ON(j) 0
#endif

static void draw(job_t *j, uint64_t *w, Py_ssize_t k)
{
#if HAVE_PCG64
    if (j->pcg) {
        pcg_fill(&j->pst, w, k, j->J);
        return;
    }
#endif
    for (Py_ssize_t i = 0; i < k; i++)
        w[i] = j->bg->next_uint64(j->bg->state);
}

/* Elements before out reaches a 64-byte boundary (NumPy's large arrays start 16 bytes past one): the
 * rest is then stored in whole cache lines. Even where words are drawn here (a float32 carrier's word
 * pairs stay pairs), else none. */
static Py_ssize_t HEAD(const void *out, Py_ssize_t isz, Py_ssize_t n, int drawn)
{
    Py_ssize_t h = (Py_ssize_t)(((64u - ((uintptr_t)out & 63u)) & 63u) / (uintptr_t)isz);
    if (h > n)
        h = n;
    return drawn && (h & 1) ? 0 : h;
}

static void run_job(job_t *j)
{
    const plan_t *p = j->p;
    uint64_t rbuf[BLK];     /* one block's random words */
    uint32_t rbuf32[2 * BLK]; /* float32 carrier: each 64-bit word as two halves, in .view(np.uint32)'s order;
                                 Philox: the stream words */
    uint64_t obuf[BLK];     /* with a sink: one rounded block, handed on while it is in L1 */
    fpsim_sink_t *const sink = j->sink;
    int m = p->mode;
    if (p->W == 32) {
        static const fn32_t pass[7] = {kernel32_pass1_RNE, kernel32_pass1_RNA, kernel32_pass1_RTZ,
                                       kernel32_pass1_RUP, kernel32_pass1_RDN, kernel32_pass1_RTO,
                                       kernel32_pass1_SR};
        static const slow32_t slow[7] = {kernel32_slow_RNE, kernel32_slow_RNA, kernel32_slow_RTZ,
                                         kernel32_slow_RUP, kernel32_slow_RDN, kernel32_slow_RTO,
                                         kernel32_slow_SR};
        fn32_t f = j->spec >= 0 ? spec_table[j->spec].fn : fast_ok(p) ? pass[m] : NULL;
        const uint32_t *in = j->in, *rand = j->rand;
        uint32_t *out = j->out;
        const int drawn = j->bg || PCG_ON(j) || j->phx;
        /* blocks only where the random words are drawn here or a sink takes them */
        const Py_ssize_t blk = drawn || sink ? BLK : j->n;
        Py_ssize_t head = sink ? 0 : HEAD(out, 4, j->n, drawn);
        for (Py_ssize_t o = 0, k; o < j->n; o += k) {
            k = o == 0 && head ? head : j->n - o < blk ? j->n - o : blk;
            const uint32_t *r = rand ? rand + o : NULL;
            if (j->phx == 2) { /* half a stream word per element (at most 16 bits used): low half first */
                Py_ssize_t w = (k + 1) / 2;
                uint32_t *words = rbuf32 + BLK; /* expanded forwards below: 2 i + 1 < BLK + i */
                philox_fill(j->pk0, j->pk1, j->pw, words, w);
                for (Py_ssize_t i = 0; i < w; i++) {
                    uint32_t x = words[i];
                    rbuf32[2 * i] = x << 16;
                    rbuf32[2 * i + 1] = x & 0xffff0000u;
                }
                j->pw += (uint64_t)w;
                r = rbuf32;
            } else if (j->phx) { /* one stream word per element */
                philox_fill(j->pk0, j->pk1, j->pw, rbuf32, k);
                j->pw += (uint64_t)k;
                r = rbuf32;
            } else if (j->bg || PCG_ON(j)) {
                draw(j, rbuf, (k + 1) / 2);
                for (Py_ssize_t w = 0; w < (k + 1) / 2; w++) {
                    uint64_t x = rbuf[w];
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
                    rbuf32[2 * w] = (uint32_t)(x >> 32); rbuf32[2 * w + 1] = (uint32_t)x;
#else
                    rbuf32[2 * w] = (uint32_t)x; rbuf32[2 * w + 1] = (uint32_t)(x >> 32);
#endif
                }
                r = rbuf32;
            }
#if HAVE_NT
            if (j->nt && o == head && k >= 16) {
                Py_ssize_t body = k & ~(Py_ssize_t)15;
                spec_nt(in + o, out + o, body, j->a);
                f(in + o + body, out + o + body, k - body, j->a, r);
                continue;
            }
#endif
            uint32_t *dst = sink ? (uint32_t *)obuf : out + o;
            if (f)
                f(in + o, dst, k, j->a, r);
            else
                slow[m](in + o, dst, k, p, r);
            if (sink)
                sink->fn(sink, j->jid, in + o, dst, j->lo + o, k);
        }
    } else {
        static const fn64_t pass[7] = {kernel64_pass1_RNE, kernel64_pass1_RNA, kernel64_pass1_RTZ,
                                       kernel64_pass1_RUP, kernel64_pass1_RDN, kernel64_pass1_RTO,
                                       kernel64_pass1_SR};
        static const slow64_t slow[7] = {kernel64_slow_RNE, kernel64_slow_RNA, kernel64_slow_RTZ,
                                         kernel64_slow_RUP, kernel64_slow_RDN, kernel64_slow_RTO,
                                         kernel64_slow_SR};
        const int fast = fast_ok(p);
        const uint64_t *in = j->in, *rand = j->rand;
        uint64_t *out = j->out;
        const int drawn = j->bg || PCG_ON(j) || j->phx;
        const Py_ssize_t blk = drawn || sink ? BLK : j->n;
        Py_ssize_t head = sink ? 0 : HEAD(out, 8, j->n, drawn);
        for (Py_ssize_t o = 0, k; o < j->n; o += k) {
            k = o == 0 && head ? head : j->n - o < blk ? j->n - o : blk;
            const uint64_t *r = rand ? rand + o : NULL;
            if (j->phx) { /* two stream words per element, the first the low half */
                philox_fill(j->pk0, j->pk1, j->pw, rbuf32, 2 * k);
                for (Py_ssize_t w = 0; w < k; w++)
                    rbuf[w] = (uint64_t)rbuf32[2 * w] | ((uint64_t)rbuf32[2 * w + 1] << 32);
                j->pw += (uint64_t)(2 * k);
                r = rbuf;
            } else if (j->bg || PCG_ON(j)) {
                draw(j, rbuf, k);
                r = rbuf;
            }
            uint64_t *dst = sink ? obuf : out + o;
            if (fast)
                pass[m](in + o, dst, k, j->a, r);
            else
                slow[m](in + o, dst, k, p, r);
            if (sink)
                sink->fn(sink, j->jid, in + o, dst, j->lo + o, k);
        }
    }
}

#if HAVE_THREADS
static void *job_entry(void *arg)
{
    run_job((job_t *)arg); /* the pool gave this thread the caller's floating-point environment */
    return NULL;
}
#endif

/* Every plan number is checked before any shift or index uses it: a bad plan is a Python exception,
 * never undefined behaviour (shift counts out of range, a NULL random buffer, a carrier that is not one). */
static int check_plan(const plan_t *p, unsigned long long tb, unsigned long long mb, unsigned long long qb,
                      unsigned long long ib, unsigned long long nb, unsigned long long hb)
{
    const char *why = NULL;
    if (!((p->W == 32 && p->M == 23 && p->B == 127) || (p->W == 64 && p->M == 52 && p->B == 1023)))
        why = "carrier (M, B, W) must be (23, 127, 32) or (52, 1023, 64)";
    else if (p->mode < RNE || p->mode > SR)
        why = "mode code must be in 0..6";
    else if ((p->need_tiny | p->saturate | p->ftz | p->has_inf | p->has_nan | p->signed_zero | p->is_signed |
              p->has_zero) & ~1)
        why = "flags must be 0 or 1";
    else if (p->d0 > p->M || p->d0 < p->M - 52)
        why = "d0 must be in M-52..M (precision 1..53)";
    else if (p->sr_bits < 0 || p->sr_bits > (p->W == 32 ? 32 : 52))
        why = "sr_bits must be in 0..32 (float32 carrier) or 0..52 (float64 carrier)";
    else if (p->qexp < -1074 || p->qexp > 1023)
        why = "qexp must be in -1074..1023";
    else if (p->need_tiny) {
        /* the carrier exponent field of the target's min normal, as pass 1 computes it */
        long tinyE = (long)p->qexp + p->M - p->d0 + p->B;
        if (tinyE < 1 || tinyE >= (1L << (p->W - 1 - p->M)) - 1)
            why = "need_tiny with a min normal outside the carrier's normal range";
    }
    if (!why) {
        unsigned long long lim = p->W == 32 ? 0x7fffffffULL : 0x7fffffffffffffffULL;
        unsigned long long inf = p->W == 32 ? 0x7f800000ULL : 0x7ff0000000000000ULL;
        if (tb > lim || mb > lim || qb > lim || hb > lim || nb > lim || ib != inf || nb <= inf || mb > inf)
            why = "bit patterns must be sign-free carrier patterns (inf exact, NaN above it, max not above it)";
        else if (!(p->q > 0.0) || isinf(p->q))
            why = "q must be a positive finite number";
    }
    if (why) {
        PyErr_Format(PyExc_ValueError, "round_bits: bad plan: %s", why);
        return -1;
    }
    return 0;
}

static int parse_plan(PyObject *params, plan_t *p)
{
    unsigned long long tb, mb, qb, ib, nb, hb;
    if (!PyArg_ParseTuple(params, "iiiiiiiiiiiiiiiKKKKKKd;round_bits: params must be the 22 plan numbers",
                          &p->M, &p->B, &p->W, &p->d0, &p->need_tiny, &p->qexp, &p->mode, &p->saturate,
                          &p->ftz, &p->has_inf, &p->has_nan, &p->signed_zero, &p->is_signed, &p->has_zero,
                          &p->sr_bits, &tb, &mb, &qb, &ib, &nb, &hb, &p->q))
        return -1;
    if (check_plan(p, tb, mb, qb, ib, nb, hb) < 0)
        return -1;
    p->tiny_bits = tb; p->max_bits = mb; p->minsub_bits = qb; p->inf_bits = ib; p->nan_bits = nb; p->hq_bits = hb;
    return 0;
}


/* round_bits(in, out, rand, params[, chunk[, sink]]):
 *   in, out: carrier-word buffers (out may be in itself: each element is read before it is written);
 *   rand: None, a buffer of random carrier words (one per element), a "BitGenerator" capsule (words drawn
 *     in element order, one full 64-bit word per element, or per two elements of a float32 carrier), or a
 *     tuple of capsules, one per thread, the k-th positioned at element k*chunk's word;
 *   chunk: elements per thread (0 or absent: one thread; else a multiple of BLK). Thread k rounds
 *     elements [k*chunk, (k+1)*chunk): each element on its own, so the bits never depend on the split;
 *   sink: None, or a sink of fpsim._carith (_csink.h) for the carrier's width: the rounded words go there
 *     block by block (in element order within each job) and out is not written (any writable buffer).
 * The GIL is released for the work; the caller holds the bit generators' locks. */
static PyObject *round_bits(PyObject *self, PyObject *args)
{
    Py_buffer in, out, rnd;
    PyObject *rand_obj, *params, *sink_obj = Py_None;
    Py_ssize_t chunk = 0;
    plan_t p;
    fpsim_sink_t *sink = NULL;
    if (!PyArg_ParseTuple(args, "y*w*OO|nO", &in, &out, &rand_obj, &params, &chunk, &sink_obj))
        return NULL;
    int have_buf = 0, n_caps = 0, have_pcg = 0, have_phx = 0;
    unsigned long long ps_hi = 0, ps_lo = 0, pi_hi = 0, pi_lo = 0;
    PyObject *result = NULL;
    bitgen_t *caps[MAX_JOBS];
    const char *why = NULL;
    if (!PyTuple_Check(params)) {
        PyErr_SetString(PyExc_TypeError, "round_bits: params must be a tuple");
        goto fail;
    }
    if (parse_plan(params, &p) < 0)
        goto fail;
    Py_ssize_t isz = p.W / 8;
    Py_ssize_t n = in.len / isz;
    if (sink_obj != Py_None) {
        sink = PyCapsule_GetPointer(sink_obj, FPSIM_SINK_CAPSULE);
        if (!sink)
            goto fail;
        if (sink->W != p.W)
            why = "the sink reads another carrier width than the plan's";
    }
    if (why) {
    } else if (rand_obj == Py_None) {
    } else if (PyTuple_Check(rand_obj) && PyTuple_GET_SIZE(rand_obj) == 5 &&
               PyUnicode_Check(PyTuple_GET_ITEM(rand_obj, 0))) {
        const char *kind;
        if (!PyArg_ParseTuple(rand_obj, "sKKKK;round_bits: rand ('pcg64', state_hi, state_lo, inc_hi, inc_lo) or "
                              "('philox', key_lo, key_hi, word, half)", &kind, &ps_hi, &ps_lo, &pi_hi, &pi_lo))
            goto fail;
        if (strcmp(kind, "philox") == 0) {
            if (ps_hi > 0xffffffffULL || ps_lo > 0xffffffffULL)
                why = "philox key halves must be 32-bit";
            else if (pi_lo > 1 || (pi_lo == 1 && p.W != 32))
                why = "philox words per element: 0 (one, or two for float64) or 1 (half a word, float32 only)";
            have_phx = pi_lo == 1 ? 2 : 1;
        } else if (strcmp(kind, "pcg64") != 0) {
            why = "the inline bit generators are 'pcg64' and 'philox'";
        } else if (!HAVE_PCG64) {
            why = "no 128-bit integers in this build: pass the bit generator's capsule";
        }
        have_pcg = !have_phx;
    } else if (PyCapsule_CheckExact(rand_obj) || PyTuple_Check(rand_obj)) {
        int tup = PyTuple_Check(rand_obj);
        Py_ssize_t k = tup ? PyTuple_GET_SIZE(rand_obj) : 1;
        if (k < 1 || k > MAX_JOBS) {
            why = "a tuple of bit generator capsules must hold 1..64 of them";
        } else {
            for (Py_ssize_t i = 0; i < k; i++) {
                caps[i] = PyCapsule_GetPointer(tup ? PyTuple_GET_ITEM(rand_obj, i) : rand_obj, "BitGenerator");
                if (!caps[i])
                    goto fail;
            }
            n_caps = (int)k;
        }
    } else {
        if (PyObject_GetBuffer(rand_obj, &rnd, PyBUF_SIMPLE) < 0)
            goto fail;
        have_buf = 1;
    }
    int have_rand = have_buf || n_caps || have_pcg || have_phx;
    Py_ssize_t n_jobs = 1;
    if (!why && chunk < 0)
        why = "chunk must be >= 0";
    else if (!why && chunk > 0) {
        if (chunk % BLK)
            why = "chunk must be a multiple of 2048";
        else
            n_jobs = n ? (n + chunk - 1) / chunk : 1;
        if (!why && n_jobs > MAX_JOBS)
            why = "at most 64 threads";
    }
    if (why) {
    } else if (in.len % isz)
        why = "input length is not a whole number of carrier words";
    else if (!sink && out.len < in.len)
        why = "output buffer shorter than the input";
    else if (p.mode == SR && !have_rand)
        why = "mode SR needs random words (a buffer or bit generators)";
    else if (have_buf && rnd.len < in.len)
        why = "random buffer shorter than the input";
    else if (n_caps > 1 && n_caps != n_jobs)
        why = "one bit generator per thread: the tuple's length must be the number of chunks";
    else if (((uintptr_t)in.buf | (uintptr_t)out.buf | (have_buf ? (uintptr_t)rnd.buf : 0)) % (uintptr_t)isz)
        why = "buffers must be aligned to the carrier width";
    if (why) {
        PyErr_Format(PyExc_ValueError, "round_bits: %s", why);
        goto fail;
    }
    {
        core_args_t a;
        core_args(&p, &a);
        int spec = find_spec(&p, &a);
        job_t jobs[MAX_JOBS];
        int use_nt = 0;
#if HAVE_NT
        use_nt = !sink && spec >= 0 && (p.mode == RNE || p.mode == RTZ) && out.len >= nt_min_bytes && out.buf != in.buf && __builtin_cpu_supports("avx512f");
#endif
#if HAVE_PCG64
        pcg_jumps_t J;
        u128 s0 = ((u128)ps_hi << 64) | ps_lo, s_end = s0;
        if (have_pcg) {
            J.inc = ((u128)pi_hi << 64) | pi_lo;
            for (int q = 0; q < 4; q++)
                lcg_jump((u128)(q + 1), PCG_MULT, J.inc, &J.a[q], &J.c[q]);
        }
#endif
        if (n_caps == 1 && n_jobs > 1)
            n_jobs = 1, chunk = 0; /* one stream: one thread draws and rounds in element order */
        Py_BEGIN_ALLOW_THREADS
        /* The kernel's float steps assume round to nearest: run in it whatever mode the caller set, and give
           the caller's mode back (FTZ/DAZ of the caller were cleared by ieee_mode and are kept). */
        int caller_mode = fegetround();
        fesetround(FE_TONEAREST);
        for (Py_ssize_t k = 0; k < n_jobs; k++) {
            Py_ssize_t lo = chunk ? k * chunk : 0, hi = chunk && lo + chunk < n ? lo + chunk : n;
            job_t *j = &jobs[k];
            j->p = &p; j->a = &a; j->spec = spec;
            j->in = (const char *)in.buf + lo * isz;
            j->out = (char *)out.buf + lo * isz;
            j->n = hi - lo;
            j->rand = have_buf ? (const char *)rnd.buf + lo * isz : NULL;
            j->bg = n_caps ? caps[n_caps > 1 ? k : 0] : NULL;
            j->phx = have_phx;
            j->pk0 = (uint32_t)ps_hi; j->pk1 = (uint32_t)ps_lo;
            /* this job's first stream word (lo is a multiple of 2048: whole words in the half-word case) */
            j->pw = (uint64_t)pi_hi + (uint64_t)(have_phx == 2 ? lo / 2 : p.W == 32 ? lo : 2 * lo);
#if HAVE_PCG64
            j->pcg = have_pcg;
            j->J = &J;
            if (have_pcg) {
                /* this job's first word: element lo's (a float32 carrier: one word per two elements) */
                u128 am, ap;
                lcg_jump((u128)(p.W == 32 ? lo / 2 : lo), PCG_MULT, J.inc, &am, &ap);
                j->pst = am * s0 + ap;
            }
#endif
            j->nt = use_nt;
            j->sink = sink;
            j->jid = (int)k;
            j->lo = lo;
        }
#if HAVE_THREADS
        fpsim_pool_run(job_entry, jobs, sizeof jobs[0], (int)n_jobs); /* job 0 here, the rest on workers */
#else
        for (Py_ssize_t k = 0; k < n_jobs; k++)
            run_job(&jobs[k]);
#endif
#if HAVE_PCG64
        if (have_pcg)
            s_end = jobs[n_jobs - 1].pst; /* after the last element's word */
#endif
        fesetround(caller_mode);
        Py_END_ALLOW_THREADS
#if HAVE_PCG64
        if (have_pcg)
            result = Py_BuildValue("(KK)", (unsigned long long)(s_end >> 64), (unsigned long long)s_end);
#endif
    }
    PyBuffer_Release(&in); PyBuffer_Release(&out);
    if (have_buf) PyBuffer_Release(&rnd);
    if (result)
        return result;
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&in); PyBuffer_Release(&out);
    if (have_buf) PyBuffer_Release(&rnd);
    return NULL;
}

/* stream_min_bytes([bytes]): the output size from which bf16 RNE/RTZ use non-temporal stores (returns
 * the previous value; -1 where this build has no such path). For tests and benchmarks. */
static PyObject *stream_min_bytes(PyObject *self, PyObject *args)
{
    Py_ssize_t v = -2, old = HAVE_NT ? nt_min_bytes : -1;
    if (!PyArg_ParseTuple(args, "|n", &v))
        return NULL;
    if (v >= 0)
        nt_min_bytes = v;
    return PyLong_FromSsize_t(old);
}

/* spec_name(params): the specialised copy that serves a plan ("bf16_rne", ...), or None (tests). */
static PyObject *spec_name(PyObject *self, PyObject *args)
{
    plan_t p;
    if (parse_plan(args, &p) < 0)
        return NULL;
    core_args_t a;
    core_args(&p, &a);
    int k = find_spec(&p, &a);
    if (k < 0)
        Py_RETURN_NONE;
    return PyUnicode_FromString(spec_table[k].tag);
}

/* ---- fma_f32: out[i] = fmaf(a[i], b[i], c[i]), the float32 fused multiply-add rounded once (RNE).
 * Used by fpsim/amp/fused.py (the replay of torch's fused optimizers), whose NumPy emulation (float64 sum,
 * tie detection, round-to-odd repair) stays the reference and fallback. fmaf is correctly rounded: the
 * hardware instruction in the "fma" clone, glibc's fmaf in the default one. Each of a, b, c holds n
 * floats or one (broadcast). out may be one of the inputs (each element is read before it is written). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define FMA_CLONES
#endif
#if defined(__GNUC__)
#define FMAF __builtin_fmaf
#else
#define FMAF fmaf
#endif
/* A NaN result takes the NaN the NumPy emulation gives (float64 product, then float64 sum, as in
 * fused.py's _fma32_block, each x86 operation returning its first NaN operand, quieted): the hardware FMA
 * picks its NaN operand by the instruction's operand order, which the compiler chooses. Spelled out,
 * so no operand order of the compiler matters: a, else b, else inf*0's default NaN; then that, else c,
 * else inf-inf's default NaN. */
__attribute__((noinline)) static float fma_nan_ref(float a, float b, float c)
{
    double p;
    if (a != a)
        p = (double)a;
    else if (b != b)
        p = (double)b;
    else
        p = (double)a * (double)b;
    if (p == p) {
        if (c != c)
            p = (double)c;
        else
            p = p + (double)c;
    }
    return (float)p;
}
#define FMA_BLK 1024
#define DEFINE_FMA(IA, IB, IC)                                                                    \
FMA_CLONES __attribute__((noinline)) static void fma_##IA##IB##IC(                              \
    const float *a, const float *b, const float *c, float *out, Py_ssize_t n)                     \
{                                                                                                 \
    const float a0 = a[0], b0 = b[0], c0 = c[0];                                                  \
    (void)a0; (void)b0; (void)c0;                                                                 \
    float r[FMA_BLK]; /* a block's results, stored once fixed: out may alias an input */          \
    for (Py_ssize_t o = 0; o < n; o += FMA_BLK) {                                                 \
        const Py_ssize_t m = n - o < FMA_BLK ? n - o : FMA_BLK;                                   \
        int nan = 0;                                                                              \
        for (Py_ssize_t i = 0; i < m; i++) {                                                      \
            r[i] = FMAF(IA ? a[o + i] : a0, IB ? b[o + i] : b0, IC ? c[o + i] : c0);    \
            nan |= r[i] != r[i];                                                                  \
        }                                                                                         \
        if (nan)                                                                                  \
            for (Py_ssize_t i = 0; i < m; i++)                                                    \
                if (r[i] != r[i])                                                                 \
                    r[i] = fma_nan_ref(IA ? a[o + i] : a0, IB ? b[o + i] : b0, IC ? c[o + i] : c0); \
        memcpy(out + o, r, (size_t)m * sizeof(float));                                            \
    }                                                                                             \
}
DEFINE_FMA(0, 0, 0) DEFINE_FMA(0, 0, 1) DEFINE_FMA(0, 1, 0) DEFINE_FMA(0, 1, 1)
DEFINE_FMA(1, 0, 0) DEFINE_FMA(1, 0, 1) DEFINE_FMA(1, 1, 0) DEFINE_FMA(1, 1, 1)

static PyObject *fma_f32(PyObject *self, PyObject *args)
{
    Py_buffer a, b, c, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &a, &b, &c, &out))
        return NULL;
    const char *why = NULL;
    Py_ssize_t n = out.len / 4;
    Py_buffer *ins[3] = {&a, &b, &c};
    int full[3];
    if (out.len % 4)
        why = "out length is not a whole number of float32 words";
    for (int k = 0; k < 3 && !why; k++) {
        full[k] = ins[k]->len == out.len;
        if (!full[k] && ins[k]->len != 4)
            why = "a, b and c must each hold as many float32 values as out, or one";
    }
    if (!why && ((uintptr_t)a.buf | (uintptr_t)b.buf | (uintptr_t)c.buf | (uintptr_t)out.buf) % 4)
        why = "buffers must be aligned to 4 bytes";
    if (!why && n == 0)
        goto done;
    if (why) {
        PyBuffer_Release(&a); PyBuffer_Release(&b); PyBuffer_Release(&c); PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "fma_f32: %s", why);
        return NULL;
    }
    {
        const float *pa = a.buf, *pb = b.buf, *pc = c.buf;
        float *po = out.buf;
        int code = full[0] * 4 + full[1] * 2 + full[2];
        Py_BEGIN_ALLOW_THREADS
        int caller_mode = fegetround(); /* fmaf rounds in the current mode: make it nearest, as the reference */
        fesetround(FE_TONEAREST);
        switch (code) {
        case 0: fma_000(pa, pb, pc, po, n); break;
        case 1: fma_001(pa, pb, pc, po, n); break;
        case 2: fma_010(pa, pb, pc, po, n); break;
        case 3: fma_011(pa, pb, pc, po, n); break;
        case 4: fma_100(pa, pb, pc, po, n); break;
        case 5: fma_101(pa, pb, pc, po, n); break;
        case 6: fma_110(pa, pb, pc, po, n); break;
        default: fma_111(pa, pb, pc, po, n); break;
        }
        fesetround(caller_mode);
        Py_END_ALLOW_THREADS
    }
done:
    PyBuffer_Release(&a); PyBuffer_Release(&b); PyBuffer_Release(&c); PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sr_impl", sr_impl, METH_VARARGS, "sr_impl([which]): the loop of exact SR below the min normal in use "
     "('avx2' or 'scalar'); 'scalar', 'avx2' or 'auto' switches it (tests)."},
    {"philox_impl", philox_impl, METH_VARARGS, "philox_impl([which]): the Philox loop in use ('avx512', "
     "'avx2' or 'scalar'); one of those or 'auto' switches it (tests)."},
    {"round_bits", round_bits, METH_VARARGS, "round_bits(in, out, rand, params[, chunk]): round carrier bit "
     "patterns into out, chunk elements per thread (see the comment above round_bits and rounding.py)."},
    {"spec_name", spec_name, METH_VARARGS, "The specialised copy of the kernel that serves a plan, or None."},
    {"stream_min_bytes", stream_min_bytes, METH_VARARGS, "Get (and set) the output size from which bf16 RNE/RTZ "
     "store non-temporally."},
    {"fma_f32", fma_f32, METH_VARARGS, "out = fmaf(a, b, c) over float32 buffers, each of a, b, c of out's length "
     "or one (see fpsim/amp/fused.py)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_ckernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__ckernel(void)
{
#if HAVE_THREADS
    fpsim_pool_init();
#endif
    PyObject *m = PyModule_Create(&moddef);
    if (m && PyModule_AddIntConstant(m, "HAVE_PCG64", HAVE_PCG64) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
