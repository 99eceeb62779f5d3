/* test_generate.c: the decode loop on the tiny Qwen3 checkpoint.
 *
 * Greedy generation must give exactly the greedy_ids of every case in
 * tests/data/fixtures/tiny_qwen3_reference/cases.jsonl (transformers, float64, KV cache; every
 * top-1 margin is >= 0.006). Its text must equal a whole-sequence decode of its ids (second
 * path). Stop strings cut the text right before their first occurrence, and nothing after the
 * cut is ever streamed. Seeded sampling repeats; max_tokens, capacity and cancellation behave.
 * LM_LABEL: model
 * LM_LINK: lm_engine lm_family lm_format lm_text lm_backend lm_base */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "check.h"
#include "engine/generate.h"
#include "family/model.h"
#include "fixtures.h"

/* Collects the streamed pieces; can cancel after `cancel_after` pieces (0 = never). */
struct sink {
    struct lm_buf all;
    int n_pieces;
    int cancel_after;
    bool bad_utf8;
};

static bool utf8_complete(const char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)p[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n) return false;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)p[i + k] & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

static bool on_piece(void *ctx, const char *text, size_t len) {
    struct sink *s = ctx;
    if (len == 0 || !utf8_complete(text, len)) s->bad_utf8 = true;
    lm_buf_append(&s->all, text, len);
    s->n_pieces++;
    return !(s->cancel_after && s->n_pieces >= s->cancel_after);
}

static struct lm_gen_request greedy_req(const struct ref_case *c, int max_tokens) {
    return (struct lm_gen_request){.prompt = c->prompt.v, .n_prompt = c->prompt.n,
                                   .max_tokens = max_tokens, .sampling = {.temperature = 0, .top_p = 1},
                                   .ignore_eos = true};
}

static bool same_ids(const struct lm_ids *a, const int32_t *b, size_t n) {
    return a->n == n && (n == 0 || !memcmp(a->v, b, n * sizeof *b));
}

static void test_greedy(struct lm_model *m, struct lm_seq *seq, const struct ref_case *cases, int n) {
    const struct lm_tokenizer *tok = lm_model_tokenizer(m);
    for (int i = 0; i < n; i++) {
        const struct ref_case *c = &cases[i];
        struct lm_gen_request req = greedy_req(c, 24);
        struct sink sink = {0};
        struct lm_gen_result res;
        lm_status st = lm_generate(m, seq, &req, on_piece, &sink, &res);
        CHECK(st == LM_OK, "%s: %s", c->name, lm_error_message());
        CHECK(same_ids(&res.ids, c->greedy.v, c->greedy.n), "%s: greedy ids differ from transformers",
              c->name);
        for (size_t k = 0; k < res.ids.n && k < c->greedy.n; k++)
            if (res.ids.v[k] != c->greedy.v[k]) {
                fprintf(stderr, "  %s: first difference at step %zu: %d vs %d\n", c->name, k,
                        res.ids.v[k], c->greedy.v[k]);
                break;
            }
        CHECK(res.finish == LM_FINISH_LENGTH && res.completion_tokens == 24 &&
              res.prompt_tokens == (int)c->prompt.n, "%s: finish %s, %d tokens", c->name,
              lm_finish_name(res.finish), res.completion_tokens);
        CHECK(res.prefill_s > 0 && res.decode_s > 0, "%s: timings %g %g", c->name, res.prefill_s,
              res.decode_s);
        struct lm_buf dec = {0};
        lm_tokenizer_decode(tok, res.ids.v, res.ids.n, true, &dec);
        CHECK(res.text.len == dec.len && !memcmp(res.text.p, dec.p, dec.len),
              "%s: streamed text differs from a whole decode of the ids", c->name);
        CHECK(sink.all.len == res.text.len && !memcmp(sink.all.p, res.text.p, res.text.len) &&
              !sink.bad_utf8, "%s: streamed pieces do not concatenate to the text", c->name);
        lm_buf_free(&dec);
        lm_buf_free(&sink.all);
        lm_gen_result_free(&res);
    }
}

