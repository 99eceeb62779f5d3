/* worker.c: see worker.h. */
#include "server/worker.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct lm_worker {
    struct lm_model *model; /* borrowed */
    struct lm_seq *seq;     /* owned; used only by the engine thread */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the engine waits here for work */
    struct lm_job *head, *tail;
    int n_waiting, max_queue;
    struct lm_job *running;
    bool stopping, joined;
    pthread_t thread;
};

static void job_free(struct lm_job *j) {
    lm_chat_request_free(&j->req);
    lm_ids_free(&j->prompt);
    lm_buf_free(&j->pending);
    lm_gen_result_free(&j->result);
    free(j->error);
    pthread_cond_destroy(&j->cond);
    free(j);
}

/* Called with the mutex held; returns true when the caller must free the job after unlocking. */
static bool unref_locked(struct lm_job *j) {
    assert(j->refs > 0);
    return --j->refs == 0;
}

static void finish_locked(struct lm_job *j, lm_status st, const char *msg) {
    j->state = LM_JOB_DONE;
    j->status = st;
    if (st && !j->error) j->error = strdup(msg ? msg : "");
    pthread_cond_broadcast(&j->cond);
}

static bool on_text(void *ctx, const char *text, size_t len) {
    struct lm_job *j = ctx;
    if (j->stream && len) {
        pthread_mutex_lock(&j->w->mu);
        lm_buf_append(&j->pending, text, len);
        pthread_cond_broadcast(&j->cond);
        pthread_mutex_unlock(&j->w->mu);
    }
    return !atomic_load(&j->cancel);
}

