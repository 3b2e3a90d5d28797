/* The block-FMA (BFMA) GEMM of fpsim/mma/model.py in integer arithmetic (issue 17, section 1).
 *
 * The same model, step for step, as the NumPy reference (fpsim.mma.model.bfma / bfma_instruction, chained
 * along K by fpsim.mma.gemm._matmul2d), which stays as the reference and the fallback; the tests
 * (tests/test_cgemm.py) check the two bit for bit on every preset. For each output and each block of k
 * products:
 *
 *   0. inputs are decomposed once: x = m * 2**(e - mbits_in) with e = max(floor(log2|x|), emin_in) and an
 *      integer significand |m| < 2**p (A's significands are pre-shifted by G bits, see below);
 *   1. E_i = e_a + e_b; E_c is the chain value's binary32 exponent (max(floor(log2|c|), -126));
 *   2. E_max = max(E_i, E_c, mel);
 *   3. Q_i = sign * (|m_a m_b| 2**G >> (E_max - E_i + c0)): the exact product truncated (sign-magnitude)
 *      to the grid 2**(E_max - 23 - neab); the addend is truncated the same way from its double bits;
 *   4. the Q_i are summed exactly (int32 in chunks that cannot overflow, then int64);
 *   5. the sum is rounded once to mb fraction bits (RZ or RNE), quantum clamped at 2**(emin_out - mb),
 *      overflow to inf, zero is +0.
 * Instructions: nblk (1, or 2 for the mod-4 grouping, whose K order the caller has permuted so that G0 and
 * G1 are consecutive blocks) blocks chained; with "late" C the instruction starts from 0 and its result is
 * added to the chain value by one RNE addition in the output format (double sum, then rounded: as NumPy).
 * Special values (step 0): a block whose products or addend hold a NaN or an infinity gives NaN (a NaN, an
 * inf*0, or both infinities) or the infinity, exactly as fpsim.mma.model.specials.
 *
 * AVX2 loop (issue 30; fused_group), used where the CPU has AVX2, impl() allows it and the inputs have
 * <= 12 significant bits, are normal float32 values and span <= 111 binades per operand (operand_shift):
 * steps 1-4 in float32 lanes (each product exact, Q_i one scaling and one truncating conversion) on a packed
 * B, step 5 as a mask on the double's bits where the result is a normal number of the output format; every
 * lane, a last partial vector on zero-padded copies. Where the CPU has AVX-512F, impl("auto") (or "avx512")
 * runs the same steps 16 lanes per zmm instead (fused_group512; its last 8-lane and partial vectors through the
 * AVX2 groups). The integer loop below is the reference beside them and runs everything else (dot mode,
 * other inputs, impl("scalar")).
 *
 * Vectorised over outputs (the inner loops run over N, contiguous, in 32-bit lanes), tiled (one tile of
 * MT x NT outputs is chained over all of K with the k x NT block of B in L1), and threaded over tiles on
 * worker threads kept between calls (_cpool.h), which take tiles from a shared counter, the GIL released. Every
 * output is computed by one thread from its own inputs only, so the bits do not depend on the thread count
 * or on which thread took a tile.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fenv.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cpool.h"

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES
#endif

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#else
#define HAVE_AVX2_PATH 0
#endif

#define ZERO_EXP (-20000) /* exponent of a zero (or non-finite) input: never wins E_max */
#define NT_MAX 256

typedef struct {
    int k, nblk, late, mbits_in, emin_in, neab, has_mel, mel, mb, rne, emin_out, emax_out, mbits_out, cs;
    int G, c0;
    int fsh; /* the AVX2 loop's operands are a 2**sa and b 2**sb (see operand_shift): fsh = sa + sb */
} prm_t;

typedef struct {
    /* decomposed inputs over the K range [k0, k1) (kr = k1 - k0 columns / rows) */
    const int32_t *ma, *ea; /* M x kr */
    const int32_t *mbv, *eb; /* kr x N */
    const float *af, *bf;    /* the same inputs as float32 (M x kr, kr x N) for the AVX2 path, or NULL */
    const double *A, *B;    /* the original values (M x Kp, Kp x N): only for special blocks */
    const float *A32, *B32; /* the same as float32 where the caller gave float32 and they were not widened */
    const uint8_t *fa;      /* M x nb: a row block holds a NaN/inf */
    const uint8_t *fb;      /* nb x N: a column block holds a NaN/inf */
    double *D;              /* M x N: the chain value, updated in place */
    Py_ssize_t M, N, Kp, k0, kr, nb;
    int MT, NT;
    const prm_t *p;
    Py_ssize_t ntiles, tiles_n, tiles_batch; /* tiles in all, per row of tiles, per batch entry */
    int nthreads, tid;
    Py_ssize_t *next; /* the next tile not yet taken (shared by the call's jobs) */
    int rowwise; /* dot mode: A is Kp x N like B (lane j pairs A[:, j] with B[:, j]); M = 1 */
    int w512;    /* the float32 loop in AVX-512 (fused_avx512) rather than AVX2 */
} job_t;

static inline int bitlen64(uint64_t a) { return a ? 64 - __builtin_clzll(a) : 0; }

