/* The rounding kernel of fpsim/rounding.py, one element at a time in C (a single pass over memory).
 *
 * It is the same algorithm, step for step, as the NumPy reference `_kernel` in rounding.py, which
 * stays as the fallback and as the reference this kernel is tested against. Driven entirely by the
 * plan's numbers: no format is named here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { RNE = 0, RNA, RTZ, RUP, RDN, RTO, SR };

/* GCC turns a constant 1 in (1 << d) - 1 into an idiom it cannot vectorize for 64-bit lanes;
 * reading the 1 from a volatile keeps the plain shift (and the float64 loop vectorized). */
static volatile int opaque_one = 1;

/* Blocks small enough for L1: pass 2 revisits only the blocks where pass 1 flagged an element. */
#define BLK 2048
#define BLOCKS(NAME, MODE_)                                                                       \
    for (Py_ssize_t o = 0; o < n; o += BLK)                                                       \
        NAME##_body(in + o, out + o, n - o < BLK ? n - o : BLK, p, rand ? rand + o : NULL, MODE_)

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

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

#define DEFINE_PASS1(NAME, UT, MODE_)                                                            \
CLONES __attribute__((noinline)) static UT NAME##_pass1_##MODE_(                                  \
    const UT *in, UT *out, Py_ssize_t n, const plan_t *p, const UT *rand)                        \
{                                                                                                 \
    const int MODE = MODE_;                                                                       \
    const UT SIGN = (UT)1 << (p->W - 1);                                                          \
    const int M = p->M;                                                                           \
    const int tinyE = p->need_tiny ? p->qexp + p->M - p->d0 + p->B : 1; /* carrier field of min normal */ \
    const UT one = (UT)opaque_one, hi = (UT)p->inf_bits, maxb = (UT)p->max_bits;                 \
    const int WW = p->W, srb = p->sr_bits;                                                        \
    const UT zs = p->signed_zero ? ~(UT)0 : 0;                                                    \
    const UT hqb = (UT)p->hq_bits, qb = (UT)p->minsub_bits, nanb = (UT)p->nan_bits;               \
    const UT infr = p->has_inf ? hi : p->has_nan ? nanb : maxb, nsat = p->saturate ? 0 : ~(UT)0;  \
    /* SR below the subnormals: bits of probability resolution, as in the reference kernel */     \
    const UT bits = (UT)(srb ? srb : (WW < 53 ? WW : 53)), rshift = (UT)WW - bits;                \
    const UT top = bits == (UT)WW ? (UT)0 : ((UT)1 << bits), mmask = ((UT)1 << M) - 1;           \
        UT bad = 0;                                                                               \
        for (Py_ssize_t i = 0; i < n; i++) {                                                      \
            /* written with masks instead of ternaries so that the 64-bit loop if-converts too */    \
            UT b = in[i], s = b & SIGN, u = b ^ s, r;                                             \
            UT sm = (UT)0 - (UT)(s != 0);                    /* all ones for negative inputs */   \
            UT ef = u >> M, eff = ef + (UT)(ef == 0);                                             \
            UT gt = (UT)0 - (UT)((UT)tinyE > eff);                                                \
            UT d = (UT)p->d0 + (((UT)tinyE - eff) & gt);                                          \
            UT over = (UT)0 - (UT)(d > (UT)M);                                                    \
            UT deep = over & ((UT)0 - (UT)(u != 0));                                                \
            const UT draw = d;                                                                    \
            d = (d & ~over) | ((UT)M & over);                                                     \
            UT mask = (one << d) - one, keep = ~mask;                                             \
            UT atm = (UT)0 - (UT)(d == (UT)M);                                                    \
            UT lsb = (((u >> d) & one) & ~atm) | ((UT)(ef != 0) & atm);                           \
            switch (MODE) {                                                                       \
            case RNE: r = (u + (mask >> 1) + lsb) & keep; break;                                  \
            case RNA: r = (u + (mask >> 1) + one) & keep; break;                                  \
            case RTZ: r = u & keep; break;                                                        \
            case RUP: r = (u + (mask & ~sm)) & keep; break;                                       \
            case RDN: r = (u + (mask & sm)) & keep; break;                                        \
            case RTO: r = (u & keep) | (((UT)((u & mask) != 0) & (lsb ^ one)) << d); break;       \
            default: {                                                                            \
                UT big = (UT)0 - ((UT)(srb != 0) & (UT)(d > (UT)srb));                                 \
                UT k = (d - (UT)srb) & big;                                                       \
                UT rk = (rand[i] >> (WW - d + k)) << k;                                           \
                r = (((u >> k) << k) + rk) & keep;                                                \
            }                                                                                     \
            }                                                                                     \
            /* below half the smallest subnormal: 0 or q, decided by one comparison (not for SR) */ \
            if (MODE != SR) {                                                                     \
                UT upd;                                                                           \
                switch (MODE) {                                                                   \
                case RNE: upd = (UT)0 - (UT)(u > hqb); break;                                     \
                case RNA: upd = (UT)0 - (UT)(u >= hqb); break;                                    \
                case RTZ: upd = 0; break;                                                         \
                case RUP: upd = ~sm; break;                                                       \
                case RDN: upd = sm; break;                                                        \
                default: upd = ~(UT)0;                                                            \
                }                                                                                 \
                r = (r & ~deep) | (qb & upd & deep);                                              \
            }                                                                                     \
            if (MODE == SR) {                                                                     \
                /* below half the smallest subnormal: up with probability x/q, from the exact */    \
                /* significand (the same sums as the reference kernel: floor(x/q * 2^bits) + bits */ \
                /* random bits >= 2^bits)                                                         */ \
                UT m = (u & mmask) | ((UT)(ef != 0) << M);                                        \
                UT rs = (UT)0 - (UT)(draw >= bits);                  /* shift right?          */  \
                UT shr = (draw - bits) & rs, shl = (bits - draw) & ~rs;                           \
                UT gone = (UT)0 - (UT)(shr > (UT)M);                 /* shifted out entirely  */  \
                shr = (shr & ~gone) | ((UT)M & gone);                                             \
                UT frac = ((m >> shr) & rs & ~gone) | ((m << shl) & ~rs);                         \
                UT rr = rand[i] >> rshift;                                                        \
                UT lim = top - frac;                                                              \
                UT upd = (UT)0 - ((UT)(frac != 0) & (UT)(rr >= lim));                             \
                r = (r & ~deep) | (qb & upd & deep);                                              \
            }                                                                                     \
            /* overflow and infinite inputs (r > max), NaN inputs (u > inf) */                    \
            UT ovf = (UT)0 - (UT)(r > maxb);                                                      \
            UT toinf;                                                                             \
            switch (MODE) {                                                                       \
            case RTZ: case RTO: toinf = 0; break;                                                 \
            case RUP: toinf = ~sm; break;                                                         \
            case RDN: toinf = sm; break;                                                          \
            default: toinf = ~(UT)0;                                                              \
            }                                                                                     \
            toinf = (toinf | ((UT)0 - (UT)(u == hi))) & nsat;                                     \
            r = (r & ~ovf) | (ovf & ((infr & toinf) | (maxb & ~toinf)));                          \
            UT isnan = (UT)0 - (UT)(u > hi);                                                      \
            r = (r & ~isnan) | (nanb & isnan);                                                    \
            UT keep_s = (((UT)0 - (UT)(r != 0)) | zs) & ((UT)0 - (UT)(r <= hi));                  \
            out[i] = r | (s & keep_s);                                                            \
        }                                                                                         \
        return bad;                                                                               \
}

