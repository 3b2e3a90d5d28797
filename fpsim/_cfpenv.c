/* Read and set the flush-to-zero (FTZ) and denormals-are-zero (DAZ) controls of the calling thread.
 *
 * fpsim computes on float32/float64 carriers whose subnormals must stay subnormal; a process may have
 * turned on FTZ/DAZ (torch.set_flush_denormal(True), a library built with -ffast-math). fpsim/_fpenv.py
 * clears them for the duration of a call and restores them afterwards. get/set only touch the flush bits;
 * getround/setround read and set the rounding mode (C99 fegetround/fesetround: a library in the process may
 * have left FE_UPWARD, FE_DOWNWARD or FE_TOWARDZERO set, under which Python and NumPy arithmetic round
 * differently). Neither touches the exception flags.
 *
 * Flags (the same on every platform): 1 = FTZ (results), 2 = DAZ (inputs), 4 = FZ16 (half precision).
 *   x86-64 / x86 with SSE: MXCSR bit 15 (FZ) and bit 6 (DAZ); FZ16 does not exist.
 *   aarch64: FPCR bit 24 (FZ, results and inputs: reported as FTZ|DAZ) and bit 19 (FZ16).
 * Elsewhere SUPPORTED is 0 and get/set raise OSError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fenv.h>

#ifdef FE_TONEAREST
#define FPENV_ROUNDING 1
#else
#define FPENV_ROUNDING 0
#define FE_TONEAREST 0
#endif

#define FLAG_FTZ 1
#define FLAG_DAZ 2
#define FLAG_FZ16 4

#if defined(__x86_64__) || defined(_M_X64) || (defined(__i386__) && defined(__SSE__))
#include <xmmintrin.h>
#define FPENV_SUPPORTED 1
#define MXCSR_FZ (1u << 15)
#define MXCSR_DAZ (1u << 6)

static int get_flags(void)
{
    unsigned int csr = _mm_getcsr();
    return ((csr & MXCSR_FZ) ? FLAG_FTZ : 0) | ((csr & MXCSR_DAZ) ? FLAG_DAZ : 0);
}

static void set_flags(int flags)
{
    unsigned int csr = _mm_getcsr() & ~(MXCSR_FZ | MXCSR_DAZ);
    if (flags & FLAG_FTZ) csr |= MXCSR_FZ;
    if (flags & FLAG_DAZ) csr |= MXCSR_DAZ;
    _mm_setcsr(csr);
}

#elif defined(__aarch64__)
#define FPENV_SUPPORTED 1
#define FPCR_FZ (1ull << 24)
#define FPCR_FZ16 (1ull << 19)

static unsigned long long read_fpcr(void)
{
    unsigned long long v;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(v));
    return v;
}

static void write_fpcr(unsigned long long v) { __asm__ __volatile__("msr fpcr, %0" : : "r"(v)); }

static int get_flags(void)
{
    unsigned long long v = read_fpcr();
    return ((v & FPCR_FZ) ? (FLAG_FTZ | FLAG_DAZ) : 0) | ((v & FPCR_FZ16) ? FLAG_FZ16 : 0);
}

static void set_flags(int flags)
{
    unsigned long long v = read_fpcr() & ~(FPCR_FZ | FPCR_FZ16);
    if (flags & (FLAG_FTZ | FLAG_DAZ)) v |= FPCR_FZ; /* one bit controls both on aarch64 */
    if (flags & FLAG_FZ16) v |= FPCR_FZ16;
    write_fpcr(v);
}

#else
#define FPENV_SUPPORTED 0
#endif

static PyObject *fpenv_get(PyObject *self, PyObject *unused)
{
#if FPENV_SUPPORTED
    return PyLong_FromLong(get_flags());
#else
    PyErr_SetString(PyExc_OSError, "_cfpenv: reading FTZ/DAZ is not supported on this platform");
    return NULL;
#endif
}

/* An exact int argument (not __index__: a float or a numpy float must not pass); *overflow set when it does
 * not fit a long. Returns -1 with an exception set on a wrong type. */
static int int_arg(PyObject *arg, const char *who, long *out, int *overflow)
{
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "_cfpenv.%s: expected an int, got %.100s", who, Py_TYPE(arg)->tp_name);
        return -1;
    }
    *out = PyLong_AsLongAndOverflow(arg, overflow);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *fpenv_set(PyObject *self, PyObject *arg)
{
    int overflow = 0;
    long flags;
    if (int_arg(arg, "set", &flags, &overflow) < 0) return NULL;
    if (overflow || flags < 0 || flags > (FLAG_FTZ | FLAG_DAZ | FLAG_FZ16)) {
        PyErr_Format(PyExc_ValueError, "_cfpenv.set: flags must be in 0..7 (1 FTZ, 2 DAZ, 4 FZ16), got %R", arg);
        return NULL;
    }
#if FPENV_SUPPORTED
    int old = get_flags();
    set_flags((int)flags);
    return PyLong_FromLong(old);
#else
    PyErr_SetString(PyExc_OSError, "_cfpenv: setting FTZ/DAZ is not supported on this platform");
    return NULL;
#endif
}

