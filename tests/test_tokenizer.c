/* test_tokenizer.c: the byte-level BPE tokenizer against Hugging Face `tokenizers` 0.23.2.
 * Goldens: tests/data/fixtures/tokenizer/{encode_cases,decode_prefix_cases}.jsonl (the real
 * Qwen3 tokenizer.json) and, for the added-token flags and the small hand-written tokenizer
 * below, ids that HF tokenizers 0.23.2 (node binding) produced for the same JSON.
 * Second paths: the streaming detokenizer against whole-sequence decode, tokenizer.json against
 * lm_tokenizer_create from parts, one thread against several, encode->decode against utf8proc's
 * NFC on random text.
 * LM_LINK: lm_text lm_base */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <utf8proc.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "base/status.h"
#include "check.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

#define QWEN_JSON TINY_MODEL "/tokenizer.json"

static json_t **read_jsonl(const char *path, size_t *n) {
    struct lm_buf b = {0};
    json_t **v = NULL;
    *n = 0;
    if (lm_file_read(path, &b)) {
        CHECK(0, "%s", lm_error_message());
        return NULL;
    }
    char *p = b.p, *end = b.p + b.len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) nl = end;
        if (nl > p) {
            json_error_t e;
            json_t *j = json_loadb(p, (size_t)(nl - p), JSON_ALLOW_NUL, &e);
            CHECK(j, "%s: line %zu: %s", path, *n + 1, e.text);
            if (j) {
                v = realloc(v, (*n + 1) * sizeof *v);
                v[(*n)++] = j;
            }
        }
        p = nl + 1;
    }
    lm_buf_free(&b);
    return v;
}

static bool ids_eq(const struct lm_ids *a, json_t *arr) {
    if (a->n != json_array_size(arr)) return false;
    for (size_t i = 0; i < a->n; i++)
        if (a->v[i] != json_integer_value(json_array_get(arr, i))) return false;
    return true;
}

static void ids_from_json(json_t *arr, struct lm_ids *out) {
    out->n = 0;
    lm_status st = lm_json_to_ids(arr, "ids", out);
    CHECK(st == LM_OK, "%s", lm_error_message());
}

static void print_ids(const char *what, const struct lm_ids *ids) {
    struct lm_buf b = {0};
    lm_ids_to_json(ids->v, ids->n, &b);
    fprintf(stderr, "  %s: %s\n", what, b.p);
    lm_buf_free(&b);
}

static bool str_eq(const struct lm_buf *b, json_t *s) {
    size_t n = json_string_length(s);
    return b->len == n && !memcmp(b->p ? b->p : "", json_string_value(s), n);
}

/* Streams ids through lm_detok and checks: every emission is whole UTF-8 characters; after
 * each id, emitted + (U+FFFD if bytes are held) equals decode of the prefix; emitted + flush
 * equals decode of the whole sequence. */
static void check_stream(const struct lm_tokenizer *tok, const int32_t *ids, size_t n, bool skip,
                         const char *label) {
    struct lm_detok d;
    lm_detok_init(&d, tok, skip);
    struct lm_buf got = {0}, piece = {0}, full = {0}, want = {0};
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        lm_buf_reset(&piece);
        CHECK(lm_detok_push(&d, ids[i], &piece) == LM_OK, "%s: push %d", label, ids[i]);
        ok = lm_utf8_valid_prefix((const unsigned char *)piece.p, piece.len) == piece.len;
        CHECK(ok, "%s: id %zu emitted part of a UTF-8 character", label, i);
        lm_buf_append(&got, piece.p, piece.len);
        struct lm_detok copy = d;
        lm_buf_reset(&full);
        lm_buf_append(&full, got.p, got.len);
        lm_detok_flush(&copy, &full);
        lm_buf_reset(&want);
        lm_tokenizer_decode(tok, ids, i + 1, skip, &want);
        ok = full.len == want.len && !memcmp(full.p, want.p, want.len);
        CHECK(ok, "%s: after %zu ids, stream+flush '%s' != decode '%s'", label, i + 1,
              full.p ? full.p : "", want.p ? want.p : "");
    }
    lm_detok_flush(&d, &got);
    lm_buf_reset(&want);
    lm_tokenizer_decode(tok, ids, n, skip, &want);
    CHECK(got.len == want.len && !memcmp(got.p ? got.p : "", want.p ? want.p : "", want.len),
          "%s: streamed text differs from decode", label);
    lm_buf_free(&got);
    lm_buf_free(&piece);
    lm_buf_free(&full);
    lm_buf_free(&want);
}

