/* Compiled hot paths of fpsim's arithmetic layer (issue 17, section 2): no rounding kernel lives here.
 *
 *   fma_ro(a, b, c, out, in32, mode[, cast32])
 *                                      RO53(a*b + c) per element: the round-to-odd float64 of the exact
 *                                      fused multiply-add, from two hardware FMAs rounded upward and
 *                                      downward (equal: exact; else truncate and set the last bit). With a
 *                                      float32 `out` the RO53 value is cast to float32 in `mode` (0 rne,
 *                                      1 rtz, 2 rup, 3 rdn): one correct rounding into fp32 (Boldo and
 *                                      Melquiond's round-to-odd theorem, 53 >= 24 + 2); cast32=1 stores
 *                                      that float32 rounding in a float64 out.
 *   pairwise_rne(x, out, n, m, in32, kind, p, emin, emax)
 *                                      fpsim.sum(order="pairwise") over axis 0 of an (n, m) array for
 *                                      round-to-nearest-even into an IEEE-style format with p <= 25,
 *                                      infinity, NaN, subnormals and signed zeros (fp32, fp16, bf16, e5m2):
 *                                      the leaves rounded into the format, then the tree of accumulate.py
 *                                      (node j of level k covers terms [j 2^k, (j+1) 2^k)), each node
 *                                      RN(a + b) computed in float64 and rounded once (exact: 53 >= 2p + 2).
 *   encode(vals, out, in32, params)    the bit patterns of values already representable in a format.
 *   analyze_block(b, r, in32, min_normal, max)   (b, r both float32 with in32=1, else both float64)
 *                                      the counts and error maxima of fpsim.analyze for one block.
 *   gelu_u(x, u, c1, c2), gelu_out(x, t, out), gelu_grad(dout, x, t, out, k3, c2)
 *                                      GELU's float32 passes of fpsim.nn.layers (all but tanh): each value
 *                                      through the same float32 operations in the same order as the NumPy
 *                                      code there, in one pass instead of five to eleven.
 *
 * The NumPy code in arith.py, accumulate.py, bits.py, rounding.py and nn/layers.py stays the reference and fallback
 * (module flags fpsim.arith.use_c_arith and friends); tests/test_hotpaths.py checks these bit for bit
 * against it. Built with -frounding-math (fma_ro switches the rounding mode), -ffp-contract=off and
 * -fno-trapping-math (no code here reads or traps on the exception flags; it lets GCC if-convert and vectorize).
 * Every function releases the GIL. encode, encode_table and analyze_block share a block among threads (the
 * caller passes fpsim.rounding.max_threads' count); the others run on the caller's thread. Results never
 * depend on the thread count. Loops are cloned for AVX-512F, AVX2 (FMA for fma_ro) and baseline x86-64.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_csink.h"

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define FMA_CLONES __attribute__((target_clones("fma", "default")))
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FMA_CLONES
#define CLONES
#endif

static inline uint64_t bits_of(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
static inline double from_bits(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }
static inline uint32_t bits_of_f(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float from_bits_f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* Run fn on jobs[0..k) (each of size `size` bytes): job 0 on the caller's thread, the others on the
 * module's worker threads kept between calls (_cpool.h), which take the caller's floating-point environment
 * (rounding mode, flush controls). */
#ifndef _WIN32
#include "_cpool.h"
#define HAVE_POOL 1
static void run_jobs(void *(*fn)(void *), void *jobs, size_t size, int k) { fpsim_pool_run(fn, jobs, size, k); }
#else
static void run_jobs(void *(*fn)(void *), void *jobs, size_t size, int k)
{
    for (int t = 0; t < k; t++) fn((char *)jobs + t * size);
}
#endif

#define WCH 65536 /* elements per chunk of shared work */

#define CANON_NAN64 0x7ff8000000000000ULL
#define CANON_NAN32 0x7fc00000U

/* ------------------------------------------------------------------------------------------ fma_ro */

#define FBLK 2048 /* elements per block: two fesetround calls per pass over a block (they cost ~100 cycles) */

FMA_CLONES __attribute__((noinline)) static void fma_ro_block(const void *a, const void *b, const void *c,
                                                               Py_ssize_t o, Py_ssize_t m, int in32,
                                                               double *ro)
{
    double ru[FBLK], rd[FBLK];
    fesetround(FE_UPWARD);
    if (in32) {
        const float *A = (const float *)a + o, *B = (const float *)b + o, *C = (const float *)c + o;
        for (Py_ssize_t i = 0; i < m; i++)
            ru[i] = fma((double)A[i], (double)B[i], (double)C[i]);
        fesetround(FE_DOWNWARD);
        for (Py_ssize_t i = 0; i < m; i++)
            rd[i] = fma((double)A[i], (double)B[i], (double)C[i]);
    } else {
        const double *A = (const double *)a + o, *B = (const double *)b + o, *C = (const double *)c + o;
        for (Py_ssize_t i = 0; i < m; i++)
            ru[i] = fma(A[i], B[i], C[i]);
        fesetround(FE_DOWNWARD);
        for (Py_ssize_t i = 0; i < m; i++)
            rd[i] = fma(A[i], B[i], C[i]);
    }
    fesetround(FE_TONEAREST);
    for (Py_ssize_t i = 0; i < m; i++) {
        /* equal (or both the same infinity): exact, and the upward zero has the round-to-nearest sign;
         * NaN: kept (the rounding canonicalises it); otherwise the truncation with its last bit set. */
        const double u = ru[i], d = rd[i];
        const uint64_t t = bits_of(u > 0 ? d : u) | 1;
        const int same = (u == d) | (u != u);
        ro[i] = same ? u : from_bits(t);
    }
}

static PyObject *fma_ro(PyObject *self, PyObject *args)
{
    Py_buffer a, b, c, out;
    int in32, mode, cast32 = 0;
    if (!PyArg_ParseTuple(args, "y*y*y*w*ii|i", &a, &b, &c, &out, &in32, &mode, &cast32))
        return NULL;
    const Py_ssize_t isz = in32 ? 4 : 8;
    const Py_ssize_t n = a.len / isz;
    const int out32 = out.len == n * 4 && n * 4 != n * 8;
    const char *why = NULL;
    if (a.len % isz || b.len != a.len || c.len != a.len)
        why = "a, b and c must be buffers of the same number of float32 (in32=1) or float64 values";
    else if (!(out.len == n * 8 || out32))
        why = "out must hold as many float64 (or float32) values as a";
    else if (mode < 0 || mode > 3)
        why = "mode must be 0 (rne), 1 (rtz), 2 (rup) or 3 (rdn)";
    if (why) {
        PyBuffer_Release(&a); PyBuffer_Release(&b); PyBuffer_Release(&c); PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "fma_ro: %s", why);
        return NULL;
    }
    static const int modes[4] = {FE_TONEAREST, FE_TOWARDZERO, FE_UPWARD, FE_DOWNWARD};
    Py_BEGIN_ALLOW_THREADS
    const int saved = fegetround();
    double ro[FBLK];
    for (Py_ssize_t o = 0; o < n; o += FBLK) {
        const Py_ssize_t m = n - o < FBLK ? n - o : FBLK;
        fma_ro_block(a.buf, b.buf, c.buf, o, m, in32, ro); /* reads a block before out's block is written */
        if (out32) {
            float *po = (float *)out.buf + o;
            fesetround(modes[mode]);
            for (Py_ssize_t i = 0; i < m; i++) {
                const float f = (float)ro[i];
                po[i] = ro[i] != ro[i] ? from_bits_f(CANON_NAN32) : f;
            }
            fesetround(FE_TONEAREST);
        } else if (cast32) { /* the float32 rounding in `mode`, stored as float64 */
            double *po = (double *)out.buf + o;
            fesetround(modes[mode]);
            for (Py_ssize_t i = 0; i < m; i++) {
                const double f = (double)(float)ro[i];
                po[i] = ro[i] != ro[i] ? from_bits(CANON_NAN64) : f;
            }
            fesetround(FE_TONEAREST);
        } else {
            memcpy((double *)out.buf + o, ro, (size_t)m * 8);
        }
    }
    fesetround(saved);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&a); PyBuffer_Release(&b); PyBuffer_Release(&c); PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------ pairwise_rne */

typedef struct {
    int kind;            /* 0: fp32 (a float cast), 1: generic p-bit format */
    int sh;              /* 53 - p: float64 mantissa bits dropped for normal results */
    uint64_t half_m1;    /* 2^(sh-1) - 1 */
    uint64_t low;        /* 2^sh - 1 */
    double min_normal;   /* 2^emin */
    double sub_magic;    /* 2^(emin - p + 1 + 52): ax + magic - magic is RNE on the subnormal grid */
    double ovf;          /* 2^emax (2 - 2^-p): from here on RNE gives infinity */
    int64_t min_normal_bits, ovf_bits;
} fmt_t;

/* RNE of a float64 into the format (infinity on overflow, canonical NaN); needs the FPU in RNE. */
/* Tests on the magnitude's bits as signed integers (they are below 2^63): branch-free, so loops vectorize. */
static inline double rnd_fp32(double x)
{
    const int64_t a = (int64_t)(bits_of(x) & 0x7fffffffffffffffULL);
    const int64_t r = (int64_t)bits_of((double)(float)x);
    return from_bits((uint64_t)(a > 0x7ff0000000000000LL ? (int64_t)CANON_NAN64 : r));
}