static inline double pow2(int q)
{
    /* 2**q for -1022 <= q <= 1023 (the callers stay far inside) */
    uint64_t bits = (uint64_t)(q + 1023) << 52;
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* sign * a * 2**L rounded to mb fraction bits, quantum clamped at 2**(emin - mb), overflow -> inf; +0 for 0. */
static inline double round_int(int neg, uint64_t a, int L, int mb, int emin, int emax, int rne)
{
    if (a == 0)
        return 0.0;
    int nbits = bitlen64(a);
    int e = L + nbits - 1;
    int q = (e > emin ? e : emin) - mb;
    int r = q - L;
    uint64_t y;
    int qq;
    if (r <= 0) {
        y = a;
        qq = L;
        if (nbits + qq - 1 > emax)
            return neg ? -INFINITY : INFINITY;
        /* a < 2**(mb+1) here unless the value is exact with more bits: normalise to keep y small */
        double d = (double)y * pow2(qq);
        return neg ? -d : d;
    }
    if (r >= 64) {
        y = 0;
    } else {
        y = a >> r;
        if (rne) {
            uint64_t rem = a & ((((uint64_t)1) << r) - 1), half = ((uint64_t)1) << (r - 1);
            if (rem > half || (rem == half && (y & 1)))
                y++;
        }
    }
    if (y == 0)
        return 0.0;
    qq = q;
    if (bitlen64(y) + qq - 1 > emax)
        return neg ? -INFINITY : INFINITY;
    double d = (double)y * pow2(qq);
    return neg ? -d : d;
}

/* RNE of a double (an exact or innocuously rounded sum of two output-format values) to the output format. */
static inline double round_double(double s, const prm_t *p)
{
    if (!isfinite(s))
        return isnan(s) ? NAN : s; /* the NumPy path's canonical +NaN (x86 makes inf - inf negative) */
    if (s == 0.0)
        return 0.0;
    uint64_t bits;
    memcpy(&bits, &s, sizeof bits);
    int neg = (int)(bits >> 63);
    int ef = (int)((bits >> 52) & 0x7ff);
    uint64_t mant = bits & 0xfffffffffffffULL;
    int L;
    if (ef) {
        mant |= 1ULL << 52;
        L = ef - 1075;
    } else {
        L = -1074;
    }
    return round_int(neg, mant, L, p->mbits_out, p->emin_out, p->emax_out, 1);
}

/* Step 0 for one output and one block: 0 when neither the products nor c are special, else sets *val. */
static int block_special(const job_t *J, Py_ssize_t i, Py_ssize_t j, Py_ssize_t kb0, int klen, double c,
                         double *val)
{
    int n = isnan(c), pinf = c == INFINITY, minf = c == -INFINITY;
    for (int l = 0; l < klen; l++) {
        Py_ssize_t kk = kb0 + l;
        Py_ssize_t ia = J->rowwise ? kk * J->N + j : i * J->Kp + kk, ib = kk * J->N + j;
        double x = (J->A32 ? (double)J->A32[ia] : J->A[ia]) * (J->B32 ? (double)J->B32[ib] : J->B[ib]);
        n |= isnan(x);
        pinf |= x == INFINITY;
        minf |= x == -INFINITY;
    }
    if (!(n | pinf | minf))
        return 0;
    *val = (n || (pinf && minf)) ? NAN : (pinf ? INFINITY : -INFINITY);
    return 1;
}

static inline double bits2d(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static inline uint64_t d2bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

/* 2**q as a double for -1022 <= q <= 1023, branch-free (callers clamp) */
static inline double pow2v(int64_t q) { return bits2d((uint64_t)(q + 1023) << 52); }

/* trunc(x) for |x| < 2**31: the truncating conversion to int32 (vcvttpd2dq), exact and vectorisable */
static inline double trunc31(double x) { return (double)(int32_t)x; }

/* Pass 3 of block_row (RNE a compile-time constant in each copy, so that the loop has no branch).
 * |qc| < 2**(24 + neab) and |t| < 2**(mb + 2) stay below 2**31 (neab <= 6, mb <= 28: checked at the call). */
static inline __attribute__((always_inline)) void finish(const int32_t *emax, const double *acc, const double *cf,
                                                         double *cout, int nt, const prm_t *p, const int RNE)
{
    const int32_t sh0 = 23 + p->neab, emin = p->emin_out, mb = p->mb;
    const int64_t bigb = (int64_t)d2bits(pow2v(p->emax_out + 1));
    const double magic = 6755399441055744.0; /* 1.5 * 2**52: (t + magic) - magic = RNE(t) */
    for (int j = 0; j < nt; j++) {
        int32_t L = emax[j] - sh0;
        int32_t Lc = L > -1000 ? L : -1000;
        double qc = trunc31(cf[j] * pow2v(-Lc)); /* the addend on the grid 2**L, truncated */
        double sv = acc[j] + qc;                /* exact integer */
        int32_t es = (int32_t)(d2bits(sv) >> 52) & 0x7ff;
        int32_t e = es - 1023 + L;
        int32_t q = (e > emin ? e : emin) - mb;
        int32_t r = q - L;
        r = r < 0 ? 0 : (r > 60 ? 60 : r);
        double t = sv * pow2v(-r);
        t = RNE ? (t + magic) - magic : trunc31(t);
        int32_t qq = r + L;
        qq = qq < -1022 ? -1022 : (qq > 1023 ? 1023 : qq);
        double res = t * pow2v(qq);
        int64_t rb = (int64_t)d2bits(res);
        int64_t ov = -(int64_t)((rb & 0x7fffffffffffffffLL) >= bigb); /* overflow: the infinity of res's sign */
        rb = (rb & ~ov) | ((rb & (int64_t)0x8000000000000000ULL) | (0x7ff0000000000000LL & ov));
        cout[j] = bits2d((uint64_t)rb) + 0.0;
    }
}

/* Which pass 1-2 loop runs: 0 auto (the widest the CPU has), 1 scalar (the reference loop below, which the
 * compiler may still vectorise), 2 avx2, 3 avx512 (each refused where the CPU lacks it). Set by _cgemm.impl(). */
static int impl_mode = 0;

static int have_avx2(void)
{
#if HAVE_AVX2_PATH
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

static int have_avx512(void)
{
#if HAVE_AVX2_PATH
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* floats in the packed B of kr rows and N columns (pack_b): every 8-lane vector, the last one maybe partial */
static Py_ssize_t packed_b_size(Py_ssize_t kr, Py_ssize_t N, int k)
{
    return ((kr + k - 1) / k) * (((N + 7) / 8 + 1) / 2) * k * 24;
}

/* The AVX2 loop's view of one input value x (a float64 value of the input format, so exact in float32): its
 * decomposed exponent e = max(floor(log2|x|), emin) (ZERO_EXP for a zero or a non-finite x) and x as float32
 * (0 for those). *nf |= x is non-finite; *lo / *hi: the least / greatest floor(log2|x|) of the finite
 * non-zero values (operand_shift). Returns 1 where the AVX2 loop cannot take x: not a normal float32 (a
 * bf16 subnormal is a float32 subnormal). float32 values take lean8, eight at a time. */
static inline int lean_d(double x, int emin, int32_t *e, float *f, int *nf, int32_t *lo, int32_t *hi)
{
    int32_t ef = (int32_t)(d2bits(x) >> 52) & 0x7ff;
    int32_t t = ef - 1023, ex = t > emin ? t : emin;
    int zero = x == 0.0, inf_nan = ef == 0x7ff;
    int z = zero | inf_nan;
    *nf |= inf_nan;
    *e = z ? ZERO_EXP : ex;
    *f = z ? 0.0f : (float)x;
    int32_t tl = z ? 1000 : t, th = z ? -1000 : t;
    *lo = tl < *lo ? tl : *lo;
    *hi = th > *hi ? th : *hi;
    return (!z) & ((t < -126) | (t > 127));
}

/* Row segment x[0, n) of A (float64 values; n = kr, starting at a block boundary) for the AVX2 loop: its
 * exponents e and float32 values f, and fa[b] = 1 for each block b of k that holds a NaN or an infinity.
 * Returns 1 where the AVX2 loop cannot take a value (the caller then runs the integer loop on everything).
 * float32 rows take lean_row32_avx2. */
CLONES static int lean_row64(const double *x, Py_ssize_t n, int k, int emin, int32_t *e, float *f, uint8_t *fa,
                             int32_t *lo_, int32_t *hi_)
{
    int bad = 0;
    int32_t lo = *lo_, hi = *hi_;
    for (Py_ssize_t b0 = 0; b0 < n; b0 += k) {
        const Py_ssize_t b1 = b0 + k < n ? b0 + k : n;
        int nf = 0;
        for (Py_ssize_t i = b0; i < b1; i++)
            bad |= lean_d(x[i], emin, e + i, f + i, &nf, &lo, &hi);
        if (nf)
            fa[b0 / k] = 1;
    }
    *lo_ = lo;
    *hi_ = hi;
    return bad;
}

/* Row r of pair pv of pack_b's layout at o, one float64 value at a time (lean_d; zeros past kr and N). */
static inline int pack_row_scalar(const double *x, Py_ssize_t r, Py_ssize_t kr, Py_ssize_t N, Py_ssize_t pv,
                                  int emin, float *o, uint8_t *fb, int32_t *lo, int32_t *hi)
{
    int bad = 0;
    int16_t ex16[16];
    for (int t = 0; t < 16; t++) {
        Py_ssize_t j = pv * 16 + t;
        int32_t ex = ZERO_EXP;
        float f = 0.0f;
        if (r < kr && j < N) {
            int nf = 0;
            bad |= lean_d(x[r * N + j], emin, &ex, &f, &nf, lo, hi);
            fb[j] |= (uint8_t)nf;
        }
        ex16[t] = (int16_t)ex;
        o[8 + t] = f;
    }
    memcpy(o, ex16, sizeof ex16);
    return bad;
}

/* Block bi (rows [bi k, bi k + k) of [0, kr)) of B (x: the Kp x N float64 values from row k0 on; float32
 * values take pack_b32_avx2), packed for the AVX2 loop as [block][pair of 8-lane vectors][row in block][16
 * int16 exponents, 16 float32 values] (lean_d), so that a block's B for a group of lanes is one contiguous
 * run; rows past kr and lanes past N (the last vector may be partial, and a last odd vector has no pair)
 * are zeros (exponent ZERO_EXP). fb[j] = 1 for each column j whose block holds a NaN or an infinity. Returns 1
 * where the AVX2 loop cannot take a value. */
CLONES static int pack_b64(const double *x, Py_ssize_t kr, Py_ssize_t N, int k, int emin, Py_ssize_t bi,
                           float *out, uint8_t *fb, int32_t *lo, int32_t *hi)
{
    const Py_ssize_t npt = ((N + 7) / 8 + 1) / 2;
    int bad = 0;
    for (Py_ssize_t pv = 0; pv < npt; pv++)
        for (int l = 0; l < k; l++)
            bad |= pack_row_scalar(x, bi * k + l, kr, N, pv, emin, out + ((bi * npt + pv) * k + l) * 24, fb,
                                   lo, hi);
    return bad;
}



#if HAVE_AVX2_PATH
/* lean_d for eight float32 values v at once: e, f as there; nf, lo, hi accumulated per lane; returns the lanes
 * the AVX2 loop cannot take (float32 subnormals). */
__attribute__((target("avx2"), always_inline)) static inline __m256i lean8(__m256 v, __m256i emin, __m256i *e,
                                                                          __m256 *f, __m256i *nf, __m256i *lo,
                                                                          __m256i *hi)
{
    const __m256i u = _mm256_castps_si256(v), z0 = _mm256_setzero_si256();
    const __m256i ef = _mm256_and_si256(_mm256_srli_epi32(u, 23), _mm256_set1_epi32(0xff));
    const __m256i t = _mm256_sub_epi32(ef, _mm256_set1_epi32(127));
    const __m256i infnan = _mm256_cmpeq_epi32(ef, _mm256_set1_epi32(0xff));
    const __m256i zero = _mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), z0);
    const __m256i z = _mm256_or_si256(zero, infnan);
    *nf = _mm256_or_si256(*nf, infnan);
    *e = _mm256_blendv_epi8(_mm256_max_epi32(t, emin), _mm256_set1_epi32(ZERO_EXP), z);
    *f = _mm256_andnot_ps(_mm256_castsi256_ps(z), v);
    *lo = _mm256_min_epi32(*lo, _mm256_blendv_epi8(t, _mm256_set1_epi32(1000), z));
    *hi = _mm256_max_epi32(*hi, _mm256_blendv_epi8(t, _mm256_set1_epi32(-1000), z));
    return _mm256_andnot_si256(z, _mm256_cmpeq_epi32(ef, z0));
}

/* *lo_ = min(lanes of lo, lo_t), *hi_ = max(lanes of hi, hi_t) */
__attribute__((target("avx2"))) static void fold_range(__m256i lo, __m256i hi, int32_t lo_t, int32_t hi_t,
                                                      int32_t *lo_, int32_t *hi_)
{
    int32_t l8[8], h8[8];
    _mm256_storeu_si256((__m256i *)l8, lo);
    _mm256_storeu_si256((__m256i *)h8, hi);
    for (int i = 0; i < 8; i++) {
        lo_t = l8[i] < lo_t ? l8[i] : lo_t;
        hi_t = h8[i] > hi_t ? h8[i] : hi_t;
    }
    *lo_ = lo_t;
    *hi_ = hi_t;
}

/* The lane mask of the first n (0..8) of eight 32-bit lanes, for the masked loads and stores of short runs */
__attribute__((target("avx2"), always_inline)) static inline __m256i first_lanes(Py_ssize_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(n < 8 ? n : 8)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* lean_row for float32 values, eight at a time (the same results); a block's last few values with masked
 * loads and stores (the masked-off lanes read as zeros, which lean8 leaves out of every result) */
__attribute__((target("avx2"))) static int lean_row32_avx2(const float *x, Py_ssize_t n, int k, int emin, int32_t *e,
                                                          float *f, uint8_t *fa, int32_t *lo_, int32_t *hi_)
{
    const __m256i em = _mm256_set1_epi32(emin);
    __m256i lo = _mm256_set1_epi32(*lo_), hi = _mm256_set1_epi32(*hi_), bad = _mm256_setzero_si256();
    for (Py_ssize_t b0 = 0; b0 < n; b0 += k) {
        const Py_ssize_t b1 = b0 + k < n ? b0 + k : n;
        __m256i nfv = _mm256_setzero_si256();
        for (Py_ssize_t i = b0; i < b1; i += 8) {
            __m256i ev;
            __m256 fv;
            if (i + 8 <= b1) {
                bad = _mm256_or_si256(bad, lean8(_mm256_loadu_ps(x + i), em, &ev, &fv, &nfv, &lo, &hi));
                _mm256_storeu_si256((__m256i *)(e + i), ev);
                _mm256_storeu_ps(f + i, fv);
            } else {
                const __m256i m = first_lanes(b1 - i);
                bad = _mm256_or_si256(bad, lean8(_mm256_maskload_ps(x + i, m), em, &ev, &fv, &nfv, &lo, &hi));
                _mm256_maskstore_epi32((int *)(e + i), m, ev);
                _mm256_maskstore_ps(f + i, m, fv);
            }
        }
        if (!_mm256_testz_si256(nfv, nfv))
            fa[b0 / k] = 1;
    }
    fold_range(lo, hi, *lo_, *hi_, lo_, hi_);
    return !_mm256_testz_si256(bad, bad);
}

/* pack_b for float32 values, eight lanes at a time (the same results): a last partial pair of vectors with
 * masked loads (zeros past N), the rows past kr as zeros */
__attribute__((target("avx2"))) static int pack_b32_avx2(const float *x, Py_ssize_t kr, Py_ssize_t N, int k, int emin,
                                                        Py_ssize_t bi, float *out, uint8_t *fb, int32_t *lo_,
                                                        int32_t *hi_)
{
    const Py_ssize_t npt = ((N + 7) / 8 + 1) / 2;
    const __m256i em = _mm256_set1_epi32(emin), ez = _mm256_set1_epi16((int16_t)ZERO_EXP);
    __m256i lo = _mm256_set1_epi32(*lo_), hi = _mm256_set1_epi32(*hi_), bad = _mm256_setzero_si256();
    for (Py_ssize_t pv = 0; pv < npt; pv++) {
        const Py_ssize_t nl = N - pv * 16 < 16 ? N - pv * 16 : 16; /* lanes of this pair inside N */
        const __m256i m0 = first_lanes(nl), m1 = first_lanes(nl - 8);
        for (int l = 0; l < k; l++) {
            const Py_ssize_t r = bi * k + l;
            float *o = out + ((bi * npt + pv) * k + l) * 24;
            if (r >= kr) {
                _mm256_storeu_si256((__m256i *)o, ez);
                _mm256_storeu_ps(o + 8, _mm256_setzero_ps());
                _mm256_storeu_ps(o + 16, _mm256_setzero_ps());
                continue;
            }
            const float *xr = x + r * N + pv * 16;
            __m256i e0, e1, nfv = _mm256_setzero_si256();
            __m256 f0, f1;
            __m256 v0 = nl == 16 ? _mm256_loadu_ps(xr) : _mm256_maskload_ps(xr, m0);
            __m256 v1 = nl == 16 ? _mm256_loadu_ps(xr + 8) : _mm256_maskload_ps(xr + 8, m1);
            bad = _mm256_or_si256(bad, lean8(v0, em, &e0, &f0, &nfv, &lo, &hi));
            bad = _mm256_or_si256(bad, lean8(v1, em, &e1, &f1, &nfv, &lo, &hi));
            _mm256_storeu_si256((__m256i *)o, _mm256_permute4x64_epi64(_mm256_packs_epi32(e0, e1), 0xd8));
            _mm256_storeu_ps(o + 8, f0);
            _mm256_storeu_ps(o + 16, f1);
            if (!_mm256_testz_si256(nfv, nfv)) /* rare: the columns' NaN/inf flags */
                for (Py_ssize_t t = 0; t < nl; t++)
                    fb[pv * 16 + t] |= (uint8_t)!isfinite(xr[t]);
        }
    }
    fold_range(lo, hi, *lo_, *hi_, lo_, hi_);
    return !_mm256_testz_si256(bad, bad);
}
#endif

#if HAVE_AVX2_PATH
/* Pass 3 for a few lanes the general way (an output subnormal or an overflow: rare), out of line. */
__attribute__((noinline)) static void finish_lanes(const int32_t *emax, const double *acc, const double *cf,
                                                  double *cout, int n, const prm_t *p)
{
    if (p->rne)
        finish(emax, acc, cf, cout, n, p, 1);
    else
        finish(emax, acc, cf, cout, n, p, 0);
}

/* One block of NV (1, 2 or 4) 8-lane vectors of one row, all passes, the values kept in registers between them
 * (issue 30, second pass: the passes had been three loops through memory). Pass 0: the addend's exponent, as in
 * block_row. Passes 1-2 in float32 (the caller checks the conditions): inputs of <= 12 significant bits,
 * normal float32 values, scaled by 2**sa (A) and 2**sb (B) into exponents [-49, 62] (bfma_gemm and
 * operand_shift), so a*b is exact in float32 (<= 24 bits, >= 2**-98, < 2**126). Q_i = trunc(a b 2**(23 +
 * neab - E_max - sa - sb)) is the integer loop's sign * (|m_a m_b| 2**G >> (E_max - E_i + c0)) (same value:
 * both are the product truncated to the grid; E_max from the unscaled exponents); the scale S is a power of
 * two, so a*b*S is exact unless it is below 2**-126, and then < 1 and truncated to 0 either way.
 * |Q_i| < 2**(25 +
 * neab) <= 2**31, so vcvttps2dq (truncation) is exact; the int32 sums are widened every cs products as in the
 * integer loop. Per product row: one broadcast of a, then per vector a load, two multiplies, a conversion and
 * an add. q: the packed B of this block at the first pair of vectors (see pack_b): per pair of vectors, per
 * product row l, 16 int16 exponents then 16 float32 values, so that the block's B for a group of lanes is one
 * contiguous run. E_max is found in int16 lanes (16 outputs per instruction; the exponents of values fit, and
 * the saturating add keeps the zeros' ZERO_EXP sums, now -32768, below any real exponent). Pass 3 per
 * 4-lane chunk, a mask where the result is normal. cin/cout: the group's chain values (cout may be cin: each
 * chunk is read before it is written, and the rare general rounding takes its inputs from registers). The group's
 * non-finite addends go to cnf only when it has one (the caller keeps cnf zero otherwise); returns whether
 * it had one. */
__attribute__((target("avx2,fma"), always_inline)) static inline int
fused_group(const prm_t *p, const float *af, const int32_t *ea, const float *q, int k, int kpk,
            const double *cin, double *cout, double *cnf, const int NV, const int RNE)
{
    const int NP = (NV + 1) / 2; /* pairs */
    const int cs = p->cs;
    const int32_t floor_e = p->has_mel ? p->mel : ZERO_EXP * 4;
    __m256i em[4], ac[4], eh[2];
    __m256 sc[4];
    __m256d a0[4], a1[4];
    int anys = 0;
    /* pass 0: E_c (the binary32 exponent of a finite non-zero addend, at least -126), at least floor_e; a zero
     * addend (a chain value is never a double subnormal) gets floor_e alone, as in block_row: products may lie
     * below 2**-126 here; a non-finite one is redone. */
    {
        const __m256i e11 = _mm256_set1_epi32(0x7ff), bias = _mm256_set1_epi32(1023);
        const __m256i lofl = _mm256_set1_epi32(floor_e > -126 ? floor_e : -126);
        const __m256i flo = _mm256_set1_epi32(floor_e), z32 = _mm256_setzero_si256();
        __m256i spec = _mm256_setzero_si256();
        for (int u = 0; u < NV; u++) {
            __m256d c0 = _mm256_loadu_pd(cin + 8 * u), c1 = _mm256_loadu_pd(cin + 8 * u + 4);
            __m256i hi = _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castpd_ps(c0), _mm256_castpd_ps(c1), 0xdd));
            hi = _mm256_permute4x64_epi64(hi, 0xd8); /* the eight high words in lane order */
            __m256i ef = _mm256_and_si256(_mm256_srli_epi32(hi, 20), e11);
            em[u] = _mm256_blendv_epi8(_mm256_max_epi32(_mm256_sub_epi32(ef, bias), lofl), flo,
                                       _mm256_cmpeq_epi32(ef, z32));
            spec = _mm256_or_si256(spec, _mm256_cmpeq_epi32(ef, e11));
        }
        if (!_mm256_testz_si256(spec, spec)) { /* rare: record the group's non-finite addends */
            for (int j = 0; j < 8 * NV; j++)
                cnf[j] = isfinite(cin[j]) ? 0.0 : cin[j];
            anys = 1;
        }
        for (int h = 0; h < NP; h++) /* int16 lanes in order (floor_e and -80000 saturate to -32768) */
            eh[h] = _mm256_permute4x64_epi64(_mm256_packs_epi32(em[2 * h], NV > 1 ? em[2 * h + 1] : em[2 * h]), 0xd8);
    }
    /* pass 1: E_max = max(E_c or mel, ea + eb) */
    {
        const Py_ssize_t hstep = (Py_ssize_t)kpk * 24; /* from one pair's packed B to the next's */
        const float *ql = q;
#pragma GCC unroll 4
        for (int l = 0; l < k; l++, ql += 24) {
            const __m256i e = _mm256_set1_epi16((int16_t)ea[l]);
            for (int h = 0; h < NP; h++)
                eh[h] = _mm256_max_epi16(eh[h],
                                         _mm256_adds_epi16(e, _mm256_loadu_si256((const __m256i *)(ql + h * hstep))));
        }
    }
    {
        const __m256i sbias = _mm256_set1_epi32(127 + 23 + p->neab - p->fsh);
        const __m256i smax = _mm256_set1_epi32(254), smin = _mm256_set1_epi32(1);
        for (int h = 0; h < NP; h++) /* only a block of zeros has E_max < -900 (sum 0 whatever L is): then L
                                         * needs no clamp in pass 3 */
            eh[h] = _mm256_max_epi16(eh[h], _mm256_set1_epi16(-900));
        for (int u = 0; u < NV; u++) {
            __m128i half = (u & 1) ? _mm256_extracti128_si256(eh[u / 2], 1) : _mm256_castsi256_si128(eh[u / 2]);
            em[u] = _mm256_cvtepi16_epi32(half);
            /* S = 2**(23 + neab - E_max), its float32 exponent field clamped to the normal range */
            __m256i f = _mm256_sub_epi32(sbias, em[u]);
            f = _mm256_min_epi32(_mm256_max_epi32(f, smin), smax);
            sc[u] = _mm256_castsi256_ps(_mm256_slli_epi32(f, 23));
            a0[u] = a1[u] = _mm256_setzero_pd();
        }
    }
    /* pass 2: the truncated products, summed exactly (int32 chunks of cs, then doubles) */
    for (int l0 = 0; l0 < k; l0 += cs) {
        const int l1 = l0 + cs < k ? l0 + cs : k;
        for (int u = 0; u < NV; u++)
            ac[u] = _mm256_setzero_si256();
        const Py_ssize_t hstep = (Py_ssize_t)kpk * 24;
        const float *ql = q + (Py_ssize_t)l0 * 24 + 8; /* running pointers, not indices recomputed per row */
#pragma GCC unroll 2
        for (int l = l0; l < l1; l++, ql += 24) {
            const __m256 a = _mm256_set1_ps(af[l]);
            for (int u = 0; u < NV; u++) {
                __m256 b = _mm256_loadu_ps(ql + (u / 2) * hstep + 8 * (u & 1));
                __m256 pr = _mm256_mul_ps(_mm256_mul_ps(a, b), sc[u]);
                ac[u] = _mm256_add_epi32(ac[u], _mm256_cvttps_epi32(pr));
            }
        }
        for (int u = 0; u < NV; u++) {
            __m256d x0 = _mm256_cvtepi32_pd(_mm256_castsi256_si128(ac[u]));
            __m256d x1 = _mm256_cvtepi32_pd(_mm256_extracti128_si256(ac[u], 1));
            a0[u] = _mm256_add_pd(a0[u], x0);
            a1[u] = _mm256_add_pd(a1[u], x1);
        }
    }
    /* pass 3: add the truncated addend; y = (acc + qc) 2**L is exact in a double (|acc + qc| < 2**53,
     * 2**-1000 <= 2**L <= 2**1000). Where the result is a normal number of the output format (the common case),
     * rounding to mb fraction bits is a mask of y's low 52 - mb bits (RZ) or the carry trick below it (RNE),
     * four lanes at a time and without a branch; a 4-lane chunk with another case (an output subnormal, an
     * overflow) is redone by finish() */
    {
        const int drop = 52 - p->mb;
        const __m128i sh0 = _mm_set1_epi32(23 + p->neab);
        const __m256i bias = _mm256_set1_epi64x(1023), absm = _mm256_set1_epi64x(0x7fffffffffffffffLL);
        const __m256i keep = _mm256_set1_epi64x((int64_t)(~((1ULL << drop) - 1)));
        const __m256i halfm1 = _mm256_set1_epi64x((int64_t)((1ULL << (drop - 1)) - 1)), one = _mm256_set1_epi64x(1);
        const __m256i bigm1 = _mm256_set1_epi64x((int64_t)d2bits(pow2v(p->emax_out + 1)) - 1);
        const __m256i small = _mm256_set1_epi64x((int64_t)d2bits(pow2v(p->emin_out)) - 1);
        const __m256i zero = _mm256_setzero_si256();
        /* Where every lane's E_max lies inside [emin_out + 23 + neab, emax_out - 3 - bitlen(k)], no lane needs
         * the checks: the result is a multiple of 2**L, so 0 or at least 2**L >= 2**emin_out (normal); and its
         * magnitude is below k 2**(E_max + 2) + 2**(E_max + 1) < 2**(E_max + 3 + bitlen(k)) <= 2**emax_out
         * (each |a b| < 2**(ea + eb + 2), the addend < 2**(E_c + 1)), so even rounded up it stays below
         * 2**(emax_out + 1): no overflow. */
        int fast;
        {
            const int32_t lg = bitlen64((uint64_t)p->k);
            const __m256i elo = _mm256_set1_epi32(p->emin_out + 23 + p->neab - 1);
            const __m256i ehi = _mm256_set1_epi32(p->emax_out - 2 - lg);
            __m256i in = _mm256_set1_epi32(-1);
            for (int u = 0; u < NV; u++)
                in = _mm256_and_si256(in, _mm256_and_si256(_mm256_cmpgt_epi32(em[u], elo),
                                                           _mm256_cmpgt_epi32(ehi, em[u])));
            fast = _mm256_movemask_epi8(in) == -1;
        }
        /* unrolled: the chunks' long dependency chains overlap */
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++)
#pragma GCC unroll 2
            for (int hh = 0; hh < 2; hh++) {
                const int j = 8 * u + 4 * hh;
                __m128i e32 = hh ? _mm256_extracti128_si256(em[u], 1) : _mm256_castsi256_si128(em[u]);
                __m256i L = _mm256_cvtepi32_epi64(_mm_sub_epi32(e32, sh0)); /* in [-1000, 1000]: E_max >= -900 */
                __m256d pL = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(L, bias), 52));
                __m256d pnL = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_sub_epi64(bias, L), 52));
                /* the addend as it is: a zero gives qc = 0, and a lane with a non-finite addend is redone by the
                 * caller (block_special), so its value here does not matter */
                __m256d cf = _mm256_loadu_pd(cin + j);
                __m256d acc = hh ? a1[u] : a0[u];
                __m256d qc = _mm256_round_pd(_mm256_mul_pd(cf, pnL), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                __m256i yb = _mm256_castpd_si256(_mm256_mul_pd(_mm256_add_pd(acc, qc), pL));
                __m256i ay = _mm256_and_si256(yb, absm);
                __m256i rb =
                    RNE ? _mm256_add_epi64(yb, _mm256_add_epi64(halfm1, _mm256_and_si256(_mm256_srli_epi64(yb, drop), one)))
                        : yb;
                rb = _mm256_and_si256(rb, keep);
                if (fast) {
                    _mm256_storeu_pd(cout + j, _mm256_castsi256_pd(rb));
                    continue;
                }
                __m256i ok = _mm256_or_si256(_mm256_cmpeq_epi64(ay, zero), _mm256_cmpgt_epi64(ay, small));
                ok = _mm256_andnot_si256(_mm256_cmpgt_epi64(_mm256_and_si256(rb, absm), bigm1), ok);
                if (__builtin_expect(_mm256_movemask_pd(_mm256_castsi256_pd(ok)) == 0xf, 1)) {
                    _mm256_storeu_pd(cout + j, _mm256_castsi256_pd(rb));
                } else { /* rare: this chunk the general way, from the register values */
                    int32_t et[4];
                    double at[4], ct[4];
                    _mm_storeu_si128((__m128i *)et, e32);
                    _mm256_storeu_pd(at, acc);
                    _mm256_storeu_pd(ct, cf);
                    finish_lanes(et, at, ct, cout + j, 4, p);
                }
            }
    }
    return anys;
}

