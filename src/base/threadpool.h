/* threadpool.h: a persistent pool of worker threads for the CPU kernels.
 *
 * lm_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once on each of the pool's nth threads
 * (the calling thread is ith 0) and returns when every call has returned: a barrier between
 * ops. Each kernel splits its rows by ith/nth (lm_pool_split), as ggml's compute threads do.
 * Workers spin briefly after a job (the forward pass issues ops back to back) and then sleep on
 * a condition variable, so an idle pool costs no CPU.
 *
 * One thread at a time may call lm_pool_run on a pool (the model serialises its forward passes).
 * A NULL pool runs fn(ctx, 0, 1) on the caller. */
#ifndef LM_BASE_THREADPOOL_H
#define LM_BASE_THREADPOOL_H

#include "base/status.h"

struct lm_pool;

/* fn(ctx, ith, nth): the work of thread ith (0 <= ith < nth). */
typedef void (*lm_pool_fn)(void *ctx, int ith, int nth);

/* Creates a pool of n_threads threads including the caller (n_threads - 1 workers are started);
 * n_threads <= 0 means every online core. *out is caller-owned (lm_pool_destroy).
 * LM_ERR_NOMEM when a thread cannot be started. */
lm_status lm_pool_create(int n_threads, struct lm_pool **out);
/* Stops and joins the workers; accepts NULL. */
void lm_pool_destroy(struct lm_pool *p);
/* Threads in the pool, counting the caller; 1 for NULL. */
int lm_pool_size(const struct lm_pool *p);
/* Runs fn on every thread of the pool and waits for all of them (see above). */
void lm_pool_run(struct lm_pool *p, lm_pool_fn fn, void *ctx);

/* The share [*begin, *end) of `total` items for thread ith of nth, in whole multiples of `align`
 * items (the last share takes the remainder). */
void lm_pool_split(long total, int ith, int nth, long align, long *begin, long *end);

/* Online cores (sysconf), at least 1. */
int lm_pool_online_cores(void);

#endif
