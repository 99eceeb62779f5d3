/* manifest.h: the run manifest (what was run, where, on what) and the coverage matrix.
 *
 * The manifest records: lumen's version and git commit (read from the .git folder above the
 * current directory or the binary, when there is one), the command line, the server's
 * GET /v1/models answer, the model's config.json and checkpoint hashes (with --model-dir), the
 * tokenizer file's hash, the dataset's file hash, size and selection (rule, counts, ledger
 * file), the hardware (CPU model, logical and online cores, memory from /proc; GPUs from
 * /proc/driver/nvidia), the kernel, and every setting.
 *
 * The coverage matrix has one cell per workload (mt_bench, spec_bench, sharegpt, synthetic,
 * custom) x model x runtime mode (ordinary generation; speculative, with its method). A cell's
 * status is one of:
 *   planned      lumen profile can run it, but no run has exercised it
 *   implemented  a run exercised it and at least one request succeeded
 *   validated    implemented, and verification against the server's records passed
 *   qualified    validated, with no failed request, every conversation complete, the server's
 *                usage agreeing with lumen's token counts, and warmup apart from measurement
 * The speculative cell is never above planned unless the server reported speculative
 * execution with acceptance counters. Each run writes its own matrix, and merges it into the
 * matrix of its parent folder (runs/coverage.json), which keeps each cell's best status. */
#ifndef LM_BENCH_MANIFEST_H
#define LM_BENCH_MANIFEST_H

#include <jansson.h>

#include "base/status.h"
#include "bench/dataset.h"
#include "bench/replay.h"
#include "bench/report.h"
#include "bench/verify.h"

struct lm_bench_manifest_info {
    const char *command_line;   /* shell-quoted argv */
    const char *preset;         /* NULL when none */
    const char *tokenizer_dir;  /* NULL when none */
    const char *model_dir;      /* NULL when none */
    const char *server_records; /* NULL when none */
    const char *ledger_file;    /* the selection ledger's file name in the run folder */
    json_t *models;             /* the parsed GET /v1/models answer (borrowed), or NULL */
    json_t *metrics_before, *metrics_after; /* speculative counters found in /metrics, or NULL */
};

/* The manifest (new reference). Never fails: what cannot be read is recorded as null. */
json_t *lm_bench_manifest(const struct lm_bench_run *run, const struct lm_bench_dataset *ds,
                          const struct lm_bench_manifest_info *info);

/* The settings of a run as JSON (new reference). */
json_t *lm_bench_settings_json(const struct lm_bench_run *run);

/* The coverage matrix of one run (new reference): {"definitions": {...}, "cells": [{"workload",
 * "model", "mode", "method", "status", "run_id", "evidence"}]}. */
json_t *lm_bench_coverage(const struct lm_bench_run *run, const struct lm_bench_dataset *ds,
                          const struct lm_bench_summary *s, const struct lm_bench_verification *v);

/* Merges `cov` into the matrix at `path` (created when absent), keeping each cell's best
 * status, and writes it back; *merged (may be NULL) gets the merged matrix (new reference).
 * LM_ERR_IO / LM_ERR_FORMAT naming the path. */
lm_status lm_bench_coverage_merge(const char *path, json_t *cov, json_t **merged);

/* Writes a JSON value to a file (indented). LM_ERR_IO naming the path. */
lm_status lm_bench_write_json(const char *path, json_t *value);

#endif