static inline double rnd_gen(double x, const fmt_t *f)
{
    const uint64_t u = bits_of(x), s = u & 0x8000000000000000ULL;
    const int64_t a = (int64_t)(u ^ s);
    const double ax = from_bits((uint64_t)a);
    const int64_t rn = (int64_t)(((uint64_t)a + f->half_m1 + (((uint64_t)a >> f->sh) & 1)) & ~f->low);
    const int64_t rs = (int64_t)bits_of((ax + f->sub_magic) - f->sub_magic);
    int64_t r = a < f->min_normal_bits ? rs : rn;
    r = a >= f->ovf_bits ? 0x7ff0000000000000LL : r;
    r |= (int64_t)s;
    return from_bits((uint64_t)(a > 0x7ff0000000000000LL ? (int64_t)CANON_NAN64 : r));
}

static inline double rnd(double x, const fmt_t *f) { return f->kind == 0 ? rnd_fp32(x) : rnd_gen(x, f); }

/* y[j] = RND(x[j] OP) for j < w, with the format's kind hoisted out of the loop (so that it vectorizes) */
#define KIND_LOOP(f, w, STMT_FP32, STMT_GEN)                                                     \
    do {                                                                                          \
        if ((f)->kind == 0) { for (Py_ssize_t j = 0; j < (w); j++) { STMT_FP32; } }              \
        else { for (Py_ssize_t j = 0; j < (w); j++) { STMT_GEN; } }                              \
    } while (0)

/* The same rounding on float32 bits, for formats inside float32's range with p <= 11 (node sums computed in
 * float32 are then rounded once more without harm: 24 >= 2p + 2), and fp32 itself (kind 0: float addition
 * is the rounding). NaN is left as a NaN (canonicalised once at the end: a NaN node keeps the root NaN). */
typedef struct {
    int kind, sh;
    uint32_t half_m1, low;
    float min_normal, sub_magic, ovf;
    int32_t min_normal_bits, ovf_bits;
} fmtf_t;

static inline float rndf(float x, const fmtf_t *f)
{
    if (f->kind == 0)
        return x;
    const uint32_t u = bits_of_f(x), s = u & 0x80000000U;
    const int32_t a = (int32_t)(u ^ s);
    const float ax = from_bits_f((uint32_t)a);
    const int32_t rn = (int32_t)(((uint32_t)a + f->half_m1 + (((uint32_t)a >> f->sh) & 1)) & ~f->low);
    const int32_t rs = (int32_t)bits_of_f((ax + f->sub_magic) - f->sub_magic);
    int32_t r = a < f->min_normal_bits ? rs : rn;
    r = a >= f->ovf_bits ? 0x7f800000 : r;
    r |= (int32_t)s;
    return from_bits_f((uint32_t)(a > 0x7f800000 ? (int32_t)CANON_NAN32 : r));
}

#define TBUF 8192 /* doubles per block buffer: 64 KiB */

/* float32 tree: leaves from float32 (rndf) or float64 (rnd, then an exact cast) input. */
CLONES __attribute__((noinline)) static void load_leaves_f(const void *src, int in32, Py_ssize_t ld, Py_ssize_t r0,
                                                           Py_ssize_t L, Py_ssize_t c0, Py_ssize_t w, int round_it,
                                                           const fmt_t *fdp, const fmtf_t *fp, float *restrict buf)
{
    const fmt_t FD = *fdp, *fd = &FD; /* local copies: no aliasing with the stores, so the loops vectorize */
    const fmtf_t F = *fp, *f = &F;
    if (ld == w) { /* whole rows: the block is one contiguous run */
        src = in32 ? (const void *)((const float *)src + r0 * ld) : (const void *)((const double *)src + r0 * ld);
        w = L * w;
        L = 1;
        r0 = 0;
    }
    for (Py_ssize_t i = 0; i < L; i++) {
        float *restrict d = buf + i * w;
        if (in32) {
            const float *s = (const float *)src + (r0 + i) * ld + c0;
            if (round_it && f->kind != 0)
                for (Py_ssize_t j = 0; j < w; j++) d[j] = rndf(s[j], f);
            else
                memcpy(d, s, (size_t)w * 4);
        } else {
            const double *s = (const double *)src + (r0 + i) * ld + c0;
            KIND_LOOP(fd, w, d[j] = (float)rnd_fp32(s[j]), d[j] = (float)rnd_gen(s[j], fd));
        }
    }
}

CLONES __attribute__((noinline)) static Py_ssize_t level_f(const float *restrict src, float *restrict dst,
                                                           Py_ssize_t L, Py_ssize_t w, const fmtf_t *fp)
{
    const fmtf_t F = *fp, *f = &F;
    const Py_ssize_t h = L / 2;
    if (w == 1) {
        KIND_LOOP(f, h, dst[j] = src[2 * j] + src[2 * j + 1], dst[j] = rndf(src[2 * j] + src[2 * j + 1], f));
    } else {
        for (Py_ssize_t i = 0; i < h; i++) {
            const float *x = src + 2 * i * w, *y = x + w;
            float *d = dst + i * w;
            KIND_LOOP(f, w, d[j] = x[j] + y[j], d[j] = rndf(x[j] + y[j], f));
        }
    }
    if (L & 1)
        memcpy(dst + h * w, src + (L - 1) * w, (size_t)w * 4);
    return h + (L & 1);
}

static int tree_f(const void *src, int in32, Py_ssize_t n, Py_ssize_t ld, Py_ssize_t c0, Py_ssize_t w, int round_it,
                  const fmt_t *fd, const fmtf_t *f, float *buf0, float *buf1, float *res)
{
    Py_ssize_t R = 2;
    while (2 * R * w <= 2 * TBUF) R *= 2;
    const Py_ssize_t nb = (n + R - 1) / R;
    float *sums = nb > 1 ? (float *)malloc((size_t)(nb * w) * 4) : res;
    if (!sums) return -1;
    for (Py_ssize_t J = 0; J < nb; J++) {
        Py_ssize_t L = n - J * R < R ? n - J * R : R;
        load_leaves_f(src, in32, ld, J * R, L, c0, w, round_it, fd, f, buf0);
        float *s = buf0, *d = buf1;
        while (L > 1) {
            L = level_f(s, d, L, w, f);
            float *t = s; s = d; d = t;
        }
        memcpy(sums + J * w, s, (size_t)w * 4);
    }
    if (nb == 1) return 0;
    const int rc = tree_f(sums, 1, nb, w, 0, w, 0, fd, f, buf0, buf1, res);
    free(sums);
    return rc;
}

/* Leaves: rows [r0, r0 + L) of the (n, ld) input, columns [c0, c0 + w), rounded (or copied) into buf. */
CLONES __attribute__((noinline)) static void load_leaves(const void *src, int in32, Py_ssize_t ld, Py_ssize_t r0,
                                                         Py_ssize_t L, Py_ssize_t c0, Py_ssize_t w, int round_it,
                                                         const fmt_t *fp, double *restrict buf)
{
    const fmt_t F = *fp, *f = &F;
    if (ld == w) { /* whole rows: the block is one contiguous run */
        src = in32 ? (const void *)((const float *)src + r0 * ld) : (const void *)((const double *)src + r0 * ld);
        w = L * w;
        L = 1;
        r0 = 0;
    }
    for (Py_ssize_t i = 0; i < L; i++) {
        double *restrict d = buf + i * w;
        if (in32) {
            const float *s = (const float *)src + (r0 + i) * ld + c0;
            if (round_it)
                KIND_LOOP(f, w, d[j] = rnd_fp32((double)s[j]), d[j] = rnd_gen((double)s[j], f));
            else
                for (Py_ssize_t j = 0; j < w; j++) d[j] = (double)s[j];
        } else {
            const double *s = (const double *)src + (r0 + i) * ld + c0;
            if (round_it)
                KIND_LOOP(f, w, d[j] = rnd_fp32(s[j]), d[j] = rnd_gen(s[j], f));
            else
                memcpy(d, s, (size_t)w * 8);
        }
    }
}

/* One level: rows 2i and 2i+1 of src (L rows of w) into row i of dst; an odd last row is carried. */
CLONES __attribute__((noinline)) static Py_ssize_t level(const double *restrict src, double *restrict dst,
                                                         Py_ssize_t L, Py_ssize_t w, const fmt_t *fp)
{
    const fmt_t F = *fp, *f = &F;
    const Py_ssize_t h = L / 2;
    if (w == 1) {
        KIND_LOOP(f, h, dst[j] = rnd_fp32(src[2 * j] + src[2 * j + 1]), dst[j] = rnd_gen(src[2 * j] + src[2 * j + 1], f));
    } else {
        for (Py_ssize_t i = 0; i < h; i++) {
            const double *x = src + 2 * i * w, *y = x + w;
            double *d = dst + i * w;
            KIND_LOOP(f, w, d[j] = rnd_fp32(x[j] + y[j]), d[j] = rnd_gen(x[j] + y[j], f));
        }
    }
    if (L & 1)
        memcpy(dst + h * w, src + (L - 1) * w, (size_t)w * 8);
    return h + (L & 1);
}

