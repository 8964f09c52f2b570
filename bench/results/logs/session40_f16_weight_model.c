/* Session 40: v23's per-head f16 weight path (decode_int2_kernel, F16W) modelled on one warp's token stream in C
   (_Float16 weights with subnormals, f32 sums) against float64 attention; output in session40_f16_weight_model.txt.
   A record, not part of the build: cc -O2 x.c -lm && ./a.out */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <stdint.h>
static uint64_t st = 0x9e3779b97f4a7c15ull;
static uint64_t nx(void) { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; }
static double un(void) { return ((nx() >> 11) + 1) * (1.0 / 9007199254740993.0); }
static double nrm(void) { return sqrt(-2 * log(un())) * cos(6.283185307179586 * un()); }
enum { D = 32 };
typedef struct { int n; float *s, *sc, *mn; uint8_t *code; } stream;
static double run(const stream *t, int *rescales, int *guards) {
    float m = -INFINITY, U = 0, vthr = 0, l = 0, acc[D] = {0}, vmin = 0;
    *rescales = *guards = 0;
    for (int t0 = 0; t0 < t->n; t0 += 32) {
        int e = t0 + 32 < t->n ? t0 + 32 : t->n;
        float vm = 0, mx = -INFINITY;
        for (int i = t0; i < e; i++) vm = fmaxf(vm, t->sc[i]), mx = fmaxf(mx, t->s[i]);
        int guard = vm > vthr, grow = mx > m + 8;
        if (guard || grow) {
            (*rescales)++; if (guard && !grow) (*guards)++;
            float mnew = fmaxf(m, mx), ref = mnew == -INFINITY ? 0 : mnew, a = -INFINITY;
            for (int i = t0; i < e; i++) a = fmaxf(a, t->s[i] + log2f(t->sc[i]));
            float u = m == -INFINITY ? (a == -INFINITY ? U : ref - a) : fminf(U + (ref - m), ref - a);
            u = fminf(fmaxf(u, -90), 90);
            float alpha = exp2f(m - ref + (u - U));
            for (int d = 0; d < D; d++) acc[d] *= alpha;
            l *= alpha, vmin *= alpha, U = u, m = mnew;
            vthr = exp2f(15 - 8 - U);
            /* pref = ref - U */
        }
        float pref = (m == -INFINITY ? 0 : m) - U;
        for (int i = t0; i < e; i++) {
            float p = exp2f(t->s[i] - pref);
            l += p;
            _Float16 w = (_Float16)(p * t->sc[i]);
            if (isinf((float)w)) return INFINITY;
            for (int d = 0; d < D; d++) acc[d] += (float)w * t->code[i * D + d];
            vmin += p * t->mn[i];
        }
    }
    /* reference */
    double M = -INFINITY, L = 0, o[D] = {0}, num = 0, den = 0;
    for (int i = 0; i < t->n; i++) M = fmax(M, t->s[i]);
    for (int i = 0; i < t->n; i++) {
        double p = exp2((double)t->s[i] - M);
        L += p;
        for (int d = 0; d < D; d++) o[d] += p * ((double)t->sc[i] * t->code[i * D + d] + t->mn[i]);
    }
    for (int d = 0; d < D; d++) {
        double ref = o[d] / L, got = ((double)acc[d] + vmin) / l;
        num += (got - ref) * (got - ref), den += ref * ref;
    }
    return sqrt(num / den);
}
int main(void) {
    int n = 4096;
    stream t = {n, malloc(4 * 32768), malloc(4 * 32768), malloc(4 * 32768), malloc(32768 * D)};
    const char *names[] = {"random, scales x 2^[-K, K] per 32 tokens", "adversarial: big scale <-> low logit",
                           "zero-scale tile raises m, then tiny scales", "logits drift up 0.05/token, scales x 2^[-K, K]"};
    for (int sc = 0; sc < 4; sc++)
        for (int K = 0; K <= 60; K += 10) {
            double worst = 0; int R = 0, Gd = 0;
            for (int rep = 0; rep < 20; rep++) {
                int k = 0;
                for (int i = 0; i < n; i++) {
                    if (i % 32 == 0) k = (int)(nx() % (2 * K + 1)) - K;
                    float base = (float)((1 + 2 * fabs(nrm())) / 3), f = ldexpf(1, k);
                    t.sc[i] = base * f, t.mn[i] = (float)(-1.5 * base) * f;
                    t.s[i] = (float)(3 * nrm());
                    if (sc == 1) t.s[i] = (float)(nrm() - 0.9 * k); /* large scales get low logits */
                    if (sc == 2) { if (i >= 1024 && i < 1056) t.sc[i] = 0, t.s[i] = 40; else if (i >= 1056) t.sc[i] = ldexpf(base, -K), t.mn[i] = ldexpf(-1.5f * base, -K); }
                    if (sc == 3) t.s[i] = (float)(nrm() + 0.05 * i);
                    for (int d = 0; d < D; d++) t.code[i * D + d] = nx() & 3;
                }
                int r, g;
                double err = run(&t, &r, &g);
                if (err > worst) worst = err;
                R += r, Gd += g;
            }
            printf("%-48s K %2d: worst rel. error %.2e, rescales %d (guard alone %d) over 20 runs\n", names[sc], K, worst, R, Gd);
        }
    /* one dominant token S (log2 units) above n - 1 others, the others' mass n 2^-S */
    for (int nn = 512; nn <= 32768; nn *= 8)
        for (int S = 10; S <= 40; S += 3) {
            double worst = 0; int R = 0, Gd = 0;
            t.n = nn;
            for (int rep = 0; rep < 20; rep++) {
                for (int i = 0; i < nn; i++) {
                    float base = (float)((1 + 2 * fabs(nrm())) / 3);
                    t.sc[i] = base, t.mn[i] = -1.5f * base, t.s[i] = (float)(0.5 * nrm());
                    if (i == 37) t.s[i] = (float)S;
                    for (int d = 0; d < D; d++) t.code[i * D + d] = nx() & 3;
                }
                int r, g;
                double err = run(&t, &r, &g);
                if (err > worst) worst = err;
                R += r, Gd += g;
            }
            printf("spike %2d above %5d tokens (their mass %.1e): worst rel. error %.2e, rescales %d (guard alone %d)\n", S, nn - 1, (nn - 1) * exp2(-S), worst, R, Gd);
        }
    return 0;
}
