/* bundle.h: GGUF bundles of a model: reading a GGUF's metadata into lumen's model description,
 * and writing a GGUF from a Hugging Face model folder (`lumen build`).
 *
 * The metadata follows what llama.cpp's convert_hf_to_gguf.py writes for llama-style decoders
 * (gguf-py/gguf/constants.py keys): general.architecture (the family's model_type, "qwen3"),
 * <arch>.block_count, .context_length, .embedding_length, .feed_forward_length,
 * .attention.head_count, .attention.head_count_kv, .attention.key_length,
 * .attention.value_length, .rope.freq_base, .attention.layer_norm_rms_epsilon; the byte-level
 * BPE vocabulary as tokenizer.ggml.model "gpt2", .pre (the pre-tokenizer's name, "qwen2"),
 * .tokens, .token_type, .merges, .bos/.eos/.padding_token_id, .add_bos_token, and
 * tokenizer.chat_template. Tensors are named as llama.cpp names them (lm_gguf_name_from_hf).
 * lumen adds general.sampling.{temp,top_p,top_k} (llama.cpp's keys for generation_config.json's
 * defaults), lumen.generation.eos_token_ids (generation_config.json's full list), lumen.version
 * and lumen.source.sha256.<file> (provenance of each source file). */
#ifndef LM_FAMILY_BUNDLE_H
#define LM_FAMILY_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/cpu/ops.h"
#include "base/status.h"
#include "family/model.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "text/tokenizer.h"

/* ---- reading ---- */

/* A config.json equivalent of the GGUF's hyperparameters (keys as struct lm_model_config's
 * Hugging Face names), so that the family checks a GGUF exactly as a model folder; out->name is
 * the file's base name. The architecture's required keys are checked here with their GGUF names:
 * LM_ERR_MISSING / LM_ERR_FORMAT ("x.gguf: missing key 'qwen3.block_count'"), LM_ERR_UNSUPPORTED
 * for value_length != key_length or a RoPE scaling type. Free with lm_hf_config_free. */
lm_status lm_bundle_gguf_config(const struct lm_gguf *g, struct lm_hf_config *out);

/* Generation defaults: eos ids from tokenizer.ggml.eos_token_id, tokenizer.ggml.eot_token_id and
 * lumen.generation.eos_token_ids; sampling from general.sampling.*. Errors name the key. */
lm_status lm_bundle_gguf_generation(const struct lm_gguf *g, struct lm_gen_defaults *out);

/* The tokenizer of tokenizer.ggml.*: model "gpt2" (byte-level BPE), pre-tokenizer regex from
 * tokenizer.ggml.pre (lm_tokenizer_pre_regex; NFC normalization for "qwen2", as the Qwen
 * tokenizer.json does), tokens with their kinds from token_type (1 normal, 3 control -> special,
 * 4 user-defined -> added, 5 unused -> no token), merges. *out is caller-owned.
 * LM_ERR_MISSING / LM_ERR_FORMAT / LM_ERR_UNSUPPORTED (another model or pre) naming the key. */
lm_status lm_bundle_gguf_tokenizer(const struct lm_gguf *g, struct lm_tokenizer **out);

/* ---- writing ---- */

struct lm_bundle_build_params {
    enum lm_dtype dtype;       /* of the matrices: F32, F16, BF16 or Q8_0; vectors are F32 */
    const char *tokenizer_dir; /* NULL: the model folder holds tokenizer.json and
                                  tokenizer_config.json */
};

struct lm_bundle_build_stats {
    long n_tensors;
    size_t data_bytes;   /* bytes of tensor data written */
    int n_fallback_f16;  /* Q8_0 requested but a row length is not a multiple of 32: written F16
                            (as llama.cpp's converter does) */
};

/* Writes the GGUF v3 bundle of the Hugging Face model folder `model_dir` (config.json,
 * safetensors, generation_config.json if present, tokenizer.json, tokenizer_config.json) to
 * `out_path`: the metadata above, every tensor converted to the requested dtype (bf16 -> bf16
 * and f32 -> f32 are bit-exact; to f16/bf16 rounds to nearest even; Q8_0 is ggml's
 * quantize_row_q8_0_ref, backend/cpu/quant.h), 32-byte aligned. The file is written whole or
 * removed. Errors: those of reading the folder (naming the file), LM_ERR_UNSUPPORTED for a
 * model_type without a family or a tokenizer that GGUF's "gpt2" model cannot describe,
 * LM_ERR_IO. stats may be NULL. */
lm_status lm_bundle_build(const char *model_dir, const char *out_path,
                          const struct lm_bundle_build_params *p, struct lm_bundle_build_stats *stats);

/* ---- internal to family/: model.c's readers of a model folder ---- */

/* config.json's generic decoder keys into *c (errors name the file and key). */
lm_status lm_model_parse_config(const struct lm_hf_config *hf, struct lm_model_config *c);
/* generation_config.json of `dir` (optional) and config.json's eos_token_id into *g. */
lm_status lm_model_parse_generation(const char *dir, const struct lm_hf_config *cfg,
                                    struct lm_gen_defaults *g);

#endif
