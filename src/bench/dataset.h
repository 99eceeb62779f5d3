/* dataset.h: multi-turn conversation corpora for the profiler, and how conversations are chosen.
 *
 * A dataset is a list of conversations; each conversation is the ordered list of its user turns
 * (what the client sends), and optionally the corpus's own assistant answers, which the replay
 * never sends: a turn's history holds the answers the server actually gave.
 *
 * Datasets (lm_bench_dataset_load; opts.name selects the parser, opts.path the file):
 *   "mt_bench"   JSONL, one {"question_id": int, "category": str, "turns": [str, ...]} per line
 *                (FastChat llm_judge/data/mt_bench/question.jsonl: 80 questions, 2 turns each).
 *   "spec_bench" the same layout (Spec-Bench data/spec_bench/question.jsonl: 480 questions,
 *                1 or 2 turns). Each question's task is "mt_bench" for the first 80 (their
 *                category is an MT-Bench category: writing, ...), else its category
 *                (translation, summarization, qa, math_reasoning, rag). opts.categories filters
 *                on either the task or the category.
 *   "sharegpt"   a JSON list of {"id": str, "conversations": [{"from": "human"|"gpt"|"system",
 *                "value": str}, ...]} (ShareGPT V3). A conversation is selected when, after an
 *                optional leading system message, its messages alternate human, gpt, human, ...
 *                for `turns` human turns (turns 0: as many as alternate, at least 1), none of
 *                them empty, and it fits the context budget (below). The selected conversation
 *                sends those human turns; the gpt answers between them are never sent.
 *   "synthetic"  no file: opts.synthetic_conversations conversations of opts.synthetic_turns user
 *                turns, each a string of words drawn (seeded) from the tokenizer's vocabulary
 *                (base tokens spelled " " + 3 or more ASCII lowercase letters, which re-encode to
 *                one token each) whose length in tokens is drawn from normal(isl_mean, isl_std),
 *                clamped to >= 1; each conversation's max_tokens is drawn from
 *                normal(osl_mean, osl_std), clamped to >= 1 (0: the run's --max-tokens).
 *   "custom"     JSONL, one conversation per line: {"turns": [str, ...]} or {"messages":
 *                [{"role": "system"|"user"|"assistant", "content": str}, ...]} (user messages
 *                are the turns, assistant ones the corpus answers, never sent), with optional
 *                "id", "category", "system" and "max_tokens".
 *
 * The context budget (ShareGPT): the whole history the last turn sends, rendered with the
 * model's chat template and counted with its tokenizer, using the corpus's answers in place of
 * the live ones, plus the answer headroom: max_tokens for the last answer, and for each earlier
 * answer max(0, max_tokens - its corpus tokens) (a live answer may be longer than the corpus's),
 * must not exceed context_tokens.
 *
 * Every conversation the loader considers gets a selection-ledger entry (opts.ledger): index,
 * id, status "selected" or "rejected", and why (starts_with_gpt, too_few_turns, empty_turn,
 * too_long, category), with the token counts behind a budget decision. Choices are deterministic:
 * file order, then lm_bench_select's seeded order. The file's SHA-256 is recorded. */
#ifndef LM_BENCH_DATASET_H
#define LM_BENCH_DATASET_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "bench/digest.h"

struct lm_bench_prompt;

struct lm_bench_conversation {
    char *id;            /* the corpus's id as text (MT-Bench question_id "81"); owned */
    char *category;      /* owned; NULL when the corpus has none */
    char *system;        /* system prompt to send first; owned; NULL when none */
    size_t n_turns;      /* >= 1 */
    char **turns;        /* [n_turns] user messages, UTF-8, owned */
    char **answers;      /* [n_turns] the corpus's own assistant answers (NULL entries when absent);
                            owned; never sent */
    int max_tokens;      /* this conversation's output cap (synthetic, custom); 0: the run's */
    long history_tokens; /* sharegpt: rendered tokens of the budgeted history; -1 unknown */
};

struct lm_bench_dataset_opts {
    const char *name;       /* mt_bench, spec_bench, sharegpt, synthetic, custom */
    const char *path;       /* the file; NULL for synthetic */
    const char *categories; /* comma-separated filter; NULL: all */
    int turns;              /* sharegpt: human turns per conversation (default 2; 0 all) */
    long context_tokens;    /* sharegpt budget; 0: the model's context (config.json), or
                               4096 when unknown */
    int max_tokens;         /* the run's max_tokens, for the answer headroom */
    int enable_thinking;    /* -1 template default, 0, 1: how to render histories */
    const struct lm_bench_prompt *prompt; /* tokenizer and template; required for sharegpt and
                                             synthetic; borrowed */
    size_t synthetic_conversations;       /* synthetic: how many (default 100) */
    int synthetic_turns;                  /* synthetic: user turns each (default 1) */
    double isl_mean, isl_std; /* synthetic: input tokens per user turn (default 128, 0) */
    double osl_mean, osl_std; /* synthetic: output tokens (default 0: the run's) */
    uint64_t seed;            /* synthetic draws */
};

struct lm_bench_dataset_opts lm_bench_dataset_default_opts(void);

struct lm_bench_dataset {
    char *name;                 /* "mt_bench", ...; owned */
    char *path;                 /* the file read; owned; NULL for synthetic */
    char sha256[LM_SHA256_HEX]; /* of the file ("" for synthetic) */
    size_t file_bytes;
    struct lm_bench_conversation *convs; /* [n] selected conversations, file order; owned */
    size_t n;
    size_t n_considered; /* conversations in the file */
    json_t *ledger;      /* array of ledger entries (see above); owned */
    json_t *rejected;    /* {"reason": count}; owned */
    char *selection;     /* one line describing the rule applied; owned */
};

/* The repository-relative default file of a named dataset ("data/mt_bench/question.jsonl"),
 * NULL for synthetic (no file) and custom (no default), "" for an unknown name. Borrowed. */
const char *lm_bench_dataset_default_path(const char *name);

/* Loads and selects. LM_ERR_UNSUPPORTED for an unknown name; LM_ERR_INVALID when a required
 * option is missing (custom without a path, sharegpt/synthetic without opts.prompt, sharegpt
 * without a template); LM_ERR_IO when the file cannot be read; LM_ERR_FORMAT with
 * "path:line: field: problem" for malformed records; LM_ERR_MISSING when no conversation is
 * selected (the message gives the rejection counts). `ds` is zeroed first; free with
 * lm_bench_dataset_free (also after a failure). */
lm_status lm_bench_dataset_open(struct lm_bench_dataset *ds,
                                const struct lm_bench_dataset_opts *opts);

/* The former interface: lm_bench_dataset_open with default options for `name` and `path`. */
lm_status lm_bench_dataset_load(struct lm_bench_dataset *ds, const char *name, const char *path);

/* Writes the ledger as JSONL. LM_ERR_IO naming the path. */
lm_status lm_bench_dataset_write_ledger(const struct lm_bench_dataset *ds, const char *path);

/* Releases everything; accepts a zeroed dataset. */
void lm_bench_dataset_free(struct lm_bench_dataset *ds);

#endif
