/* A pool of worker threads kept between calls, shared by the compiled kernels (_ckernel.c, _cgemm.c,
 * _carith.c).
 *
 * Starting threads costs 50-150 microseconds per call on a virtual machine, as much as a whole small GEMM
 * or rounding call, so the workers stay: worker w runs job w of each dispatch, the caller runs job 0.
 * Every job computes its own outputs from its own inputs, so the bits never depend on which thread ran it.
 *
 *   fpsim_pool_run(fn, jobs, size, n): run fn(jobs + w * size) for w in [0, n) (at most FPSIM_POOL_MAX at
 *   once on threads; any further job runs in the caller) and
 *   return when all are done. Each worker first takes the dispatching thread's floating-point environment
 *   (rounding mode, and FTZ/DAZ in MXCSR on x86), whatever it had when it was started.
 *
 * One dispatch at a time: a caller that finds the pool busy (another thread of the process inside a
 * kernel) starts threads of its own for that call. A forked child starts with an empty pool (the workers
 * do not survive fork). Workers spin briefly after each job before they sleep, so that the next dispatch
 * of a run of calls (a GEMM's preparation, then its tiles) finds them awake; the spin is bounded (about
 * 20-60 microseconds), so an idle process uses no CPU. A job that cannot get a thread runs in the caller.
 * Each extension module that includes this header has a pool of its own.
 */
#ifndef FPSIM_CPOOL_H
#define FPSIM_CPOOL_H

#include <fenv.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#define FPSIM_POOL_MAX 64
#define FPSIM_POOL_SPIN 2048 /* pause instructions before a waiting thread sleeps */

typedef void *(*fpsim_pool_fn)(void *);

static pthread_mutex_t fpsim_pool_busy = PTHREAD_MUTEX_INITIALIZER; /* held by the dispatching caller */
static pthread_mutex_t fpsim_pool_mx = PTHREAD_MUTEX_INITIALIZER;   /* guards the sleeps and wake-ups */
static pthread_cond_t fpsim_pool_go = PTHREAD_COND_INITIALIZER, fpsim_pool_done = PTHREAD_COND_INITIALIZER;
static int fpsim_pool_n = 1;                            /* 1 + the workers started */
static unsigned long fpsim_pool_want[FPSIM_POOL_MAX];   /* worker w's job number: a new value is a new job */
static unsigned long fpsim_pool_seen0[FPSIM_POOL_MAX];  /* want[w] when worker w was started */
static int fpsim_pool_pending = 0;                      /* jobs of this dispatch not done (atomic) */
static int fpsim_pool_waiting = 0;                      /* the caller sleeps on fpsim_pool_done */
static fpsim_pool_fn fpsim_pool_f = NULL;               /* this dispatch (written before the want[] values) */
static char *fpsim_pool_jobs = NULL;
static size_t fpsim_pool_size = 0;
static fenv_t fpsim_pool_env;

static inline void fpsim_pool_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *fpsim_pool_worker(void *arg)
{
    const int w = (int)(intptr_t)arg;
    unsigned long seen = fpsim_pool_seen0[w]; /* written before the thread was created */
    for (;;) {
        unsigned long want;
        int spin = 0;
        while ((want = __atomic_load_n(&fpsim_pool_want[w], __ATOMIC_ACQUIRE)) == seen) {
            if (++spin < FPSIM_POOL_SPIN) {
                fpsim_pool_relax();
                continue;
            }
            pthread_mutex_lock(&fpsim_pool_mx);
            while ((want = __atomic_load_n(&fpsim_pool_want[w], __ATOMIC_ACQUIRE)) == seen)
                pthread_cond_wait(&fpsim_pool_go, &fpsim_pool_mx);
            pthread_mutex_unlock(&fpsim_pool_mx);
            break;
        }
        seen = want;
        fesetenv(&fpsim_pool_env);
        fpsim_pool_f(fpsim_pool_jobs + (size_t)w * fpsim_pool_size);
        if (__atomic_sub_fetch(&fpsim_pool_pending, 1, __ATOMIC_ACQ_REL) == 0) {
            pthread_mutex_lock(&fpsim_pool_mx);
            if (fpsim_pool_waiting)
                pthread_cond_signal(&fpsim_pool_done);
            pthread_mutex_unlock(&fpsim_pool_mx);
        }
    }
    return NULL;
}

static void fpsim_pool_after_fork_child(void)
{
    /* the workers did not survive the fork: forget them (and any dispatch in flight in another thread) */
    pthread_mutex_init(&fpsim_pool_busy, NULL);
    pthread_mutex_init(&fpsim_pool_mx, NULL);
    pthread_cond_init(&fpsim_pool_go, NULL);
    pthread_cond_init(&fpsim_pool_done, NULL);
    fpsim_pool_n = 1;
    fpsim_pool_pending = 0;
    fpsim_pool_waiting = 0;
}