/* The tree over rows [0, n) (columns [c0, c0 + w)) into res (w values). Blocks of R = 2^k rows are reduced
 * in cache; their sums (nodes of level k) are the rows of the next call. 0: ok, -1: out of memory. */
static int tree(const void *src, int in32, Py_ssize_t n, Py_ssize_t ld, Py_ssize_t c0, Py_ssize_t w, int round_it,
                const fmt_t *f, double *buf0, double *buf1, double *res)
{
    Py_ssize_t R = 2;
    while (2 * R * w <= TBUF) R *= 2;
    const Py_ssize_t nb = (n + R - 1) / R;
    double *sums = nb > 1 ? (double *)malloc((size_t)(nb * w) * 8) : res;
    if (!sums) return -1;
    for (Py_ssize_t J = 0; J < nb; J++) {
        Py_ssize_t L = n - J * R < R ? n - J * R : R;
        load_leaves(src, in32, ld, J * R, L, c0, w, round_it, f, buf0);
        double *s = buf0, *d = buf1;
        while (L > 1) {
            L = level(s, d, L, w, f);
            double *t = s; s = d; d = t;
        }
        memcpy(sums + J * w, s, (size_t)w * 8);
    }
    if (nb == 1) return 0;
    const int rc = tree(sums, 0, nb, w, 0, w, 0, f, buf0, buf1, res);
    free(sums);
    return rc;
}

static PyObject *pairwise_rne(PyObject *self, PyObject *args)
{
    Py_buffer x, out;
    Py_ssize_t n, m;
    int in32, kind, p, emin, emax;
    if (!PyArg_ParseTuple(args, "y*w*nniiiii", &x, &out, &n, &m, &in32, &kind, &p, &emin, &emax))
        return NULL;
    const char *why = NULL;
    if (n < 1 || m < 1 || x.len != n * m * (in32 ? 4 : 8) || out.len != m * 8)
        why = "x must hold n*m float32 (in32=1) or float64 values and out m float64 values, n, m >= 1";
    else if (p < 2 || p > 25 || emin > 0 || emax < 1 || emax > 1000 || emin < -1000)
        why = "the format needs 2 <= p <= 25 and a range inside float64's";
    if (why) {
        PyBuffer_Release(&x); PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "pairwise_rne: %s", why);
        return NULL;
    }
    fmt_t f;
    f.kind = kind ? 1 : 0;
    f.sh = 53 - p;
    f.half_m1 = (1ULL << (f.sh - 1)) - 1;
    f.low = (1ULL << f.sh) - 1;
    f.min_normal = ldexp(1.0, emin);
    f.sub_magic = ldexp(1.0, emin - p + 1 + 52);
    f.ovf = ldexp(2.0 - ldexp(1.0, -p), emax);
    f.min_normal_bits = (int64_t)bits_of(f.min_normal);
    f.ovf_bits = (int64_t)bits_of(f.ovf);
    /* float32 nodes: fp32 itself, or p <= 11 inside float32's range (emin - p + 24 >= -126: a normal magic) */
    const int use_f = kind == 0 || (p <= 11 && emax <= 127 && emin - p + 24 >= -126);
    fmtf_t g;
    g.kind = f.kind;
    g.sh = 24 - p;
    g.half_m1 = g.sh > 0 ? (1U << (g.sh - 1)) - 1 : 0;
    g.low = (1U << g.sh) - 1;
    g.min_normal = (float)f.min_normal;
    g.sub_magic = use_f ? (float)ldexp(1.0, emin - p + 1 + 23) : 0.0f;
    g.ovf = use_f ? (float)f.ovf : 0.0f;
    g.min_normal_bits = (int32_t)bits_of_f(g.min_normal);
    g.ovf_bits = (int32_t)bits_of_f(g.ovf);
    int rc = 0;
    double *buf0 = (double *)malloc(TBUF * 8), *buf1 = (double *)malloc(TBUF * 8);
    float *res32 = use_f ? (float *)malloc((size_t)m * 4) : NULL;
    Py_BEGIN_ALLOW_THREADS
    const int saved = fegetround();
    fesetround(FE_TONEAREST);
    if (!buf0 || !buf1 || (use_f && !res32)) rc = -1;
    const Py_ssize_t W = m < TBUF / 2 ? m : TBUF / 2;
    for (Py_ssize_t c0 = 0; c0 < m && rc == 0; c0 += W) {
        const Py_ssize_t w = m - c0 < W ? m - c0 : W;
        if (use_f)
            rc = tree_f(x.buf, in32, n, m, c0, w, 1, &f, &g, (float *)buf0, (float *)buf1, res32 + c0);
        else
            rc = tree(x.buf, in32, n, m, c0, w, 1, &f, buf0, buf1, (double *)out.buf + c0);
    }
    if (use_f && rc == 0)
        for (Py_ssize_t j = 0; j < m; j++) {
            const double v = (double)res32[j];
            ((double *)out.buf)[j] = v != v ? from_bits(CANON_NAN64) : v;
        }
    fesetround(saved);
    Py_END_ALLOW_THREADS
    free(buf0); free(buf1); free(res32);
    PyBuffer_Release(&x); PyBuffer_Release(&out);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------ encode */

/* Codes of values already in the format (has_zero formats whose values are normal float64 numbers). The
 * element function is branch-free (so the loops vectorize); `bad` collects values it cannot encode (NaN
 * without a NaN code, infinity without one, a value not in the format, a negative value in an unsigned
 * format): the caller then lets the NumPy encoder raise. */
typedef struct {
    int mbits, bias, has_inf, has_nan, is_signed, signed_zero;
    uint64_t nan_code, sbit, infc, lowmask;
    int64_t min_normal_bits, max_bits;
    double scale;
} enc_t;

static inline uint64_t enc1(double v, const enc_t *e, uint64_t *bad)
{
    const uint64_t u = bits_of(v), neg = u >> 63, ua = u & 0x7fffffffffffffffULL;
    const int64_t ia = (int64_t)ua;
    const double a = from_bits(ua);
    /* normal: the exponent field rebiased and the top mbits of the mantissa */
    const uint64_t ef = (uint64_t)((int64_t)(ua >> 52) - 1023 + e->bias);
    const uint64_t cn = (ef << e->mbits) | ((ua & 0xfffffffffffffULL) >> (52 - e->mbits));
    const uint64_t badn = (ua & e->lowmask) != 0;
    /* subnormal (or zero): the integer a / quantum, exact, read off with the 2^52 trick */
    const double fr = a * e->scale;
    const double big = fr + 4503599627370496.0;
    const uint64_t cs = bits_of(big) - 0x4330000000000000ULL;
    const uint64_t bads = (big - 4503599627370496.0) != fr;
    const int normal = ia >= e->min_normal_bits;
    uint64_t code = normal ? cn : cs;
    uint64_t b = normal ? badn : bads;
    const uint64_t nz = ua != 0;
    code |= (neg & (uint64_t)e->is_signed & ((uint64_t)e->signed_zero | nz)) ? e->sbit : 0;
    b |= neg & (uint64_t)!e->is_signed & nz;
    const int isinf = ua == 0x7ff0000000000000ULL, isnan = ia > 0x7ff0000000000000LL;
    const int beyond = (ia > e->max_bits) & !isinf & !isnan;
    code = isinf ? (e->infc | (neg ? e->sbit : 0)) : code;
    b = isinf ? ((uint64_t)!e->has_inf | (neg & (uint64_t)!e->is_signed)) : b;
    code = isnan ? e->nan_code : code;
    b = isnan ? (uint64_t)!e->has_nan : b;
    b |= (uint64_t)beyond;
    *bad |= b;
    (void)a;
    return code;
}

/* The same on float32 carrier bits in 32-bit lanes (formats inside float32's range: emin >= -126). */
typedef struct {
    int32_t mbits, rebias, subsh0, has_inf, has_nan, is_signed, signed_zero;
    uint32_t nan_code, sbit, infc, lowmask;
    int32_t min_normal_bits, max_bits;
} encf_t;

static inline uint32_t enc1f(float v, const encf_t *e, uint32_t *bad)
{
    const uint32_t u = bits_of_f(v), neg = u >> 31, ua = u & 0x7fffffffU;
    const int32_t ia = (int32_t)ua, E = (int32_t)(ua >> 23);
    const uint32_t cn = ((uint32_t)(E + e->rebias) << e->mbits) | ((ua & 0x7fffffU) >> (23 - e->mbits));
    const uint32_t badn = (ua & e->lowmask) != 0;
    /* below the format's min normal: ua = M * 2^(E' - 150); the code is M >> (subsh0 - E') */
    const uint32_t M = E ? (ua & 0x7fffffU) | 0x800000U : ua;
    const int32_t sh = e->subsh0 - (E ? E : 1);
    const int32_t shc = sh < 31 ? sh : 31;
    const uint32_t cs = sh < 32 ? M >> shc : 0;
    const uint32_t bads = (cs << shc) != M;
    const int normal = ia >= e->min_normal_bits;
    uint32_t code = normal ? cn : cs;
    uint32_t b = normal ? badn : bads;
    const uint32_t nz = ua != 0;
    code |= (neg & (uint32_t)e->is_signed & ((uint32_t)e->signed_zero | nz)) ? e->sbit : 0;
    b |= neg & (uint32_t)!e->is_signed & nz;
    const int isinf = ua == 0x7f800000U, isnan = ia > 0x7f800000;
    const int beyond = (ia > e->max_bits) & !isinf & !isnan;
    code = isinf ? (e->infc | (neg ? e->sbit : 0)) : code;
    b = isinf ? ((uint32_t)!e->has_inf | (neg & (uint32_t)!e->is_signed)) : b;
    code = isnan ? e->nan_code : code;
    b = isnan ? (uint32_t)!e->has_nan : b;
    b |= (uint32_t)beyond;
    *bad |= b;
    return code;
}

