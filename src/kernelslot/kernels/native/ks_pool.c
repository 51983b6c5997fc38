/* kernelslot native: the persistent thread pool of the MoE decode kernels.
 *
 * ks_pool_run(fn, arg, nth) runs fn(arg, tid, nth) for tid = 0..nth-1 (the caller is tid 0)
 * and returns when every slice is done: the return is the phase barrier.  Posting a phase is
 * one atomic generation bump; workers spin on it for KS_POOL_SPIN_NS after their last slice
 * before sleeping on a condition variable, and the caller spins on the pending count before
 * sleeping, so back-to-back phases and calls cost about a microsecond each instead of two
 * condition-variable wake-ups.  One phase at a time (ks_pool_lock / ks_pool_unlock around a
 * call).  Threads that cannot be created leave their slices to the caller.  After fork() the
 * child starts with no workers.
 */
#include "ks_native.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#ifndef KS_POOL_SPIN_NS
#define KS_POOL_SPIN_NS 200000L /* 200 us: covers the Python gap between layers' calls */
#endif
#define KS_MAX_THREADS 64

static struct {
    pthread_mutex_t call_lock, mu;
    pthread_cond_t wake, done;
    int workers;                  /* created workers, tids 1..workers */
    atomic_ulong gen;             /* phase generation */
    atomic_int pending;           /* helpers still running the current phase */
    atomic_int sleepers;          /* workers blocked on `wake` */
    atomic_int caller_waiting;    /* the caller is blocked on `done` */
    ks_pool_fn fn;
    void *arg;
    int nth;
    unsigned long start_gen[KS_MAX_THREADS];
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, NULL, NULL, 0, {0}};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Spin until `cond` holds or KS_POOL_SPIN_NS pass; returns whether it holds. */
#define SPIN_UNTIL(cond)                                                        \
    ({                                                                          \
        int ok_ = 0;                                                            \
        const int64_t end_ = now_ns() + KS_POOL_SPIN_NS;                        \
        for (unsigned i_ = 1;; ++i_) {                                          \
            if (cond) { ok_ = 1; break; }                                       \
            CPU_RELAX();                                                        \
            if ((i_ & 255) == 0 && now_ns() > end_) break;                      \
        }                                                                       \
        ok_;                                                                    \
    })

static void *pool_worker(void *arg) {
    const int tid = (int)(intptr_t)arg;
    unsigned long seen = pool.start_gen[tid];
    for (;;) {
        unsigned long g = seen;
        if (!SPIN_UNTIL((g = atomic_load(&pool.gen)) != seen)) {
            pthread_mutex_lock(&pool.mu);
            atomic_fetch_add(&pool.sleepers, 1);
            while ((g = atomic_load(&pool.gen)) == seen) pthread_cond_wait(&pool.wake, &pool.mu);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = g;
        const int nth = pool.nth;
        if (tid >= nth) continue;
        pool.fn(pool.arg, tid, nth);
        if (atomic_fetch_sub(&pool.pending, 1) == 1 && atomic_load(&pool.caller_waiting)) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.mu);
        }
    }
    return NULL;
}

static void pool_after_fork_child(void) { /* the workers do not exist in a forked child */
    pthread_mutex_init(&pool.call_lock, NULL);
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.workers = 0;
    atomic_store(&pool.pending, 0);
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.caller_waiting, 0);
}

__attribute__((constructor)) static void pool_init(void) {
    pthread_atfork(NULL, NULL, pool_after_fork_child);
}

void ks_pool_lock(void) { pthread_mutex_lock(&pool.call_lock); }
void ks_pool_unlock(void) { pthread_mutex_unlock(&pool.call_lock); }

void ks_pool_run(ks_pool_fn fn, void *arg, int nth) {
    if (nth > KS_MAX_THREADS) nth = KS_MAX_THREADS;
    if (nth <= 1) { fn(arg, 0, 1); return; }
    while (pool.workers < nth - 1) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pool.start_gen[pool.workers + 1] = atomic_load(&pool.gen);
        const int ok = pthread_create(&th, &attr, pool_worker, (void *)(intptr_t)(pool.workers + 1)) == 0;
        pthread_attr_destroy(&attr);
        if (!ok) break;
        pool.workers++;
    }
    const int helpers = pool.workers < nth - 1 ? pool.workers : nth - 1;
    pool.fn = fn;
    pool.arg = arg;
    pool.nth = nth;
    atomic_store(&pool.pending, helpers);
    atomic_fetch_add(&pool.gen, 1);  /* seq_cst: publishes fn/arg/nth */
    if (atomic_load(&pool.sleepers)) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.mu);
    }
    for (int t = 0; t < nth; ++t)
        if (t == 0 || t > helpers) fn(arg, t, nth);
    if (!SPIN_UNTIL(atomic_load(&pool.pending) == 0)) {
        pthread_mutex_lock(&pool.mu);
        atomic_store(&pool.caller_waiting, 1);
        while (atomic_load(&pool.pending) > 0) pthread_cond_wait(&pool.done, &pool.mu);
        atomic_store(&pool.caller_waiting, 0);
        pthread_mutex_unlock(&pool.mu);
    }
}

static void pool_noop(void *arg, int tid, int nth) { (void)arg; (void)tid; (void)nth; }

/* Wake the workers of an nth-thread call and return once each has run an empty slice: they then
 * spin for KS_POOL_SPIN_NS, as after a previous layer's call, so the next call pays no wake-up. */
void ks_pool_warm(int nth) {
    ks_pool_lock();
    ks_pool_run(pool_noop, NULL, nth);
    ks_pool_unlock();
}
