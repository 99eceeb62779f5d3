/* test_engine.c: the serving engine behind the HTTP layer (server/worker.h) on the tiny model.
 *
 * - Prefix reuse across turns: turn 2 of a conversation (thinking on and off) reports
 *   cached_tokens >= the tokens of turn 1's conversation plus its answer in canonical form (the
 *   form the chat template renders when the answer comes back as history), and its greedy ids
 *   equal those of the same prompt on a fresh engine (reuse changes nothing).
 * - Cancellation: a running request stops within a step and its KV blocks go back (pool
 *   counters); a request waiting for a slot never runs.
 * - Admission: max_seqs + max_queue requests are taken, the next one is refused (429).
 * - Shutdown: in-flight requests finish within the drain timeout; past it they are cancelled;
 *   submissions are refused.
 * LM_LABEL: model
 * LM_LINK: lm_server lm_engine lm_family lm_format lm_text lm_backend lm_base */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "family/model.h"
#include "server/openai.h"
#include "server/worker.h"

static struct lm_model *g_model;

/* A chat job from a JSON body; the prompt is rendered and tokenized as the server does. */
static struct lm_job *chat_job(struct lm_worker *w, const char *body, int max_tokens,
                               struct lm_ids *prompt_out) {
    struct lm_job *j = lm_job_create(w);
    struct lm_api_error err;
    lm_status st = lm_chat_request_parse(body, strlen(body), &j->req, &err);
    CHECK(st == LM_OK, "parse: %s", err.message);
    struct lm_buf text = {0};
    st = lm_model_render_chat(g_model, j->req.messages, j->req.n_messages, &j->req.chat, &text);
    CHECK(st == LM_OK, "render: %s", lm_error_message());
    lm_tokenizer_encode(lm_model_tokenizer(g_model), text.p, text.len, 0, &j->prompt);
    lm_buf_free(&text);
    j->gen = (struct lm_gen_request){.prompt = j->prompt.v,
                                     .n_prompt = j->prompt.n,
                                     .max_tokens = max_tokens,
                                     .sampling = {.temperature = 0, .top_p = 1},
                                     .ignore_eos = true};
    if (prompt_out) lm_ids_append(prompt_out, j->prompt.v, j->prompt.n);
    return j;
}

static enum lm_job_state wait_done(struct lm_job *j, double secs) {
    enum lm_job_state s = LM_JOB_NEW;
    for (int i = 0; i < secs * 100 && (s = lm_job_wait(j, 10, NULL)) != LM_JOB_DONE; i++) {
    }
    return s;
}

static char *json_escape(const char *s) {
    json_t *v = json_string(s);
    char *out = json_dumps(v, JSON_ENCODE_ANY);
    json_decref(v);
    return out;
}

/* Content as the reasoning parser gives it: after the last "</think>", leading newlines
 * dropped; the whole text when there is none. */
static const char *content_of(const char *text) {
    const char *c = text, *p;
    while ((p = strstr(c, "</think>")))
        c = p + 8;
    if (c != text)
        while (*c == '\n')
            c++;
    return c;
}