#define DEFINE_ENCF(NAME, TO)                                                                     \
CLONES __attribute__((noinline)) static uint64_t NAME(const float *restrict in, TO *restrict out,  \
                                                      Py_ssize_t n, const encf_t *ep)              \
{                                                                                                 \
    const encf_t E = *ep;                                                                         \
    uint32_t bad = 0;                                                                             \
    for (Py_ssize_t i = 0; i < n; i++)                                                            \
        out[i] = (TO)enc1f(in[i], &E, &bad);                                                      \
    return bad;                                                                                   \
}
DEFINE_ENCF(encf_8, uint8_t) DEFINE_ENCF(encf_16, uint16_t) DEFINE_ENCF(encf_32, uint32_t)

/* Narrow signed formats on float32 carriers (fp16, the fp8/fp6/fp4 types): the code's magnitude is the float32
 * pattern shifted and rebiased for the format's normal values, and |v| / quantum (exact, converted in
 * float32 lanes) below them; few operations, so it runs at memory speed. bad: a value that is not in the
 * format, NaN without a NaN code, infinity without one. */
typedef struct {
    int32_t sh, rebias, min_normal_bits, max_bits, has_inf, has_nan, signed_zero;
    uint32_t nan_code, sbit, infc, low;
    float scale;
} encq_t;

/* Each group of 1024 first takes a lean pass that assumes no NaN, infinity or value beyond max (checked by the
 * group's largest magnitude); a group with one is encoded again by the full loop (issue 30: a third fewer
 * operations where none is, which is nearly always). */
#define ENCQ_BODY(TO, FULL)                                                                       \
    const uint32_t u = bits_of_f(in[i]), ua = u & 0x7fffffffU;                                    \
    const int32_t ia = (int32_t)ua;                                                               \
    const float a = from_bits_f(ua);                                                              \
    const uint32_t cn = (ua >> E.sh) - (uint32_t)E.rebias;                                        \
    const float fr = a * E.scale, big = fr + 8388608.0f; /* 2^23: the integer fr, read off */       \
    const uint32_t cs = bits_of_f(big) - 0x4b000000U;                                             \
    const int normal = ia >= E.min_normal_bits;                                                   \
    uint32_t code = normal ? cn : cs;                                                             \
    uint32_t b = normal ? (ua & E.low) : (uint32_t)((big - 8388608.0f) != fr);                    \
    code |= ((u >> 31) & (uint32_t)(E.signed_zero | (ua != 0))) ? E.sbit : 0;                     \
    if (FULL) {                                                                                   \
        const int isinf = ia == 0x7f800000, isnan = ia > 0x7f800000;                              \
        b |= (uint32_t)((ia > E.max_bits) & !isinf & !isnan);                                     \
        code = isinf ? (E.infc | ((u >> 31) ? E.sbit : 0)) : code;                                \
        b = isinf ? (uint32_t)!E.has_inf : b;                                                     \
        code = isnan ? E.nan_code : code;                                                         \
        b = isnan ? (uint32_t)!E.has_nan : b;                                                     \
    }                                                                                             \
    out[i] = (TO)code;

#define DEFINE_ENCQ(NAME, TO)                                                                     \
CLONES __attribute__((noinline)) static uint64_t NAME(const float *restrict in, TO *restrict out,  \
                                                      Py_ssize_t n, const encq_t *ep)              \
{                                                                                                 \
    const encq_t E = *ep;                                                                         \
    uint32_t bad = 0;                                                                             \
    for (Py_ssize_t o = 0; o < n; o += 1024) {                                                    \
        const Py_ssize_t end = n - o < 1024 ? n : o + 1024;                                       \
        int32_t hi = 0;                                                                           \
        uint32_t gb = 0;                                                                          \
        for (Py_ssize_t i = o; i < end; i++) {                                                    \
            ENCQ_BODY(TO, 0)                                                                      \
            gb |= b;                                                                              \
            hi = ia > hi ? ia : hi;                                                               \
        }                                                                                         \
        if (hi > E.max_bits) { /* NaN, infinity or a value beyond max in this group */            \
            gb = 0;                                                                               \
            for (Py_ssize_t i = o; i < end; i++) {                                                \
                ENCQ_BODY(TO, 1)                                                                  \
                gb |= b;                                                                          \
            }                                                                                     \
        }                                                                                         \
        bad |= gb;                                                                                \
    }                                                                                             \
    return bad;                                                                                   \
}
DEFINE_ENCQ(encq_8, uint8_t) DEFINE_ENCQ(encq_16, uint16_t)

/* Formats with float32's exponent field (bf16, tf32: 8 bits, bias 127, infinity, NaN, signed zero): the
 * code of a value is its float32 pattern shifted right by 23 - mbits (subnormals included); NaN: nan_code. */
#define DEFINE_ENCS(NAME, TO)                                                                     \
CLONES __attribute__((noinline)) static uint64_t NAME(const float *restrict in, TO *restrict out,  \
                                                      Py_ssize_t n, int sh, uint32_t nan_code)     \
{                                                                                                 \
    const uint32_t low = (1U << sh) - 1;                                                          \
    uint32_t bad = 0;                                                                             \
    for (Py_ssize_t i = 0; i < n; i++) {                                                          \
        const uint32_t u = bits_of_f(in[i]);                                                      \
        const int isnan = (int32_t)(u & 0x7fffffffU) > 0x7f800000;                                \
        bad |= isnan ? 0 : (u & low);                                                             \
        out[i] = (TO)(isnan ? nan_code : u >> sh);                                                \
    }                                                                                             \
    return bad;                                                                                   \
}
DEFINE_ENCS(encs_16, uint16_t) DEFINE_ENCS(encs_32, uint32_t)

#define DEFINE_ENC(NAME, TI, TO)                                                                  \
CLONES __attribute__((noinline)) static uint64_t NAME(const TI *restrict in, TO *restrict out,    \
                                                      Py_ssize_t n, const enc_t *ep)               \
{                                                                                                 \
    const enc_t E = *ep;                                                                          \
    uint64_t bad = 0;                                                                             \
    for (Py_ssize_t i = 0; i < n; i++)                                                            \
        out[i] = (TO)enc1((double)in[i], &E, &bad);                                               \
    return bad;                                                                                   \
}
DEFINE_ENC(enc_f_8, float, uint8_t) DEFINE_ENC(enc_f_16, float, uint16_t) DEFINE_ENC(enc_f_32, float, uint32_t)
DEFINE_ENC(enc_d_8, double, uint8_t) DEFINE_ENC(enc_d_16, double, uint16_t) DEFINE_ENC(enc_d_32, double, uint32_t)

/* Formats of at most 8 bits on float32 carriers: the code is a table lookup on the float32 pattern's sign,
 * exponent and top mbits (the table, built in bits.py by the reference encoder, holds 0xFFFF for patterns
 * that are not values of the format; 32-bit entries, so that AVX2 gathers them). */
CLONES __attribute__((noinline)) static uint32_t enct_loop(const float *restrict in, uint8_t *restrict out,
                                                           Py_ssize_t n, const uint32_t *restrict table, int sh)
{
    const uint32_t low = (1U << sh) - 1;
    uint32_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint32_t u = bits_of_f(in[i]);
        const uint32_t code = table[u >> sh];
        bad |= (u & low) | (code >> 8);
        out[i] = (uint8_t)code;
    }
    return bad;
}

/* One thread's share of an encoding: kind 0 table, 1 shifted float32 bits, 2 float32 lanes, 3 float32 in
 * float64 lanes, 4 float64. */
typedef struct {
    const char *in;
    char *out;
    Py_ssize_t n, isz, *next;
    int kind, osz, sh;
    uint32_t nan_code;
    const uint32_t *table;
    const encq_t *q;
    const encf_t *g;
    const enc_t *e;
    uint64_t bad;
} enc_job_t;

static void enc_range(enc_job_t *j, const void *in, void *out, Py_ssize_t n)
{
    const int osz = j->osz;
    switch (j->kind) {
    case 0: j->bad = enct_loop(in, out, n, j->table, j->sh); break;
    case 5: j->bad = osz == 1 ? encq_8(in, out, n, j->q) : encq_16(in, out, n, j->q); break;
    case 1: j->bad = osz == 2 ? encs_16(in, out, n, j->sh, j->nan_code) : encs_32(in, out, n, j->sh, j->nan_code); break;
    case 2: j->bad = osz == 1 ? encf_8(in, out, n, j->g) : osz == 2 ? encf_16(in, out, n, j->g) : encf_32(in, out, n, j->g); break;
    case 3: j->bad = osz == 1 ? enc_f_8(in, out, n, j->e) : osz == 2 ? enc_f_16(in, out, n, j->e) : enc_f_32(in, out, n, j->e); break;
    default: j->bad = osz == 1 ? enc_d_8(in, out, n, j->e) : osz == 2 ? enc_d_16(in, out, n, j->e) : enc_d_32(in, out, n, j->e); break;
    }
}

