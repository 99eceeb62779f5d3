/* family.c: the Qwen3 family entry (see qwen3/family.h). */
#include "family/qwen3/family.h"

#include "family/qwen3/chat_template.h"
#include "family/qwen3/model.h"

const struct lm_family lm_family_qwen3 = {
    .model_type = "qwen3",
    .tasks = LM_TASK_TEXT_GENERATION | LM_TASK_TEXT_CONVERSATION,
    .load = lm_qwen3_load,
    .unload = lm_qwen3_unload,
    .seq_create = lm_qwen3_seq_create,
    .seq_destroy = lm_qwen3_seq_destroy,
    .forward = lm_qwen3_forward,
    .render_chat = lm_qwen3_render_chat,
};
