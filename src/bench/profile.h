/* profile.h: one profiling run end to end, and sweeps of runs: load the tokenizer and the
 * dataset, replay (replay.h), verify against the server's records (verify.h), summarize
 * (report.h), and write the run folder:
 *
 *   requests.jsonl    one line per request, sent or skipped (lm_bench_write_jsonl)
 *   summary.json      AIPerf-named metrics, throughputs, per-turn rows, errors, usage check
 *   summary.csv       the same as tables
 *   summary.txt       the text tables printed to stdout
 *   report.html       self-contained, with inline SVG plots (html.h)
 *   manifest.json     version, commit, command line, /v1/models, hashes, hardware, settings
 *   coverage.json     this run's coverage matrix (a run in the default folder also merges it
 *                     into runs/coverage.json; a sweep's runs into the sweep folder's)
 *   selection.jsonl   the dataset's selection ledger
 *   verification.json verification totals and issues ("available": false without records)
 *
 * The runtime mode is "ordinary generation" unless the server reports speculative execution
 * with acceptance counters: per request in usage/timings (record.h), or as counters in
 * GET /metrics whose names hold "draft" (drafted tokens) and "accept" (accepted tokens), read
 * before and after the run. Acceptance is "unavailable" otherwise, never zero. */
#ifndef LM_BENCH_PROFILE_H
#define LM_BENCH_PROFILE_H

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>

#include "base/status.h"
#include "bench/dataset.h"
#include "bench/replay.h"
#include "bench/report.h"

struct lm_bench_profile_opts {
    struct lm_bench_params params;     /* the load; params.prompt/render are set here */
    struct lm_bench_dataset_opts data; /* the dataset; data.prompt is set here */
    const char *tokenizer_dir;  /* the model's tokenizer (and config.json): counts tokens, selects
                                   ShareGPT, builds synthetic prompts; NULL: none */
    bool render_with_tokenizer; /* render prompts with tokenizer_dir for the prompt_ids check
                                   (the user named the tokenizer) */
    const char *model_dir;      /* optional model folder: renders prompts, and its config and
                                   checkpoint hashes go to the manifest */
    const char *artifact_dir;   /* the run folder; NULL: <runs_root>/<UTC stamp>-<run id> */
    const char *runs_root;      /* NULL: "runs" */
    const char *server_records; /* the server's --records file; NULL: verification unavailable */
    const char *output_jsonl;   /* an extra copy of requests.jsonl; NULL: none */
    struct lm_bench_slo slo;
    const char *command_line; /* for the manifest */
    const char *preset;       /* for the manifest; NULL */
    FILE *out;                /* the summary tables; NULL: none */
    FILE *log;                /* notes ("verification unavailable", file paths); NULL: none */
    const volatile sig_atomic_t *stop; /* set (to the signal's number) by a SIGINT/SIGTERM
                                          handler: the run sends nothing more, gives requests in
                                          flight min(timeout_s, 2 s) to finish (client.h), and
                                          is written from what completed, marked interrupted;
                                          a sweep starts no further run. NULL: none; borrowed */
};

struct lm_bench_profile_result {
    char *dir;       /* the run folder; owned */
    json_t *summary; /* summary.json's content; owned */
    size_t n_ok;     /* successful profiling requests */
    bool verification_available, verification_ok;
    int interrupted; /* the signal that stopped the run early (opts.stop), or 0 */
    int exit_code;   /* 0; 1 when no request succeeded or verification failed (or could not be
                        done: --server-records not JSONL); 128 + the signal when interrupted */
};

void lm_bench_profile_result_free(struct lm_bench_profile_result *r);

/* One run. Fails (status) only when the run could not happen: tokenizer or dataset cannot be
 * loaded, the server cannot be reached for its model, the folder cannot be written. The paths
 * are checked before the first request is sent, so that a bad one costs no run: the run folder
 * (or, for the default one, runs_root) is created and must take a file, output_jsonl must be
 * writable and server_records readable; each error names the flag and the path. A
 * server_records file that cannot be parsed after the run does not fail it: the run is written
 * and verification reported as failed, with the reason. */
lm_status lm_bench_profile(const struct lm_bench_profile_opts *o,
                           struct lm_bench_profile_result *res);

/* A sweep: one run per value of `what` ("concurrency" or "request_rate"), each in
 * <folder>/<what>-<value>/, then sweep.json, sweep.csv and sweep.html (the throughput-versus-
 * latency curve) in the folder (artifact_dir, or <runs_root>/<stamp>-sweep). *exit_code is the
 * worst of the runs'; after a stop (opts.stop) the runs done so far, the interrupted one
 * included, are written and summarized, and *exit_code is 128 + the signal. */
lm_status lm_bench_sweep(const struct lm_bench_profile_opts *o, const char *what,
                         const double *values, size_t n, char **dir_out, int *exit_code);

#endif