static void *enc_job(void *arg) /* chunks from the shared counter (see count_job) */
{
    enc_job_t *j = (enc_job_t *)arg;
    uint64_t bad = 0;
    for (;;) {
        const Py_ssize_t lo = __atomic_fetch_add(j->next, WCH, __ATOMIC_RELAXED);
        if (lo >= j->n) break;
        const Py_ssize_t m = j->n - lo < WCH ? j->n - lo : WCH;
        enc_range(j, j->in + lo * j->isz, j->out + lo * j->osz, m);
        bad |= j->bad;
    }
    j->bad = bad;
    return NULL;
}

#define ENC_THREADS_MAX 8

/* Share job0's range among `threads` threads (chunks of WCH from a shared counter, at least two a thread:
 * starting a thread costs tens of microseconds; the shifted encoding, a few instructions an element, is
 * never split) and run them; the OR of bad. */
static uint64_t run_enc(enc_job_t job0, Py_ssize_t isz, int threads)
{
    enc_job_t jobs[ENC_THREADS_MAX];
    if (threads < 1) threads = 1;
    if (threads > ENC_THREADS_MAX) threads = ENC_THREADS_MAX;
    if (job0.kind == 1) threads = 1;
    while (threads > 1 && (Py_ssize_t)threads * 2 * WCH > job0.n) threads--; /* two chunks a thread at least */
    Py_ssize_t next = 0;
    const int k = threads;
    for (int t = 0; t < threads; t++) {
        jobs[t] = job0;
        jobs[t].isz = isz;
        jobs[t].next = &next;
    }
    run_jobs(enc_job, jobs, sizeof(enc_job_t), k);
    uint64_t bad = 0;
    for (int t = 0; t < k; t++) bad |= jobs[t].bad;
    return bad;
}

static PyObject *encode_table(PyObject *self, PyObject *args)
{
    Py_buffer v, out, table;
    int sh, threads = 1;
    if (!PyArg_ParseTuple(args, "y*w*y*i|i", &v, &out, &table, &sh, &threads))
        return NULL;
    const Py_ssize_t n = v.len / 4;
    if (v.len % 4 || out.len != n || sh < 0 || sh > 23 || table.len != (Py_ssize_t)((1ULL << (32 - sh)) * 4)) {
        PyBuffer_Release(&v); PyBuffer_Release(&out); PyBuffer_Release(&table);
        PyErr_SetString(PyExc_ValueError, "encode_table: float32 values, one uint8 code each, a uint32 table of "
                                          "2**(32 - sh) entries");
        return NULL;
    }
    uint64_t bad;
    enc_job_t j;
    memset(&j, 0, sizeof j);
    j.in = v.buf; j.out = out.buf; j.n = n; j.kind = 0; j.osz = 1; j.sh = sh; j.table = table.buf;
    Py_BEGIN_ALLOW_THREADS
    bad = run_enc(j, 4, threads);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v); PyBuffer_Release(&out); PyBuffer_Release(&table);
    return PyLong_FromLong(bad != 0);
}

/* An encoding's numbers, worked out once (by `encode` for one call, by `encode_sink` for a sink): the job
 * template j points at e, g and q here, so the struct must stay where it is once set up. */
typedef struct {
    enc_t e;
    encf_t g;
    encq_t q;
    enc_job_t j;
} enc_plan_t;

static void enc_plan(enc_plan_t *P, int in32, int mbits, int bias, int emin, int has_inf, int has_nan,
                     unsigned long long nan_code, int is_signed, int signed_zero, int width, double min_normal,
                     double max)
{
    const int osz = width <= 8 ? 1 : width <= 16 ? 2 : width <= 32 ? 4 : 8;
    enc_t *e = &P->e;
    memset(P, 0, sizeof *P);
    e->mbits = mbits; e->bias = bias; e->has_inf = has_inf; e->has_nan = has_nan; e->is_signed = is_signed;
    e->signed_zero = signed_zero; e->nan_code = (uint64_t)nan_code;
    e->sbit = is_signed ? 1ULL << (width - 1) : 0;
    e->infc = ((1ULL << (width - mbits - (is_signed ? 1 : 0))) - 1) << mbits;
    e->lowmask = (1ULL << (52 - mbits)) - 1;
    e->min_normal_bits = (int64_t)bits_of(min_normal);
    e->max_bits = (int64_t)bits_of(max);
    e->scale = ldexp(1.0, mbits - emin); /* subnormal value -> integer fraction (exact) */
    const int f32ok = in32 && emin >= -126 && mbits <= 23;
    encf_t *g = &P->g;
    g->mbits = mbits; g->rebias = bias - 127; g->subsh0 = 150 + emin - mbits; g->has_inf = has_inf; g->has_nan = has_nan;
    g->is_signed = is_signed; g->signed_zero = signed_zero; g->nan_code = (uint32_t)nan_code;
    g->sbit = (uint32_t)e->sbit; g->infc = (uint32_t)e->infc; g->lowmask = (1U << (23 - mbits)) - 1;
    g->min_normal_bits = f32ok ? (int32_t)bits_of_f((float)min_normal) : 0;
    g->max_bits = f32ok ? (int32_t)bits_of_f((float)max) : 0;
    const int shifted = in32 && osz >= 2 && width - mbits - is_signed == 8 && bias == 127 && emin == -126
                        && has_inf && has_nan && is_signed && signed_zero;
    enc_job_t *j = &P->j;
    j->osz = osz; j->sh = 23 - mbits; j->nan_code = (uint32_t)nan_code;
    /* quick: signed formats of at most 16 bits inside float32's range (normal values: a shifted, rebiased
     * pattern; subnormal quanta at least float32's smallest normal times 2^-23 so |v| / quantum is exact) */
    const int quick = f32ok && is_signed && osz <= 2 && emin - mbits >= -149 && mbits <= 23 && mbits - emin <= 127;
    encq_t *q = &P->q;
    q->sh = 23 - mbits; q->rebias = (127 - bias) << mbits; q->min_normal_bits = g->min_normal_bits;
    q->max_bits = g->max_bits; q->has_inf = has_inf; q->has_nan = has_nan; q->signed_zero = signed_zero;
    q->nan_code = (uint32_t)nan_code; q->sbit = g->sbit; q->infc = g->infc; q->low = (1U << (23 - mbits)) - 1;
    q->scale = quick ? (float)ldexp(1.0, mbits - emin) : 1.0f;
    j->g = g; j->e = e; j->q = q;
    j->kind = shifted ? 1 : quick ? 5 : f32ok ? 2 : in32 ? 3 : 4;
    j->isz = in32 ? 4 : 8;
}

#define ENC_ARGS "iiiiiKiiidd" /* mbits, bias, emin, has_inf, has_nan, nan_code, is_signed, signed_zero, width, min_normal, max */

static PyObject *encode(PyObject *self, PyObject *args)
{
    Py_buffer v, out;
    int in32, mbits, bias, emin, has_inf, has_nan, is_signed, signed_zero, width, threads = 1;
    unsigned long long nan_code;
    double min_normal, max;
    if (!PyArg_ParseTuple(args, "y*w*i" ENC_ARGS "|i", &v, &out, &in32, &mbits, &bias, &emin, &has_inf, &has_nan,
                          &nan_code, &is_signed, &signed_zero, &width, &min_normal, &max, &threads))
        return NULL;
    const Py_ssize_t n = v.len / (in32 ? 4 : 8);
    const int osz = width <= 8 ? 1 : width <= 16 ? 2 : width <= 32 ? 4 : 8;
    if (v.len % (in32 ? 4 : 8) || out.len != n * osz || mbits < 0 || mbits > 52 || width > 32) {
        PyBuffer_Release(&v); PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "encode: out must hold one code of the format's width per value "
                                          "(formats up to 32 bits, mbits <= 52)");
        return NULL;
    }
    enc_plan_t P;
    enc_plan(&P, in32, mbits, bias, emin, has_inf, has_nan, nan_code, is_signed, signed_zero, width, min_normal, max);
    P.j.in = v.buf; P.j.out = out.buf; P.j.n = n;
    uint64_t bad = 0;
    Py_BEGIN_ALLOW_THREADS
    const int saved = fegetround();
    fesetround(FE_TONEAREST);
    bad = run_enc(P.j, in32 ? 4 : 8, threads);
    fesetround(saved);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v); PyBuffer_Release(&out);
    return PyLong_FromLong(bad != 0);
}

/* ----------------------------------------------------------------------------------- analyze_block */

typedef struct {
    Py_ssize_t exact, underflow, subnormal, nan, beyond;
    double max_abs, max_rel;
} counts_t;

/* The largest |r - b| and |r - b| / |b| (float64, over pairs with both finite; 0 where b == 0) without a
 * division per element: RN is monotone, so the largest rounded quotient is the rounded largest quotient, and
 * an element can raise the running maximum mr only if err >= mr |b|. Groups of 1024 count such candidates
 * branch-free (conservatively: err >= RN(mr |b|) (1 - 2^-50), which every one passes); a group with any is
 * gone through again with the divisions (rare once mr is near the maximum). */