/* fused_avx2 for one rounding (RNE: 1 round to nearest even, 0 toward zero; a constant in each copy). q: the
 * packed B of the block at lane j0. A last partial vector (nt not a multiple of 8) runs with its pair's other
 * vector, if any, on copies padded with zeros (pack_b pads B there), and only its lanes are written back. */
__attribute__((target("avx2,fma"), always_inline)) static inline int
fused_row(const job_t *J, const float *af, const int32_t *ea, const float *q, int nt, int klen, const double *cin,
          double *cout, double *cnf, const int RNE)
{
    const int k = J->p->k;
    const int nfull = nt / 8, rem = nt % 8;
    /* full vectors before the tail group: all of them, or those before the partial vector's pair */
    const int nv = rem ? nfull & ~1 : nfull;
    int v = 0, s = 0;
    for (; v + 4 <= nv; v += 4)
        s |= fused_group(J->p, af, ea, q + (Py_ssize_t)(v / 2) * k * 24, klen, k, cin + 8 * v, cout + 8 * v,
                         cnf + 8 * v, 4, RNE);
    for (; v + 2 <= nv; v += 2)
        s |= fused_group(J->p, af, ea, q + (Py_ssize_t)(v / 2) * k * 24, klen, k, cin + 8 * v, cout + 8 * v,
                         cnf + 8 * v, 2, RNE);
    if (v < nv)
        s |= fused_group(J->p, af, ea, q + (Py_ssize_t)(v / 2) * k * 24, klen, k, cin + 8 * v, cout + 8 * v,
                         cnf + 8 * v, 1, RNE);
    if (rem) { /* v = nv, even: the pair of the partial vector */
        const int n = nt - 8 * v, NV = n > 8 ? 2 : 1;
        double ti[16] = {0.0}, to[16], tn[16];
        memcpy(ti, cin + 8 * v, sizeof(double) * (size_t)n);
        const float *qv = q + (Py_ssize_t)(v / 2) * k * 24;
        int sp = NV == 2 ? fused_group(J->p, af, ea, qv, klen, k, ti, to, tn, 2, RNE)
                         : fused_group(J->p, af, ea, qv, klen, k, ti, to, tn, 1, RNE);
        memcpy(cout + 8 * v, to, sizeof(double) * (size_t)n);
        if (sp)
            memcpy(cnf + 8 * v, tn, sizeof(double) * (size_t)n);
        s |= sp;
    }
    return s;
}

