/* matmul.c: what the fast matmul of every vector target shares: the per-thread scratch for its
 * panels (matmul.h). The matmul itself is kern_matmul.h, compiled once per target. */
#include "backend/cpu/matmul.h"

#include <pthread.h>
#include <stdlib.h>

/* The calling thread's scratch, grown on demand and freed when the thread exits. */
struct scratch {
    float *p;
    size_t floats;
};
static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static void scratch_destroy(void *s) {
    struct scratch *sc = s;
    free(sc->p);
    free(sc);
}
static void scratch_key_init(void) { pthread_key_create(&g_scratch_key, scratch_destroy); }

float *lm_cpu_scratch(size_t floats) {
    pthread_once(&g_scratch_once, scratch_key_init);
    struct scratch *s = pthread_getspecific(g_scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        if (pthread_setspecific(g_scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    if (s->floats < floats) {
        free(s->p);
        size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
        s->p = aligned_alloc(64, bytes);
        s->floats = s->p ? floats : 0;
    }
    return s->p;
}
