/* html.h: the run's self-contained HTML report, with plots drawn here as inline SVG (no script,
 * no external file): request latency and TTFT distributions (histograms with p50/p95 marks),
 * output token throughput and requests in flight over the profiling window, a per-turn
 * comparison (TTFT and latency p50/p95 per turn), and for a sweep the throughput-versus-latency
 * curve. Tables repeat the summary, the per-turn rows, errors, the usage check, verification,
 * the dataset selection, the coverage matrix and the manifest. */
#ifndef LM_BENCH_HTML_H
#define LM_BENCH_HTML_H

#include <jansson.h>

#include "base/status.h"
#include "bench/dataset.h"
#include "bench/replay.h"
#include "bench/report.h"
#include "bench/verify.h"

/* Writes report.html. v, manifest, coverage may be NULL. LM_ERR_IO naming the path. */
lm_status lm_bench_write_html(const char *path, const struct lm_bench_run *run,
                              const struct lm_bench_summary *s,
                              const struct lm_bench_verification *v,
                              const struct lm_bench_dataset *ds, json_t *manifest,
                              json_t *coverage);

/* Writes a sweep's report: `points` is an array of {"label", "value", "dir",
 * "output_token_throughput", "request_throughput", "ttft_p50", "ttft_p95", "latency_p50",
 * "latency_p95", "itl_p50"}; `what` names the swept setting ("concurrency", "request_rate"). */
lm_status lm_bench_write_sweep_html(const char *path, json_t *points, const char *what,
                                    const char *title);

/* The metrics of a sweep point, in the column order of the sweep's tables (HTML, CSV, text). */
enum { LM_BENCH_SWEEP_METRICS = 7 };
extern const char *const lm_bench_sweep_metrics[LM_BENCH_SWEEP_METRICS];

/* Sweep point pt's metric k (lm_bench_sweep_metrics), NAN when it has none. */
double lm_bench_sweep_metric(json_t *pt, int k);

#endif
