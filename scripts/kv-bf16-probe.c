/* kv-bf16-probe.c: how far the CPU forward's logits move when only its K/V cache is rounded to
 * bf16 (lm_qwen3_set_cpu_kv_bf16, as the CUDA cache stores K/V), on the first 8 fixture prompts
 * (tests/data/fixtures/tiny_qwen3_reference/cases.jsonl) and 3 of their greedy ids, as
 * test_cuda_engine's Q8_0 comparison runs them: the prompt on the Q8_0 dequantize path, the decode
 * steps on the int8 path (Q8 = 1), or everything on the model's own path (Q8 = 0). Prints one row
 * a prompt: ||kv_bf16 - kv_f32|| / ||kv_f32|| of the last logits at the prompt and each step.
 * A development probe for docs/perf-notes.md (v32). Usage, from the source root:
 *   kv-bf16-probe MODEL Q8   (e.g. ../shared/models/tiny-qwen3-gguf/tiny-qwen3-q8_0.gguf 1)
 * Built by hand from a build dir (CPU-only is enough: cmake -DLM_CUDA=OFF):
 *   cc -O2 -Isrc scripts/kv-bf16-probe.c BUILD/liblm_family.a BUILD/liblm_text.a BUILD/liblm_format.a \
 *     BUILD/liblm_backend.a BUILD/liblm_base.a $(pkg-config --libs jansson libpcre2-8 libutf8proc \
 *     libcrypto) -lm -lpthread -o /tmp/kv-bf16-probe */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/ops.h"
#include "family/model.h"
#include "family/qwen3/model.h"

static double rel(const float *a, const float *b, int n) {
    double d = 0, r = 0;
    for (int i = 0; i < n; i++) {
        const double x = (double)a[i] - b[i];
        d += x * x;
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: kv-bf16-probe MODEL Q8 (run from the source root; Q8: 1 for a Q8_0 GGUF's paths)\n");
        return 2;
    }
    const int q8 = atoi(argv[2]);
    FILE *f = fopen("tests/data/fixtures/tiny_qwen3_reference/cases.jsonl", "r");
    struct lm_model *m = NULL;
    if (!f || lm_model_open(argv[1], NULL, &m)) {
        fprintf(stderr, "kv-bf16-probe: %s\n", f ? lm_error_message() : "cannot open the fixture cases");
        return 1;
    }
    const int V = lm_model_config(m)->vocab_size;
    float *lg[2][4];
    for (int kb = 0; kb < 2; kb++)
        for (int t = 0; t < 4; t++) lg[kb][t] = malloc(sizeof(float) * (size_t)V);
    printf("%-32s %6s | %7s %7s %7s %7s\n", "prompt", "tokens", "prompt", "step 1", "step 2", "step 3");
    char *line = NULL;
    size_t cap = 0;
    for (int ci = 0; ci < 8 && getline(&line, &cap, f) > 0;) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) continue;
        const json_t *p = json_object_get(j, "prompt_ids"), *g = json_object_get(j, "greedy_ids");
        const int np = (int)json_array_size(p);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(np + 3));
        for (int i = 0; i < np + 3; i++)
            ids[i] = (int32_t)json_integer_value(i < np ? json_array_get(p, i) : json_array_get(g, i - np));
        for (int kb = 0; kb < 2; kb++) {
            lm_qwen3_set_cpu_kv_bf16(kb);
            struct lm_seq *s = NULL;
            if (lm_seq_create(m, np + 8, &s)) return fprintf(stderr, "kv-bf16-probe: %s\n", lm_error_message()), 1;
            for (int t = -1; t < 3; t++) {
                if (q8) lm_cpu_set_q8_0_path(t < 0 ? LM_Q8_0_DEQUANT : LM_Q8_0_INT8);
                if (lm_seq_forward(s, t < 0 ? ids : ids + np + t, t < 0 ? np : 1, lg[kb][t + 1], false))
                    return fprintf(stderr, "kv-bf16-probe: %s\n", lm_error_message()), 1;
            }
            lm_seq_destroy(s);
        }
        lm_qwen3_set_cpu_kv_bf16(false);
        printf("%-32s %6d |", json_string_value(json_object_get(j, "name")), np);
        for (int t = 0; t < 4; t++) printf(" %7.4f", rel(lg[1][t], lg[0][t], V));
        printf("\n");
        free(ids);
        json_decref(j);
        ci++;
    }
    free(line);
    fclose(f);
    lm_model_close(m);
    return 0;
}