/* The packed B (pack_b) of the block of products at kl (a multiple of k), from lane j0 (a multiple of 16) on. */
static inline const float *packed_block(const job_t *J, Py_ssize_t kl, Py_ssize_t j0)
{
    const int k = J->p->k;
    const Py_ssize_t npt = ((J->N + 7) / 8 + 1) / 2; /* pairs of 8-lane vectors per row of blocks */
    return J->bf + ((kl / k) * npt + j0 / 16) * (Py_ssize_t)k * 24;
}

/* Lanes [j0, j0 + nt) of row i, the block of klen products whose packed B is q (packed_block), all passes
 * (fused_group). Returns whether an addend was non-finite (cnf as fused_group). */
__attribute__((target("avx2,fma"))) static int fused_avx2(const job_t *J, const float *af, const int32_t *ea,
                                                         const float *q, int nt, int klen, const double *cin,
                                                         double *cout, double *cnf)
{
    if (J->p->rne)
        return fused_row(J, af, ea, q, nt, klen, cin, cout, cnf, 1);
    return fused_row(J, af, ea, q, nt, klen, cin, cout, cnf, 0);
}

/* fused_group in AVX-512 (issue 30, sixth pass), the same steps and bits: NZ (1 or 2) zmm vectors of 16 lanes,
 * each one pair of pack_b's layout (its 16 float32 values are one load), so that passes 0, 2 and 3 take half the
 * instructions of the AVX2 loop; pass 1 stays in int16 ymm lanes (16 outputs per instruction already). The
 * addend exponents narrow with vpmovqd / vpmovsdw (saturating, as packs), which keep lane order. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline int
fused_group512(const prm_t *p, const float *af, const int32_t *ea, const float *q, int k, int kpk,
               const double *cin, double *cout, double *cnf, const int NZ, const int RNE)
{
    const int cs = p->cs;
    const int32_t floor_e = p->has_mel ? p->mel : ZERO_EXP * 4;
    const Py_ssize_t hstep = (Py_ssize_t)kpk * 24; /* from one pair's packed B to the next's */
    __m512i em[4], ac[4];
    __m256i eh[4];
    __m512 sc[4];
    __m512d a0[4], a1[4];
    int anys = 0;
    /* pass 0: E_c, at least floor_e (see fused_group) */
    {
        const __m512i e11 = _mm512_set1_epi64(0x7ff);
        const __m512i bias = _mm512_set1_epi32(1023), lofl = _mm512_set1_epi32(floor_e > -126 ? floor_e : -126);
        const __m512i flo = _mm512_set1_epi32(floor_e), f11 = _mm512_set1_epi32(0x7ff);
        __mmask16 spec = 0;
        for (int z = 0; z < NZ; z++) {
            __m512i b0 = _mm512_castpd_si512(_mm512_loadu_pd(cin + 16 * z));
            __m512i b1 = _mm512_castpd_si512(_mm512_loadu_pd(cin + 16 * z + 8));
            b0 = _mm512_and_si512(_mm512_srli_epi64(b0, 52), e11); /* the exponent fields */
            b1 = _mm512_and_si512(_mm512_srli_epi64(b1, 52), e11);
            __m512i ef = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(b0)),
                                            _mm512_cvtepi64_epi32(b1), 1);
            em[z] = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(ef, _mm512_setzero_si512()),
                                            _mm512_max_epi32(_mm512_sub_epi32(ef, bias), lofl), flo);
            spec |= _mm512_cmpeq_epi32_mask(ef, f11);
            eh[z] = _mm512_cvtsepi32_epi16(em[z]); /* int16 lanes in order (floor_e, -80000 saturate to -32768) */
        }
        if (spec) { /* rare: record the group's non-finite addends */
            for (int j = 0; j < 16 * NZ; j++)
                cnf[j] = isfinite(cin[j]) ? 0.0 : cin[j];
            anys = 1;
        }
    }
    /* pass 1: E_max = max(E_c or mel, ea + eb) */
    {
        const float *ql = q;
#pragma GCC unroll 4
        for (int l = 0; l < k; l++, ql += 24) {
            const __m256i e = _mm256_set1_epi16((int16_t)ea[l]);
            for (int z = 0; z < NZ; z++)
                eh[z] = _mm256_max_epi16(eh[z],
                                         _mm256_adds_epi16(e, _mm256_loadu_si256((const __m256i *)(ql + z * hstep))));
        }
    }
    {
        const __m512i sbias = _mm512_set1_epi32(127 + 23 + p->neab - p->fsh);
        const __m512i smax = _mm512_set1_epi32(254), smin = _mm512_set1_epi32(1);
        for (int z = 0; z < NZ; z++) {
            em[z] = _mm512_cvtepi16_epi32(_mm256_max_epi16(eh[z], _mm256_set1_epi16(-900)));
            __m512i f = _mm512_min_epi32(_mm512_max_epi32(_mm512_sub_epi32(sbias, em[z]), smin), smax);
            sc[z] = _mm512_castsi512_ps(_mm512_slli_epi32(f, 23));
            a0[z] = a1[z] = _mm512_setzero_pd();
        }
    }
    /* pass 2: the truncated products, summed exactly (int32 chunks of cs, then doubles) */
    for (int l0 = 0; l0 < k; l0 += cs) {
        const int l1 = l0 + cs < k ? l0 + cs : k;
        for (int z = 0; z < NZ; z++)
            ac[z] = _mm512_setzero_si512();
        const float *ql = q + (Py_ssize_t)l0 * 24 + 8;
#pragma GCC unroll 4
        for (int l = l0; l < l1; l++, ql += 24) {
            const __m512 a = _mm512_set1_ps(af[l]);
            for (int z = 0; z < NZ; z++) {
                __m512 pr = _mm512_mul_ps(_mm512_mul_ps(a, _mm512_loadu_ps(ql + z * hstep)), sc[z]);
                ac[z] = _mm512_add_epi32(ac[z], _mm512_cvttps_epi32(pr));
            }
        }
        for (int z = 0; z < NZ; z++) {
            a0[z] = _mm512_add_pd(a0[z], _mm512_cvtepi32_pd(_mm512_castsi512_si256(ac[z])));
            a1[z] = _mm512_add_pd(a1[z], _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(ac[z], 1)));
        }
    }
    /* pass 3: as fused_group's, eight lanes at a time */
    {
        const int drop = 52 - p->mb;
        const __m256i sh0 = _mm256_set1_epi32(23 + p->neab);
        const __m512i bias = _mm512_set1_epi64(1023), absm = _mm512_set1_epi64(0x7fffffffffffffffLL);
        const __m512i keep = _mm512_set1_epi64((int64_t)(~((1ULL << drop) - 1)));
        const __m512i halfm1 = _mm512_set1_epi64((int64_t)((1ULL << (drop - 1)) - 1)), one = _mm512_set1_epi64(1);
        const __m512i bigm1 = _mm512_set1_epi64((int64_t)d2bits(pow2v(p->emax_out + 1)) - 1);
        const __m512i small = _mm512_set1_epi64((int64_t)d2bits(pow2v(p->emin_out)) - 1);
        int fast;
        {
            const int32_t lg = bitlen64((uint64_t)p->k);
            const __m512i elo = _mm512_set1_epi32(p->emin_out + 23 + p->neab - 1);
            const __m512i ehi = _mm512_set1_epi32(p->emax_out - 2 - lg);
            fast = 1;
            for (int z = 0; z < NZ; z++)
                fast &= (_mm512_cmpgt_epi32_mask(em[z], elo) & _mm512_cmpgt_epi32_mask(ehi, em[z])) == 0xffff;
        }
#pragma GCC unroll 4
        for (int z = 0; z < NZ; z++)
#pragma GCC unroll 2
            for (int hh = 0; hh < 2; hh++) {
                const int j = 16 * z + 8 * hh;
                __m256i e32 = hh ? _mm512_extracti64x4_epi64(em[z], 1) : _mm512_castsi512_si256(em[z]);
                __m512i L = _mm512_cvtepi32_epi64(_mm256_sub_epi32(e32, sh0));
                __m512d pL = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(L, bias), 52));
                __m512d pnL = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_sub_epi64(bias, L), 52));
                __m512d cf = _mm512_loadu_pd(cin + j);
                __m512d acc = hh ? a1[z] : a0[z];
                __m512d qc = _mm512_roundscale_pd(_mm512_mul_pd(cf, pnL), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                __m512i yb = _mm512_castpd_si512(_mm512_mul_pd(_mm512_add_pd(acc, qc), pL));
                __m512i rb = yb;
                if (RNE)
                    rb = _mm512_add_epi64(yb, _mm512_add_epi64(halfm1,
                                                               _mm512_and_si512(_mm512_srli_epi64(yb, drop), one)));
                rb = _mm512_and_si512(rb, keep);
                if (fast) {
                    _mm512_storeu_pd(cout + j, _mm512_castsi512_pd(rb));
                    continue;
                }
                __m512i ay = _mm512_and_si512(yb, absm);
                __mmask8 ok = _mm512_cmpeq_epi64_mask(ay, _mm512_setzero_si512()) | _mm512_cmpgt_epi64_mask(ay, small);
                ok &= (__mmask8)~_mm512_cmpgt_epi64_mask(_mm512_and_si512(rb, absm), bigm1);
                if (__builtin_expect(ok == 0xff, 1)) {
                    _mm512_storeu_pd(cout + j, _mm512_castsi512_pd(rb));
                } else { /* rare: these lanes the general way, from the register values */
                    int32_t et[8];
                    double at[8], ct[8];
                    _mm256_storeu_si256((__m256i *)et, e32);
                    _mm512_storeu_pd(at, acc);
                    _mm512_storeu_pd(ct, cf);
                    finish_lanes(et, at, ct, cout + j, 8, p);
                }
            }
    }
    return anys;
}