#define DEFINE_KERNEL(NAME, UT, FT)                                                               \
static inline __attribute__((always_inline)) void NAME##_body(                                    \
    const UT *in, UT *out, Py_ssize_t n, const plan_t *p, const UT *rand, const int MODE)        \
{                                                                                                 \
    const UT SIGN = (UT)1 << (p->W - 1);                                                          \
    const int M = p->M;                                                                           \
    /* pass 1, branch-free so that it vectorizes: every element by the bit trick, with the number of */ \
    /* dropped bits d growing by one per binade below the target's min normal (clamped to M here);  */ \
    /* deep underflow, overflow, inf and NaN are blended in with masks; only SR's deep underflow   */ \
    /* (a probability from the value) is left to pass 2.                                            */ \
    const int fast_ok = p->is_signed && !p->ftz && p->d0 >= 1;                                   \
    const UT one = (UT)opaque_one;                                                                \
    if (fast_ok) {                                                                                \
        UT bad;                                                                                   \
        switch (MODE) {                                                                           \
        case RNE: bad = NAME##_pass1_RNE(in, out, n, p, rand); break;                             \
        case RNA: bad = NAME##_pass1_RNA(in, out, n, p, rand); break;                             \
        case RTZ: bad = NAME##_pass1_RTZ(in, out, n, p, rand); break;                             \
        case RUP: bad = NAME##_pass1_RUP(in, out, n, p, rand); break;                             \
        case RDN: bad = NAME##_pass1_RDN(in, out, n, p, rand); break;                             \
        case RTO: bad = NAME##_pass1_RTO(in, out, n, p, rand); break;                             \
        default: bad = NAME##_pass1_SR(in, out, n, p, rand);                                      \
        }                                                                                         \
        (void)bad;                                                                                \
        return;                                                                                   \
    }                                                                                             \
    /* otherwise (unsigned formats, flush to zero, formats wider than the carrier): the general */ \
    /* per-element path, the reference kernel's steps one by one                                 */ \
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
            UT mask = (one << d) - one, keep = ~mask;                                              \
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
}                                                                                                 \
CLONES static void NAME(const UT *in, UT *out, Py_ssize_t n, const plan_t *p, const UT *rand)    \
{                                                                                                 \
    switch (p->mode) {                                                                            \
    case RNE: BLOCKS(NAME, RNE); break;                                       \
    case RNA: BLOCKS(NAME, RNA); break;                                       \
    case RTZ: BLOCKS(NAME, RTZ); break;                                       \
    case RUP: BLOCKS(NAME, RUP); break;                                       \
    case RDN: BLOCKS(NAME, RDN); break;                                       \
    case RTO: BLOCKS(NAME, RTO); break;                                       \
    default: BLOCKS(NAME, SR);                                                \
    }                                                                                             \
}