static PyObject *fpenv_getround(PyObject *self, PyObject *unused)
{
#if FPENV_ROUNDING
    return PyLong_FromLong(fegetround());
#else
    PyErr_SetString(PyExc_OSError, "_cfpenv: the rounding mode cannot be read on this platform");
    return NULL;
#endif
}

static PyObject *fpenv_setround(PyObject *self, PyObject *arg)
{
    int overflow = 0;
    long mode;
    if (int_arg(arg, "setround", &mode, &overflow) < 0) return NULL;
#if FPENV_ROUNDING
    /* only the modes this platform's fenv.h defines: fesetround would reject the others, but say which */
    if (overflow || !(mode == FE_TONEAREST
#ifdef FE_UPWARD
                      || mode == FE_UPWARD
#endif
#ifdef FE_DOWNWARD
                      || mode == FE_DOWNWARD
#endif
#ifdef FE_TOWARDZERO
                      || mode == FE_TOWARDZERO
#endif
                      )) {
        PyErr_Format(PyExc_ValueError, "_cfpenv.setround: mode must be one of the FE_* values of this platform "
                     "(TONEAREST, UPWARD, DOWNWARD, TOWARDZERO), got %R", arg);
        return NULL;
    }
    int old = fegetround();
    if (fesetround((int)mode) != 0) {
        PyErr_Format(PyExc_OSError, "_cfpenv.setround: fesetround(%ld) failed", mode);
        return NULL;
    }
    return PyLong_FromLong(old);
#else
    PyErr_SetString(PyExc_OSError, "_cfpenv: the rounding mode cannot be set on this platform");
    return NULL;
#endif
}

/* The whole rounding state, saved and set to nearest in one call (what fpsim/_fpenv.py uses), and restored.
 * On x86-64 the x87 unit and the SSE unit (MXCSR, which Python and NumPy arithmetic use) each have their own
 * rounding control. A library can set MXCSR alone (_MM_SET_ROUNDING_MODE, _mm_setcsr); fegetround reads only
 * the x87 word there, so saving with it and restoring with fesetround would lose the caller's SSE mode.
 * Both controls are saved, packed as SAVED_X86 | x87 RC | SSE RC << 2 (RC: 0 nearest, 1 down, 2 up, 3 toward
 * zero in both units); elsewhere the state is fegetround's value. */
#if FPENV_ROUNDING && (defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))) && \
    (defined(__GNUC__) || defined(__clang__))
#define FPENV_X86_RC 1
#define SAVED_X86 0x100
#define MXCSR_RC_SHIFT 13
#define X87_RC_SHIFT 10

static unsigned int x87_rc(void)
{
    unsigned short cw;
    __asm__ __volatile__("fnstcw %0" : "=m"(cw));
    return (cw >> X87_RC_SHIFT) & 3u;
}

static void set_x87_rc(unsigned int rc)
{
    unsigned short cw;
    __asm__ __volatile__("fnstcw %0" : "=m"(cw));
    cw = (unsigned short)((cw & ~(3u << X87_RC_SHIFT)) | (rc << X87_RC_SHIFT));
    __asm__ __volatile__("fldcw %0" : : "m"(cw));
}

static unsigned int sse_rc(void) { return (_mm_getcsr() >> MXCSR_RC_SHIFT) & 3u; }

static void set_sse_rc(unsigned int rc)
{
    _mm_setcsr((_mm_getcsr() & ~(3u << MXCSR_RC_SHIFT)) | (rc << MXCSR_RC_SHIFT));
}
#else
#define FPENV_X86_RC 0
#endif

static PyObject *fpenv_nearest(PyObject *self, PyObject *unused)
{
#if FPENV_X86_RC
    long saved = SAVED_X86 | (long)x87_rc() | ((long)sse_rc() << 2);
    set_x87_rc(0);
    set_sse_rc(0);
    return PyLong_FromLong(saved);
#elif FPENV_ROUNDING
    int old = fegetround();
    if (fesetround(FE_TONEAREST) != 0) {
        PyErr_SetString(PyExc_OSError, "_cfpenv.nearest: fesetround(FE_TONEAREST) failed");
        return NULL;
    }
    return PyLong_FromLong(old);
#else
    PyErr_SetString(PyExc_OSError, "_cfpenv: the rounding mode cannot be set on this platform");
    return NULL;
#endif
}