/* Runs `c` greedily with `stops` and checks the cut against `full` (the text without stops). */
static void check_stop(struct lm_model *m, struct lm_seq *seq, const struct ref_case *c,
                       const char *full, const char *const *stops, size_t n_stops, const char *what) {
    long cut = -1;
    for (size_t i = 0; i < n_stops; i++) {
        if (!*stops[i]) continue; /* empty stop strings are ignored */
        const char *hit = strstr(full, stops[i]);
        if (hit && (cut < 0 || hit - full < cut)) cut = hit - full;
    }
    struct lm_gen_request req = greedy_req(c, 24);
    req.stop = stops;
    req.n_stop = n_stops;
    struct sink sink = {0};
    struct lm_gen_result res;
    lm_status st = lm_generate(m, seq, &req, on_piece, &sink, &res);
    CHECK(st == LM_OK, "%s: %s", what, lm_error_message());
    size_t want_len = cut >= 0 ? (size_t)cut : strlen(full);
    CHECK(res.text.len == want_len && !memcmp(res.text.p ? res.text.p : "", full, want_len),
          "%s: text of %zu bytes, want the %zu before the stop", what, res.text.len, want_len);
    CHECK(res.finish == (cut >= 0 ? LM_FINISH_STOP : LM_FINISH_LENGTH), "%s: finish %s", what,
          lm_finish_name(res.finish));
    /* Nothing past the cut was streamed: the pieces are exactly the result text. */
    CHECK(sink.all.len == res.text.len && !memcmp(sink.all.p ? sink.all.p : "",
                                                  res.text.p ? res.text.p : "", res.text.len) &&
          !sink.bad_utf8, "%s: streamed %zu bytes for a text of %zu", what, sink.all.len, res.text.len);
    if (cut >= 0) {
        /* The stop ended the request at the token that completed it. */
        struct lm_buf dec = {0};
        lm_tokenizer_decode(lm_model_tokenizer(m), res.ids.v, res.ids.n, true, &dec);
        CHECK(dec.len >= (size_t)cut + strlen(stops[0]) || n_stops > 1, "%s: ids reach the stop", what);
        if (res.ids.n > 1) {
            struct lm_buf dec1 = {0};
            lm_tokenizer_decode(lm_model_tokenizer(m), res.ids.v, res.ids.n - 1, true, &dec1);
            bool earlier = false;
            for (size_t i = 0; i < n_stops; i++)
                earlier |= *stops[i] && strstr(dec1.p ? dec1.p : "", stops[i]) != NULL;
            CHECK(!earlier, "%s: generation went on past the token that completed the stop", what);
            lm_buf_free(&dec1);
        }
        lm_buf_free(&dec);
    }
    lm_buf_free(&sink.all);
    lm_gen_result_free(&res);
}

static void test_stops(struct lm_model *m, struct lm_seq *seq, const struct ref_case *cases, int n) {
    /* The case whose greedy ids vary most gives the most varied text. */
    int best = 0, best_distinct = 0;
    for (int i = 0; i < n; i++) {
        int distinct = 0;
        for (size_t k = 0; k < cases[i].greedy.n; k++)
            if (k == 0 || cases[i].greedy.v[k] != cases[i].greedy.v[k - 1]) distinct++;
        if (distinct > best_distinct) best = i, best_distinct = distinct;
    }
    const struct ref_case *c = &cases[best];
    struct lm_gen_request req = greedy_req(c, 24);
    struct lm_gen_result res;
    lm_status st = lm_generate(m, seq, &req, NULL, NULL, &res);
    CHECK(st == LM_OK && res.text.len > 8, "%s: plain run (%zu bytes)", c->name, res.text.len);
    if (st || res.text.len <= 8) return;
    char *full = strdup(res.text.p);
    size_t len = res.text.len;
    lm_gen_result_free(&res);

    /* A stop string of about 5 bytes from the middle of the text, on character boundaries. */
    size_t a = len / 2, b;
    while (a > 0 && ((unsigned char)full[a] & 0xC0) == 0x80) a--;
    b = a + 5 < len ? a + 5 : len;
    while (b < len && ((unsigned char)full[b] & 0xC0) == 0x80) b++;
    char *mid = strndup(full + a, b - a);
    const char *s1[] = {mid};
    check_stop(m, seq, c, full, s1, 1, "stop from the middle");

    /* The first character alone: stops before anything is released. */
    size_t f = 1;
    while (f < len && ((unsigned char)full[f] & 0xC0) == 0x80) f++;
    char *first = strndup(full, f);
    const char *s2[] = {first};
    check_stop(m, seq, c, full, s2, 1, "stop at the start");

    /* A string whose every proper prefix keeps appearing but which never completes: text is
     * held back and released, and the whole text still comes out. */
    size_t plen = strlen(mid);
    char *never = malloc(plen + 2);
    memcpy(never, mid, plen);
    never[plen] = '\x01';
    never[plen + 1] = 0;
    const char *s3[] = {never};
    check_stop(m, seq, c, full, s3, 1, "held but never completed");

    /* Several stops: the earliest occurrence wins; an empty stop string is ignored. */
    const char *s4[] = {never, "", mid, first + 0};
    check_stop(m, seq, c, full, s4, 4, "several stops");
    const char *s5[] = {"", mid};
    check_stop(m, seq, c, full, s5, 2, "empty and middle");

    free(never);
    free(first);
    free(mid);
    free(full);
}