static void *engine_main(void *arg) {
    struct lm_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stopping) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stopping) break;
        struct lm_job *j = w->head;
        w->head = j->next;
        if (!w->head) w->tail = NULL;
        j->next = NULL;
        w->n_waiting--;
        j->state = LM_JOB_RUNNING;
        w->running = j;
        pthread_mutex_unlock(&w->mu);

        struct lm_gen_result res = {0};
        lm_status st = lm_generate(w->model, w->seq, &j->gen, on_text, j, &res);
        pthread_mutex_lock(&w->mu);
        if (st == LM_OK && res.finish == LM_FINISH_CANCELLED)
            st = lm_errorf(LM_ERR_CANCELLED, "%s", w->stopping ? "server is shutting down" : "the client went away");
        j->result = res;
        finish_locked(j, st, st ? lm_error_message() : NULL);
        w->running = NULL;
        if (unref_locked(j)) {
            pthread_mutex_unlock(&w->mu);
            job_free(j);
            pthread_mutex_lock(&w->mu);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

lm_status lm_worker_create(struct lm_model *m, int ctx_size, int max_queue, struct lm_worker **out) {
    *out = NULL;
    struct lm_worker *w = calloc(1, sizeof *w);
    if (!w) return lm_errorf(LM_ERR_NOMEM, "out of memory");
    w->model = m;
    w->max_queue = max_queue;
    lm_status st = lm_seq_create(m, ctx_size, &w->seq);
    if (st) {
        free(w);
        return st;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int rc = pthread_create(&w->thread, NULL, engine_main, w);
    if (rc) {
        lm_seq_destroy(w->seq);
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return lm_errorf(LM_ERR_NOMEM, "cannot start the engine thread: %s", strerror(rc));
    }
    *out = w;
    return LM_OK;
}

void lm_worker_shutdown(struct lm_worker *w) {
    if (!w) return;
    struct lm_job *to_free = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->joined) {
        pthread_mutex_unlock(&w->mu);
        return;
    }
    w->stopping = true;
    while (w->head) {
        struct lm_job *j = w->head;
        w->head = j->next;
        j->next = NULL;
        w->n_waiting--;
        atomic_store(&j->cancel, true);
        finish_locked(j, LM_ERR_CANCELLED, "server is shutting down");
        if (unref_locked(j)) {
            j->next = to_free;
            to_free = j;
        }
    }
    w->tail = NULL;
    if (w->running) atomic_store(&w->running->cancel, true);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    while (to_free) {
        struct lm_job *n = to_free->next;
        job_free(to_free);
        to_free = n;
    }
    pthread_join(w->thread, NULL);
    pthread_mutex_lock(&w->mu);
    w->joined = true;
    pthread_mutex_unlock(&w->mu);
}

void lm_worker_destroy(struct lm_worker *w) {
    if (!w) return;
    lm_worker_shutdown(w);
    lm_seq_destroy(w->seq);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void lm_worker_load(struct lm_worker *w, int *waiting, bool *running) {
    pthread_mutex_lock(&w->mu);
    if (waiting) *waiting = w->n_waiting;
    if (running) *running = w->running != NULL;
    pthread_mutex_unlock(&w->mu);
}

struct lm_job *lm_job_create(struct lm_worker *w) {
    struct lm_job *j = calloc(1, sizeof *j);
    if (!j) abort();
    j->w = w;
    j->refs = 1;
    j->state = LM_JOB_NEW;
    atomic_init(&j->cancel, false);
    j->gen.cancel = &j->cancel;
    pthread_cond_init(&j->cond, NULL);
    return j;
}

void lm_job_retain(struct lm_job *j) {
    pthread_mutex_lock(&j->w->mu);
    j->refs++;
    pthread_mutex_unlock(&j->w->mu);
}

void lm_job_release(struct lm_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->w->mu);
    bool last = unref_locked(j);
    pthread_mutex_unlock(&j->w->mu);
    if (last) job_free(j);
}

lm_status lm_worker_submit(struct lm_job *j) {
    struct lm_worker *w = j->w;
    assert(j->state == LM_JOB_NEW && j->gen.max_tokens > 0);
    j->gen.cancel = &j->cancel;
    pthread_mutex_lock(&w->mu);
    lm_status st = LM_OK;
    if (w->stopping) {
        st = lm_errorf(LM_ERR_CANCELLED, "server is shutting down");
    } else if (w->n_waiting + (w->running ? 1 : 0) > w->max_queue) {
        /* max_queue bounds the requests waiting behind a running one; an idle engine takes one
         * more even with max_queue 0 */
        st = lm_errorf(LM_ERR_RANGE, "the queue is full: %d requests are waiting (--max-queue %d)",
                       w->n_waiting, w->max_queue);
    } else {
        j->refs++;
        j->state = LM_JOB_QUEUED;
        if (w->tail) w->tail->next = j;
        else w->head = j;
        w->tail = j;
        w->n_waiting++;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return st;
}

enum lm_job_state lm_job_wait(struct lm_job *j, int timeout_ms, struct lm_buf *text) {
    struct lm_worker *w = j->w;
    pthread_mutex_lock(&w->mu);
    if (j->pending.len == 0 && j->state != LM_JOB_DONE && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cond, &w->mu, &ts);
    }
    if (j->pending.len) {
        if (text) lm_buf_append(text, j->pending.p, j->pending.len);
        lm_buf_reset(&j->pending);
    }
    enum lm_job_state s = j->state;
    pthread_mutex_unlock(&w->mu);
    return s;
}

void lm_job_cancel(struct lm_job *j) {
    struct lm_worker *w = j->w;
    atomic_store(&j->cancel, true);
    pthread_mutex_lock(&w->mu);
    bool last = false;
    if (j->state == LM_JOB_QUEUED) {
        struct lm_job **pp = &w->head, *prev = NULL;
        while (*pp && *pp != j) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = j->next;
            if (w->tail == j) w->tail = prev;
            j->next = NULL;
            w->n_waiting--;
            finish_locked(j, LM_ERR_CANCELLED, "the client went away");
            last = unref_locked(j); /* the queue's reference */
        }
    }
    pthread_mutex_unlock(&w->mu);
    assert(!last); /* the caller still holds its own reference */
    (void)last;
}