#define ERR_PAIR(TI, bv, r, i)                                                                    \
    const double b = (double)(bv)[i], x = (double)(r)[i];                                         \
    const int64_t ib = (int64_t)(bits_of(b) & 0x7fffffffffffffffULL);                             \
    const int64_t ix = (int64_t)(bits_of(x) & 0x7fffffffffffffffULL);                             \
    const int64_t ok = (ib < 0x7ff0000000000000LL) & (ix < 0x7ff0000000000000LL) & (ib != 0);    \
    const double e = (ib < 0x7ff0000000000000LL) & (ix < 0x7ff0000000000000LL) ? fabs(x - b) : 0.0; \
    const double a = from_bits((uint64_t)ib);
#define DEFINE_ERRMAX(NAME, TI)                                                                   \
CLONES __attribute__((noinline)) static void NAME(const TI *restrict bv, const TI *restrict r,      \
                                                  Py_ssize_t n, double mr0, counts_t *c)          \
{                                                                                                 \
    int64_t ma = 0;                                                                               \
    double mr = mr0; /* a maximum known already (from earlier blocks): fewer candidates */        \
    const double shrink = 1.0 - 0x1p-50;                                                          \
    for (Py_ssize_t o = 0; o < n; o += 1024) {                                                    \
        const Py_ssize_t end = n - o < 1024 ? n : o + 1024;                                       \
        const double t = mr;                                                                      \
        int64_t cand = 0;                                                                         \
        for (Py_ssize_t i = o; i < end; i++) {                                                    \
            ERR_PAIR(TI, bv, r, i)                                                                \
            const int64_t eb = (int64_t)bits_of(e);                                               \
            ma = eb > ma ? eb : ma;                                                               \
            cand += ok & (e >= (t * a) * shrink);                                                 \
        }                                                                                         \
        if (cand)                                                                                 \
            for (Py_ssize_t i = o; i < end; i++) {                                                \
                ERR_PAIR(TI, bv, r, i)                                                            \
                if (ok) {                                                                         \
                    const double q = e / a;                                                       \
                    mr = q > mr ? q : mr;                                                         \
                }                                                                                 \
            }                                                                                     \
    }                                                                                             \
    c->max_abs = from_bits((uint64_t)ma);                                                         \
    c->max_rel = mr;                                                                              \
}
DEFINE_ERRMAX(errmax_f, float) DEFINE_ERRMAX(errmax_d, double)

/* Branch-free (so it vectorizes): comparisons on the magnitudes' bits as signed integers. */
#define DEFINE_COUNT(NAME, TI)                                                                    \
CLONES __attribute__((noinline)) static void NAME(const TI *restrict bv, const TI *restrict r,      \
                                                  Py_ssize_t n, double min_normal, double max,    \
                                                  double mr0, counts_t *c)                        \
{                                                                                                 \
    const int64_t INF = 0x7ff0000000000000LL, mnb = (int64_t)bits_of(min_normal);                 \
    const int64_t mxb = (int64_t)bits_of(max);                                                    \
    int64_t ex = 0, uf = 0, sub = 0, nan = 0, bey = 0;                                            \
    for (Py_ssize_t i = 0; i < n; i++) {                                                          \
        const double b = (double)bv[i], x = (double)r[i];                                         \
        const int64_t ab = (int64_t)(bits_of(b) & 0x7fffffffffffffffULL);                         \
        const int64_t ax = (int64_t)(bits_of(x) & 0x7fffffffffffffffULL);                         \
        const int64_t fin_in = ab < INF, fin_out = ax < INF, rn = ax > INF, bn = ab > INF;         \
        ex += (int64_t)(x == b) | (rn & bn);                                                       \
        uf += fin_in & (ab != 0) & (ax == 0);                                                     \
        sub += (ax != 0) & (ax < mnb);                                                            \
        nan += rn;                                                                                \
        bey += fin_in & (ab > mxb);                                                               \
        (void)fin_out;                                                                            \
    }                                                                                             \
    c->exact = ex; c->underflow = uf; c->subnormal = sub; c->nan = nan; c->beyond = bey;          \
    errmax_d(bv, r, n, mr0, c);                                                                   \
}
DEFINE_COUNT(count_d, double)

/* float32 blocks, one pass in 32-bit lanes per group of 1024: the counts on the float32 bits (exact there:
 * min_normal and max of a format that fits float32 are float32 values), and |r - b| in float32, which equals
 * the float64 difference of the reference wherever Sterbenz's lemma applies (r = 0, or r and b of one sign
 * within a factor of two): a group with any other finite pair goes through the float64 path (errmax). The
 * candidates for a larger relative error are found with a float32 threshold below the running maximum.
 *
 * Each group first takes a lean pass that assumes no input and no result beyond max (so no NaN, infinity or
 * overflow: every pair finite), which its own maximum of both magnitudes then checks; a group where that
 * fails (rare: NaN, infinity or values beyond max) is counted again by the full loop below. Issue 30: the lean
 * pass has about half the operations of the full one, and analyze runs at the speed of this loop. */
CLONES __attribute__((noinline)) static void count_f(const float *restrict bv, const float *restrict r,
                                                     Py_ssize_t n, double min_normal, double max, double mr0,
                                                     counts_t *c)
{
    const int32_t INF = 0x7f800000, mnb = (int32_t)bits_of_f((float)min_normal);
    const int32_t mxb = max >= 3.4028234663852886e38 ? 0x7f7fffff : (int32_t)bits_of_f((float)max);
    Py_ssize_t ex = 0, uf = 0, sub = 0, nan = 0, bey = 0;
    int32_t maf = 0;
    double mad = 0.0, mr = mr0; /* mr0: a maximum known already (earlier blocks), so fewer candidates */
    for (Py_ssize_t o = 0; o < n; o += 1024) {
        const Py_ssize_t end = n - o < 1024 ? n : o + 1024;
        const float tf = mr < 1e38 ? (float)mr * (1.0f - 0x1p-20f) : INFINITY;
        int32_t e1 = 0, u1 = 0, s1 = 0, n1 = 0, b1 = 0, cand = 0, unsafe = 0, gm = 0;
        { /* the lean pass */
            int32_t lo1 = 0, z1 = 0, hi = 0, dmin = 0, dmax = 0;
            uint32_t sx = 0;
            for (Py_ssize_t i = o; i < end; i++) {
                const float b = bv[i], x = r[i];
                const uint32_t ub = bits_of_f(b), ux = bits_of_f(x);
                const int32_t ab = (int32_t)(ub & 0x7fffffffU), ax = (int32_t)(ux & 0x7fffffffU);
                const int32_t zx = ax == 0;
                e1 += x == b;
                lo1 += ax < mnb;
                z1 += zx;
                u1 += zx & (ab != 0);
                const float e = fabsf(x - b);
                const int32_t eb = (int32_t)bits_of_f(e);
                gm = eb > gm ? eb : gm;
                /* an underflow (x = 0, b != 0) has relative error exactly 1: counted in u1, not a candidate */
                cand += !zx & (e >= tf * from_bits_f((uint32_t)ab));
                /* Sterbenz (as `safe` below): one sign, magnitudes' bits within 2^23; x = 0 always safe */
                sx |= zx ? 0U : ub ^ ux;
                const int32_t d = zx ? 0 : ax - ab;
                dmin = d < dmin ? d : dmin;
                dmax = d > dmax ? d : dmax;
                const int32_t m = ab > ax ? ab : ax;
                hi = m > hi ? m : hi;
            }
            s1 = lo1 - z1;
            unsafe = (sx >> 31) | (dmin < -0x800000) | (dmax > 0x800000);
            if (hi > mxb) /* some input or result beyond max (or not finite): the full loop */
                e1 = u1 = s1 = cand = unsafe = gm = -1;
        }
        if (e1 < 0) {
            e1 = u1 = s1 = cand = unsafe = gm = 0;
            for (Py_ssize_t i = o; i < end; i++) {
                const float b = bv[i], x = r[i];
                const uint32_t ub = bits_of_f(b), ux = bits_of_f(x);
                const int32_t ab = (int32_t)(ub & 0x7fffffffU), ax = (int32_t)(ux & 0x7fffffffU);
                const int32_t fin_in = ab < INF, rn = ax > INF, bn = ab > INF, ok = fin_in & (ax < INF);
                e1 += (int32_t)(x == b) | (rn & bn);
                u1 += fin_in & (ab != 0) & (ax == 0);
                s1 += (ax != 0) & (ax < mnb);
                n1 += rn;
                b1 += fin_in & (ab > mxb);
                const int32_t safe = (ax == 0) | (((ub ^ ux) >> 31 == 0) & (ax <= ab + 0x800000) & (ab <= ax + 0x800000));
                unsafe += ok & !safe;
                const float e = ok ? fabsf(x - b) : 0.0f;
                const int32_t eb = (int32_t)bits_of_f(e);
                gm = eb > gm ? eb : gm;
                cand += ok & (ab != 0) & (ax != 0) & (e >= tf * from_bits_f((uint32_t)ab));
            }
        }
        ex += e1; uf += u1; sub += s1; nan += n1; bey += b1;
        if (unsafe || mr >= 1e38) { /* the float64 path for this group */
            counts_t g;
            errmax_f(bv + o, r + o, end - o, mr, &g);
            mad = g.max_abs > mad ? g.max_abs : mad;
            mr = g.max_rel > mr ? g.max_rel : mr;
            continue;
        }
        maf = gm > maf ? gm : maf;
        if (u1 && mr < 1.0)
            mr = 1.0;
        if (cand)
            for (Py_ssize_t i = o; i < end; i++) {
                ERR_PAIR(float, bv, r, i)
                if (ok) {
                    const double q = e / a;
                    mr = q > mr ? q : mr;
                }
            }
    }
    c->exact = ex; c->underflow = uf; c->subnormal = sub; c->nan = nan; c->beyond = bey;
    const double mf = (double)from_bits_f((uint32_t)maf);
    c->max_abs = mf > mad ? mf : mad;
    c->max_rel = mr;
}

