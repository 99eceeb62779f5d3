/* family.c: the Qwen3 family entry (see qwen3/family.h). */
#include "family/qwen3/family.h"

#include "family/qwen3/chat_template.h"
#include "family/qwen3/model.h"
#include "family/qwen3/reasoning.h"

const struct lm_family lm_family_qwen3 = {
    .model_type = "qwen3",
    .tasks = LM_TASK_TEXT_GENERATION | LM_TASK_TEXT_CONVERSATION,
    .load = lm_qwen3_load,
    .unload = lm_qwen3_unload,
    .kv_create = lm_qwen3_kv_create,
    .kv_destroy = lm_qwen3_kv_destroy,
    .kv_copy = lm_qwen3_kv_copy,
    .forward = lm_qwen3_forward,
    .forward_sample = lm_qwen3_forward_sample,
    .queue_sample = lm_qwen3_queue_sample,
    .collect = lm_qwen3_collect,
    .render_chat = lm_qwen3_render_chat,
    .reasoning = &lm_qwen3_reasoning,
};