/* Call once at module initialisation. */
static void fpsim_pool_init(void)
{
    static int done = 0;
    if (!done && pthread_atfork(NULL, NULL, fpsim_pool_after_fork_child) == 0)
        done = 1;
}

/* Workers of the pool up to n - 1 (fewer where threads cannot be had); called holding fpsim_pool_busy. */
static void fpsim_pool_grow(int n)
{
    while (fpsim_pool_n < n) {
        pthread_t tid;
        pthread_attr_t at;
        sigset_t all, old;
        fpsim_pool_seen0[fpsim_pool_n] = fpsim_pool_want[fpsim_pool_n];
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        /* signals stay with the threads Python knows (a worker never runs Python's handlers) */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int ok = pthread_create(&tid, &at, fpsim_pool_worker, (void *)(intptr_t)fpsim_pool_n) == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&at);
        if (!ok)
            break;
        fpsim_pool_n++;
    }
}

typedef struct {
    fpsim_pool_fn fn;
    void *arg;
    const fenv_t *env;
} fpsim_pool_own_t;

static void *fpsim_pool_own(void *arg)
{
    fpsim_pool_own_t *o = (fpsim_pool_own_t *)arg;
    fesetenv(o->env);
    return o->fn(o->arg);
}

/* fn on jobs[0..n), each on its own thread (the caller's own threads where the pool is busy). */
static void fpsim_pool_run(fpsim_pool_fn fn, void *jobs, size_t size, int n)
{
    const int nt = n < FPSIM_POOL_MAX ? n : FPSIM_POOL_MAX; /* jobs on threads: 0 (the caller) .. nt-1 */
    if (n <= 1) {
        if (n == 1)
            fn(jobs);
        return;
    }
    if (pthread_mutex_trylock(&fpsim_pool_busy) != 0) { /* another caller's dispatch: threads of this call's own */
        pthread_t th[FPSIM_POOL_MAX];
        int started[FPSIM_POOL_MAX];
        fpsim_pool_own_t own[FPSIM_POOL_MAX];
        fenv_t env;
        fegetenv(&env);
        for (int t = 1; t < nt; t++) {
            own[t] = (fpsim_pool_own_t){fn, (char *)jobs + (size_t)t * size, &env};
            started[t] = pthread_create(&th[t], NULL, fpsim_pool_own, &own[t]) == 0;
        }
        fn(jobs);
        for (int t = nt; t < n; t++)
            fn((char *)jobs + (size_t)t * size);
        for (int t = 1; t < nt; t++) {
            if (started[t])
                pthread_join(th[t], NULL);
            else
                fn((char *)jobs + (size_t)t * size); /* no thread to be had: here, same bits */
        }
        return;
    }
    fpsim_pool_grow(nt);
    const int served = nt < fpsim_pool_n ? nt : fpsim_pool_n; /* jobs 1..served-1 go to workers */
    fegetenv(&fpsim_pool_env);
    fpsim_pool_f = fn;
    fpsim_pool_jobs = (char *)jobs;
    fpsim_pool_size = size;
    __atomic_store_n(&fpsim_pool_pending, served - 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&fpsim_pool_mx); /* the new job numbers under the lock, so no sleeper misses them */
    for (int w = 1; w < served; w++)
        __atomic_store_n(&fpsim_pool_want[w], fpsim_pool_want[w] + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&fpsim_pool_go);
    pthread_mutex_unlock(&fpsim_pool_mx);
    fn(jobs);
    for (int t = served; t < n; t++)
        fn((char *)jobs + (size_t)t * size); /* no worker to be had: here, same bits */
    for (int spin = 0; __atomic_load_n(&fpsim_pool_pending, __ATOMIC_ACQUIRE) > 0;) {
        if (++spin < FPSIM_POOL_SPIN) {
            fpsim_pool_relax();
            continue;
        }
        pthread_mutex_lock(&fpsim_pool_mx);
        fpsim_pool_waiting = 1;
        while (__atomic_load_n(&fpsim_pool_pending, __ATOMIC_ACQUIRE) > 0)
            pthread_cond_wait(&fpsim_pool_done, &fpsim_pool_mx);
        fpsim_pool_waiting = 0;
        pthread_mutex_unlock(&fpsim_pool_mx);
        break;
    }
    pthread_mutex_unlock(&fpsim_pool_busy);
}

#endif
