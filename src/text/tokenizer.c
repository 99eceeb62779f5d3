/* tokenizer.c: byte-level BPE (see tokenizer.h).
 *
 * Each step follows Hugging Face `tokenizers` (0.23), the reference the fixtures come from:
 *   added tokens      tokenizer/added_vocabulary.rs  find_matches / extract_and_normalize
 *   normalizer        normalizers/unicode.rs NFC (here utf8proc)
 *   pre-tokenizer     pre_tokenizers/split.rs (Isolated), byte_level.rs (bytes_to_unicode)
 *   BPE               models/bpe/model.rs merge_word, models/bpe/word.rs merge_all
 *   decoder           decoders/byte_level.rs + String::from_utf8_lossy
 *
 * Internally every token is known both by its string (the ByteLevel spelling, used for lookups
 * by name and for the merges) and by the bytes it decodes to. BPE runs on symbol ids: a word's
 * bytes start as the ids of the 256 single-byte tokens and pairs are merged by rank through a
 * hash map (left id, right id) -> (rank, merged id). Everything is immutable after create; an
 * encode call keeps its scratch (PCRE2 match data, BPE symbols and heap) on its own. */
#include "text/tokenizer.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include "text/utf8.h"

#define MAX_SPLITS 8

struct added_tok {
    int32_t id;
    uint32_t len;
    char *s; /* content (NFC-normalized when LM_ADDED_NORMALIZED), owned */
    uint8_t flags;
    bool special;
};

/* Added tokens matched at one stage (raw or normalized text), longest first. */
struct added_set {
    struct added_tok *v;
    size_t n;
    uint8_t first[256]; /* 1 when some token starts with this byte */
};

struct pair_slot {
    uint64_t key; /* (left << 32) | right; PAIR_EMPTY when free */
    uint32_t rank;
    int32_t id; /* merged token */
};
#define PAIR_EMPTY UINT64_MAX

struct lm_tokenizer {
    size_t n_tokens;
    uint8_t *kind;               /* [n_tokens] enum lm_token_kind */
    char *strs;                  /* token strings, each NUL-terminated */
    uint32_t *str_off, *str_len; /* [n_tokens] into strs */
    unsigned char *bytes;        /* decoded bytes of every token */
    uint32_t *byte_off, *byte_len;

    int32_t *vocab; /* open-addressing hash of NORMAL token strings -> id, -1 empty */
    size_t vocab_mask;
    struct pair_slot *pairs;
    size_t pair_mask;
    int32_t byte_id[256];          /* id of the single-byte token for each byte, -1 if none */
    unsigned char bl_utf8[256][2]; /* ByteLevel spelling of each byte (1 or 2 UTF-8 bytes) */
    uint8_t bl_len[256];

    struct added_set raw, norm;
    pcre2_code *re[MAX_SPLITS];
    size_t n_re;
    bool nfc, ignore_merges, fuse_unk;
    int32_t unk_id;
};

/* ---- hashing ---- */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

static int32_t vocab_find(const struct lm_tokenizer *t, const char *s, size_t n) {
    size_t i = hash_bytes(s, n) & t->vocab_mask;
    for (;;) {
        int32_t id = t->vocab[i];
        if (id < 0) return -1;
        if (t->str_len[id] == n && !memcmp(t->strs + t->str_off[id], s, n)) return id;
        i = (i + 1) & t->vocab_mask;
    }
}

/* Inserts unless the string is present (the first id keeps it). */
static void vocab_insert(struct lm_tokenizer *t, int32_t id) {
    const char *s = t->strs + t->str_off[id];
    size_t n = t->str_len[id];
    size_t i = hash_bytes(s, n) & t->vocab_mask;
    while (t->vocab[i] >= 0) {
        int32_t o = t->vocab[i];
        if (t->str_len[o] == n && !memcmp(t->strs + t->str_off[o], s, n)) return;
        i = (i + 1) & t->vocab_mask;
    }
    t->vocab[i] = id;
}