static void test_encode_cases(const struct lm_tokenizer *tok) {
    size_t n;
    json_t **cases = read_jsonl(TEST_DATA("fixtures/tokenizer/encode_cases.jsonl"), &n);
    CHECK(n == 56, "encode cases: %zu", n);
    struct lm_ids ids = {0}, want = {0};
    struct lm_buf text = {0};
    for (size_t i = 0; i < n; i++) {
        json_t *c = cases[i];
        json_t *jt = json_object_get(c, "text");
        const char *t = json_string_value(jt);
        size_t tl = json_string_length(jt);
        char label[64];
        snprintf(label, sizeof label, "encode_cases[%zu]", i);

        ids.n = 0;
        CHECK(lm_tokenizer_encode(tok, t, tl, 0, &ids) == LM_OK, "%s", label);
        bool ok = ids_eq(&ids, json_object_get(c, "ids"));
        CHECK(ok, "%s: ids differ for %s", label, t);
        if (!ok) print_ids("got", &ids);

        ids.n = 0;
        CHECK(lm_tokenizer_encode(tok, t, tl, LM_ENCODE_SPECIAL_AS_TEXT, &ids) == LM_OK, "%s", label);
        ok = ids_eq(&ids, json_object_get(c, "ids_special_as_text"));
        CHECK(ok, "%s: ids_special_as_text differ for %s", label, t);
        if (!ok) print_ids("got", &ids);

        ids_from_json(json_object_get(c, "ids"), &want);
        lm_buf_reset(&text);
        CHECK(lm_tokenizer_decode(tok, want.v, want.n, false, &text) == LM_OK, "%s", label);
        CHECK(str_eq(&text, json_object_get(c, "decoded")), "%s: decoded '%s'", label, text.p);
        lm_buf_reset(&text);
        CHECK(lm_tokenizer_decode(tok, want.v, want.n, true, &text) == LM_OK, "%s", label);
        CHECK(str_eq(&text, json_object_get(c, "decoded_skip_special")), "%s: decoded_skip_special '%s'",
              label, text.p);

        check_stream(tok, want.v, want.n, false, label);
        check_stream(tok, want.v, want.n, true, label);
        ids_from_json(json_object_get(c, "ids_special_as_text"), &want);
        check_stream(tok, want.v, want.n, false, label);
        json_decref(c);
    }
    free(cases);
    lm_ids_free(&ids);
    lm_ids_free(&want);
    lm_buf_free(&text);
}

static void test_decode_prefixes(const struct lm_tokenizer *tok) {
    size_t n;
    json_t **cases = read_jsonl(TEST_DATA("fixtures/tokenizer/decode_prefix_cases.jsonl"), &n);
    CHECK(n == 4, "decode prefix cases: %zu", n);
    struct lm_ids ids = {0}, want = {0};
    struct lm_buf text = {0};
    for (size_t i = 0; i < n; i++) {
        json_t *c = cases[i];
        json_t *jt = json_object_get(c, "text");
        char label[64];
        snprintf(label, sizeof label, "decode_prefix_cases[%zu]", i);
        ids.n = 0;
        lm_tokenizer_encode(tok, json_string_value(jt), json_string_length(jt), 0, &ids);
        CHECK(ids_eq(&ids, json_object_get(c, "ids")), "%s: ids differ", label);
        ids_from_json(json_object_get(c, "ids"), &want);
        json_t *pre = json_object_get(c, "decoded_prefixes");
        CHECK(json_array_size(pre) == want.n, "%s: %zu prefixes", label, json_array_size(pre));
        for (size_t k = 1; k <= want.n && k <= json_array_size(pre); k++) {
            lm_buf_reset(&text);
            lm_tokenizer_decode(tok, want.v, k, false, &text);
            CHECK(str_eq(&text, json_array_get(pre, k - 1)), "%s: prefix %zu decoded '%s'", label, k,
                  text.p);
        }
        /* Token strings: the fixture's ByteLevel spellings name the same ids. */
        json_t *toks = json_object_get(c, "tokens");
        for (size_t k = 0; k < json_array_size(toks); k++)
            CHECK(lm_tokenizer_token_id(tok, json_string_value(json_array_get(toks, k))) == want.v[k],
                  "%s: token_id(tokens[%zu])", label, k);
        check_stream(tok, want.v, want.n, false, label);
        json_decref(c);
    }
    free(cases);
    lm_ids_free(&ids);
    lm_ids_free(&want);
    lm_buf_free(&text);
}