/* fused_row with the AVX-512 groups: 32 and 16 lanes; a last 8-lane vector and a partial one as in fused_row. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline int
fused_row512(const job_t *J, const float *af, const int32_t *ea, const float *q, int nt, int klen,
             const double *cin, double *cout, double *cnf, const int RNE)
{
    const int k = J->p->k;
    const int nfull = nt / 8, rem = nt % 8;
    const int nv = rem ? nfull & ~1 : nfull;
    int v = 0, s = 0;
    for (; v + 8 <= nv; v += 8)
        s |= fused_group512(J->p, af, ea, q + (Py_ssize_t)(v / 2) * k * 24, klen, k, cin + 8 * v, cout + 8 * v,
                            cnf + 8 * v, 4, RNE);
    for (; v + 4 <= nv; v += 4)
        s |= fused_group512(J->p, af, ea, q + (Py_ssize_t)(v / 2) * k * 24, klen, k, cin + 8 * v, cout + 8 * v,
                            cnf + 8 * v, 2, RNE);
    for (; v + 2 <= nv; v += 2)
        s |= fused_group512(J->p, af, ea, q + (Py_ssize_t)(v / 2) * k * 24, klen, k, cin + 8 * v, cout + 8 * v,
                            cnf + 8 * v, 1, RNE);
    if (v < nt / 8 || rem) /* the rest: the AVX2 groups (one vector, or the partial vector's pair) */
        s |= fused_row(J, af, ea, q + (Py_ssize_t)(v / 2) * k * 24, nt - 8 * v, klen, cin + 8 * v, cout + 8 * v,
                       cnf + 8 * v, RNE);
    return s;
}

/* fused_avx2 with the AVX-512 groups (fused_row512) */
__attribute__((target("avx512f,avx2,fma"))) static int fused_avx512(const job_t *J, const float *af,
                                                                   const int32_t *ea, const float *q, int nt,
                                                                   int klen, const double *cin, double *cout,
                                                                   double *cnf)
{
    if (J->p->rne)
        return fused_row512(J, af, ea, q, nt, klen, cin, cout, cnf, 1);
    return fused_row512(J, af, ea, q, nt, klen, cin, cout, cnf, 0);
}
#endif

/* One block of k products for row i and lanes [j0, j0+nt): cout[j] := BFMA(products, addend cin[j]).
 * cnf[j] receives the non-finite addends (0 elsewhere); returns whether there was one. cout may be cin.
 * Pass 3 works in doubles that hold integers exactly (|S| < 2**51): the sum, its exponent (from its bits),
 * the power-of-two scalings and the RZ (trunc) / RNE (magic-number) rounding are exact and vectorise. */
CLONES static int block_row(const job_t *J, Py_ssize_t i, Py_ssize_t j0, int nt, Py_ssize_t kl, int klen,
                            const double *cin, double *cout, double *cnf)
{
    const prm_t *p = J->p;
    const int k = klen, c0 = p->c0, cs = p->cs; /* klen < k only for a last, partial block (zeros need no work) */
    int32_t emax[NT_MAX];
    int32_t acc32[NT_MAX];
    double acc[NT_MAX];
    double cf[NT_MAX];
    const int32_t floor_e = p->has_mel ? p->mel : ZERO_EXP * 4;
    int anyspec = 0;
    const int32_t *ma = J->ma + i * J->kr + kl;
    const int32_t *ea = J->ea + i * J->kr + kl;
#if HAVE_AVX2_PATH
    if (J->af) { /* every lane in the fused float32 loop (k: klen here) */
        const float *af = J->af + i * J->kr + kl, *q = packed_block(J, kl, j0);
        return J->w512 ? fused_avx512(J, af, ea, q, nt, k, cin, cout, cnf)
                       : fused_avx2(J, af, ea, q, nt, k, cin, cout, cnf);
    }
#endif
    /* pass 0: the addend's binary32 exponent (chain values are never double subnormals) */
    for (int j = 0; j < nt; j++) {
        double c = cin[j];
        uint64_t bits = d2bits(c);
        int32_t ef = (int32_t)((bits >> 52) & 0x7ff);
        int nf = ef == 0x7ff;
        int fin = !nf && ef != 0;
        anyspec |= nf;
        cnf[j] = nf ? c : 0.0;
        cf[j] = fin ? c : 0.0;
        int32_t ec = ef - 1023 > -126 ? ef - 1023 : -126;
        int32_t em = fin ? ec : ZERO_EXP * 4;
        emax[j] = em > floor_e ? em : floor_e;
    }
    if (J->rowwise) { /* dot: both factors per lane */
        for (int l = 0; l < k; l++) {
            const int32_t *eal = J->ea + (kl + l) * J->N + j0;
            const int32_t *ebl = J->eb + (kl + l) * J->N + j0;
            for (int j = 0; j < nt; j++) {
                int32_t e = eal[j] + ebl[j];
                emax[j] = e > emax[j] ? e : emax[j];
            }
        }
        for (int j = 0; j < nt; j++)
            acc[j] = 0.0;
        for (int l0 = 0; l0 < k; l0 += cs) {
            int l1 = l0 + cs < k ? l0 + cs : k;
            for (int j = 0; j < nt; j++)
                acc32[j] = 0;
            for (int l = l0; l < l1; l++) {
                const int32_t *mal = J->ma + (kl + l) * J->N + j0, *eal = J->ea + (kl + l) * J->N + j0;
                const int32_t *mbl = J->mbv + (kl + l) * J->N + j0, *ebl = J->eb + (kl + l) * J->N + j0;
                for (int j = 0; j < nt; j++) {
                    int32_t m = mal[j] * mbl[j];
                    int32_t sh = emax[j] - eal[j] - ebl[j] + c0;
                    sh = sh < 31 ? sh : 31;
                    int32_t s = m >> 31;
                    int32_t am = (m ^ s) - s;
                    acc32[j] += ((am >> sh) ^ s) - s;
                }
            }
            for (int j = 0; j < nt; j++)
                acc[j] += (double)acc32[j];
        }
        goto pass3;
    }
    /* pass 1: E_max */
    for (int l = 0; l < k; l++) {
        const int32_t eai = ea[l];
        const int32_t *ebl = J->eb + (kl + l) * J->N + j0;
        for (int j = 0; j < nt; j++) {
            int32_t e = eai + ebl[j];
            emax[j] = e > emax[j] ? e : emax[j];
        }
    }
    /* pass 2: truncated products, summed exactly (int32 chunks that cannot overflow, then doubles) */
    for (int j = 0; j < nt; j++)
        acc[j] = 0.0;
    for (int l0 = 0; l0 < k; l0 += cs) {
        int l1 = l0 + cs < k ? l0 + cs : k;
        for (int j = 0; j < nt; j++)
            acc32[j] = 0;
        for (int l = l0; l < l1; l++) {
            const int32_t mai = ma[l], eai = ea[l] - c0;
            const int32_t *mbl = J->mbv + (kl + l) * J->N + j0;
            const int32_t *ebl = J->eb + (kl + l) * J->N + j0;
            for (int j = 0; j < nt; j++) {
                int32_t m = mai * mbl[j];
                int32_t sh = emax[j] - eai - ebl[j];
                sh = sh < 31 ? sh : 31;
                int32_t s = m >> 31;
                int32_t am = (m ^ s) - s;
                acc32[j] += ((am >> sh) ^ s) - s;
            }
        }
        for (int j = 0; j < nt; j++)
            acc[j] += (double)acc32[j];
    }
pass3:;
    /* pass 3: add the truncated addend, round to mb bits, store */
    if (p->rne)
        finish(emax, acc, cf, cout, nt, p, 1);
    else
        finish(emax, acc, cf, cout, nt, p, 0);
    return anyspec;
}

static void run_tile(const job_t *JB, Py_ssize_t t)
{
    /* the batch entry of tile t: the same job with its matrices' pointers moved there */
    job_t Jl = *JB;
    const job_t *J = &Jl;
    {
        Py_ssize_t bt = t / JB->tiles_batch;
        t -= bt * JB->tiles_batch;
        Py_ssize_t M = JB->M, N = JB->N, Kp = JB->Kp, kr = JB->kr, nb = JB->nb;
        Jl.ma += bt * M * kr; Jl.ea += bt * M * kr; Jl.mbv += bt * kr * N; Jl.eb += bt * kr * N;
        if (Jl.af) {
            Jl.af += bt * M * kr;
            Jl.bf += bt * packed_b_size(kr, N, JB->p->k);
        }
        if (Jl.A32)
            Jl.A32 += bt * M * Kp;
        else
            Jl.A += bt * M * Kp;
        if (Jl.B32)
            Jl.B32 += bt * Kp * N;
        else
            Jl.B += bt * Kp * N;
        Jl.fa += bt * M * nb; Jl.fb += bt * nb * N; Jl.D += bt * M * N;
    }
    const prm_t *p = J->p;
    Py_ssize_t ti = t / J->tiles_n, tj = t % J->tiles_n;
    Py_ssize_t i0 = ti * J->MT, i1 = i0 + J->MT < J->M ? i0 + J->MT : J->M;
    Py_ssize_t j0 = tj * J->NT;
    int nt = (int)(j0 + J->NT < J->N ? J->NT : J->N - j0);
    const int k = p->k, ki = k * p->nblk;
    double cnf[NT_MAX], zero[NT_MAX], blk[NT_MAX];
    for (int j = 0; j < nt; j++)
        zero[j] = cnf[j] = 0.0; /* cnf stays zero between blocks (the AVX2 loop writes it only for specials) */
    for (Py_ssize_t kl = 0; kl < J->kr; kl += ki) {
        /* special value bookkeeping: does a column block (or, in dot mode, an A block) of this tile hold a
         * NaN/inf? Only then are the lanes scanned one by one (block_special). */
        int colany[2] = {0, 0};
        for (int b = 0; b < p->nblk; b++) {
            Py_ssize_t bi = (J->k0 + kl + (Py_ssize_t)b * k) / k;
            const uint8_t *fbrow = J->fb + bi * J->N + j0;
            for (int j = 0; j < nt; j++)
                colany[b] |= fbrow[j];
            if (J->rowwise) {
                const uint8_t *farow = J->fa + bi * J->N + j0;
                for (int j = 0; j < nt; j++)
                    colany[b] |= farow[j];
            }
        }
        for (Py_ssize_t i = i0; i < i1; i++) {
            double *d = J->D + i * J->N + j0;
            const double *cin = p->late ? zero : d;
            for (int b = 0; b < p->nblk; b++) {
                Py_ssize_t kb = kl + (Py_ssize_t)b * k;
                int klen = (int)(J->kr - kb < k ? J->kr - kb : k);
                double *cout = (b == p->nblk - 1 && !p->late) ? d : blk;
                /* cnf: the non-finite addends (cout may be cin) */
                int cspec = block_row(J, i, j0, nt, kb, klen, cin, cout, cnf);
                Py_ssize_t bi = (J->k0 + kb) / k;
                int rowspec = J->rowwise ? 0 : J->fa[i * J->nb + bi];
                if (rowspec || colany[b] || cspec) {
                    const uint8_t *farow = J->rowwise ? J->fa + bi * J->N + j0 : NULL;
                    const uint8_t *fbrow = J->fb + bi * J->N + j0;
                    for (int j = 0; j < nt; j++) {
                        if (rowspec || fbrow[j] || (farow && farow[j]) || (cspec && cnf[j] != 0.0)) {
                            double v;
                            if (block_special(J, i, j0 + j, J->k0 + kb, klen, cnf[j], &v))
                                cout[j] = v;
                        }
                    }
                    if (cspec)
                        for (int j = 0; j < nt; j++)
                            cnf[j] = 0.0;
                }
                cin = cout;
            }
            if (p->late) {
                for (int j = 0; j < nt; j++)
                    d[j] = round_double(blk[j] + d[j], p) + 0.0;
            }
        }
    }
}