static void test_two_turns(int thinking) {
    struct lm_worker_params p = lm_worker_default_params();
    p.ctx_size = 2048;
    struct lm_worker *w;
    CHECK(lm_worker_start(g_model, &p, &w) == LM_OK, "worker: %s", lm_error_message());
    char kw[96] = "";
    if (thinking >= 0)
        snprintf(kw, sizeof kw, ",\"chat_template_kwargs\":{\"enable_thinking\":%s}",
                 thinking ? "true" : "false");
    const char *q1 =
        "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
        "cultural experiences and must-see attractions.";
    const char *q2 = "Rewrite your previous response. Start every sentence with the letter A.";
    char body1[1024];
    snprintf(body1, sizeof body1,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"You are helpful.\"},"
             "{\"role\":\"user\",\"content\":\"%s\"}]%s}",
             q1, kw);
    struct lm_ids p1 = {0};
    struct lm_job *j1 = chat_job(w, body1, 60, &p1);
    CHECK(lm_worker_submit(j1) == LM_OK, "submit turn 1");
    CHECK(wait_done(j1, 60) == LM_JOB_DONE && j1->status == LM_OK, "turn 1 done");
    char *answer = json_escape(content_of(j1->result.text.p ? j1->result.text.p : ""));

    /* Turn 2 as a client sends it: the history with the answer's content. */
    char *body2 = malloc(strlen(answer) + 2048);
    sprintf(body2,
            "{\"messages\":[{\"role\":\"system\",\"content\":\"You are helpful.\"},"
            "{\"role\":\"user\",\"content\":\"%s\"},{\"role\":\"assistant\",\"content\":%s},"
            "{\"role\":\"user\",\"content\":\"%s\"}]%s}",
            q1, answer, q2, kw);
    /* Turn 1 with its canonical answer = turn 2's prompt up to its new user turn: everything
     * before the second-to-last <|im_start|> (the last opens the generation prompt), plus it. */
    struct lm_job *probe = chat_job(w, body2, 1, NULL);
    const int32_t im_start = lm_tokenizer_token_id(lm_model_tokenizer(g_model), "<|im_start|>");
    size_t canon = 0;
    for (size_t i = probe->prompt.n, seen = 0; i-- > 0;)
        if (probe->prompt.v[i] == im_start && ++seen == 2) {
            canon = i + 1;
            break;
        }
    lm_job_release(probe);
    /* No pause: turn 2 reaches the engine after turn 1's canonical-form prefill was queued
     * (with priority) and waits for it rather than computing the same blocks. */
    struct lm_ids p2 = {0};
    struct lm_job *j2 = chat_job(w, body2, 24, &p2);
    CHECK(lm_worker_submit(j2) == LM_OK, "submit turn 2");
    CHECK(wait_done(j2, 60) == LM_JOB_DONE && j2->status == LM_OK, "turn 2 done");
    int cached = j2->result.cached_tokens;

    CHECK(canon > p1.n && cached >= (int)canon && cached < (int)p2.n,
          "thinking %d: turn 2 reuses %d of %zu prompt tokens; turn 1 (prompt %zu) with its "
          "canonical "
          "answer is %zu",
          thinking, cached, p2.n, p1.n, canon);
    fprintf(stderr,
            "test_engine: thinking %d: turn 1 prompt %zu + answer %d tokens; turn 2 prompt %zu, "
            "cached %d (canonical history %zu)\n",
            thinking, p1.n, j1->result.completion_tokens, p2.n, cached, canon);
    CHECK(j2->result.times.arrival_ms > 0 &&
              j2->result.times.scheduled_ms >= j2->result.times.arrival_ms &&
              j2->result.times.first_token_ms >= j2->result.times.scheduled_ms &&
              j2->result.times.finish_ms >= j2->result.times.first_token_ms,
          "times in order");
    struct lm_worker_stats st;
    lm_worker_stats(w, &st);
    CHECK(st.warm_requests >= 1 && st.later_turn_requests == 1 &&
              st.later_turn_cached_tokens == cached &&
              st.later_turn_reusable_tokens == (long long)canon,
          "stats: %lld warm, %lld later turns, %lld reusable", st.warm_requests,
          st.later_turn_requests, st.later_turn_reusable_tokens);

    /* The same turn 2 on a fresh engine: same ids, nothing cached. */
    struct lm_worker *w2;
    CHECK(lm_worker_start(g_model, &p, &w2) == LM_OK, "worker 2");
    struct lm_job *j3 = chat_job(w2, body2, 24, NULL);
    lm_worker_submit(j3);
    CHECK(wait_done(j3, 60) == LM_JOB_DONE && j3->status == LM_OK && j3->result.cached_tokens == 0,
          "fresh turn 2");
    CHECK(j3->result.ids.n == j2->result.ids.n &&
              !memcmp(j3->result.ids.v, j2->result.ids.v, j2->result.ids.n * sizeof(int32_t)),
          "thinking %d: turn 2 with reused prefix gives the ids of a fresh prefill", thinking);
    lm_job_release(j3);
    lm_worker_destroy(w2);

    lm_job_release(j1);
    lm_job_release(j2);
    free(answer);
    free(body2);
    lm_ids_free(&p1);
    lm_ids_free(&p2);
    lm_worker_destroy(w);
}

static const char *k_long =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a long story.\"}]}";

