/* Read and set the flush-to-zero (FTZ) and denormals-are-zero (DAZ) controls of the calling thread.
 *
 * fpsim computes on float32/float64 carriers whose subnormals must stay subnormal; a process may have
 * turned on FTZ/DAZ (torch.set_flush_denormal(True), a library built with -ffast-math). fpsim/_fpenv.py
 * clears them for the duration of a call and restores them afterwards; this module only touches the
 * flush bits and leaves the rounding mode and the exception flags alone.
 *
 * Flags (the same on every platform): 1 = FTZ (results), 2 = DAZ (inputs), 4 = FZ16 (half precision).
 *   x86-64 / x86 with SSE: MXCSR bit 15 (FZ) and bit 6 (DAZ); FZ16 does not exist.
 *   aarch64: FPCR bit 24 (FZ, results and inputs: reported as FTZ|DAZ) and bit 19 (FZ16).
 * Elsewhere SUPPORTED is 0 and get/set raise OSError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

static PyObject *fpenv_set(PyObject *self, PyObject *arg)
{
    int overflow = 0;
    long flags;
    if (!PyLong_Check(arg)) { /* not __index__: a float or a numpy float must not pass */
        PyErr_Format(PyExc_TypeError, "_cfpenv.set: flags must be an int, got %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    flags = PyLong_AsLongAndOverflow(arg, &overflow);
    if (flags == -1 && PyErr_Occurred()) return NULL;
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

static PyMethodDef methods[] = {
    {"get", fpenv_get, METH_NOARGS, "get() -> int: the calling thread's flush flags (1 FTZ, 2 DAZ, 4 FZ16)."},
    {"set", fpenv_set, METH_O, "set(flags) -> int: set the calling thread's flush flags; returns the previous ones."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_cfpenv", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cfpenv(void)
{
    PyObject *m = PyModule_Create(&moddef);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "SUPPORTED", FPENV_SUPPORTED) < 0 ||
        PyModule_AddIntConstant(m, "FTZ", FLAG_FTZ) < 0 || PyModule_AddIntConstant(m, "DAZ", FLAG_DAZ) < 0 ||
        PyModule_AddIntConstant(m, "FZ16", FLAG_FZ16) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