/* Threads for `ntiles` tiles: at least 1, at most one per tile and 64. */
static int clamp_threads(int n, Py_ssize_t ntiles)
{
    if (n > ntiles)
        n = (int)ntiles;
    if (n > 64)
        n = 64;
    return n < 1 ? 1 : n;
}

/* Tiles from a shared counter, not a fixed share: a worker that starts late (woken from sleep, which on a
 * virtual machine can take longer than a small GEMM) leaves its tiles to the threads already running, instead
 * of making the call wait for it. Every tile's outputs come from its own inputs only: the bits never depend
 * on which thread took it. */
static void *worker(void *arg)
{
    job_t *J = (job_t *)arg;
    for (Py_ssize_t t; (t = __atomic_fetch_add(J->next, 1, __ATOMIC_RELAXED)) < J->ntiles;)
        run_tile(J, t);
    return NULL;
}

/* x = m * 2**(e - mbits) with e = max(floor(log2|x|), emin); m pre-shifted by G; zero / non-finite: m = 0.
 * The inputs are values of a format inside binary32's range, so never double subnormals: floor(log2|x|) is
 * the double's exponent field, and the scaling by a power of two and the conversion to int32 are exact. */
CLONES static void decompose(const double *x, Py_ssize_t n, int mbits, int emin, int G, int32_t *m, int32_t *e)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = x[i];
        int32_t ef = (int32_t)(d2bits(v) >> 52) & 0x7ff;
        int ok = ef != 0 && ef != 0x7ff;
        int32_t ex = ef - 1023;
        ex = ex > emin ? ex : emin;
        double sc = ok ? v * pow2v(mbits - ex + G) : 0.0;
        m[i] = (int32_t)sc;
        e[i] = ok ? ex : ZERO_EXP;
    }
}

static int use_avx2(void) { return impl_mode != 1 && have_avx2(); }
static int use_avx512(void) { return impl_mode == 3 || (impl_mode == 0 && have_avx512()); }

static PyObject *impl(PyObject *self, PyObject *args)
{
    (void)self;
    const char *name = NULL;
    static const char *names[] = {"auto", "scalar", "avx2", "avx512"};
    if (!PyArg_ParseTuple(args, "|s", &name))
        return NULL;
    const char *was = names[impl_mode];
    if (name) {
        int m = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(name, names[i]))
                m = i;
        if (m < 0) {
            PyErr_Format(PyExc_ValueError, "impl: unknown loop %R; valid: 'auto', 'scalar', 'avx2', 'avx512'",
                         PyTuple_GET_ITEM(args, 0));
            return NULL;
        }
        if (m == 2 && !have_avx2()) {
            PyErr_SetString(PyExc_ValueError, "impl: 'avx2' needs an x86-64 CPU with AVX2 (this one has none)");
            return NULL;
        }
        if (m == 3 && !have_avx512()) {
            PyErr_SetString(PyExc_ValueError, "impl: 'avx512' needs an x86-64 CPU with AVX-512F (this one has none)");
            return NULL;
        }
        impl_mode = m;
    }
    return PyUnicode_FromString(was);
}

/* The inputs' preparation outside dot mode, split over threads: A by rows, B by blocks of k rows of Kp, so
 * that every flag byte and packed block is written by one thread. With af set (the AVX2 loop): A's exponents
 * and float32 copies, B packed (lean_row, pack_b), straight from the caller's float32 or float64 values; bad
 * is set where a value does not suit that loop. Else the integer loop's decomposition of the float64 values. */
typedef struct {
    const double *A, *B;     /* float64 values (the integer loop) */
    const void *Ar, *Br;     /* the caller's values, float32 where a32 / b32 (the AVX2 loop) */
    int a32, b32;
    int32_t *ma, *ea, *mbv, *eb;
    uint8_t *fa, *fb;
    float *af, *bf; /* NULL: the integer loop */
    Py_ssize_t M, N, Kp, k0, kr, nb, nbatch;
    const prm_t *p;
    int nthreads, tid, bad;
    int32_t lo_a, hi_a, lo_b, hi_b; /* the AVX2 loop's exponent ranges (lean_d, lean8), this thread's share */
    int sa, sb;                     /* scale_worker: the scalings */
} prep_t;

static void *prep_worker(void *arg)
{
    prep_t *P = (prep_t *)arg;
    const prm_t *p = P->p;
    const Py_ssize_t M = P->M, N = P->N, Kp = P->Kp, k0 = P->k0, kr = P->kr, nb = P->nb;
    const int k = p->k;
    const size_t sa = P->a32 ? sizeof(float) : sizeof(double), sb = P->b32 ? sizeof(float) : sizeof(double);
    for (Py_ssize_t bt = 0; bt < P->nbatch; bt++) {
        int32_t *ea = P->ea + bt * M * kr;
        uint8_t *fa = P->fa + bt * M * nb, *fb = P->fb + bt * nb * N;
        if (P->af) { /* set only where the AVX2 loop runs (bfma_gemm) */
#if HAVE_AVX2_PATH
            const char *a = (const char *)P->Ar + sa * (size_t)(bt * M * Kp);
            const char *b = (const char *)P->Br + sb * (size_t)(bt * Kp * N);
            float *af = P->af + bt * M * kr, *bf = P->bf + bt * packed_b_size(kr, N, k);
            for (Py_ssize_t i = P->tid; i < M; i += P->nthreads) { /* k0 is a multiple of k */
                const Py_ssize_t o = i * Kp + k0;
                P->bad |= P->a32 ? lean_row32_avx2((const float *)a + o, kr, k, p->emin_in, ea + i * kr, af + i * kr,
                                                   fa + i * nb + k0 / k, &P->lo_a, &P->hi_a)
                                 : lean_row64((const double *)a + o, kr, k, p->emin_in, ea + i * kr, af + i * kr,
                                              fa + i * nb + k0 / k, &P->lo_a, &P->hi_a);
            }
            for (Py_ssize_t bi = P->tid; bi < (kr + k - 1) / k; bi += P->nthreads)
                P->bad |= P->b32 ? pack_b32_avx2((const float *)b + k0 * N, kr, N, k, p->emin_in, bi, bf,
                                                 fb + (k0 / k + bi) * N, &P->lo_b, &P->hi_b)
                                 : pack_b64((const double *)b + k0 * N, kr, N, k, p->emin_in, bi, bf,
                                            fb + (k0 / k + bi) * N, &P->lo_b, &P->hi_b);
#endif
            continue;
        }
        const double *a = P->A + bt * M * Kp, *b = P->B + bt * Kp * N;
        int32_t *ma = P->ma + bt * M * kr;
        int32_t *mbv = P->mbv + bt * kr * N, *eb = P->eb + bt * kr * N;
        for (Py_ssize_t i = P->tid; i < M; i += P->nthreads) {
            decompose(a + i * Kp + k0, kr, p->mbits_in, p->emin_in, p->G, ma + i * kr, ea + i * kr);
            for (Py_ssize_t kk = 0; kk < Kp; kk++)
                if (!isfinite(a[i * Kp + kk]))
                    fa[i * nb + kk / k] = 1;
        }
        for (Py_ssize_t bi = P->tid; bi < nb; bi += P->nthreads) {
            Py_ssize_t r0 = bi * k, r1 = r0 + k < Kp ? r0 + k : Kp;
            for (Py_ssize_t kk = r0; kk < r1; kk++)
                for (Py_ssize_t j = 0; j < N; j++)
                    if (!isfinite(b[kk * N + j]))
                        fb[bi * N + j] = 1;
            Py_ssize_t d0 = r0 > k0 ? r0 : k0, d1 = r1 < k0 + kr ? r1 : k0 + kr;
            if (d0 < d1)
                decompose(b + d0 * N, (d1 - d0) * N, p->mbits_in, p->emin_in, 0, mbv + (d0 - k0) * N, eb + (d0 - k0) * N);
        }
    }
    return NULL;
}

/* The float32 loop needs each product a*b exact and the scale S of fused_group a normal float32, which holds
 * where every operand's exponents lie in [-49, 62] (products in [2**-98, 2**126): S <= 2**127 wherever a
 * product is non-zero, and S >= 2**-126 wherever one can reach 1). Operands outside it but spanning at most
 * 111 binades are scaled by a power of two into it (gradients of 2**-48, say): the loop then multiplies
 * a 2**sa by b 2**sb and scales by S 2**-(sa + sb), the same exact value. *s: the scaling for [lo, hi] (the
 * least and greatest exponent; lo > hi: no non-zero value); returns 0 where the span is too wide. */
static int operand_shift(int32_t lo, int32_t hi, int *s)
{
    *s = 0;
    if (lo > hi || (lo >= -49 && hi <= 62))
        return 1;
    if (hi - lo > 111)
        return 0;
    *s = -49 - lo;
    return 1;
}

/* A's float32 copies times 2**sa and the values of the packed B times 2**sb (exact: into the normal range),
 * split as prep_worker splits them. */
static void *scale_worker(void *arg)
{
    prep_t *P = (prep_t *)arg;
    const Py_ssize_t M = P->M, kr = P->kr;
    const int k = P->p->k;
    const double fa = ldexp(1.0, P->sa), fb = ldexp(1.0, P->sb); /* |sa|, |sb| may exceed float32's range */
    const Py_ssize_t nblk = (kr + k - 1) / k, per = packed_b_size(kr, P->N, k) / (nblk ? nblk : 1);
    for (Py_ssize_t bt = 0; bt < P->nbatch; bt++) {
        float *af = P->af + bt * M * kr, *bf = P->bf + bt * packed_b_size(kr, P->N, k);
        if (P->sa)
            for (Py_ssize_t i = P->tid; i < M; i += P->nthreads)
                for (Py_ssize_t l = 0; l < kr; l++)
                    af[i * kr + l] = (float)((double)af[i * kr + l] * fa);
        if (P->sb)
            for (Py_ssize_t bi = P->tid; bi < nblk; bi += P->nthreads)
                for (Py_ssize_t r = bi * per; r < (bi + 1) * per; r += 24) /* [16 int16 exponents, 16 values] */
                    for (int t = 8; t < 24; t++)
                        bf[r + t] = (float)((double)bf[r + t] * fb);
    }
    return NULL;
}

/* float32 -> float64 (exact) */
CLONES static void widen(const void *src, Py_ssize_t n, double *dst)
{
    const float *x = (const float *)src;
    for (Py_ssize_t i = 0; i < n; i++)
        dst[i] = (double)x[i];
}

/* One cached work buffer for bfma_gemm, reused from call to call so that a run of GEMMs does not fault in and
 * clear fresh pages every time (10 MiB at 512^2). Taken and given back with the GIL held; a call that finds it
 * taken (another thread inside bfma_gemm) or needs more than ARENA_MAX bytes gets a buffer of its own. */
#define ARENA_MAX ((size_t)48 << 20)
static char *arena_buf = NULL;
static size_t arena_size = 0;
static int arena_busy = 0;

