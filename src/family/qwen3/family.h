/* family.h: the Qwen3 entry of the family registry (family/family.h). */
#ifndef LM_FAMILY_QWEN3_FAMILY_H
#define LM_FAMILY_QWEN3_FAMILY_H

#include "family/family.h"

/* model_type "qwen3": text_generation and text_conversation; forward in qwen3/model.c, chat
 * template in qwen3/chat_template.c. */
extern const struct lm_family lm_family_qwen3;

#endif