static void test_basics(const struct lm_tokenizer *tok) {
    /* GPT-2 bytes_to_unicode: a bijection; printable Latin-1 maps to itself, byte 0 to U+0100,
     * space to U+0120 (Ġ), 0xAD to U+0143. */
    int seen = 0;
    for (int b = 0; b < 256; b++) seen += lm_bytelevel_byte(lm_bytelevel_char((unsigned char)b)) == b;
    CHECK(seen == 256 && lm_bytelevel_char(0) == 0x100 && lm_bytelevel_char(' ') == 0x120 &&
              lm_bytelevel_char('A') == 'A' && lm_bytelevel_char(0xAD) == 0x143 &&
              lm_bytelevel_byte(0x144) == -1 && lm_bytelevel_byte(0xAD) == -1,
          "bytes_to_unicode");
    CHECK(lm_tokenizer_vocab_size(tok) == 151669, "vocab size %zu", lm_tokenizer_vocab_size(tok));
    CHECK(lm_tokenizer_token_id(tok, "<|im_end|>") == 151645, "im_end");
    CHECK(lm_tokenizer_token_id(tok, "<think>") == 151667, "think");
    CHECK(lm_tokenizer_token_id(tok, "Hello") == 9707, "Hello");
    CHECK(lm_tokenizer_token_id(tok, "no such token ") == -1, "missing token");
    CHECK(lm_tokenizer_is_special(tok, 151645), "im_end special");
    CHECK(!lm_tokenizer_is_special(tok, 151667), "<think> is not special");
    CHECK(!lm_tokenizer_is_special(tok, 9707), "Hello is not special");

    /* Ids with no token (Qwen3 models pad the embedding to 151936) decode to nothing, as HF
     * drops them; a negative id is an error. */
    struct lm_buf b = {0};
    int32_t pad[] = {9707, 151700, 1879};
    CHECK(lm_tokenizer_decode(tok, pad, 3, false, &b) == LM_OK && !strcmp(b.p, "Hello world"),
          "padding id: %s", b.p ? b.p : "(null)");
    lm_buf_reset(&b);
    int32_t neg[] = {9707, -3};
    CHECK(lm_tokenizer_decode(tok, neg, 2, false, &b) == LM_ERR_INVALID && b.len == 0 &&
              strstr(lm_error_message(), "-3"),
          "bad id: %s", lm_error_message());
    struct lm_detok d;
    lm_detok_init(&d, tok, false);
    CHECK(lm_detok_push(&d, -1, &b) == LM_ERR_INVALID, "detok bad id");
    CHECK(lm_detok_push(&d, 151935, &b) == LM_OK && b.len == 0, "detok padding id");

    /* Ill-formed UTF-8 input is encoded as its lossy conversion. */
    struct lm_ids a = {0}, c = {0};
    lm_tokenizer_encode(tok, "ab\xff\xe2\x82 cd\xc3", 9, 0, &a);
    const char *fixed = "ab\xEF\xBF\xBD\xEF\xBF\xBD cd\xEF\xBF\xBD";
    lm_tokenizer_encode(tok, fixed, strlen(fixed), 0, &c);
    CHECK(a.n == c.n && a.n && !memcmp(a.v, c.v, a.n * sizeof *a.v), "lossy input");

    /* The Qwen2 regex macro is the one in tokenizer.json. */
    json_t *root = json_load_file(QWEN_JSON, 0, NULL);
    json_t *re = json_object_get(json_object_get(json_array_get(json_object_get(
                                     json_object_get(root, "pre_tokenizer"), "pretokenizers"), 0),
                                     "pattern"),
                                 "Regex");
    CHECK(re && !strcmp(json_string_value(re), LM_TOKENIZER_REGEX_QWEN2), "QWEN2 regex macro");
    CHECK(!strcmp(lm_tokenizer_pre_regex("qwen2"), LM_TOKENIZER_REGEX_QWEN2), "pre_regex qwen2");
    CHECK(!lm_tokenizer_pre_regex("no-such-pre"), "pre_regex unknown");
    json_decref(root);

    /* U+0085 (NEL) is White_Space but not \s for HF's Oniguruma; HF 0.23.2 gives: */
    static const int32_t nel_want[] = {64, 126, 227, 65, 2139, 227};
    a.n = 0;
    lm_tokenizer_encode(tok, "a\xc2\x85" "b \xc2\x85", 7, 0, &a);
    CHECK(a.n == 6 && !memcmp(a.v, nel_want, sizeof nel_want), "NEL");
    if (a.n != 6 || memcmp(a.v, nel_want, sizeof nel_want)) print_ids("NEL got", &a);
    lm_ids_free(&a);
    lm_ids_free(&c);
    lm_buf_free(&b);
}

/* A small tokenizer.json exercising the added-token flags, NFC, and merge order; written with
 * ' for " to stay readable. Expected ids below come from HF tokenizers 0.23.2 (node binding)
 * on this exact JSON, except where marked "by rule". */