static PyObject *fpenv_restoreround(PyObject *self, PyObject *arg)
{
    long saved = PyLong_AsLong(arg);
    if (saved == -1 && PyErr_Occurred()) return NULL;
#if FPENV_X86_RC
    if (saved & SAVED_X86) {
        set_x87_rc((unsigned int)saved & 3u);
        set_sse_rc(((unsigned int)saved >> 2) & 3u);
        Py_RETURN_NONE;
    }
#endif
    PyObject *old = fpenv_setround(self, arg);
    if (old == NULL) return NULL;
    Py_DECREF(old);
    Py_RETURN_NONE;
}

/* For tests: set the SSE unit's rounding control alone (0 nearest, 1 down, 2 up, 3 toward zero), as a
 * library calling _MM_SET_ROUNDING_MODE does; returns the previous one. x86 only (OSError elsewhere). */
static PyObject *fpenv_set_sse_round(PyObject *self, PyObject *arg)
{
    long rc = PyLong_AsLong(arg);
    if (rc == -1 && PyErr_Occurred()) return NULL;
    if (rc < 0 || rc > 3) {
        PyErr_Format(PyExc_ValueError, "_cfpenv._set_sse_round: rc must be 0..3, got %R", arg);
        return NULL;
    }
#if FPENV_X86_RC
    unsigned int old = sse_rc();
    set_sse_rc((unsigned int)rc);
    return PyLong_FromLong((long)old);
#else
    PyErr_SetString(PyExc_OSError, "_cfpenv._set_sse_round: x86 with gcc/clang only");
    return NULL;
#endif
}

static PyMethodDef methods[] = {
    {"nearest", fpenv_nearest, METH_NOARGS,
     "nearest() -> int: set round-to-nearest in every unit; returns the whole previous state for restoreround."},
    {"restoreround", fpenv_restoreround, METH_O, "restoreround(state): put back a state nearest() returned."},
    {"_set_sse_round", fpenv_set_sse_round, METH_O, "_set_sse_round(rc) -> int: tests only (x86)."},
    {"get", fpenv_get, METH_NOARGS, "get() -> int: the calling thread's flush flags (1 FTZ, 2 DAZ, 4 FZ16)."},
    {"set", fpenv_set, METH_O, "set(flags) -> int: set the calling thread's flush flags; returns the previous ones."},
    {"getround", fpenv_getround, METH_NOARGS, "getround() -> int: the calling thread's rounding mode (fegetround)."},
    {"setround", fpenv_setround, METH_O,
     "setround(mode) -> int: set the calling thread's rounding mode (fesetround); returns the previous one."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_cfpenv", NULL, -1, methods};

/* The directed modes' values on this platform (-1 where fenv.h lacks one), for tests and diagnostics. */
static int add_modes(PyObject *m)
{
#ifdef FE_UPWARD
    if (PyModule_AddIntConstant(m, "UPWARD", FE_UPWARD) < 0) return -1;
#else
    if (PyModule_AddIntConstant(m, "UPWARD", -1) < 0) return -1;
#endif
#ifdef FE_DOWNWARD
    if (PyModule_AddIntConstant(m, "DOWNWARD", FE_DOWNWARD) < 0) return -1;
#else
    if (PyModule_AddIntConstant(m, "DOWNWARD", -1) < 0) return -1;
#endif
#ifdef FE_TOWARDZERO
    if (PyModule_AddIntConstant(m, "TOWARDZERO", FE_TOWARDZERO) < 0) return -1;
#else
    if (PyModule_AddIntConstant(m, "TOWARDZERO", -1) < 0) return -1;
#endif
    return 0;
}

PyMODINIT_FUNC PyInit__cfpenv(void)
{
    PyObject *m = PyModule_Create(&moddef);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "SUPPORTED", FPENV_SUPPORTED) < 0 ||
        PyModule_AddIntConstant(m, "FTZ", FLAG_FTZ) < 0 || PyModule_AddIntConstant(m, "DAZ", FLAG_DAZ) < 0 ||
        PyModule_AddIntConstant(m, "FZ16", FLAG_FZ16) < 0 || PyModule_AddIntConstant(m, "ROUNDING", FPENV_ROUNDING) < 0 ||
        PyModule_AddIntConstant(m, "TONEAREST", FE_TONEAREST) < 0 || add_modes(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
