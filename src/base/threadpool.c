/* threadpool.c: see threadpool.h. */
#include "base/threadpool.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* Spins before sleeping: about 50-100 microseconds of pause instructions. */
enum { SPIN_WAIT = 20000, SPIN_YIELD_EVERY = 1024 };

struct worker {
    struct lm_pool *pool;
    int ith;
    pthread_t thread;
};

struct lm_pool {
    int n;                  /* threads including the caller */
    struct worker *workers; /* [n - 1] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;     /* job generation; bumped by lm_pool_run */
    atomic_int pending;  /* workers that have not finished the current job */
    atomic_bool stop;
    lm_pool_fn fn;       /* current job, published before gen is bumped */
    void *ctx;
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct lm_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < SPIN_WAIT; i++) {
            cpu_relax();
            if ((i + 1) % SPIN_YIELD_EVERY == 0) sched_yield();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
                   !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        p->fn(p->ctx, w->ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

int lm_pool_online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

lm_status lm_pool_create(int n_threads, struct lm_pool **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = lm_pool_online_cores();
    struct lm_pool *p = calloc(1, sizeof *p);
    if (!p) return lm_errorf(LM_ERR_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, false);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            free(p);
            return lm_errorf(LM_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i + 1;
        if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]) != 0) {
            p->n = i + 1; /* join the ones that started */
            lm_pool_destroy(p);
            return lm_errorf(LM_ERR_NOMEM, "thread pool: cannot start thread %d of %d", i + 2,
                             n_threads);
        }
    }
    *out = p;
    return LM_OK;
}

void lm_pool_destroy(struct lm_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int lm_pool_size(const struct lm_pool *p) { return p ? p->n : 1; }

void lm_pool_run(struct lm_pool *p, lm_pool_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    assert(atomic_load(&p->pending) == 0);
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    for (unsigned i = 1; atomic_load_explicit(&p->pending, memory_order_acquire) != 0; i++) {
        cpu_relax();
        if (i % SPIN_YIELD_EVERY == 0) sched_yield();
    }
}

void lm_pool_split(long total, int ith, int nth, long align, long *begin, long *end) {
    assert(nth >= 1 && ith >= 0 && ith < nth && align >= 1);
    long units = (total + align - 1) / align;
    long per = units / nth, rem = units % nth;
    long b = ith * per + (ith < rem ? ith : rem);
    long e = b + per + (ith < rem ? 1 : 0);
    b *= align;
    e *= align;
    *begin = b < total ? b : total;
    *end = e < total ? e : total;
}
