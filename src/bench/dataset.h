/* dataset.h: multi-turn conversation corpora for the profiler.
 *
 * A dataset is a list of conversations; each conversation is the ordered list of its user turns
 * (what the client sends), and optionally the corpus's own assistant answers, which the replay
 * never sends: a turn's history holds the answers the server actually gave.
 *
 * Formats (the name selects the parser; the file is given or taken from the default path):
 *   "mt_bench"   JSONL, one {"question_id": int, "category": str, "turns": [str, ...]} per line
 *                (FastChat llm_judge/data/mt_bench/question.jsonl: 80 questions, 2 turns each).
 *   "spec_bench" the same JSONL layout (Spec-Bench data/spec_bench/question.jsonl: 480 questions
 *                with 1 or 2 turns).
 *   "sharegpt"   a JSON list of {"id": str, "conversations": [{"from": "human"|"gpt"|"system",
 *                "value": str}, ...]} (ShareGPT V3). Leading "gpt" messages are dropped (V3 splits
 *                long conversations into chunks); a "system" message becomes the system prompt;
 *                conversations without a human message are skipped. */
#ifndef LM_BENCH_DATASET_H
#define LM_BENCH_DATASET_H

#include <stddef.h>

#include "base/status.h"

struct lm_bench_conversation {
    char *id;       /* the corpus's id as text (MT-Bench question_id "81"); owned */
    char *category; /* owned; NULL when the corpus has none */
    char *system;   /* system prompt to send first; owned; NULL when none */
    size_t n_turns; /* >= 1 */
    char **turns;   /* [n_turns] user messages, UTF-8, owned */
    char **answers; /* [n_turns] the corpus's own assistant answers (NULL entries when absent);
                       owned; never sent */
};

struct lm_bench_dataset {
    char *name;                           /* "mt_bench", ...; owned */
    char *path;                           /* the file read; owned */
    struct lm_bench_conversation *convs;  /* [n] owned */
    size_t n;
};

/* The repository-relative default file of a named dataset ("data/mt_bench/question.jsonl"), or
 * NULL when the name is unknown. Borrowed (static). */
const char *lm_bench_dataset_default_path(const char *name);

/* Loads dataset `name` from `path`. LM_ERR_UNSUPPORTED for an unknown name; LM_ERR_IO when the
 * file cannot be read; LM_ERR_FORMAT with "path:line: field: problem" for malformed records;
 * LM_ERR_MISSING when the file holds no conversation. `ds` is zeroed first; free with
 * lm_bench_dataset_free (also after a failure). */
lm_status lm_bench_dataset_load(struct lm_bench_dataset *ds, const char *name, const char *path);

/* Releases everything; accepts a zeroed dataset. */
void lm_bench_dataset_free(struct lm_bench_dataset *ds);

#endif