static void test_sampling(struct lm_model *m, struct lm_seq *seq, const struct ref_case *c) {
    struct lm_gen_request req = greedy_req(c, 16);
    req.sampling = (struct lm_sampling_params){.temperature = 0.8f, .top_p = 0.95f, .top_k = 0,
                                               .seed = 42, .seeded = true};
    struct lm_gen_result r1, r2, r3;
    lm_generate(m, seq, &req, NULL, NULL, &r1);
    lm_generate(m, seq, &req, NULL, NULL, &r2);
    req.sampling.seed = 43;
    lm_generate(m, seq, &req, NULL, NULL, &r3);
    CHECK(r1.ids.n == 16 && same_ids(&r1.ids, r2.ids.v, r2.ids.n), "seeded sampling repeats");
    CHECK(!same_ids(&r1.ids, r3.ids.v, r3.ids.n), "another seed gives other ids");
    CHECK(!same_ids(&r1.ids, c->greedy.v, 16), "sampling is not greedy");
    lm_gen_result_free(&r1);
    lm_gen_result_free(&r2);
    lm_gen_result_free(&r3);

    req.sampling = (struct lm_sampling_params){.temperature = 0.7f, .top_k = 1, .top_p = 1};
    lm_generate(m, seq, &req, NULL, NULL, &r1);
    CHECK(same_ids(&r1.ids, c->greedy.v, 16), "top_k=1 sampling equals greedy");
    lm_gen_result_free(&r1);
}

