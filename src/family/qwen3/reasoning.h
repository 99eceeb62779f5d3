/* reasoning.h: the Qwen3 reasoning parser (<think>...</think>), an lm_reasoning_ops. */
#ifndef LM_FAMILY_QWEN3_REASONING_H
#define LM_FAMILY_QWEN3_REASONING_H

#include "family/family.h"

/* Splits Qwen3 output at <think> ... </think> (see reasoning.c for the rules). Static. */
extern const struct lm_reasoning_ops lm_qwen3_reasoning;

#endif