static const struct pair_slot *pair_find(const struct lm_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = hash_pair(key) & t->pair_mask;
    for (;;) {
        const struct pair_slot *s = &t->pairs[i];
        if (s->key == key) return s;
        if (s->key == PAIR_EMPTY) return NULL;
        i = (i + 1) & t->pair_mask;
    }
}

/* A later merge of the same pair replaces the earlier one, as HF's HashMap collect does. */
static void pair_insert(struct lm_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = hash_pair(key) & t->pair_mask;
    while (t->pairs[i].key != PAIR_EMPTY && t->pairs[i].key != key)
        i = (i + 1) & t->pair_mask;
    t->pairs[i] = (struct pair_slot){key, rank, id};
}

/* ---- Unicode helpers for the added-token flags (HF uses Rust regex \s and \w) ---- */

/* The White_Space property: Rust regex's \s (HF's lstrip/rstrip strip \s* at the edge). */
static bool is_white_space(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Rust regex's Unicode \w, which HF's single_word test uses (^\w, \w$): Alphabetic, marks,
 * decimal digits, connector punctuation and the joiners. Alphabetic is approximated by the
 * letter categories, Nl, and the circled letters (Other_Alphabetic outside the marks). */
static bool is_word_cp(int32_t c) {
    if (c < 0x80)
        return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_';
    if (c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9)) return true;
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC: return true;
    default: return false;
    }
}

/* The code point that ends at s[n-1] (s is well-formed UTF-8), or -1 for n == 0. */
static int32_t last_cp(const char *s, size_t n) {
    if (!n) return -1;
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    int len;
    return lm_utf8_decode((const unsigned char *)s + i, n - i, &len);
}

static int32_t first_cp(const char *s, size_t n) {
    if (!n) return -1;
    int len;
    return lm_utf8_decode((const unsigned char *)s, n, &len);
}

/* Length of s[0..n) after Rust's trim_end. */
static size_t trim_end_len(const char *s, size_t n) {
    while (n > 0) {
        size_t i = n - 1;
        while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
            i--;
        int len;
        if (!is_white_space(lm_utf8_decode((const unsigned char *)s + i, n - i, &len))) break;
        n = i;
    }
    return n;
}

/* Bytes of leading White_Space in s[0..n). */
static size_t lead_space_len(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        int len;
        if (!is_white_space(lm_utf8_decode((const unsigned char *)s + i, n - i, &len))) break;
        i += (size_t)len;
    }
    return i;
}

/* NFC of s[0..n) (well-formed UTF-8) in a malloc'd buffer, or NULL when utf8proc fails. */
static char *nfc_dup(const char *s, size_t n, size_t *out_n) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) return NULL;
    *out_n = (size_t)r;
    return (char *)dst;
}

static bool all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

/* ---- regex ---- */

const char *lm_tokenizer_pre_regex(const char *gguf_pre) {
    if (!gguf_pre) return NULL;
    if (!strcmp(gguf_pre, "qwen2") || !strcmp(gguf_pre, "deepseek-r1-qwen"))
        return LM_TOKENIZER_REGEX_QWEN2;
    if (!strcmp(gguf_pre, "gpt2") || !strcmp(gguf_pre, "default")) return LM_TOKENIZER_REGEX_GPT2;
    return NULL;
}

/* ---- create / destroy ---- */

