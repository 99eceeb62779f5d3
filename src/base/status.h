/* status.h: result codes and the per-thread error message.
 *
 * Every function that can fail for an outside reason (I/O, a bad file, a bad request, a full
 * cache) returns an lm_status and records a message a person can act on with lm_errorf(), for
 * example "tokenizer.json: merges[17] is not a pair of strings". The message belongs to the
 * calling thread and stays valid until that thread's next lm_errorf(). Programmer errors are
 * asserts, not statuses. Style follows sqlite's result codes. */
#ifndef LM_BASE_STATUS_H
#define LM_BASE_STATUS_H

typedef enum lm_status {
    LM_OK = 0,
    LM_ERR_IO,          /* a file could not be opened, read, mapped or written */
    LM_ERR_FORMAT,      /* a file or message is malformed: bad JSON, truncated data, bad header */
    LM_ERR_SHAPE,       /* a tensor or array has the wrong shape or dtype */
    LM_ERR_MISSING,     /* something required is absent: a tensor, a key, a file */
    LM_ERR_UNSUPPORTED, /* well-formed but not something lumen serves: model_type, tools, images */
    LM_ERR_INVALID,     /* a request or argument is out of range or of the wrong type */
    LM_ERR_RANGE,       /* a limit is exceeded: context length, message count, queue length */
    LM_ERR_NOMEM,       /* an allocation failed */
    LM_ERR_CANCELLED,   /* the work was cancelled, for example because its client went away */
} lm_status;

/* Records a printf-style message for the calling thread and returns `st`, so that a failing
 * function can `return lm_errorf(LM_ERR_IO, "%s: %s", path, strerror(errno));`. */
lm_status lm_errorf(lm_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the calling thread's message with "<prefix>: " and returns `st` unchanged. */
lm_status lm_error_prefix(lm_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The calling thread's last message; "" when none. Borrowed, valid until the next lm_errorf(). */
const char *lm_error_message(void);

/* A short fixed name for a status: "io", "format", ... */
const char *lm_status_name(lm_status st);

#endif