static const char *k_small_json =
    "{'version':'1.0','truncation':null,'padding':null,'added_tokens':["
    "{'id':25,'content':'<s>','single_word':false,'lstrip':false,'rstrip':false,'normalized':false,'special':true},"
    "{'id':26,'content':'[L]','single_word':false,'lstrip':true,'rstrip':false,'normalized':false,'special':false},"
    "{'id':27,'content':'[R]','single_word':false,'lstrip':false,'rstrip':true,'normalized':false,'special':false},"
    "{'id':28,'content':'dd','single_word':true,'lstrip':false,'rstrip':false,'normalized':false,'special':false},"
    "{'id':29,'content':'é','single_word':false,'lstrip':false,'rstrip':false,'normalized':true,'special':false},"
    "{'id':30,'content':'<s>xx','single_word':false,'lstrip':false,'rstrip':false,'normalized':false,'special':false},"
    "{'id':31,'content':'[S]','single_word':false,'lstrip':false,'rstrip':false,'normalized':false,'special':true},"
    "{'id':32,'content':'S]','single_word':false,'lstrip':false,'rstrip':false,'normalized':false,'special':false}],"
    "'normalizer':{'type':'Sequence','normalizers':[{'type':'NFC'}]},"
    "'pre_tokenizer':{'type':'Sequence','pretokenizers':["
    "{'type':'Split','pattern':{'Regex':' ?\\\\p{L}+|\\\\s+|[^\\\\s\\\\p{L}]+'},'behavior':'Isolated','invert':false},"
    "{'type':'ByteLevel','add_prefix_space':false,'trim_offsets':false,'use_regex':false}]},"
    "'post_processor':{'type':'ByteLevel','add_prefix_space':false,'trim_offsets':false,'use_regex':false},"
    "'decoder':{'type':'ByteLevel','add_prefix_space':false,'trim_offsets':false,'use_regex':false},"
    "'model':{'type':'BPE','dropout':null,'unk_token':null,'continuing_subword_prefix':'',"
    "'end_of_word_suffix':'','fuse_unk':false,'byte_fallback':false,'ignore_merges':false,"
    "'vocab':{'a':0,'b':1,'c':2,'d':3,'Ġ':4,'ab':5,'bc':6,'abc':7,'Ġa':8,'[':9,']':10,'L':11,"
    "'R':12,'S':13,'x':14,'Ã':15,'©':16,'e':17,'<':18,'>':19,'cd':20,'s':21,'Ì':22,'ģ':23,'Ã©':24},"
    "'merges':MERGES}}";

struct small_case {
    const char *text;
    unsigned flags;
    int n;
    int32_t ids[8];
};

static const struct small_case k_small_cases[] = {
    {"abc abcd", 0, 4, {7, 4, 7, 3}},        /* (b,c) outranks (a,b); (c,d) comes too late */
    {"ab  [L]cd", 0, 3, {5, 26, 20}},        /* lstrip swallows the spaces */
    {"ab[R]  cd", 0, 3, {5, 27, 20}},        /* rstrip */
    {"a dd b", 0, 5, {0, 4, 28, 4, 1}},      /* single_word between spaces */
    {"add dd.", 0, 5, {0, 3, 3, 4, 28}},     /* not inside a word; '.' has no token: dropped */
    {"e\xcc\x81 \xc3\xa9", 0, 3, {29, 4, 29}}, /* normalized token matches after NFC */
    {"\xc3\xa9<s>\xc3\xa9", 0, 3, {29, 25, 29}},
    {"<s>xx<s>x", 0, 3, {30, 25, 14}},       /* longest match */
    {"[S]", 0, 1, {31}},
    {"aqa", 0, 2, {0, 0}},                   /* bytes without a token are dropped */
    {" a\xc3\xa9", 0, 2, {8, 29}},
    {"[L] [L]", 0, 2, {26, 26}},
    {" \xe3\x80\x80[L]", 0, 1, {26}},         /* lstrip takes U+3000 too */
    /* by rule (HF's find_matches skips special matches and resumes after them): */
    {"[S]", LM_ENCODE_SPECIAL_AS_TEXT, 3, {9, 13, 10}},
    {"<s>xx<s>x", LM_ENCODE_SPECIAL_AS_TEXT, 5, {30, 18, 21, 19, 14}},
};

static char *small_json(const char *merges) {
    struct lm_buf b = {0};
    const char *m = strstr(k_small_json, "MERGES");
    lm_buf_append(&b, k_small_json, (size_t)(m - k_small_json));
    lm_buf_puts(&b, merges);
    lm_buf_puts(&b, m + 6);
    for (size_t i = 0; i < b.len; i++)
        if (b.p[i] == '\'') b.p[i] = '"';
    return lm_buf_take(&b);
}

static const char *k_merges_str = "['b c','a b','ab c','a bc','Ġ a','c d','Ã ©']";
static const char *k_merges_pairs =
    "[['b','c'],['a','b'],['ab','c'],['a','bc'],['Ġ','a'],['c','d'],['Ã','©']]";

/* s with the first `from` replaced by `to`; ' in from/to stands for ". */
static char *replace(const char *s, const char *from_q, const char *to_q) {
    char *from = strdup(from_q), *to = strdup(to_q);
    for (char *p = from; *p; p++) if (*p == '\'') *p = '"';
    for (char *p = to; *p; p++) if (*p == '\'') *p = '"';
    struct lm_buf b = {0};
    const char *m = strstr(s, from);
    CHECK(m != NULL, "replace: '%s' not found", from);
    if (m) {
        lm_buf_append(&b, s, (size_t)(m - s));
        lm_buf_puts(&b, to);
        lm_buf_puts(&b, m + strlen(from));
    } else {
        lm_buf_puts(&b, s);
    }
    free(from);
    free(to);
    return lm_buf_take(&b);
}

static char g_tmpdir[64];