/* Work sharing (WCH, count_job, enc_job): threads take chunks from a shared counter until none is left, so
 * a thread that the OS deschedules does not hold the others up; what each thread adds up is combined with
 * sums and maxima (the OR of flags), the same for any split. */

typedef struct {
    const void *b, *r;
    Py_ssize_t n, *next;
    int in32;
    double min_normal, max;
    counts_t c;
} count_job_t;

static void *count_job(void *arg)
{
    count_job_t *j = (count_job_t *)arg;
    counts_t acc;
    memset(&acc, 0, sizeof acc);
    const Py_ssize_t isz = j->in32 ? 4 : 8;
    for (;;) {
        const Py_ssize_t lo = __atomic_fetch_add(j->next, WCH, __ATOMIC_RELAXED);
        if (lo >= j->n) break;
        const Py_ssize_t m = j->n - lo < WCH ? j->n - lo : WCH;
        const char *b = (const char *)j->b + lo * isz, *r = (const char *)j->r + lo * isz;
        counts_t c;
        if (j->in32)
            count_f((const float *)b, (const float *)r, m, j->min_normal, j->max, 0.0, &c);
        else
            count_d((const double *)b, (const double *)r, m, j->min_normal, j->max, 0.0, &c);
        acc.exact += c.exact; acc.underflow += c.underflow; acc.subnormal += c.subnormal; acc.nan += c.nan;
        acc.beyond += c.beyond;
        acc.max_abs = c.max_abs > acc.max_abs ? c.max_abs : acc.max_abs;
        acc.max_rel = c.max_rel > acc.max_rel ? c.max_rel : acc.max_rel;
    }
    j->c = acc;
    return NULL;
}

#define MAX_THREADS 8

static PyObject *analyze_block(PyObject *self, PyObject *args)
{
    Py_buffer b, r;
    int in32, threads = 1;
    double min_normal, max;
    if (!PyArg_ParseTuple(args, "y*y*idd|i", &b, &r, &in32, &min_normal, &max, &threads))
        return NULL;
    const Py_ssize_t n = r.len / (in32 ? 4 : 8);
    if (r.len % (in32 ? 4 : 8) || b.len != r.len) {
        PyBuffer_Release(&b); PyBuffer_Release(&r);
        PyErr_SetString(PyExc_ValueError, "analyze_block: b and r must be float32 (in32=1) or float64 buffers of one length");
        return NULL;
    }
    /* threads share the block in contiguous parts of whole 1024-groups; counts add and maxima combine the same
     * way for any split, so the result does not depend on the thread count */
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    while (threads > 1 && (Py_ssize_t)threads * 2 * WCH > n) threads--; /* two chunks a thread at least */
    count_job_t jobs[MAX_THREADS];
    Py_ssize_t next = 0;
    const int t_used = threads;
    for (int t = 0; t < threads; t++) {
        jobs[t].b = b.buf; jobs[t].r = r.buf; jobs[t].n = n; jobs[t].next = &next;
        jobs[t].in32 = in32; jobs[t].min_normal = min_normal; jobs[t].max = max;
    }
    counts_t c;
    Py_BEGIN_ALLOW_THREADS
    run_jobs(count_job, jobs, sizeof(count_job_t), t_used);
    c = jobs[0].c;
    for (int t = 1; t < t_used; t++) {
        const counts_t *d = &jobs[t].c;
        c.exact += d->exact; c.underflow += d->underflow; c.subnormal += d->subnormal; c.nan += d->nan;
        c.beyond += d->beyond;
        c.max_abs = d->max_abs > c.max_abs ? d->max_abs : c.max_abs;
        c.max_rel = d->max_rel > c.max_rel ? d->max_rel : c.max_rel;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b); PyBuffer_Release(&r);
    return Py_BuildValue("nnnnndd", c.exact, c.underflow, c.subnormal, c.nan, c.beyond, c.max_abs, c.max_rel);
}

/* ---------------------------------------------------------------------------------------------- sinks */

/* Sinks for fpsim/_ckernel.c's round_bits (the interface is in _csink.h): analyze counts each rounded block
 * (count_f / count_d, the code of analyze_block) and encode writes its codes (enc_range, the code of encode and
 * encode_table) while the block is in L1, so one pass over the input does the whole of fpsim.analyze and
 * fpsim.to_bits. What a sink adds up is kept per job and combined by sink_result with sums and maxima (the OR
 * of flags): the same for any split among threads. */
enum { SINK_ANALYZE = 1, SINK_ENCODE = 2 };

typedef struct {
    counts_t c;
    uint64_t bad;
    char pad[64]; /* jobs on different threads write different cache lines */
} sink_acc_t;

typedef struct {
    fpsim_sink_t base;
    int kind;
    double min_normal, max;        /* analyze */
    enc_plan_t P;                  /* encode: the job template (kind 0 for the table) */
    Py_buffer out, table;
    int have_out, have_table;
    Py_ssize_t cap;                /* codes that out holds */
    sink_acc_t acc[FPSIM_SINK_JOBS];
} sink_t;

static void sink_analyze_fn(fpsim_sink_t *b, int job, const void *in, const void *r, Py_ssize_t lo, Py_ssize_t n)
{
    sink_t *s = (sink_t *)b;
    counts_t *A = &s->acc[job].c, c;
    (void)lo;
    if (b->W == 32)
        count_f((const float *)in, (const float *)r, n, s->min_normal, s->max, A->max_rel, &c);
    else
        count_d((const double *)in, (const double *)r, n, s->min_normal, s->max, A->max_rel, &c);
    A->exact += c.exact; A->underflow += c.underflow; A->subnormal += c.subnormal; A->nan += c.nan;
    A->beyond += c.beyond;
    A->max_abs = c.max_abs > A->max_abs ? c.max_abs : A->max_abs;
    A->max_rel = c.max_rel > A->max_rel ? c.max_rel : A->max_rel;
}

static void sink_encode_fn(fpsim_sink_t *b, int job, const void *in, const void *r, Py_ssize_t lo, Py_ssize_t n)
{
    sink_t *s = (sink_t *)b;
    (void)in;
    if (lo < 0 || n > s->cap - lo) { /* a block beyond out: nothing written, sink_result raises */
        s->acc[job].bad |= 2;
        return;
    }
    enc_job_t j = s->P.j;
    enc_range(&j, r, (char *)s->out.buf + lo * j.osz, n);
    s->acc[job].bad |= j.bad != 0;
}

static void sink_free(PyObject *cap)
{
    sink_t *s = PyCapsule_GetPointer(cap, FPSIM_SINK_CAPSULE);
    if (!s)
        return;
    if (s->have_out) PyBuffer_Release(&s->out);
    if (s->have_table) PyBuffer_Release(&s->table);
    PyMem_Free(s);
}

static PyObject *sink_new(sink_t *s)
{
    PyObject *cap = PyCapsule_New(s, FPSIM_SINK_CAPSULE, sink_free);
    if (!cap) {
        if (s->have_out) PyBuffer_Release(&s->out);
        if (s->have_table) PyBuffer_Release(&s->table);
        PyMem_Free(s);
    }
    return cap;
}

static sink_t *sink_alloc(int kind, int W)
{
    sink_t *s = PyMem_Calloc(1, sizeof(sink_t));
    if (!s) {
        PyErr_NoMemory();
        return NULL;
    }
    s->kind = kind;
    s->base.W = W;
    s->base.fn = kind == SINK_ANALYZE ? sink_analyze_fn : sink_encode_fn;
    return s;
}

/* analyze_sink(in32, min_normal, max): a sink that counts as analyze_block does (in32: float32 carrier). */
static PyObject *analyze_sink(PyObject *self, PyObject *args)
{
    int in32;
    double min_normal, max;
    if (!PyArg_ParseTuple(args, "idd", &in32, &min_normal, &max))
        return NULL;
    sink_t *s = sink_alloc(SINK_ANALYZE, in32 ? 32 : 64);
    if (!s)
        return NULL;
    s->min_normal = min_normal; s->max = max;
    return sink_new(s);
}

/* encode_sink(out, in32, <encode's format numbers>): a sink that writes the codes of the rounded values into
 * out, as encode does. */