static void test_cancel_and_admission(void) {
    struct lm_worker_params p = lm_worker_default_params();
    p.ctx_size = 4096;
    p.max_seqs = 2;
    p.max_queue = 1;
    p.max_batch_tokens = 64;
    struct lm_worker *w;
    CHECK(lm_worker_start(g_model, &p, &w) == LM_OK, "worker: %s", lm_error_message());
    struct lm_job *a = chat_job(w, k_long, 4000, NULL), *b = chat_job(w, k_long, 4000, NULL);
    struct lm_job *c = chat_job(w, k_long, 4000, NULL), *d = chat_job(w, k_long, 10, NULL);
    a->stream = true;
    CHECK(lm_worker_submit(a) == LM_OK && lm_worker_submit(b) == LM_OK, "two running");
    CHECK(lm_worker_submit(c) == LM_OK, "one waiting (max_queue 1)");
    CHECK(lm_worker_submit(d) == LM_ERR_RANGE && strstr(lm_error_message(), "queue is full"),
          "the fourth is refused: %s", lm_error_message());
    lm_job_release(d);

    /* a streams some text, then its client goes away. */
    struct lm_buf got = {0};
    for (int i = 0; i < 2000 && got.len < 20; i++)
        lm_job_wait(a, 10, &got);
    CHECK(got.len >= 20, "a streamed %zu bytes", got.len);
    struct lm_worker_stats st;
    lm_worker_stats(w, &st);
    CHECK(st.running == 2 && st.waiting == 1 && st.engine.kv_blocks_used > 0,
          "2 running, 1 waiting, %d blocks used", st.engine.kv_blocks_used);
    /* c waits for a slot; its client leaves: it never runs. */
    lm_job_cancel(c);
    CHECK(wait_done(c, 10) == LM_JOB_DONE && c->status == LM_ERR_CANCELLED &&
              c->result.times.scheduled_ms == 0 && c->result.completion_tokens == 0,
          "waiting request cancelled without running (scheduled %g)", c->result.times.scheduled_ms);
    lm_job_cancel(a);
    CHECK(wait_done(a, 10) == LM_JOB_DONE && a->status == LM_ERR_CANCELLED,
          "running request cancelled");
    CHECK(a->result.completion_tokens < 4000, "a stopped early (%d tokens)",
          a->result.completion_tokens);
    lm_job_cancel(b);
    CHECK(wait_done(b, 10) == LM_JOB_DONE && b->status == LM_ERR_CANCELLED, "b cancelled");
    /* The worker returns the blocks on its own thread: poll (a loaded machine may take a while). */
    for (int i = 0; i < 500; i++) {
        lm_worker_stats(w, &st);
        if (st.running == 0 && st.waiting == 0 && st.engine.kv_blocks_used == 0) break;
        usleep(10 * 1000);
    }
    CHECK(st.running == 0 && st.waiting == 0 && st.engine.kv_blocks_used == 0 &&
              st.engine.kv_blocks_free + st.engine.kv_blocks_cached == st.engine.kv_blocks,
          "every block back: %d used, %d cached, %d free of %d", st.engine.kv_blocks_used,
          st.engine.kv_blocks_cached, st.engine.kv_blocks_free, st.engine.kv_blocks);
    lm_buf_free(&got);
    lm_job_release(a);
    lm_job_release(b);
    lm_job_release(c);
    lm_worker_destroy(w);
}

static void test_shutdown(void) {
    struct lm_worker_params p = lm_worker_default_params();
    p.ctx_size = 4096;
    p.shutdown_timeout_s = 30;
    struct lm_worker *w;
    lm_worker_start(g_model, &p, &w);
    struct lm_job *a = chat_job(w, k_long, 200, NULL);
    lm_worker_submit(a);
    lm_worker_shutdown(w); /* drains: a finishes */
    CHECK(lm_job_wait(a, 0, NULL) == LM_JOB_DONE && a->status == LM_OK &&
              a->result.completion_tokens == 200,
          "in-flight request finished during the drain (%d tokens)", a->result.completion_tokens);
    struct lm_job *late = chat_job(w, k_long, 10, NULL);
    CHECK(lm_worker_submit(late) == LM_ERR_CANCELLED, "no submissions after shutdown");
    lm_job_release(late);
    lm_job_release(a);
    lm_worker_destroy(w);

    p.shutdown_timeout_s = 0.2;
    lm_worker_start(g_model, &p, &w);
    struct lm_job *b = chat_job(w, k_long, 4000, NULL);
    lm_worker_submit(b);
    double t0 = lm_now_ms();
    lm_worker_shutdown(w);
    double dt = lm_now_ms() - t0;
    CHECK(lm_job_wait(b, 0, NULL) == LM_JOB_DONE && b->status == LM_ERR_CANCELLED && b->error &&
              strstr(b->error, "shutting down"),
          "past the drain timeout the request is cancelled: %s", b->error ? b->error : "");
    CHECK(dt < 5000, "shutdown took %.0f ms", dt);
    lm_job_release(b);
    lm_worker_destroy(w);
}

int main(void) {
    struct lm_model_open_params mp = lm_model_default_open_params();
    lm_status rc = lm_model_open(TINY_MODEL, &mp, &g_model);
    CHECK(rc == LM_OK, "open: %s", lm_error_message());
    if (rc) return check_exit("test_engine");
    test_two_turns(-1);
    test_two_turns(0);
    test_two_turns(1);
    test_cancel_and_admission();
    test_shutdown();
    lm_model_close(g_model);
    return check_exit("test_engine");
}