/* Writes tokenizer.json text into the temp dir and loads it. */
static lm_status load_text(const char *json, struct lm_tokenizer **tok) {
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_tmpdir);
    lm_status st = lm_file_write(path, json, strlen(json));
    CHECK(st == LM_OK, "%s", lm_error_message());
    return lm_tokenizer_load(path, tok);
}

static void check_small(const struct lm_tokenizer *tok, const char *label) {
    struct lm_ids ids = {0};
    for (size_t i = 0; i < sizeof k_small_cases / sizeof k_small_cases[0]; i++) {
        const struct small_case *c = &k_small_cases[i];
        ids.n = 0;
        CHECK(lm_tokenizer_encode(tok, c->text, strlen(c->text), c->flags, &ids) == LM_OK, "encode");
        bool ok = ids.n == (size_t)c->n && !memcmp(ids.v, c->ids, ids.n * sizeof *ids.v);
        CHECK(ok, "%s: case %zu '%s' flags %u", label, i, c->text, c->flags);
        if (!ok) print_ids("got", &ids);
    }
    lm_ids_free(&ids);
}

static void test_small(void) {
    struct lm_tokenizer *a = NULL, *b = NULL, *c = NULL;
    char *j = small_json(k_merges_str);
    CHECK(load_text(j, &a) == LM_OK, "small (string merges): %s", lm_error_message());
    free(j);
    j = small_json(k_merges_pairs);
    CHECK(load_text(j, &b) == LM_OK, "small (pair merges): %s", lm_error_message());
    free(j);
    if (a) check_small(a, "small/json strings");
    if (b) check_small(b, "small/json pairs");

    /* The same tokenizer from parts, as a GGUF loader would build it. */
    const char *tokens[33] = {"a", "b", "c", "d", "Ġ", "ab", "bc", "abc", "Ġa", "[", "]",
                              "L", "R", "S", "x", "Ã", "©", "e", "<", ">", "cd", "s",
                              "Ì", "ģ", "Ã©", "<s>", "[L]", "[R]", "dd", "é", "<s>xx", "[S]", "S]"};
    uint8_t kinds[33] = {0}, flags[33] = {0};
    for (int i = 25; i < 33; i++) kinds[i] = LM_TOKEN_ADDED;
    kinds[25] = kinds[31] = LM_TOKEN_SPECIAL;
    flags[26] = LM_ADDED_LSTRIP;
    flags[27] = LM_ADDED_RSTRIP;
    flags[28] = LM_ADDED_SINGLE_WORD;
    flags[29] = LM_ADDED_NORMALIZED;
    const char *merges[] = {"b c", "a b", "ab c", "a bc", "Ġ a", "c d", "Ã ©"};
    const char *re = " ?\\p{L}+|\\s+|[^\\s\\p{L}]+";
    struct lm_tokenizer_parts p = {.source = "parts", .n_tokens = 33, .tokens = tokens,
                                   .kinds = kinds, .added_flags = flags, .n_merges = 7,
                                   .merges = merges, .nfc = true, .n_split_regexes = 1,
                                   .split_regexes = &re};
    CHECK(lm_tokenizer_create(&p, &c) == LM_OK, "parts: %s", lm_error_message());
    if (c) check_small(c, "small/parts");
    if (c) {
        CHECK(lm_tokenizer_vocab_size(c) == 33 && lm_tokenizer_is_special(c, 31) &&
                  !lm_tokenizer_is_special(c, 32) && lm_tokenizer_token_id(c, "S]") == 32,
              "parts lookups");
        struct lm_buf t = {0};
        /* HF 0.23.2: decode([25,7,24,26,31,15]) = "<s>abcé[L][S]\uFFFD" (15 is a lone 0xC3);
         * with 29 (the added token "é") in place of 24, "é" goes through the ByteLevel map
         * like every token, becomes the lone byte 0xE9, and decodes to U+FFFD. */
        int32_t ids[] = {25, 7, 24, 26, 31, 15}, ids2[] = {25, 7, 29, 26, 31, 15};
        lm_tokenizer_decode(c, ids, 6, false, &t);
        CHECK(t.p && !strcmp(t.p, "<s>abc\xc3\xa9[L][S]\xef\xbf\xbd"), "small decode '%s'", t.p);
        lm_buf_reset(&t);
        lm_tokenizer_decode(c, ids, 6, true, &t);
        CHECK(t.p && !strcmp(t.p, "abc\xc3\xa9[L]\xef\xbf\xbd"), "small decode skip '%s'", t.p);
        lm_buf_reset(&t);
        lm_tokenizer_decode(c, ids2, 6, false, &t);
        CHECK(t.p && !strcmp(t.p, "<s>abc\xef\xbf\xbd[L][S]\xef\xbf\xbd"), "small decode2 '%s'", t.p);
        lm_buf_free(&t);
        check_stream(c, ids2, 6, false, "small stream2");
        check_stream(c, ids, 6, false, "small stream");
        check_stream(c, ids, 6, true, "small stream skip");
    }
    /* unk_token (HF 0.23.2 on the same JSON with "unk_token":"x", with and without fuse_unk). */
    static const struct { const char *fuse, *text; int n; int32_t ids[4]; } unk_cases[] = {
        {"true", "aqqa", 3, {0, 14, 0}}, {"true", "a.q", 3, {0, 14, 14}}, {"true", "qab", 2, {14, 5}},
        {"false", "aqqa", 4, {0, 14, 14, 0}}, {"false", "a.q", 3, {0, 14, 14}},
    };
    for (size_t i = 0; i < sizeof unk_cases / sizeof unk_cases[0]; i++) {
        char *j0 = small_json(k_merges_str), *fuse = NULL;
        char *j1 = replace(j0, "'unk_token':null", "'unk_token':'x'");
        struct lm_buf f = {0};
        lm_buf_printf(&f, "'fuse_unk':%s", unk_cases[i].fuse);
        fuse = lm_buf_take(&f);
        char *j2 = replace(j1, "'fuse_unk':false", fuse);
        struct lm_tokenizer *u = NULL;
        CHECK(load_text(j2, &u) == LM_OK, "unk json: %s", lm_error_message());
        if (u) {
            struct lm_ids ids = {0};
            lm_tokenizer_encode(u, unk_cases[i].text, strlen(unk_cases[i].text), 0, &ids);
            CHECK(ids.n == (size_t)unk_cases[i].n && !memcmp(ids.v, unk_cases[i].ids, ids.n * 4),
                  "unk case %zu", i);
            lm_ids_free(&ids);
        }
        lm_tokenizer_destroy(u);
        free(j0);
        free(j1);
        free(j2);
        free(fuse);
    }
    /* A merge whose result is not in the vocabulary is refused, naming the merge. */
    merges[6] = "c c";
    struct lm_tokenizer *d = NULL;
    CHECK(lm_tokenizer_create(&p, &d) == LM_ERR_FORMAT && !d &&
              strstr(lm_error_message(), "merges[6]") && strstr(lm_error_message(), "\"cc\""),
          "parts bad merge: %s", lm_error_message());
    lm_tokenizer_destroy(a);
    lm_tokenizer_destroy(b);
    lm_tokenizer_destroy(c);
}

