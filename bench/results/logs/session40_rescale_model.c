/* Session 40: a CPU model of v23's per-warp rescale rules (decode_int2_kernel, F16W) on data like bench_decode's
   (f16 scales (1 + 2|N|) / 3, random codes, normal q): counts rescales by cause. Run: cc -O2 x.c -lm && ./a.out 61 100
   -> 6100 tiles, 128 rescales by logits, 0 by the V-scale guard alone. A record, not part of the build. */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <stdint.h>
static uint64_t st = 88172645463325252ull;
static uint64_t nx(void) { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; }
static double un(void) { return ((nx() >> 11) + 1) * (1.0 / 9007199254740993.0); }
static double nrm(void) { return sqrt(-2 * log(un())) * cos(6.283185307179586 * un()); }
int main(int argc, char **argv) {
    int D = 128, H = 8, tiles = argc > 1 ? atoi(argv[1]) : 61, warps = argc > 2 ? atoi(argv[2]) : 200;
    long fires_logit = 0, fires_guard = 0, total = 0;
    for (int w = 0; w < warps; w++) {
        double q[8][128], qs[8];
        for (int h = 0; h < H; h++) { qs[h] = 0; for (int d = 0; d < D; d++) q[h][d] = nrm(), qs[h] += q[h][d]; }
        double m[8], U[8], vthr = 0;
        for (int h = 0; h < H; h++) m[h] = -INFINITY, U[h] = 0;
        for (int t = 0; t < tiles; t++) {
            double s[32][8], sc[32];
            for (int k = 0; k < 32; k++) {
                double range = 1 + 2 * fabs(nrm()), ks = range / 3, kmn = -range / 2;
                sc[k] = (1 + 2 * fabs(nrm())) / 3;
                for (int h = 0; h < H; h++) {
                    double dot = 0;
                    for (int d = 0; d < D; d++) dot += q[h][d] * (double)(nx() & 3);
                    s[k][h] = (ks * dot + kmn * qs[h]) / sqrt(D) * 1.4426950408889634;
                }
            }
            int grow = 0, guard = 0;
            double vm = 0;
            for (int k = 0; k < 32; k++) vm = fmax(vm, sc[k]);
            guard = vm > vthr;
            double mx[8];
            for (int h = 0; h < H; h++) { mx[h] = -INFINITY; for (int k = 0; k < 32; k++) mx[h] = fmax(mx[h], s[k][h]); if (mx[h] > m[h] + 8) grow = 1; }
            total++;
            if (grow) fires_logit++; else if (guard) fires_guard++;
            if (grow || guard) {
                double umax = -90;
                for (int h = 0; h < H; h++) {
                    double mn = fmax(m[h], mx[h]), ref = mn, a = -INFINITY;
                    for (int k = 0; k < 32; k++) a = fmax(a, s[k][h] + log2(sc[k]));
                    double u = isinf(m[h]) ? ref - a : fmin(U[h] + (ref - m[h]), ref - a);
                    u = fmin(fmax(u, -90), 90);
                    U[h] = u; m[h] = mn; umax = fmax(umax, u);
                }
                vthr = exp2(7 - umax);
            }
        }
        if (w < 3) { printf("warp %d: U", w); for (int h = 0; h < H; h++) printf(" %.2f", U[h]); printf(" vthr %.1f\n", vthr); }
    }
    printf("tiles %ld: rescales by logits %ld, by the guard alone %ld\n", total, fires_logit, fires_guard);
    return 0;
}
