/* flash-precision.c: the arithmetic of k_attn_prefill (attention.cu) on the CPU, against a
 * float64 reference, to choose how q enters the tensor cores (docs/perf-notes.md v19).
 *
 *   cc -O2 scripts/flash-precision.c -o /tmp/flash-precision -lm && /tmp/flash-precision
 *
 * Inputs as test_cuda's attention test draws them (q and k RMS-normalised with weights
 * 1 +- 0.3, k and v rounded to bf16, v uniform in [-2, 2]), head_dim 128, 20 draws a context
 * length. The kernel's arithmetic: scores in float32 from bf16 products, position tiles of 64,
 * an online softmax in log2 units, p rounded to bf16 for p.V, the sum l from the unrounded p,
 * the output rounded to bf16. Printed: the worst relative L2 error of a head's output over the
 * draws, with q rounded to bf16 and with q split into bf16 hi + lo parts (both multiplied by K).
 * test_cuda's bound for bf16 output is 4e-3. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { D = 128, MAXL = 1093, TILE = 64 };

static float bf(float x) { /* round to nearest even bf16 */
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}
static uint64_t rng = 1;
static float fr(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static void normed(float *x, int round) { /* RMSNorm with a weight of 1 +- 0.3 */
    double ss = 0;
    for (int i = 0; i < D; i++) x[i] = fr() * 2, ss += (double)x[i] * x[i];
    const double r = sqrt(ss / D);
    for (int i = 0; i < D; i++) {
        x[i] = (float)(x[i] / r * (1 + 0.3 * fr()));
        if (round) x[i] = bf(x[i]);
    }
}

/* Relative L2 error of the kernel's output for q against the float64 reference. */
static double one(const float *q, float (*k)[D], float (*v)[D], int L, int split) {
    const double sc = 1 / sqrt((double)D);
    static double s[MAXL];
    double m = -1e300, l = 0, o[D] = {0};
    for (int p = 0; p < L; p++) {
        double d = 0;
        for (int i = 0; i < D; i++) d += (double)q[i] * k[p][i];
        s[p] = d * sc;
        if (s[p] > m) m = s[p];
    }
    for (int p = 0; p < L; p++) {
        const double e = exp(s[p] - m);
        l += e;
        for (int i = 0; i < D; i++) o[i] += e * v[p][i];
    }
    float qh[D], ql[D];
    for (int i = 0; i < D; i++) qh[i] = bf(q[i]), ql[i] = split ? bf(q[i] - qh[i]) : 0.f;
    const float sl2 = (float)(sc * 1.4426950408889634);
    float M = -INFINITY, Lf = 0, O[D] = {0};
    for (int t0 = 0; t0 < L; t0 += TILE) {
        const int t1 = t0 + TILE < L ? t0 + TILE : L;
        float st[TILE], mx = -INFINITY;
        for (int p = t0; p < t1; p++) {
            float a = 0, b = 0;
            for (int i = 0; i < D; i++) a += qh[i] * k[p][i], b += ql[i] * k[p][i];
            st[p - t0] = (a + b) * sl2;
            if (st[p - t0] > mx) mx = st[p - t0];
        }
        const float mn = fmaxf(M, mx), al = exp2f(M - mn);
        Lf *= al;
        for (int i = 0; i < D; i++) O[i] *= al;
        for (int p = t0; p < t1; p++) {
            const float e = exp2f(st[p - t0] - mn);
            Lf += e;
            for (int i = 0; i < D; i++) O[i] += bf(e) * v[p][i];
        }
        M = mn;
    }
    double num = 0, den = 0;
    for (int i = 0; i < D; i++) {
        const double y = bf(O[i] / Lf), r = o[i] / l;
        num += (y - r) * (y - r), den += r * r;
    }
    return sqrt(num / den);
}

int main(void) {
    static float q[D], k[MAXL][D], v[MAXL][D];
    double worst[2] = {0, 0};
    printf("context   q bf16    q hi + lo\n");
    for (int L = 1; L <= MAXL; L = L * 3 + 1) {
        double w[2] = {0, 0};
        for (int draw = 0; draw < 20; draw++) {
            normed(q, 0);
            for (int p = 0; p < L; p++) {
                normed(k[p], 1);
                for (int i = 0; i < D; i++) v[p][i] = bf(fr() * 2);
            }
            for (int split = 0; split < 2; split++) {
                const double e = one(q, k, v, L, split);
                if (e > w[split]) w[split] = e;
            }
        }
        printf("%7d   %.2e  %.2e\n", L, w[0], w[1]);
        for (int i = 0; i < 2; i++)
            if (w[i] > worst[i]) worst[i] = w[i];
    }
    printf("worst     %.2e  %.2e\n", worst[0], worst[1]);
    return 0;
}