static void expect_error(const char *json, lm_status want, const char *needle, const char *label) {
    struct lm_tokenizer *t = NULL;
    lm_status st = load_text(json, &t);
    CHECK(st == want && !t && strstr(lm_error_message(), needle) &&
              strstr(lm_error_message(), "tokenizer.json"),
          "%s: got %s '%s', want %s naming %s", label, lm_status_name(st), lm_error_message(),
          lm_status_name(want), needle);
    lm_tokenizer_destroy(t);
}

static void test_errors(void) {
    struct lm_tokenizer *t = NULL;
    lm_status st = lm_tokenizer_load("/nonexistent/dir/tokenizer.json", &t);
    CHECK(st == LM_ERR_IO && !t && strstr(lm_error_message(), "/nonexistent/dir/tokenizer.json"),
          "missing file: %s", lm_error_message());

    char *good = small_json(k_merges_pairs);
    struct { const char *from, *to; lm_status st; const char *needle; } cases[] = {
        {"['a','bc']", "['a']", LM_ERR_FORMAT, "model.merges[3] is not a pair of strings"},
        {"['a','bc']", "['a',7]", LM_ERR_FORMAT, "model.merges[3] is not a pair of strings"},
        {"['a','bc']", "['a','q']", LM_ERR_FORMAT, "model.merges[3]: token \"q\" is not in the vocabulary"},
        {"{'type':'NFC'}", "{'type':'NFKD'}", LM_ERR_UNSUPPORTED, "normalizer.normalizers[0].type NFKD"},
        {"'Isolated'", "'Removed'", LM_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].behavior Removed"},
        {"'add_prefix_space':false,'trim_offsets':false,'use_regex':false}]",
         "'add_prefix_space':true}]", LM_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[1].add_prefix_space"},
        {"'type':'BPE'", "'type':'WordPiece'", LM_ERR_UNSUPPORTED, "model.type WordPiece"},
        {"'decoder':{'type':'ByteLevel'", "'decoder':{'type':'Metaspace'", LM_ERR_UNSUPPORTED,
         "decoder.type Metaspace"},
        {"'Regex':'", "'Regex':'(", LM_ERR_UNSUPPORTED, "does not compile"},
        {"'vocab':{", "'vocab':{'zz':'x',", LM_ERR_FORMAT, "model.vocab[\"zz\"] is not a token id"},
        {"{'version'", "{{'version'", LM_ERR_FORMAT, "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *j = replace(good, cases[i].from, cases[i].to);
        char label[32];
        snprintf(label, sizeof label, "error case %zu", i);
        expect_error(j, cases[i].st, cases[i].needle, label);
        free(j);
    }
    free(good);
    char *j = small_json("['b c','a b','ab c','a bc','Ġ a','c d','Ã©']");
    expect_error(j, LM_ERR_FORMAT, "model.merges[6] is not two tokens separated by one space", "string merge");
    free(j);
}

/* encode -> decode gives back the NFC form of any text without added-token strings; checked
 * against utf8proc's NFC on random mixes of scripts, spaces, marks and emoji. */
static void test_roundtrip(const struct lm_tokenizer *tok) {
    static const int32_t pool[] = {'a', 'Z', 'q', ' ', ' ', '\n', '\t', '\r', '.', ',', '\'', '1', '7', '<',
                                   '|', 0xE9, 0x301, 0x308, 0x4E2D, 0x6587, 0xAC00, 0x1100, 0x1161, 0x3042,
                                   0x0416, 0x05D0, 0x0915, 0x094D, 0x1F600, 0x1F3FD, 0x200D, 0x2009,
                                   0xA0, 0x3000, 0xFB01, 0x1D518, 0x85, 0xFEFF, 0x10FFFD, 0x7F};
    unsigned seed = 12345;
    struct lm_ids ids = {0};
    struct lm_buf text = {0}, back = {0};
    int bad = 0;
    for (int it = 0; it < 300; it++) {
        lm_buf_reset(&text);
        seed = seed * 1103515245u + 12345u;
        int n = 1 + (int)((seed >> 16) % 80);
        for (int k = 0; k < n; k++) {
            seed = seed * 1103515245u + 12345u;
            unsigned char u[4];
            int l = lm_utf8_encode((uint32_t)pool[(seed >> 16) % (sizeof pool / sizeof pool[0])], u);
            lm_buf_append(&text, u, (size_t)l);
        }
        ids.n = 0;
        lm_tokenizer_encode(tok, text.p, text.len, 0, &ids);
        lm_buf_reset(&back);
        lm_tokenizer_decode(tok, ids.v, ids.n, false, &back);
        char *nfc = (char *)utf8proc_NFC((const utf8proc_uint8_t *)text.p);
        if (!nfc || strcmp(nfc, back.p ? back.p : "")) bad++;
        free(nfc);
        check_stream(tok, ids.v, ids.n, false, "roundtrip");
    }
    CHECK(bad == 0, "%d of 300 random texts do not round-trip to their NFC", bad);
    lm_ids_free(&ids);
    lm_buf_free(&text);
    lm_buf_free(&back);
}

/* ~100 KB of English-like text from a fixed word list (deterministic). */
static void english_text(struct lm_buf *b, size_t bytes) {
    static const char *words[] = {
        "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
        "by", "on", "not", "he", "I", "this", "are", "or", "his", "from", "at", "which", "but",
        "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her",
        "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
        "tokenizer", "language", "model", "serving", "throughput", "latency", "Hugging", "Face",
        "understanding", "implementation", "performance", "2026", "3.14", "don't", "it's",
        "(see", "below)", "e.g.,", "\"quoted\"", "well-known", "HTTP/1.1", "user@example.com"};
    unsigned seed = 7;
    size_t nw = sizeof words / sizeof words[0];
    int in_sentence = 0;
    while (b->len < bytes) {
        seed = seed * 1103515245u + 12345u;
        const char *w = words[(seed >> 16) % nw];
        if (in_sentence) lm_buf_putc(b, ' ');
        lm_buf_puts(b, w);
        if (++in_sentence > 8 + (int)((seed >> 8) % 12)) {
            lm_buf_puts(b, (seed >> 4) % 5 ? ". " : ".\n\n");
            in_sentence = 0;
        }
    }
}

struct thread_arg {
    const struct lm_tokenizer *tok;
    const struct lm_buf *text;
    const struct lm_ids *want;
    int mismatches;
};

static void *encode_thread(void *p) {
    struct thread_arg *a = p;
    struct lm_ids ids = {0};
    for (int rep = 0; rep < 3; rep++) {
        ids.n = 0;
        lm_tokenizer_encode(a->tok, a->text->p, a->text->len, 0, &ids);
        if (ids.n != a->want->n || memcmp(ids.v, a->want->v, ids.n * sizeof *ids.v)) a->mismatches++;
    }
    lm_ids_free(&ids);
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_speed_and_threads(const struct lm_tokenizer *tok) {
    struct lm_buf text = {0};
    english_text(&text, 100 * 1024);
    struct lm_ids ids = {0};
    lm_tokenizer_encode(tok, text.p, text.len, 0, &ids); /* warm up */
    int reps = 5;
    double t0 = now_s();
    for (int r = 0; r < reps; r++) {
        ids.n = 0;
        lm_tokenizer_encode(tok, text.p, text.len, 0, &ids);
    }
    double dt = (now_s() - t0) / reps;
    fprintf(stderr, "encode: %zu bytes -> %zu tokens in %.2f ms: %.0f tokens/s, %.1f MB/s\n", text.len,
            ids.n, dt * 1e3, (double)ids.n / dt, (double)text.len / dt / 1e6);
    struct lm_buf back = {0};
    t0 = now_s();
    lm_tokenizer_decode(tok, ids.v, ids.n, false, &back);
    dt = now_s() - t0;
    fprintf(stderr, "decode: %zu tokens in %.2f ms: %.0f tokens/s\n", ids.n, dt * 1e3, (double)ids.n / dt);
    CHECK(back.len == text.len && !memcmp(back.p, text.p, text.len), "English text round trip");

    /* Concurrent encodes of the same text give the single-thread ids. */
    enum { NT = 4 };
    pthread_t th[NT];
    struct thread_arg args[NT];
    for (int i = 0; i < NT; i++) {
        args[i] = (struct thread_arg){tok, &text, &ids, 0};
        pthread_create(&th[i], NULL, encode_thread, &args[i]);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].mismatches == 0, "thread %d: %d mismatching encodes", i, args[i].mismatches);
    }
    lm_ids_free(&ids);
    lm_buf_free(&text);
    lm_buf_free(&back);
}

/* Qwen3 rebuilt from parts (as the GGUF loader will: tokens by id, kinds, "a b" merges, the
 * regex named by tokenizer.ggml.pre) must encode the fixtures like tokenizer.json does. */
static void test_qwen_parts(const struct lm_tokenizer *ref) {
    json_t *root = json_load_file(QWEN_JSON, 0, NULL);
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab"), *jm = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    size_t n = 151669, nm = json_array_size(jm);
    const char **tokens = calloc(n, sizeof *tokens);
    uint8_t *kinds = calloc(n, 1);
    char **merges = calloc(nm, sizeof *merges);
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) tokens[json_integer_value(v)] = key;
    size_t i;
    json_array_foreach(added, i, v) {
        size_t id = (size_t)json_integer_value(json_object_get(v, "id"));
        tokens[id] = json_string_value(json_object_get(v, "content"));
        kinds[id] = json_is_true(json_object_get(v, "special")) ? LM_TOKEN_SPECIAL : LM_TOKEN_ADDED;
    }
    json_array_foreach(jm, i, v) {
        struct lm_buf b = {0};
        lm_buf_printf(&b, "%s %s", json_string_value(json_array_get(v, 0)),
                      json_string_value(json_array_get(v, 1)));
        merges[i] = lm_buf_take(&b);
    }
    const char *re = lm_tokenizer_pre_regex("qwen2");
    struct lm_tokenizer_parts p = {.source = "qwen3 parts", .n_tokens = n, .tokens = tokens,
                                   .kinds = kinds, .n_merges = nm, .merges = (const char *const *)merges,
                                   .nfc = true, .n_split_regexes = 1, .split_regexes = &re};
    struct lm_tokenizer *tok = NULL;
    CHECK(lm_tokenizer_create(&p, &tok) == LM_OK, "qwen parts: %s", lm_error_message());
    if (tok) {
        size_t nc;
        json_t **cases = read_jsonl(TEST_DATA("fixtures/tokenizer/encode_cases.jsonl"), &nc);
        struct lm_ids ids = {0};
        for (size_t k = 0; k < nc; k++) {
            json_t *jt = json_object_get(cases[k], "text");
            ids.n = 0;
            lm_tokenizer_encode(tok, json_string_value(jt), json_string_length(jt), 0, &ids);
            CHECK(ids_eq(&ids, json_object_get(cases[k], "ids")), "qwen parts: case %zu", k);
            ids.n = 0;
            lm_tokenizer_encode(tok, json_string_value(jt), json_string_length(jt),
                                LM_ENCODE_SPECIAL_AS_TEXT, &ids);
            CHECK(ids_eq(&ids, json_object_get(cases[k], "ids_special_as_text")),
                  "qwen parts: case %zu special as text", k);
            json_decref(cases[k]);
        }
        free(cases);
        CHECK(lm_tokenizer_vocab_size(tok) == lm_tokenizer_vocab_size(ref), "qwen parts vocab size");
        lm_ids_free(&ids);
    }
    lm_tokenizer_destroy(tok);
    for (i = 0; i < nm; i++) free(merges[i]);
    free(merges);
    free(tokens);
    free(kinds);
    json_decref(root);
}

int main(void) {
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/lm_test_tokenizer.XXXXXX");
    if (!mkdtemp(g_tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    struct lm_tokenizer *tok = NULL;
    double t0 = now_s();
    lm_status st = lm_tokenizer_load(QWEN_JSON, &tok);
    CHECK(st == LM_OK, "load: %s", lm_error_message());
    fprintf(stderr, "load tokenizer.json: %.0f ms\n", (now_s() - t0) * 1e3);
    if (tok) {
        test_basics(tok);
        test_encode_cases(tok);
        test_decode_prefixes(tok);
        test_roundtrip(tok);
        test_speed_and_threads(tok);
        test_qwen_parts(tok);
    }
    test_small();
    test_errors();
    lm_tokenizer_destroy(tok);
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_tmpdir);
    unlink(path);
    rmdir(g_tmpdir);
    return check_exit("test_tokenizer");
}
