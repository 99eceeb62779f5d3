/* reasoning.c: the family-independent wrappers of struct lm_reasoning (family/family.h). */
#include <assert.h>
#include <string.h>

#include "family/family.h"

void lm_reasoning_init(struct lm_reasoning *r, const struct lm_reasoning_ops *ops,
                       const char *prompt, size_t len) {
    assert(ops);
    memset(r, 0, sizeof *r);
    r->ops = ops;
    ops->begin(r, prompt ? prompt : "", prompt ? len : 0);
}

void lm_reasoning_push(struct lm_reasoning *r, const char *text, size_t len,
                       struct lm_buf *reasoning, struct lm_buf *content) {
    if (len) r->ops->push(r, text, len, reasoning, content);
}

void lm_reasoning_end(struct lm_reasoning *r, struct lm_buf *reasoning, struct lm_buf *content) {
    r->ops->end(r, reasoning, content);
}

void lm_reasoning_free(struct lm_reasoning *r) {
    if (!r) return;
    lm_buf_free(&r->held);
    memset(r, 0, sizeof *r);
}