DEFINE_PASS1(kernel32, uint32_t, RNE)
DEFINE_PASS1(kernel32, uint32_t, RNA)
DEFINE_PASS1(kernel32, uint32_t, RTZ)
DEFINE_PASS1(kernel32, uint32_t, RUP)
DEFINE_PASS1(kernel32, uint32_t, RDN)
DEFINE_PASS1(kernel32, uint32_t, RTO)
DEFINE_PASS1(kernel32, uint32_t, SR)
DEFINE_PASS1(kernel64, uint64_t, RNE)
DEFINE_PASS1(kernel64, uint64_t, RNA)
DEFINE_PASS1(kernel64, uint64_t, RTZ)
DEFINE_PASS1(kernel64, uint64_t, RUP)
DEFINE_PASS1(kernel64, uint64_t, RDN)
DEFINE_PASS1(kernel64, uint64_t, RTO)
DEFINE_PASS1(kernel64, uint64_t, SR)
DEFINE_KERNEL(kernel32, uint32_t, float)
DEFINE_KERNEL(kernel64, uint64_t, double)

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

static PyObject *round_bits(PyObject *self, PyObject *args)
{
    Py_buffer in, out, rnd;
    PyObject *rand_obj;
    plan_t p;
    unsigned long long tb, mb, qb, ib, nb, hb;
    if (!PyArg_ParseTuple(args, "y*w*O(iiiiiiiiiiiiiiiKKKKKKd)", &in, &out, &rand_obj,
                          &p.M, &p.B, &p.W, &p.d0, &p.need_tiny, &p.qexp, &p.mode, &p.saturate,
                          &p.ftz, &p.has_inf, &p.has_nan, &p.signed_zero, &p.is_signed, &p.has_zero,
                          &p.sr_bits, &tb, &mb, &qb, &ib, &nb, &hb, &p.q))
        return NULL;
    if (check_plan(&p, tb, mb, qb, ib, nb, hb) < 0) {
        PyBuffer_Release(&in); PyBuffer_Release(&out);
        return NULL;
    }
    p.tiny_bits = tb; p.max_bits = mb; p.minsub_bits = qb; p.inf_bits = ib; p.nan_bits = nb; p.hq_bits = hb;
    Py_ssize_t isz = p.W / 8;
    Py_ssize_t n = in.len / isz;
    int have_rand = rand_obj != Py_None;
    if (have_rand && PyObject_GetBuffer(rand_obj, &rnd, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&in); PyBuffer_Release(&out);
        return NULL;
    }
    const char *why = NULL;
    if (in.len % isz)
        why = "input length is not a whole number of carrier words";
    else if (out.len < in.len)
        why = "output buffer shorter than the input";
    else if (p.mode == SR && !have_rand)
        why = "mode SR needs a random buffer";
    else if (have_rand && rnd.len < in.len)
        why = "random buffer shorter than the input";
    else if (((uintptr_t)in.buf | (uintptr_t)out.buf | (have_rand ? (uintptr_t)rnd.buf : 0)) % (uintptr_t)isz)
        why = "buffers must be aligned to the carrier width";
    if (why) {
        PyBuffer_Release(&in); PyBuffer_Release(&out);
        if (have_rand) PyBuffer_Release(&rnd);
        PyErr_Format(PyExc_ValueError, "round_bits: %s", why);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (p.W == 32)
        kernel32((const uint32_t *)in.buf, (uint32_t *)out.buf, n, &p,
                 have_rand ? (const uint32_t *)rnd.buf : NULL);
    else
        kernel64((const uint64_t *)in.buf, (uint64_t *)out.buf, n, &p,
                 have_rand ? (const uint64_t *)rnd.buf : NULL);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in); PyBuffer_Release(&out);
    if (have_rand) PyBuffer_Release(&rnd);
    Py_RETURN_NONE;
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
        Py_END_ALLOW_THREADS
    }
done:
    PyBuffer_Release(&a); PyBuffer_Release(&b); PyBuffer_Release(&c); PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"round_bits", round_bits, METH_VARARGS, "Round carrier bit patterns in place into out (see rounding.py)."},
    {"fma_f32", fma_f32, METH_VARARGS, "out = fmaf(a, b, c) over float32 buffers, each of a, b, c of out's length "
     "or one (see fpsim/amp/fused.py)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_ckernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__ckernel(void) { return PyModule_Create(&moddef); }