void lm_tokenizer_destroy(struct lm_tokenizer *t) {
    if (!t) return;
    for (size_t i = 0; i < t->raw.n; i++)
        free(t->raw.v[i].s);
    for (size_t i = 0; i < t->norm.n; i++)
        free(t->norm.v[i].s);
    free(t->raw.v);
    free(t->norm.v);
    for (size_t i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    free(t->kind);
    free(t->strs);
    free(t->str_off);
    free(t->str_len);
    free(t->bytes);
    free(t->byte_off);
    free(t->byte_len);
    free(t->vocab);
    free(t->pairs);
    free(t);
}

static int cmp_added(const void *a, const void *b) {
    const struct added_tok *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static lm_status add_merge(struct lm_tokenizer *t, const char *src, const char *mf, size_t i,
                           const char *a, size_t na, const char *b, size_t nb, struct lm_buf *tmp) {
    int32_t ia = vocab_find(t, a, na), ib = vocab_find(t, b, nb);
    if (ia < 0 || ib < 0) {
        const char *s = ia < 0 ? a : b;
        int n = (int)(ia < 0 ? na : nb);
        return lm_errorf(LM_ERR_FORMAT, "%s: %s[%zu]: token \"%.*s\" is not in the vocabulary", src,
                         mf, i, n, s);
    }
    lm_buf_reset(tmp);
    lm_buf_append(tmp, a, na);
    lm_buf_append(tmp, b, nb);
    int32_t im = vocab_find(t, tmp->p, tmp->len);
    if (im < 0)
        return lm_errorf(LM_ERR_FORMAT, "%s: %s[%zu]: merged token \"%s\" is not in the vocabulary",
                         src, mf, i, tmp->p);
    pair_insert(t, ia, ib, (uint32_t)i, im);
    return LM_OK;
}

lm_status lm_tokenizer_create(const struct lm_tokenizer_parts *P, struct lm_tokenizer **out) {
    assert(P && out);
    *out = NULL;
    const char *src = P->source ? P->source : "tokenizer";
    const char *tf = P->tokens_field ? P->tokens_field : "tokens";
    const char *mf = P->merges_field ? P->merges_field : "merges";
    size_t n = P->n_tokens;
    if (n == 0 || n > INT32_MAX) return lm_errorf(LM_ERR_FORMAT, "%s: %s: %zu tokens", src, tf, n);
    if (P->n_split_regexes > MAX_SPLITS)
        return lm_errorf(LM_ERR_UNSUPPORTED, "%s: %zu Split pre-tokenizers (at most %d)", src,
                         P->n_split_regexes, MAX_SPLITS);

    struct lm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return lm_errorf(LM_ERR_NOMEM, "%s: out of memory", src);
    lm_status st = LM_OK;
    struct lm_buf tmp = {0};
    t->n_tokens = n;
    t->nfc = P->nfc;
    t->ignore_merges = P->ignore_merges;
    t->fuse_unk = P->fuse_unk;
    t->unk_id = -1;

    /* Token strings and their decoded bytes. */
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (P->tokens[i]) total += strlen(P->tokens[i]) + 1;
    if (total > UINT32_MAX) {
        st = lm_errorf(LM_ERR_FORMAT, "%s: %s: token strings too large", src, tf);
        goto fail;
    }
    t->kind = malloc(n);
    t->strs = malloc(total + 1);
    t->bytes = malloc(total + 1);
    t->str_off = malloc(n * sizeof *t->str_off);
    t->str_len = malloc(n * sizeof *t->str_len);
    t->byte_off = malloc(n * sizeof *t->byte_off);
    t->byte_len = malloc(n * sizeof *t->byte_len);
    t->vocab_mask = pow2_at_least(2 * n) - 1;
    t->vocab = malloc((t->vocab_mask + 1) * sizeof *t->vocab);
    t->pair_mask = pow2_at_least(P->n_merges + P->n_merges / 2 + 1) - 1;
    t->pairs = malloc((t->pair_mask + 1) * sizeof *t->pairs);
    if (!t->kind || !t->strs || !t->bytes || !t->str_off || !t->str_len || !t->byte_off ||
        !t->byte_len || !t->vocab || !t->pairs) {
        st = lm_errorf(LM_ERR_NOMEM, "%s: out of memory for %zu tokens", src, n);
        goto fail;
    }
    memset(t->vocab, 0xff, (t->vocab_mask + 1) * sizeof *t->vocab);
    for (size_t i = 0; i <= t->pair_mask; i++)
        t->pairs[i].key = PAIR_EMPTY;

    size_t so = 0, bo = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = P->tokens[i];
        uint8_t k = P->kinds ? P->kinds[i] : LM_TOKEN_NORMAL;
        if (k > LM_TOKEN_UNUSED) {
            st = lm_errorf(LM_ERR_FORMAT, "%s: %s: token %zu has unknown kind %u", src, tf, i, k);
            goto fail;
        }
        if (!s) k = LM_TOKEN_UNUSED;
        t->kind[i] = k;
        size_t len = s ? strlen(s) : 0;
        if (s && lm_utf8_valid_prefix((const unsigned char *)s, len) != len) {
            st = lm_errorf(LM_ERR_FORMAT, "%s: %s: token %zu is not valid UTF-8", src, tf, i);
            goto fail;
        }
        t->str_off[i] = (uint32_t)so;
        t->str_len[i] = (uint32_t)len;
        if (s) memcpy(t->strs + so, s, len + 1);
        so += s ? len + 1 : 0;
        /* ByteLevel decoder: every char maps back to a byte, or the token's own UTF-8 is used. */
        t->byte_off[i] = (uint32_t)bo;
        size_t nb = 0;
        bool mapped = true;
        for (size_t j = 0; j < len;) {
            int cl;
            int32_t cp = lm_utf8_decode((const unsigned char *)s + j, len - j, &cl);
            int b = lm_bytelevel_byte((uint32_t)cp);
            if (b < 0) {
                mapped = false;
                break;
            }
            t->bytes[bo + nb++] = (unsigned char)b;
            j += (size_t)cl;
        }
        if (!mapped) {
            memcpy(t->bytes + bo, s, len);
            nb = len;
        }
        t->byte_len[i] = (uint32_t)nb;
        bo += nb;
        if (k == LM_TOKEN_NORMAL) vocab_insert(t, (int32_t)i);
    }

    if (P->unk_token && (t->unk_id = vocab_find(t, P->unk_token, strlen(P->unk_token))) < 0) {
        st = lm_errorf(LM_ERR_FORMAT, "%s: unk_token \"%s\" is not in %s", src, P->unk_token, tf);
        goto fail;
    }
    for (int b = 0; b < 256; b++) {
        t->bl_len[b] = (uint8_t)lm_utf8_encode(lm_bytelevel_char((unsigned char)b), t->bl_utf8[b]);
        t->byte_id[b] = vocab_find(t, (const char *)t->bl_utf8[b], t->bl_len[b]);
    }

    /* Merges. */
    for (size_t i = 0; i < P->n_merges; i++) {
        if (P->merge_pairs) {
            const char *a = P->merge_pairs[2 * i], *b = P->merge_pairs[2 * i + 1];
            if (!a || !b) {
                st = lm_errorf(LM_ERR_FORMAT, "%s: %s[%zu] is not a pair of strings", src, mf, i);
                goto fail;
            }
            st = add_merge(t, src, mf, i, a, strlen(a), b, strlen(b), &tmp);
        } else {
            const char *m = P->merges[i];
            const char *sp = m ? strchr(m, ' ') : NULL;
            if (!sp || strchr(sp + 1, ' ')) {
                st = lm_errorf(LM_ERR_FORMAT,
                               "%s: %s[%zu] is not two tokens separated by one space", src, mf, i);
                goto fail;
            }
            st = add_merge(t, src, mf, i, m, (size_t)(sp - m), sp + 1, strlen(sp + 1), &tmp);
        }
        if (st) goto fail;
    }

    /* Added tokens, split by the stage that matches them. */
    size_t n_added = 0;
    for (size_t i = 0; i < n; i++)
        n_added += t->kind[i] == LM_TOKEN_SPECIAL || t->kind[i] == LM_TOKEN_ADDED;
    t->raw.v = calloc(n_added + 1, sizeof *t->raw.v);
    t->norm.v = calloc(n_added + 1, sizeof *t->norm.v);
    if (!t->raw.v || !t->norm.v) {
        st = lm_errorf(LM_ERR_NOMEM, "%s: out of memory", src);
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        if (t->kind[i] != LM_TOKEN_SPECIAL && t->kind[i] != LM_TOKEN_ADDED) continue;
        uint8_t fl = P->added_flags ? P->added_flags[i] : 0;
        const char *s = t->strs + t->str_off[i];
        size_t len = t->str_len[i];
        bool normalized = (fl & LM_ADDED_NORMALIZED) != 0;
        char *c;
        if (normalized && t->nfc) {
            c = nfc_dup(s, len, &len);
        } else {
            c = malloc(len + 1);
            if (c) memcpy(c, s, len + 1);
        }
        if (!c) {
            st = lm_errorf(LM_ERR_NOMEM, "%s: %s: cannot normalize added token %zu", src, tf, i);
            goto fail;
        }
        if (!len) { /* an empty added token never matches */
            free(c);
            continue;
        }
        struct added_set *set = normalized ? &t->norm : &t->raw;
        set->v[set->n++] =
            (struct added_tok){(int32_t)i, (uint32_t)len, c, fl, t->kind[i] == LM_TOKEN_SPECIAL};
        set->first[(unsigned char)c[0]] = 1;
    }
    qsort(t->raw.v, t->raw.n, sizeof *t->raw.v, cmp_added);
    qsort(t->norm.v, t->norm.n, sizeof *t->norm.v, cmp_added);

    /* Pre-tokenizer regexes. */
    for (size_t i = 0; i < P->n_split_regexes; i++) {
        /* PCRE2's UCP classes agree with HF's Oniguruma on the patterns in use: \s is Z plus
         * \t\n\v\f\r in both (U+0085 is not \s in either), checked against HF 0.23.2. */
        int err;
        PCRE2_SIZE off;
        t->re[i] = pcre2_compile((PCRE2_SPTR)P->split_regexes[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
        if (!t->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            st = lm_errorf(LM_ERR_UNSUPPORTED,
                           "%s: Split regex %zu does not compile with PCRE2 at offset %zu: %s", src,
                           i, (size_t)off, (const char *)msg);
            goto fail;
        }
        t->n_re = i + 1;
        pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE); /* on failure pcre2_match interprets */
    }

    lm_buf_free(&tmp);
    *out = t;
    return LM_OK;
fail:
    lm_buf_free(&tmp);
    lm_tokenizer_destroy(t);
    return st;
}

/* ---- encode ---- */

struct sym {
    int32_t c;          /* token id */
    int32_t prev, next; /* neighbours, -1 at the ends */
    bool gone;          /* merged into its left neighbour */
};

struct merge {
    uint32_t rank, pos;
    int32_t id;
};

struct enc {
    const struct lm_tokenizer *t;
    unsigned flags;
    struct lm_ids *out;
    pcre2_match_data *md[MAX_SPLITS];
    struct sym *sym;
    struct merge *heap;
    size_t cap; /* of sym and heap */
    struct lm_buf tmp;
};

static bool merge_before(const struct merge *a, const struct merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct merge *h, size_t *n, struct merge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_before(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct merge heap_pop(struct merge *h, size_t *n) {
    struct merge top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && merge_before(&h[c + 1], &h[c])) c++;
        if (!merge_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = last;
    return top;
}

static void push_pair(struct enc *e, size_t *hn, int32_t pos) {
    const struct sym *s = e->sym;
    if (pos < 0 || s[pos].next < 0) return;
    const struct pair_slot *p = pair_find(e->t, s[pos].c, s[s[pos].next].c);
    if (p) heap_push(e->heap, hn, (struct merge){p->rank, (uint32_t)pos, p->id});
}

/* BPE on one pre-tokenized word (raw bytes): HF merge_word + Word::merge_all, including its
 * handling of stale queue entries (an entry is applied when the pair now at its position merges
 * into the same id). */
static lm_status bpe_word(struct enc *e, const unsigned char *w, size_t n) {
    const struct lm_tokenizer *t = e->t;
    if (!n) return LM_OK;
    if (n == 1 && t->byte_id[w[0]] >= 0) {
        lm_ids_push(e->out, t->byte_id[w[0]]);
        return LM_OK;
    }
    if (t->ignore_merges) {
        lm_buf_reset(&e->tmp);
        for (size_t i = 0; i < n; i++)
            lm_buf_append(&e->tmp, t->bl_utf8[w[i]], t->bl_len[w[i]]);
        int32_t id = vocab_find(t, e->tmp.p, e->tmp.len);
        if (id >= 0) {
            lm_ids_push(e->out, id);
            return LM_OK;
        }
    }
    if (n > e->cap) {
        size_t cap = n < 64 ? 64 : n;
        struct sym *s = realloc(e->sym, cap * sizeof *s);
        if (s) e->sym = s;
        struct merge *h = realloc(e->heap, 3 * cap * sizeof *h);
        if (h) e->heap = h;
        if (!s || !h)
            return lm_errorf(LM_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte word", n);
        e->cap = cap;
    }
    struct sym *s = e->sym;
    int32_t ns = 0;
    bool pending_unk = false;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id >= 0) {
            s[ns] = (struct sym){id, ns - 1, ns + 1, false};
            ns++;
            pending_unk = false;
        } else if (t->unk_id >= 0 && !(t->fuse_unk && pending_unk)) {
            s[ns] = (struct sym){t->unk_id, ns - 1, ns + 1, false};
            ns++;
            pending_unk = true;
        }
    }
    if (!ns) return LM_OK;
    s[ns - 1].next = -1;
    /* Heap entries: ns - 1 initial pairs plus at most 2 per merge (ns - 1 merges): < 3n. */
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        push_pair(e, &hn, i);
    while (hn) {
        struct merge top = heap_pop(e->heap, &hn);
        struct sym *cur = &s[top.pos];
        if (cur->gone || cur->next < 0) continue;
        int32_t nx = cur->next;
        const struct pair_slot *p = pair_find(t, cur->c, s[nx].c);
        if (!p || p->id != top.id) continue; /* stale */
        cur->c = top.id;
        s[nx].gone = true;
        cur->next = s[nx].next;
        if (cur->next >= 0) s[cur->next].prev = (int32_t)top.pos;
        push_pair(e, &hn, cur->prev);
        push_pair(e, &hn, (int32_t)top.pos);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next)
        lm_ids_push(e->out, s[i].c);
    return LM_OK;
}

/* Split (behavior Isolated) by regex `level`, then the next level; after the last, BPE. */
static lm_status pretokenize(struct enc *e, size_t level, const char *s, size_t n) {
    const struct lm_tokenizer *t = e->t;
    if (level == t->n_re) return bpe_word(e, (const unsigned char *)s, n);
    pcre2_match_data *md = e->md[level];
    size_t start = 0, prev_end = 0;
    lm_status st;
    while (start < n) {
        int rc = pcre2_match(t->re[level], (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(t->re[level], (PCRE2_SPTR)s, n, start,
                             PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return lm_errorf(LM_ERR_RANGE,
                             "tokenizer: pre-tokenizer regex failed on a %zu-byte span: %s", n,
                             (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > prev_end && (st = pretokenize(e, level + 1, s + prev_end, ms - prev_end)))
            return st;
        if (me > ms && (st = pretokenize(e, level + 1, s + ms, me - ms))) return st;
        prev_end = me;
        if (me == ms) { /* empty match: a split point; step over one character */
            int len;
            lm_utf8_decode((const unsigned char *)s + me, n - me, &len);
            start = me + (size_t)len;
        } else {
            start = me;
        }
    }
    if (prev_end < n) return pretokenize(e, level + 1, s + prev_end, n - prev_end);
    return LM_OK;
}

static lm_status normalize_stage(struct enc *e, const char *s, size_t n);

/* HF AddedVocabulary::find_matches: leftmost-longest non-overlapping matches of the set's
 * tokens in s, with single_word / lstrip / rstrip applied; text between matches goes to the
 * next stage (normalization after the raw set, pre-tokenization after the normalized set). */
static lm_status split_added(struct enc *e, const struct added_set *set, bool raw, const char *s,
                             size_t n) {
    size_t off = 0, i = 0;
    lm_status st;
    while (i < n) {
        if (!set->first[(unsigned char)s[i]]) {
            i++;
            continue;
        }
        const struct added_tok *m = NULL;
        for (size_t k = 0; k < set->n; k++) {
            const struct added_tok *a = &set->v[k];
            if (a->len <= n - i && !memcmp(s + i, a->s, a->len)) {
                m = a;
                break;
            }
        }
        if (!m) {
            i++;
            continue;
        }
        size_t start = i, stop = i + m->len;
        i = stop;
        if (m->special && (e->flags & LM_ENCODE_SPECIAL_AS_TEXT)) continue;
        if (m->flags & LM_ADDED_SINGLE_WORD) {
            bool start_space = start == 0 || !is_word_cp(last_cp(s, start));
            bool stop_space = stop == n || !is_word_cp(first_cp(s + stop, n - stop));
            if (!start_space || !stop_space) continue;
        }
        if (m->flags & LM_ADDED_LSTRIP) {
            size_t ns = trim_end_len(s, start);
            start = ns > off ? ns : off;
        }
        if (m->flags & LM_ADDED_RSTRIP) stop += lead_space_len(s + stop, n - stop);
        if (start > off) {
            st = raw ? normalize_stage(e, s + off, start - off)
                     : pretokenize(e, 0, s + off, start - off);
            if (st) return st;
        }
        lm_ids_push(e->out, m->id);
        off = stop;
    }
    if (off < n)
        return raw ? normalize_stage(e, s + off, n - off) : pretokenize(e, 0, s + off, n - off);
    return LM_OK;
}

static lm_status normalize_stage(struct enc *e, const char *s, size_t n) {
    const struct lm_tokenizer *t = e->t;
    char *norm = NULL;
    if (t->nfc && !all_ascii(s, n)) {
        size_t nn;
        norm = nfc_dup(s, n, &nn);
        if (!norm) return lm_errorf(LM_ERR_NOMEM, "tokenizer: NFC normalization failed");
        s = norm;
        n = nn;
    }
    lm_status st = t->norm.n ? split_added(e, &t->norm, false, s, n) : pretokenize(e, 0, s, n);
    free(norm);
    return st;
}

lm_status lm_tokenizer_encode(const struct lm_tokenizer *t, const char *text, size_t len,
                              unsigned flags, struct lm_ids *out) {
    assert(t && out && (text || !len));
    if (!len) return LM_OK;
    struct enc e = {.t = t, .flags = flags, .out = out};
    struct lm_buf fixed = {0};
    if (lm_utf8_valid_prefix((const unsigned char *)text, len) != len) {
        lm_utf8_lossy((const unsigned char *)text, len, true, &fixed);
        text = fixed.p;
        len = fixed.len;
    }
    lm_status st = LM_OK;
    for (size_t i = 0; i < t->n_re; i++) {
        e.md[i] = pcre2_match_data_create_from_pattern(t->re[i], NULL);
        if (!e.md[i]) st = lm_errorf(LM_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t n0 = out->n;
    if (!st) st = split_added(&e, &t->raw, true, text, len);
    if (st) out->n = n0;
    for (size_t i = 0; i < t->n_re; i++)
        pcre2_match_data_free(e.md[i]);
    free(e.sym);
    free(e.heap);
    lm_buf_free(&e.tmp);
    lm_buf_free(&fixed);
    return st;
}

/* ---- decode ---- */

/* A negative id is an error. An id with no token (UNUSED, or at or past n_tokens: Qwen3 models
 * pad the embedding to 151936 rows while the tokenizer has 151669 ids) decodes to nothing, as
 * HF's decode drops ids it does not know; a model can sample such an id. */
static lm_status check_id(const struct lm_tokenizer *t, int32_t id) {
    if (id < 0) return lm_errorf(LM_ERR_INVALID, "token id %d is negative", id);
    return LM_OK;
}

static bool has_token(const struct lm_tokenizer *t, int32_t id) {
    return (size_t)id < t->n_tokens && t->kind[id] != LM_TOKEN_UNUSED;
}

lm_status lm_tokenizer_decode(const struct lm_tokenizer *t, const int32_t *ids, size_t n,
                              bool skip_special, struct lm_buf *out) {
    assert(t && out && (ids || !n));
    for (size_t i = 0; i < n; i++) {
        lm_status st = check_id(t, ids[i]);
        if (st) return lm_error_prefix(st, "ids[%zu]", i);
    }
    struct lm_buf raw = {0};
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (!has_token(t, id) || (skip_special && t->kind[id] == LM_TOKEN_SPECIAL)) continue;
        lm_buf_append(&raw, t->bytes + t->byte_off[id], t->byte_len[id]);
    }
    lm_buf_reserve(out, raw.len);
    lm_utf8_lossy((const unsigned char *)raw.p, raw.len, true, out);
    lm_buf_free(&raw);
    return LM_OK;
}

size_t lm_tokenizer_vocab_size(const struct lm_tokenizer *t) { return t->n_tokens; }

int32_t lm_tokenizer_token_id(const struct lm_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int set = 0; set < 2; set++) {
        const struct added_set *a = set ? &t->norm : &t->raw;
        for (size_t i = 0; i < a->n; i++) {
            int32_t id = a->v[i].id;
            if (t->str_len[id] == n && !memcmp(t->strs + t->str_off[id], token, n)) return id;
        }
    }
    return vocab_find(t, token, n);
}

bool lm_tokenizer_is_special(const struct lm_tokenizer *t, int32_t id) {
    return id >= 0 && (size_t)id < t->n_tokens && t->kind[id] == LM_TOKEN_SPECIAL;
}

/* ---- streaming ---- */

void lm_detok_init(struct lm_detok *d, const struct lm_tokenizer *tok, bool skip_special) {
    memset(d, 0, sizeof *d);
    d->tok = tok;
    d->skip_special = skip_special;
}

lm_status lm_detok_push(struct lm_detok *d, int32_t id, struct lm_buf *out) {
    const struct lm_tokenizer *t = d->tok;
    lm_status st = check_id(t, id);
    if (st) return st;
    if (!has_token(t, id) || (d->skip_special && t->kind[id] == LM_TOKEN_SPECIAL)) return LM_OK;
    const unsigned char *p = t->bytes + t->byte_off[id];
    size_t n = t->byte_len[id], i = 0;
    /* Complete (or reject) the held-back character first, one byte at a time. */
    while (d->n_pending && i < n) {
        d->pending[d->n_pending++] = p[i++];
        int r = lm_utf8_check(d->pending, d->n_pending);
        if (r > 0) {
            lm_buf_append(out, d->pending, d->n_pending);
            d->n_pending = 0;
        } else if (r < 0) { /* the held bytes are a maximal subpart; the new byte starts afresh */
            lm_buf_append(out, "\xEF\xBF\xBD", 3);
            d->n_pending = 0;
            i--;
        }
    }
    size_t used = lm_utf8_lossy(p + i, n - i, false, out);
    i += used;
    assert(n - i < sizeof d->pending - d->n_pending);
    memcpy(d->pending + d->n_pending, p + i, n - i);
    d->n_pending += n - i;
    return LM_OK;
}

void lm_detok_flush(struct lm_detok *d, struct lm_buf *out) {
    if (d->n_pending) lm_buf_append(out, "\xEF\xBF\xBD", 3);
    d->n_pending = 0;
}
