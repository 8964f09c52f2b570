/* Session 41: the failing regime of decode_gpu/dominant_tokens_over_long_warps (seed 2, r16: 6.3e-3) in a model:
   one warp of 32K tokens, logits near 0 (K ranges x 2^-10) with one token S above, V scales in a narrow band.
   f16 weights p * scale * 2^U with subnormals; the unit rule's E (largest weight of a rescaled tile at 2^E) and
   the lazy-rescale slack varied. A record, not part of the build: cc -O2 session41_long_warp_model.c -lm.
   Result (session41_long_warp_model.txt): E and the slack change nothing here; the error peaks where the dominant
   token stands ~24 binades above the rest (1.3-1.8e-3 with exact 16-token sums added to f32 accumulators with
   round-to-nearest) -- the accumulation after the dominant token, not the f16 weights, which is why the H200's
   bf16 hi + lo kernels miss too (session41_h200.txt call 3) and why the plan now caps the tokens a warp sums. */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <stdint.h>
static uint64_t st = 0x9e3779b97f4a7c15ull;
static uint64_t nx(void) { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; }
static double un(void) { return ((nx() >> 11) + 1) * (1.0 / 9007199254740993.0); }
static double nrm(void) { return sqrt(-2 * log(un())) * cos(6.283185307179586 * un()); }
enum { D = 32, N = 32768 };
static float s[N], sc[N], mn[N];
static uint8_t code[N * D];
static double run(float E, float SL, int *rescales) {
    float m = -INFINITY, U = 0, vthr = 0, l = 0, acc[D] = {0}, vmin = 0;
    double accd[D] = {0};
    *rescales = 0;
    for (int t0 = 0; t0 < N; t0 += 32) {
        float vm = 0, mx = -INFINITY;
        for (int i = t0; i < t0 + 32; i++) vm = fmaxf(vm, sc[i]), mx = fmaxf(mx, s[i]);
        if (vm > vthr || mx > m + SL) {
            (*rescales)++;
            float mnew = fmaxf(m, mx), ref = mnew, a = -INFINITY;
            for (int i = t0; i < t0 + 32; i++) a = fmaxf(a, s[i] + log2f(sc[i]));
            float u = m == -INFINITY ? ref - a + E : fminf(U + (ref - m), ref - a + E);
            float alpha = exp2f(m - ref + (u - U));
            for (int d = 0; d < D; d++) accd[d] *= alpha;
            l *= alpha, vmin *= alpha, U = u, m = mnew;
            vthr = exp2f(15 - SL - U);
        }
        float pref = m - U;
        /* the tensor cores: 16 products summed (exactly here), added to the f32 accumulator per mma */
        for (int h = t0; h < t0 + 32; h += 16) {
            double part[D] = {0};
            for (int i = h; i < h + 16; i++) {
                float p = exp2f(s[i] - pref);
                l += p;
                _Float16 w = (_Float16)(p * sc[i]);
                if (isinf((float)w)) return INFINITY;
                for (int d = 0; d < D; d++) part[d] += (double)(float)w * code[i * D + d];
                vmin += p * mn[i];
            }
            for (int d = 0; d < D; d++) accd[d] = (float)(accd[d] + part[d]);
        }
    }
    double M = -INFINITY, L = 0, o[D] = {0}, num = 0, den = 0;
    for (int i = 0; i < N; i++) M = fmax(M, s[i]);
    for (int i = 0; i < N; i++) {
        double p = exp2((double)s[i] - M);
        L += p;
        for (int d = 0; d < D; d++) o[d] += p * ((double)sc[i] * code[i * D + d] + mn[i]);
    }
    for (int d = 0; d < D; d++) {
        double r = o[d] / L, got = (accd[d] + vmin) / l;
        num += (got - r) * (got - r), den += r * r;
    }
    return sqrt(num / den);
}
int main(void) {
    static const float rules[][2] = {{0, 8}, {4, 8}, {6, 6}, {8, 4}};
    for (int k = 0; k < 2; k++) {
        double spread = k ? 0.3 : 0.05;
        printf("== V scales 1 +- %.2f (normal), logits 0.02 x normal, one token S above\n", spread);
        printf("   S  | E 0 SL 8 (v23)   | E 4 SL 8         | E 6 SL 6         | E 8 SL 4\n");
        for (int S = 12; S <= 32; S += 2) {
            double worst[4] = {0}; int res[4] = {0};
            for (int rep = 0; rep < 6; rep++) {
                for (int i = 0; i < N; i++) {
                    sc[i] = (float)(1 + spread * nrm()), mn[i] = -1.5f * sc[i], s[i] = (float)(0.02 * nrm());
                    if (i == 5000 + rep) s[i] = (float)S;
                    for (int d = 0; d < D; d++) code[i * D + d] = nx() & 3;
                }
                for (int r = 0; r < 4; r++) {
                    int re; double e = run(rules[r][0], rules[r][1], &re);
                    if (e > worst[r]) worst[r] = e;
                    res[r] += re;
                }
            }
            printf("  %2d  ", S);
            for (int r = 0; r < 4; r++) printf("| %.2e (%4d)  ", worst[r], res[r]);
            printf("\n");
        }
    }
    return 0;
}