static PyObject *encode_sink(PyObject *self, PyObject *args)
{
    int in32, mbits, bias, emin, has_inf, has_nan, is_signed, signed_zero, width;
    unsigned long long nan_code;
    double min_normal, max;
    sink_t *s = sink_alloc(SINK_ENCODE, 32);
    if (!s)
        return NULL;
    if (!PyArg_ParseTuple(args, "w*i" ENC_ARGS, &s->out, &in32, &mbits, &bias, &emin, &has_inf, &has_nan,
                          &nan_code, &is_signed, &signed_zero, &width, &min_normal, &max)) {
        PyMem_Free(s);
        return NULL;
    }
    s->have_out = 1;
    const int osz = width <= 8 ? 1 : width <= 16 ? 2 : 4;
    if (s->out.len % osz || mbits < 0 || mbits > 52 || width > 32 || width < 1) {
        PyBuffer_Release(&s->out); PyMem_Free(s);
        PyErr_SetString(PyExc_ValueError, "encode_sink: out must hold whole codes of the format's width "
                                          "(formats up to 32 bits, mbits <= 52)");
        return NULL;
    }
    s->base.W = in32 ? 32 : 64;
    enc_plan(&s->P, in32, mbits, bias, emin, has_inf, has_nan, nan_code, is_signed, signed_zero, width, min_normal, max);
    s->cap = s->out.len / osz;
    return sink_new(s);
}

/* encode_table_sink(out, table, sh): a sink that writes 8-bit codes by the table, as encode_table does. */
static PyObject *encode_table_sink(PyObject *self, PyObject *args)
{
    int sh;
    sink_t *s = sink_alloc(SINK_ENCODE, 32);
    if (!s)
        return NULL;
    if (!PyArg_ParseTuple(args, "w*y*i", &s->out, &s->table, &sh)) {
        PyMem_Free(s);
        return NULL;
    }
    s->have_out = s->have_table = 1;
    if (sh < 0 || sh > 23 || s->table.len != (Py_ssize_t)((1ULL << (32 - sh)) * 4)) {
        PyBuffer_Release(&s->out); PyBuffer_Release(&s->table); PyMem_Free(s);
        PyErr_SetString(PyExc_ValueError, "encode_table_sink: one uint8 code per value, a uint32 table of "
                                          "2**(32 - sh) entries");
        return NULL;
    }
    s->P.j.kind = 0; s->P.j.osz = 1; s->P.j.isz = 4; s->P.j.sh = sh; s->P.j.table = s->table.buf;
    s->cap = s->out.len;
    return sink_new(s);
}

/* sink_result(sink): an analyze sink's counts (as analyze_block returns them); an encode sink's flag (1: some
 * value needs the NumPy path, as encode returns it). */
static PyObject *sink_result(PyObject *self, PyObject *cap)
{
    sink_t *s = PyCapsule_GetPointer(cap, FPSIM_SINK_CAPSULE);
    if (!s)
        return NULL;
    if (s->kind == SINK_ENCODE) {
        uint64_t bad = 0;
        for (int t = 0; t < FPSIM_SINK_JOBS; t++) bad |= s->acc[t].bad;
        if (bad & 2) {
            PyErr_SetString(PyExc_ValueError, "sink_result: the rounded elements did not fit in out");
            return NULL;
        }
        return PyLong_FromLong(bad != 0);
    }
    counts_t c = s->acc[0].c;
    for (int t = 1; t < FPSIM_SINK_JOBS; t++) {
        const counts_t *d = &s->acc[t].c;
        c.exact += d->exact; c.underflow += d->underflow; c.subnormal += d->subnormal; c.nan += d->nan;
        c.beyond += d->beyond;
        c.max_abs = d->max_abs > c.max_abs ? d->max_abs : c.max_abs;
        c.max_rel = d->max_rel > c.max_rel ? d->max_rel : c.max_rel;
    }
    return Py_BuildValue("nnnnndd", c.exact, c.underflow, c.subnormal, c.nan, c.beyond, c.max_abs, c.max_rel);
}

/* GELU (tanh approximation) in float32, the passes around NumPy's tanh. Each line is one float32 operation of
 * the NumPy code in fpsim/nn/layers.py, in its order (no contraction: this file is built with
 * -ffp-contract=off), so the bits are the same; one pass through memory instead of one per operation, each
 * with a fresh temporary (and its page faults). The constants come from the caller as float32, as NumPy
 * converts a Python float. */
CLONES static void gelu_u_loop(const float *x, float *u, Py_ssize_t n, float c1, float c2)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        const float v = x[i];
        float w = v * v;
        w = w * v;
        w = w * c1;
        w = v + w;
        u[i] = w * c2;
    }
}

CLONES static void gelu_out_loop(const float *x, const float *t, float *o, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        const float a = x[i] * 0.5f;
        o[i] = a * (t[i] + 1.0f);
    }
}

CLONES static void gelu_grad_loop(const float *d, const float *x, const float *t, float *g, Py_ssize_t n, float k3,
                                  float c2)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        const float v = x[i], tt = t[i];
        float du = v * k3;
        du = du * v;
        du = du + 1.0f;
        du = du * c2;
        float q = v * 0.5f;
        float r = tt * tt;
        r = 1.0f - r;
        q = q * r;
        q = q * du;
        float p = tt + 1.0f;
        p = p * 0.5f;
        p = p + q;
        g[i] = d[i] * p;
    }
}

/* the nb buffers of a GELU pass (its inputs, then its output): float32 values, all of one length (*n) */
static int gelu_buffers(const char *name, Py_buffer *b, int nb, Py_ssize_t *n)
{
    *n = b[0].len / 4;
    for (int i = 0; i < nb; i++)
        if (b[i].len != b[0].len || b[i].len % 4) {
            for (int j = 0; j < nb; j++)
                PyBuffer_Release(&b[j]);
            PyErr_Format(PyExc_ValueError, "%s: the buffers must hold the same number of float32 values", name);
            return -1;
        }
    return 0;
}

static PyObject *gelu_u(PyObject *self, PyObject *args)
{
    Py_buffer b[2];
    float c1, c2;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*w*ff", &b[0], &b[1], &c1, &c2) || gelu_buffers("gelu_u", b, 2, &n))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    gelu_u_loop((const float *)b[0].buf, (float *)b[1].buf, n, c1, c2);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b[0]); PyBuffer_Release(&b[1]);
    Py_RETURN_NONE;
}

static PyObject *gelu_out(PyObject *self, PyObject *args)
{
    Py_buffer b[3];
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*y*w*", &b[0], &b[1], &b[2]) || gelu_buffers("gelu_out", b, 3, &n))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    gelu_out_loop((const float *)b[0].buf, (const float *)b[1].buf, (float *)b[2].buf, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b[0]); PyBuffer_Release(&b[1]); PyBuffer_Release(&b[2]);
    Py_RETURN_NONE;
}

static PyObject *gelu_grad(PyObject *self, PyObject *args)
{
    Py_buffer b[4];
    float k3, c2;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*y*y*w*ff", &b[0], &b[1], &b[2], &b[3], &k3, &c2) ||
        gelu_buffers("gelu_grad", b, 4, &n))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    gelu_grad_loop((const float *)b[0].buf, (const float *)b[1].buf, (const float *)b[2].buf, (float *)b[3].buf, n,
                   k3, c2);
    Py_END_ALLOW_THREADS
    for (int i = 0; i < 4; i++)
        PyBuffer_Release(&b[i]);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fma_ro", fma_ro, METH_VARARGS, "RO53(a*b + c) into a float64 out, or its float32 rounding in a mode."},
    {"pairwise_rne", pairwise_rne, METH_VARARGS, "Pairwise sum over axis 0, round-to-nearest-even, p <= 25."},
    {"encode", encode, METH_VARARGS, "Bit patterns of values already in a format (1: some value needs the NumPy path)."},
    {"encode_table", encode_table, METH_VARARGS, "8-bit codes of float32 values by a table (1: NumPy path needed)."},
    {"analyze_block", analyze_block, METH_VARARGS, "Counts and error maxima of fpsim.analyze for one block."},
    {"analyze_sink", analyze_sink, METH_VARARGS, "A sink for _ckernel.round_bits that counts as analyze_block."},
    {"encode_sink", encode_sink, METH_VARARGS, "A sink for _ckernel.round_bits that encodes as encode."},
    {"encode_table_sink", encode_table_sink, METH_VARARGS, "A sink for _ckernel.round_bits that encodes as encode_table."},
    {"gelu_u", gelu_u, METH_VARARGS, "GELU's tanh argument, float32 (fpsim.nn.layers' operations)."},
    {"gelu_out", gelu_out, METH_VARARGS, "GELU's output from x and tanh, float32 (fpsim.nn.layers' operations)."},
    {"gelu_grad", gelu_grad, METH_VARARGS, "GELU's input gradient, float32 (fpsim.nn.layers' operations)."},
    {"sink_result", sink_result, METH_O, "An analyze sink's counts, or an encode sink's flag (1: NumPy path needed)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_carith", NULL, -1, methods};

PyMODINIT_FUNC PyInit__carith(void)
{
#ifdef HAVE_POOL
    fpsim_pool_init(); /* a forked child starts with an empty pool */
#endif
    return PyModule_Create(&moddef);
}
