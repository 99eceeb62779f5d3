/* worker.h: the engine thread and the queue in front of it.
 *
 * One engine thread owns the model's only lm_seq (KV capacity ctx_size) and runs jobs one at a
 * time, first come first served. Network threads and the engine meet only here: a job is created
 * and filled on a network thread, submitted to the queue (bounded by max_queue waiting jobs), and
 * the network thread then waits on the job for released text and completion. Everything a job
 * shares between the two sides is guarded by the worker's one mutex; the job is reference-counted
 * (creator + queue/engine) and freed, with the request's memory, when the last side lets go.
 *
 * Cancellation: lm_job_cancel sets the job's cancel flag (lm_generate polls it every step, and
 * the text callback returns false) and, if the job is still waiting, takes it out of the queue
 * so it never runs. A later continuous-batching scheduler can replace the engine loop behind the
 * same job interface. */
#ifndef LM_SERVER_WORKER_H
#define LM_SERVER_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "base/buf.h"
#include "base/status.h"
#include "engine/generate.h"
#include "family/model.h"
#include "server/openai.h"

enum lm_job_state {
    LM_JOB_NEW,     /* created, not submitted */
    LM_JOB_QUEUED,  /* waiting in the queue */
    LM_JOB_RUNNING, /* on the engine thread */
    LM_JOB_DONE,    /* finished, failed or cancelled; result/status final */
};

struct lm_worker;

struct lm_job {
    /* Filled by the creator before lm_worker_submit; read-only afterwards. Owned by the job. */
    struct lm_chat_request req; /* the parsed request (owns the stop strings) */
    struct lm_ids prompt;       /* prompt ids */
    struct lm_gen_request gen;  /* points into req and prompt; gen.cancel = &cancel */
    bool stream;                /* release text to `pending` as it is generated */

    atomic_bool cancel; /* set by lm_job_cancel; polled by lm_generate */

    /* Guarded by the worker mutex; final (readable without the lock) once state is DONE. */
    enum lm_job_state state;
    struct lm_buf pending;       /* streamed text released but not yet taken by lm_job_wait */
    struct lm_gen_result result; /* valid when DONE and status == LM_OK */
    lm_status status;            /* LM_OK, LM_ERR_CANCELLED (client gone, shutdown) or the error */
    char *error;                 /* message for a non-OK status; owned */

    /* Private to worker.c. */
    struct lm_worker *w;
    pthread_cond_t cond;
    int refs;
    struct lm_job *next;
};

/* Creates the engine thread with one sequence of `ctx_size` positions. `m` is borrowed and must
 * outlive the worker. Errors from lm_seq_create (LM_ERR_RANGE, LM_ERR_NOMEM). */
lm_status lm_worker_create(struct lm_model *m, int ctx_size, int max_queue, struct lm_worker **out);
/* Stops taking jobs: queued jobs finish as LM_ERR_CANCELLED ("server is shutting down"), the
 * running one is cancelled, and the engine thread is joined. Waiters wake up. Idempotent. */
void lm_worker_shutdown(struct lm_worker *w);
/* Shuts down (if not yet) and frees. Every job must have been released first. */
void lm_worker_destroy(struct lm_worker *w);

/* Counts for logs and tests: jobs waiting, and whether one is running. */
void lm_worker_load(struct lm_worker *w, int *waiting, bool *running);

/* A new job with one reference (the caller's), state NEW. Never NULL (aborts on OOM). */
struct lm_job *lm_job_create(struct lm_worker *w);
/* Takes one more reference (for example for a streaming response that outlives the request). */
void lm_job_retain(struct lm_job *j);
/* Drops the caller's reference; the last reference frees the job and its request memory. */
void lm_job_release(struct lm_job *j);

/* Queues `j` (state NEW, gen filled). LM_ERR_RANGE when max_queue jobs already wait (answer
 * 429); LM_ERR_CANCELLED when the worker is shutting down (answer 503). */
lm_status lm_worker_submit(struct lm_job *j);

/* Waits up to `timeout_ms` for released text or completion. Moves released text to `text` (when
 * non-NULL) and returns the job's state at that moment. */
enum lm_job_state lm_job_wait(struct lm_job *j, int timeout_ms, struct lm_buf *text);

/* The client went away: sets the cancel flag; a queued job leaves the queue and never runs. */
void lm_job_cancel(struct lm_job *j);

#endif