static char *arena_take(size_t n)
{
    if (arena_busy || n > ARENA_MAX)
        return malloc(n ? n : 1);
    if (arena_size < n) {
        free(arena_buf);
        arena_size = 0;
        arena_buf = malloc(n);
        if (!arena_buf)
            return NULL;
        arena_size = n;
    }
    arena_busy = 1;
    return arena_buf;
}

static void arena_give(char *b)
{
    if (b && b == arena_buf)
        arena_busy = 0;
    else
        free(b);
}

static PyObject *bfma_gemm(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer A, B, D;
    Py_ssize_t M, N, Kp, k0, k1;
    prm_t p;
    int nthreads, MT, NT, rowwise;
    Py_ssize_t nbatch;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnnn(iiiiiiiiiiiiii)iiiin", &A, &B, &D, &M, &N, &Kp, &k0, &k1, &p.k,
                          &p.nblk, &p.late, &p.mbits_in, &p.emin_in, &p.neab, &p.has_mel, &p.mel, &p.mb,
                          &p.rne, &p.emin_out, &p.emax_out, &p.mbits_out, &p.cs, &nthreads, &MT, &NT, &rowwise, &nbatch))
        return NULL;
    const char *why = NULL;
    int ki = p.k * p.nblk;
    if (rowwise && (M != 1 || nbatch != 1))
        why = "dot mode needs M = 1 and one batch entry (A is Kp x N)";
    else if (M < 0 || N < 0 || Kp < 0 || nbatch < 1 ||
             (A.len != (Py_ssize_t)sizeof(double) * nbatch * (rowwise ? N : M) * Kp &&
              A.len != (Py_ssize_t)sizeof(float) * nbatch * (rowwise ? N : M) * Kp) ||
             (B.len != (Py_ssize_t)sizeof(double) * nbatch * Kp * N &&
              B.len != (Py_ssize_t)sizeof(float) * nbatch * Kp * N) ||
             D.len != (Py_ssize_t)sizeof(double) * nbatch * M * N)
        why = "buffer sizes do not match nbatch, M, N, Kp (A and B float64 or float32, D float64, C order)";
    else if (p.k < 1 || p.k > 4096 || (p.nblk != 1 && p.nblk != 2) || k0 < 0 || k1 > Kp || k0 > k1 ||
             k0 % ki || (p.nblk == 2 && (Kp % ki || k1 % ki)) || (k1 % ki && k1 != Kp))
        why = "bad block size or K range";
    else if (p.mbits_in < 0 || p.mbits_in > 23 || p.neab < -23 || p.neab > 6 || p.mb < 0 || p.mb > 28 || p.mbits_out < 0 || p.mbits_out > 30 ||
             p.cs < 1)
        why = "bad format parameters";
    else if (NT < 1 || NT > NT_MAX || MT < 1)
        why = "bad tile shape";
    if (why) {
        PyBuffer_Release(&A); PyBuffer_Release(&B); PyBuffer_Release(&D);
        PyErr_Format(PyExc_ValueError, "bfma_gemm: %s", why);
        return NULL;
    }
    p.G = 23 + p.neab - 2 * p.mbits_in;
    if (p.G < 0)
        p.G = 0;
    p.c0 = 2 * p.mbits_in - 23 - p.neab;
    if (p.c0 < 0)
        p.c0 = 0;
    p.fsh = 0;
    Py_ssize_t kr = k1 - k0, nb = (Kp + p.k - 1) / p.k; /* a last partial block (nblk = 1 only) */
    int err = 0;
    if (M == 0 || N == 0 || kr == 0) {
        PyBuffer_Release(&A); PyBuffer_Release(&B); PyBuffer_Release(&D);
        Py_RETURN_NONE;
    }
    /* The buffers (decomposed inputs, NaN/inf flags, the AVX2 loop's float32 copies) in one block: the
     * module's cached one where free and large enough (taken and given back under the GIL), else a fresh one. */
    Py_ssize_t na = rowwise ? kr * N : M * kr;
    const int want_f32 = !rowwise && p.mbits_in <= 11 && (NT % 16 == 0 || N <= NT) && use_avx2();
    /* float32 operands (the training runtime's values) are widened into the work buffer here, which saves
     * the caller a float64 copy of its own (an allocation and fresh pages per call) */
    const Py_ssize_t nA = nbatch * (rowwise ? N : M) * Kp, nB = nbatch * Kp * N;
    const int a32 = A.len != (Py_ssize_t)sizeof(double) * nA, b32 = B.len != (Py_ssize_t)sizeof(double) * nB;
    size_t off[11];
    {
        size_t sz[10] = {sizeof(int32_t) * (size_t)(na * nbatch), sizeof(int32_t) * (size_t)(na * nbatch),
                        sizeof(int32_t) * (size_t)(kr * N * nbatch), sizeof(int32_t) * (size_t)(kr * N * nbatch),
                        (size_t)((rowwise ? nb * N : M * nb) * nbatch), (size_t)(nb * N * nbatch),
                        want_f32 ? sizeof(float) * (size_t)(M * kr * nbatch) : 0,
                        want_f32 ? sizeof(float) * (size_t)(packed_b_size(kr, N, p.k) * nbatch + 1) : 0,
                         a32 ? sizeof(double) * (size_t)nA : 0, b32 ? sizeof(double) * (size_t)nB : 0};
        off[0] = 0;
        for (int t = 0; t < 10; t++)
            off[t + 1] = off[t] + ((sz[t] + 63) & ~(size_t)63);
    }
    char *buf = arena_take(off[10]);
    Py_BEGIN_ALLOW_THREADS
    int caller_mode = fegetround(); /* the rounding steps assume round to nearest; threads inherit it */
    fesetround(FE_TONEAREST);
    float *af32 = NULL, *bf32 = NULL;
    const double *Ad = (const double *)A.buf, *Bd = (const double *)B.buf;
    int32_t *ma = NULL, *ea = NULL, *mbv = NULL, *eb = NULL;
    uint8_t *fa = NULL, *fb = NULL;
    if (!buf) {
        err = 1;
    } else {
        ma = (int32_t *)(buf + off[0]); ea = (int32_t *)(buf + off[1]);
        mbv = (int32_t *)(buf + off[2]); eb = (int32_t *)(buf + off[3]);
        fa = (uint8_t *)(buf + off[4]); fb = (uint8_t *)(buf + off[5]);
        memset(fa, 0, off[6] - off[4]);
        int lean = 0;
        if (want_f32) { /* the AVX2 loop where its conditions hold (see fused_group; tiles start at pairs of
                         * vectors), prepared straight from the caller's values */
            af32 = (float *)(buf + off[6]);
            bf32 = (float *)(buf + off[7]);
            prep_t pj[64];
            int np = clamp_threads(nthreads, M > nb ? M : nb);
            for (int t = 0; t < np; t++)
                pj[t] = (prep_t){NULL, NULL, A.buf, B.buf, a32, b32, ma, ea, mbv, eb, fa, fb, af32, bf32,
                                 M, N, Kp, k0, kr, nb, nbatch, &p, np, t, 0, 1000, -1000, 1000, -1000, 0, 0};
            fpsim_pool_run(prep_worker, pj, sizeof pj[0], np);
            lean = 1;
            int32_t lo_a = 1000, hi_a = -1000, lo_b = 1000, hi_b = -1000;
            for (int t = 0; t < np; t++) {
                lean &= !pj[t].bad;
                lo_a = pj[t].lo_a < lo_a ? pj[t].lo_a : lo_a;
                hi_a = pj[t].hi_a > hi_a ? pj[t].hi_a : hi_a;
                lo_b = pj[t].lo_b < lo_b ? pj[t].lo_b : lo_b;
                hi_b = pj[t].hi_b > hi_b ? pj[t].hi_b : hi_b;
            }
            int sa = 0, sb = 0;
            lean = lean && operand_shift(lo_a, hi_a, &sa) && operand_shift(lo_b, hi_b, &sb);
            p.fsh = sa + sb;
            if (lean && (sa || sb)) {
                for (int t = 0; t < np; t++) {
                    pj[t].sa = sa;
                    pj[t].sb = sb;
                }
                fpsim_pool_run(scale_worker, pj, sizeof pj[0], np);
            }
            if (!lean) { /* a value out of the AVX2 loop's range: the integer loop on everything (same bits) */
                af32 = bf32 = NULL;
                memset(fa, 0, off[6] - off[4]);
            }
        }
        /* the integer loop (and the special blocks) take float64 values: float32 operands (the training
         * runtime's) are widened into the work buffer, which saves the caller a float64 copy of its own */
        if (a32 && !lean) {
            double *w = (double *)(buf + off[8]);
            widen(A.buf, nA, w);
            Ad = w;
        }
        if (b32 && !lean) {
            double *w = (double *)(buf + off[9]);
            widen(B.buf, nB, w);
            Bd = w;
        }
        if (!rowwise && !lean) {
            prep_t pj[64];
            int np = clamp_threads(nthreads, M > nb ? M : nb);
            for (int t = 0; t < np; t++)
                pj[t] = (prep_t){Ad, Bd, NULL, NULL, 0, 0, ma, ea, mbv, eb, fa, fb, NULL, NULL,
                                 M, N, Kp, k0, kr, nb, nbatch, &p, np, t, 0};
            fpsim_pool_run(prep_worker, pj, sizeof pj[0], np);
        }
      for (Py_ssize_t bt = 0; bt < nbatch && rowwise; bt++) { /* dot mode: A is Kp x N like B */
        const double *a = Ad, *b = Bd;
        int32_t *ma_ = ma, *ea_ = ea, *mbv_ = mbv, *eb_ = eb;
        uint8_t *fa_ = fa, *fb_ = fb;
        decompose(a + k0 * N, kr * N, p.mbits_in, p.emin_in, p.G, ma_, ea_);
        for (Py_ssize_t kk = 0; kk < Kp; kk++)
            for (Py_ssize_t j = 0; j < N; j++)
                if (!isfinite(a[kk * N + j]))
                    fa_[(kk / p.k) * N + j] = 1;
        decompose(b + k0 * N, kr * N, p.mbits_in, p.emin_in, 0, mbv_, eb_);
        for (Py_ssize_t kk = 0; kk < Kp; kk++)
            for (Py_ssize_t j = 0; j < N; j++)
                if (!isfinite(b[kk * N + j]))
                    fb_[(kk / p.k) * N + j] = 1;
      }
        job_t base;
        base.ma = ma; base.ea = ea; base.mbv = mbv; base.eb = eb;
        base.af = af32; base.bf = bf32;
        base.A = Ad; base.B = Bd; /* the caller's float32 values where lean left them unwidened */
        base.A32 = a32 && lean ? (const float *)A.buf : NULL;
        base.B32 = b32 && lean ? (const float *)B.buf : NULL;
        base.fa = fa; base.fb = fb; base.D = (double *)D.buf;
        base.M = M; base.N = N; base.Kp = Kp; base.k0 = k0; base.kr = kr; base.nb = nb;
        base.MT = MT; base.NT = NT; base.p = &p; base.rowwise = rowwise;
        base.w512 = af32 && use_avx512();
        Py_ssize_t tm = (M + MT - 1) / MT, tn = (N + NT - 1) / NT;
        base.tiles_n = tn;
        base.tiles_batch = tm * tn;
        base.ntiles = tm * tn * nbatch;
        nthreads = clamp_threads(nthreads, base.ntiles);
        Py_ssize_t next_tile = 0;
        base.next = &next_tile;
        job_t jobs[64];
        for (int t = 0; t < nthreads; t++) {
            jobs[t] = base;
            jobs[t].nthreads = nthreads;
            jobs[t].tid = t;
        }
        /* job 0 here, the rest on the pool's workers, each taking tiles until none is left (worker) */
        fpsim_pool_run(worker, jobs, sizeof jobs[0], nthreads);
    }
    fesetround(caller_mode);
    Py_END_ALLOW_THREADS
    arena_give(buf);
    PyBuffer_Release(&A); PyBuffer_Release(&B); PyBuffer_Release(&D);
    if (err)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------------------
 * Generic models (fpsim.mma.model.generic_reduce): "wide" (d := d + a_i b_i in float64, index order, one RNE
 * to the output at the end) and "fma_chain" (d := RNE_acc(a_i b_i + d), one correct rounding per product).
 * Products of inputs of at most 26 bits are exact in float64; the exact sum p + d of fma_chain is s + e
 * (TwoSum), and RNE of s + e to acc differs from RNE(s) only when s is a midpoint of acc's grid (midpoints of a
 * format of <= 25 bits lie on the double grid): there the sign of e decides. NaN and infinities follow IEEE.
 * ------------------------------------------------------------------------------------------------------- */

