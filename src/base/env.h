/* env.h: on/off switches and integer settings read from the environment (LM_CPU_Q8_ACT,
 * LM_CUDA_FLASH_MIN, ...).
 *
 * One spelling for every LM_* switch: 1, on, true, yes turn it on; 0, off, false, no turn it
 * off (case-insensitive); unset or empty keeps the default. Anything else keeps the default too,
 * after one warning on stderr that names the variable, the value and the accepted values, so a
 * typo such as LM_CPU_Q8_ACT=of is never silently read as "on". */
#ifndef LM_BASE_ENV_H
#define LM_BASE_ENV_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The accepted spellings, for messages and --help texts: "0/1, off/on, false/true, no/yes". */
#define LM_ENV_FLAG_VALUES "0/1, off/on, false/true, no/yes"

/* Parses one switch value: 1 (on), 0 (off), or -1 when `s` is NULL, empty or not one of the
 * accepted spellings (case-insensitive, no surrounding spaces). */
int lm_env_flag_parse(const char *s);

/* Reads the switch `name` from the environment: its value when set to an accepted spelling,
 * else `dflt` (a value that is set, non-empty and not accepted also prints one warning line to
 * stderr: "lumen: LM_X=value is not a switch value (accepted: ...); using the default (on)").
 * Callers that read a switch more than once keep the first answer, so the warning prints once. */
bool lm_env_flag(const char *name, bool dflt);

/* Parses one integer setting: a whole decimal number in [lo, hi] (no surrounding spaces) into
 * *out; false when `s` is NULL, empty, not such a number or out of the range. */
bool lm_env_int_parse(const char *s, long lo, long hi, long *out);

/* Reads the integer setting `name` from the environment: its value when set to a number in
 * [lo, hi], else `dflt` (a value that is set, non-empty and not accepted prints one warning line
 * to stderr, as lm_env_flag: "lumen: LM_X=value is not a whole number from lo to hi; using the
 * default (d)"). Callers that read a setting more than once keep the first answer. */
long lm_env_int(const char *name, long dflt, long lo, long hi);

#ifdef __cplusplus
}
#endif

#endif