static void test_limits(struct lm_model *m, struct lm_seq *seq, const struct ref_case *cases, int n) {
    const struct ref_case *c = &cases[0];
    struct lm_gen_request req = greedy_req(c, 5);
    struct lm_gen_result res;
    lm_status st = lm_generate(m, seq, &req, NULL, NULL, &res);
    CHECK(st == LM_OK && res.finish == LM_FINISH_LENGTH && same_ids(&res.ids, c->greedy.v, 5),
          "max_tokens 5: finish %s, %zu ids", lm_finish_name(res.finish), res.ids.n);
    lm_gen_result_free(&res);

    /* The greedy ids of these cases hold no EOS, so honouring EOS changes nothing. */
    req.ignore_eos = false;
    req.max_tokens = 24;
    st = lm_generate(m, seq, &req, NULL, NULL, &res);
    CHECK(st == LM_OK && same_ids(&res.ids, c->greedy.v, 24), "EOS honoured, none met");
    lm_gen_result_free(&res);

    /* EOS: random weights never choose <|im_end|>, so the test makes the 4th greedy id an EOS id
     * for a moment (the model's defaults are a plain struct inside it). Generation must stop
     * before it, emit neither it nor its text, and finish "stop". */
    struct lm_gen_defaults *gd = (struct lm_gen_defaults *)lm_model_gen_defaults(m);
    struct lm_gen_defaults saved = *gd;
    CHECK(gd->n_eos >= 1 && gd->eos_token_ids[0] == 151645, "EOS from generation_config.json: %d",
          gd->eos_token_ids[0]);
    gd->eos_token_ids[gd->n_eos++] = c->greedy.v[3];
    struct sink sink_eos = {0};
    st = lm_generate(m, seq, &req, on_piece, &sink_eos, &res);
    struct lm_buf dec3 = {0};
    lm_tokenizer_decode(lm_model_tokenizer(m), c->greedy.v, 3, true, &dec3);
    bool first_eos = c->greedy.v[0] != c->greedy.v[3] && c->greedy.v[1] != c->greedy.v[3] &&
                     c->greedy.v[2] != c->greedy.v[3];
    if (first_eos)
        CHECK(st == LM_OK && res.finish == LM_FINISH_STOP && same_ids(&res.ids, c->greedy.v, 3) &&
              res.text.len == dec3.len && !memcmp(res.text.p, dec3.p, dec3.len) &&
              sink_eos.all.len == dec3.len, "EOS: finish %s after %zu ids", lm_finish_name(res.finish),
              res.ids.n);
    else
        CHECK(st == LM_OK && res.finish == LM_FINISH_STOP && res.ids.n < 3, "EOS early: %zu ids", res.ids.n);
    lm_gen_result_free(&res);
    req.ignore_eos = true;
    st = lm_generate(m, seq, &req, NULL, NULL, &res);
    CHECK(st == LM_OK && same_ids(&res.ids, c->greedy.v, 24), "ignore_eos goes past EOS ids");
    lm_gen_result_free(&res);
    *gd = saved;
    lm_buf_free(&dec3);
    lm_buf_free(&sink_eos.all);

    const struct ref_case *big = NULL;
    for (int i = 0; i < n; i++)
        if (!big || cases[i].prompt.n > big->prompt.n) big = &cases[i];
    int cap = lm_seq_capacity(seq);
    req = greedy_req(big, cap - (int)big->prompt.n + 1);
    st = lm_generate(m, seq, &req, NULL, NULL, &res);
    char want[64];
    snprintf(want, sizeof want, "%d tokens", cap);
    CHECK(st == LM_ERR_RANGE && strstr(lm_error_message(), want), "over capacity: %s: %s",
          lm_status_name(st), lm_error_message());
    lm_gen_result_free(&res);
    req.max_tokens = cap - (int)big->prompt.n;
    st = lm_generate(m, seq, &req, NULL, NULL, &res);
    CHECK(st == LM_OK && res.ids.n == (size_t)req.max_tokens && res.finish == LM_FINISH_LENGTH,
          "exactly at capacity: %s %zu", lm_error_message(), res.ids.n);
    lm_gen_result_free(&res);

    /* Cancellation: by the flag before the first token, and by the callback. */
    atomic_bool cancel = true;
    req = greedy_req(c, 24);
    req.cancel = &cancel;
    st = lm_generate(m, seq, &req, NULL, NULL, &res);
    CHECK(st == LM_OK && res.finish == LM_FINISH_CANCELLED && res.ids.n == 0, "flag: finish %s, %zu ids",
          lm_finish_name(res.finish), res.ids.n);
    lm_gen_result_free(&res);
    req.cancel = NULL;
    struct sink sink = {.cancel_after = 2};
    st = lm_generate(m, seq, &req, on_piece, &sink, &res);
    CHECK(st == LM_OK && res.finish == LM_FINISH_CANCELLED && sink.n_pieces == 2 && res.ids.n < 24,
          "callback: finish %s, %d pieces, %zu ids", lm_finish_name(res.finish), sink.n_pieces, res.ids.n);
    CHECK(sink.all.len == res.text.len && !memcmp(sink.all.p, res.text.p, res.text.len),
          "cancelled text equals the streamed pieces");
    lm_buf_free(&sink.all);
    lm_gen_result_free(&res);

    req.max_tokens = 0;
    st = lm_generate(m, seq, &req, NULL, NULL, &res);
    CHECK(st == LM_ERR_INVALID, "max_tokens 0: %s", lm_status_name(st));
    lm_gen_result_free(&res);
}

int main(void) {
    struct lm_model_open_params op = lm_model_default_open_params();
    op.n_threads = 2;
    struct lm_model *m = NULL;
    lm_status st = lm_model_open(TINY_MODEL, &op, &m);
    CHECK(st == LM_OK, "open: %s", lm_error_message());
    if (st) return check_exit("test_generate");
    struct lm_seq *seq = NULL;
    st = lm_seq_create(m, 1024, &seq);
    CHECK(st == LM_OK, "seq: %s", lm_error_message());
    struct ref_case *cases = NULL;
    int n = ref_cases_load(&cases);
    CHECK(n == 10, "%d cases", n);
    if (seq && n > 0) {
        test_greedy(m, seq, cases, n);
        test_stops(m, seq, cases, n);
        test_sampling(m, seq, &cases[0]);
        test_limits(m, seq, cases, n);
    }
    ref_cases_free(cases, n);
    lm_seq_destroy(seq);
    lm_model_close(m);
    return check_exit("test_generate");
}