typedef struct {
    int kind; /* 0 wide, 1 fma_chain, 2 pairwise */
    int acc_m, acc_emin, acc_emax, out_m, out_emin, out_emax;
} gprm_t;

/* RNE of the exact value s + e (|e| <= ulp(s)/2, e = 0 when s is exact) to mbits fraction bits, exponent range
 * [emin, emax], overflow to inf; non-finite s passes through. Branch-free (vectorises). */
static inline double rne_fmt(double s, double e, int32_t mbits, int32_t emin, int64_t bigb)
{
    const double magic = 6755399441055744.0;
    const int64_t half = (int64_t)d2bits(0.5), mhalf = (int64_t)d2bits(-0.5);
    int64_t sb = (int64_t)d2bits(s);
    int32_t ef = (int32_t)(sb >> 52) & 0x7ff;
    int32_t es = ef - 1023;
    int32_t q = (es > emin ? es : emin) - mbits;
    double r = s * pow2v(-q);
    double rr = (r + magic) - magic;
    int64_t db = (int64_t)d2bits(r - rr);
    int64_t eb = (int64_t)d2bits(e);
    int64_t epos = -(int64_t)(eb > 0), eneg = -(int64_t)(eb < 0 && (eb & 0x7fffffffffffffffLL) != 0);
    int64_t up = -(int64_t)(db == half) & epos, dn = -(int64_t)(db == mhalf) & eneg;
    double rup = rr + 1.0, rdn = rr - 1.0;
    int64_t rrb = ((int64_t)d2bits(rup) & up) | ((int64_t)d2bits(rdn) & dn) | ((int64_t)d2bits(rr) & ~(up | dn));
    double res = bits2d((uint64_t)rrb) * pow2v(q);
    int64_t rb = (int64_t)d2bits(res);
    int64_t ov = -(int64_t)((rb & 0x7fffffffffffffffLL) >= bigb);
    rb = (rb & ~ov) | ((rb & (int64_t)0x8000000000000000ULL) | (0x7ff0000000000000LL & ov));
    int64_t nf = -(int64_t)(ef == 0x7ff);
    return bits2d((uint64_t)((rb & ~nf) | (sb & nf)));
}

CLONES static void generic_rows(const double *A, const double *B, double *D, Py_ssize_t i0, Py_ssize_t i1,
                                Py_ssize_t j0, int nt, Py_ssize_t K, Py_ssize_t N, const gprm_t *g)
{
    const int32_t am = g->acc_m, aemin = g->acc_emin;
    const int64_t abig = (int64_t)d2bits(pow2v(g->acc_emax + 1));
    for (Py_ssize_t l = 0; l < K; l++) {
        const double *brow = B + l * N + j0;
        for (Py_ssize_t i = i0; i < i1; i++) {
            const double ai = A[i * K + l];
            double *d = D + i * N + j0;
            if (g->kind == 0) {
                for (int j = 0; j < nt; j++)
                    d[j] = d[j] + ai * brow[j];
            } else {
                for (int j = 0; j < nt; j++) {
                    double p = ai * brow[j], dj = d[j];
                    double sm = p + dj;
                    double bb = sm - p;
                    double er = (p - (sm - bb)) + (dj - bb);
                    d[j] = rne_fmt(sm, er, am, aemin, abig);
                }
            }
        }
    }
}

/* pairwise: products rounded to acc, summed by the bottom-up pairwise tree of fpsim.mma.model.generic_reduce
 * (adjacent pairs level by level, an odd last element carried up), then C added, all RNE in acc. The tree is
 * built streaming with a stack of perfect blocks (merged when two of the same level meet); the blocks left at
 * the end (the binary digits of K) are merged from the top, which is the same tree. K is the same for every
 * lane, so the stack's shape is too: the merges run over all lanes at once. */
#define PW_DEPTH 64
CLONES static void pairwise_row(const double *arow, const double *B, double *d, Py_ssize_t j0, int nt,
                                Py_ssize_t K, Py_ssize_t N, const gprm_t *g, double (*st)[NT_MAX])
{
    const int32_t am = g->acc_m, aemin = g->acc_emin;
    const int64_t abig = (int64_t)d2bits(pow2v(g->acc_emax + 1));
    int lev[PW_DEPTH];
    int top = 0;
    for (Py_ssize_t l = 0; l < K; l++) {
        const double ai = arow[l];
        const double *brow = B + l * N + j0;
        double *cur = st[top];
        for (int j = 0; j < nt; j++)
            cur[j] = rne_fmt(ai * brow[j], 0.0, am, aemin, abig);
        lev[top++] = 0;
        while (top >= 2 && lev[top - 1] == lev[top - 2]) {
            double *x = st[top - 2], *y = st[top - 1];
            for (int j = 0; j < nt; j++)
                x[j] = rne_fmt(x[j] + y[j], 0.0, am, aemin, abig);
            lev[top - 2]++;
            top--;
        }
    }
    while (top >= 2) {
        double *x = st[top - 2], *y = st[top - 1];
        for (int j = 0; j < nt; j++)
            x[j] = rne_fmt(x[j] + y[j], 0.0, am, aemin, abig);
        top--;
    }
    for (int j = 0; j < nt; j++)
        d[j] = rne_fmt((top ? st[0][j] : 0.0) + d[j], 0.0, am, aemin, abig);
}

CLONES static void generic_out(double *d, int nt, const gprm_t *g)
{
    const int64_t obig = (int64_t)d2bits(pow2v(g->out_emax + 1));
    for (int j = 0; j < nt; j++)
        d[j] = rne_fmt(d[j], 0.0, g->out_m, g->out_emin, obig) + 0.0;
}

typedef struct {
    const double *A, *B;
    double *D;
    Py_ssize_t M, N, K, ntiles, tiles_n;
    int MT, NT, nthreads, tid, err;
    const gprm_t *g;
} gjob_t;

static void *gworker(void *arg)
{
    gjob_t *J = (gjob_t *)arg;
    for (Py_ssize_t t = J->tid; t < J->ntiles; t += J->nthreads) {
        Py_ssize_t ti = t / J->tiles_n, tj = t % J->tiles_n;
        Py_ssize_t i0 = ti * J->MT, i1 = i0 + J->MT < J->M ? i0 + J->MT : J->M;
        Py_ssize_t j0 = tj * J->NT;
        int nt = (int)(j0 + J->NT < J->N ? J->NT : J->N - j0);
        if (J->g->kind == 2) {
            double(*st)[NT_MAX] = malloc(sizeof(double) * PW_DEPTH * NT_MAX);
            if (!st) {
                J->err = 1;
                return NULL;
            }
            for (Py_ssize_t i = i0; i < i1; i++)
                pairwise_row(J->A + i * J->K, J->B, J->D + i * J->N + j0, j0, nt, J->K, J->N, J->g, st);
            free(st);
        } else {
            generic_rows(J->A, J->B, J->D, i0, i1, j0, nt, J->K, J->N, J->g);
        }
        for (Py_ssize_t i = i0; i < i1; i++)
            generic_out(J->D + i * J->N + j0, nt, J->g);
    }
    return NULL;
}

static PyObject *generic_gemm(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer A, B, D;
    Py_ssize_t M, N, K;
    gprm_t g;
    int nthreads, MT, NT;
    if (!PyArg_ParseTuple(args, "y*y*w*nnn(iiiiiii)iii", &A, &B, &D, &M, &N, &K, &g.kind, &g.acc_m, &g.acc_emin,
                          &g.acc_emax, &g.out_m, &g.out_emin, &g.out_emax, &nthreads, &MT, &NT))
        return NULL;
    const char *why = NULL;
    if (M < 0 || N < 0 || K < 0 || A.len != (Py_ssize_t)sizeof(double) * M * K ||
        B.len != (Py_ssize_t)sizeof(double) * K * N || D.len != (Py_ssize_t)sizeof(double) * M * N)
        why = "buffer sizes do not match M, N, K (float64, C order)";
    else if (g.kind < 0 || g.kind > 2 || g.acc_m < 1 || g.acc_m > 24 || g.out_m < 1 || g.out_m > 24 ||
             g.acc_emin < -1000 || g.out_emin < -1000 || g.acc_emax > 1000 || g.out_emax > 1000)
        why = "bad model parameters";
    else if (NT < 1 || NT > NT_MAX || MT < 1)
        why = "bad tile shape";
    if (why) {
        PyBuffer_Release(&A); PyBuffer_Release(&B); PyBuffer_Release(&D);
        PyErr_Format(PyExc_ValueError, "generic_gemm: %s", why);
        return NULL;
    }
    int err = 0;
    if (M && N) {
        Py_BEGIN_ALLOW_THREADS
        int caller_mode = fegetround(); /* the rounding steps assume round to nearest; threads inherit it */
        fesetround(FE_TONEAREST);
        gjob_t base;
        base.A = (const double *)A.buf; base.B = (const double *)B.buf; base.D = (double *)D.buf;
        base.M = M; base.N = N; base.K = K; base.MT = MT; base.NT = NT; base.g = &g;
        base.tiles_n = (N + NT - 1) / NT;
        base.ntiles = ((M + MT - 1) / MT) * base.tiles_n;
        nthreads = clamp_threads(nthreads, base.ntiles);
        gjob_t jobs[64];
        for (int t = 0; t < nthreads; t++) {
            jobs[t] = base;
            jobs[t].nthreads = nthreads;
            jobs[t].tid = t;
            jobs[t].err = 0;
        }
        fpsim_pool_run(gworker, jobs, sizeof jobs[0], nthreads);
        for (int t = 0; t < nthreads; t++)
            err |= jobs[t].err;
        fesetround(caller_mode);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&A); PyBuffer_Release(&B); PyBuffer_Release(&D);
    if (err)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bfma_gemm", bfma_gemm, METH_VARARGS,
     "bfma_gemm(A, B, D, M, N, Kp, k0, k1, params, nthreads, MT, NT, rowwise, nbatch): chain D (nbatch x M x N "
     "float64, in place) through the BFMA blocks of A[:, :, k0:k1] @ B[:, k0:k1, :] (float64 or float32 each, told "
     "apart by the buffer's size; C order); "
     "rowwise: M = 1, nbatch = 1, A is Kp x N and D[j] chains sum_k A[k, j] * B[k, j] (dot)."},
    {"impl", impl, METH_VARARGS,
     "impl([name]): the previous choice of the block-FMA GEMM's inner loop, then sets it to name if given: 'auto' "
     "(AVX2 where the CPU has it and the inputs allow: at most 12 significant bits, normal float32 values, each "
     "operand's exponents within 111 binades), "
     "'scalar' (the integer reference loop) or 'avx2' (as auto; ValueError without AVX2). The bits are the same."},
    {"generic_gemm", generic_gemm, METH_VARARGS,
     "generic_gemm(A, B, D, M, N, K, params, nthreads, MT, NT): D (M x N float64, the addends, in place) "
     "through the generic 'wide' or 'fma_chain' model of A @ B, then rounded to the output format."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_cgemm",
                                    "Compiled block-FMA and generic GEMMs (see fpsim/mma/gemm.py).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cgemm(void)
{
    fpsim_pool_init();
    PyObject *m = PyModule_Create(&moddef);
    /* bfma_gemm takes float32 operands (and widens them itself): fpsim/mma/gemm.py passes them only then */
    if (m && PyModule_AddIntConstant(m, "FLOAT32_OPERANDS", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
