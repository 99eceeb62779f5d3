/* chat.c: see chat.h. */
#include "family/chat.h"

#include <string.h>

bool lm_chat_role_parse(const char *s, enum lm_chat_role *out) {
    static const struct {
        const char *name;
        enum lm_chat_role role;
    } k_roles[] = {
        {"system", LM_ROLE_SYSTEM},
        {"developer", LM_ROLE_SYSTEM}, /* chat.h */
        {"user", LM_ROLE_USER},
        {"assistant", LM_ROLE_ASSISTANT},
        {"tool", LM_ROLE_TOOL},
    };
    if (!s) return false;
    for (size_t i = 0; i < sizeof k_roles / sizeof k_roles[0]; i++)
        if (!strcmp(s, k_roles[i].name)) {
            *out = k_roles[i].role;
            return true;
        }
    return false;
}
