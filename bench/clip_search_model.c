/* bench/clip_search_model.c -- a CPU model of quantize.cuh's clip search: how
   many counting probes a warp of 32 rows (one per lane) executes to find
   tau = the m-th largest |y| of each 128-value row, for v9's search ("today"
   in the output) and for the step-down that dc70f3b added to it. The GPU runs every
   probe for the whole warp while any lane still searches, so a warp pays the
   maximum over its lanes. Keys are the bf16 bit patterns of |y| (ordered as
   the values). No GPU, no oscar: cc -O2 clip_search_model.c -lm.

   v9: bracket [max - 2 binades, max], else everything below it, then
   halvings. Step-down (quantize.cuh since dc70f3b): up to three more 2-binade
   steps down while a lane's first bracket failed. Both exact:
   every probe keeps count(>= lo) >= m > count(>= hi + 1); the model checks
   that both give the same tau. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { D = 128, LANES = 32, BINADE = 1 << 7, WARPS = 3000 };

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}
static double nrand(void) { return sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand()); }
static uint16_t key_of(float v) { /* bf16 bits of |v|, round to nearest even */
    uint32_t u;
    v = fabsf(v);
    memcpy(&u, &v, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static int count_ge(const uint16_t *k, unsigned key) {
    int c = 0, i;
    for (i = 0; i < D; i++) c += k[i] >= key;
    return c;
}

/* probes one warp executes; tau[] per lane */
static int warp_probes(uint16_t k[LANES][D], int m, int step_down, unsigned tau[LANES]) {
    unsigned lo[LANES], hi[LANES];
    int down[LANES], probes = 1, l, i, s;
    for (l = 0; l < LANES; l++) {
        unsigned kmax = 0, p;
        for (i = 0; i < D; i++) kmax = k[l][i] > kmax ? k[l][i] : kmax;
        p = kmax > 2 * BINADE ? kmax - 2 * BINADE : 0;
        down[l] = count_ge(k[l], p) < m;
        lo[l] = down[l] ? 0 : p, hi[l] = down[l] ? p - 1 : kmax;
    }
    for (s = 0; step_down && s < 3; s++) {
        int any = 0;
        for (l = 0; l < LANES; l++) any |= down[l] && hi[l] > 2 * BINADE;
        if (!any) break;
        probes++;
        for (l = 0; l < LANES; l++)
            if (down[l] && hi[l] > 2 * BINADE) {
                unsigned p = hi[l] - 2 * BINADE;
                if (count_ge(k[l], p) >= m) lo[l] = p, down[l] = 0;
                else hi[l] = p - 1;
            }
    }
    for (;;) {
        int any = 0;
        for (l = 0; l < LANES; l++) any |= lo[l] < hi[l];
        if (!any) break;
        probes++;
        for (l = 0; l < LANES; l++)
            if (lo[l] < hi[l]) {
                unsigned mid = (lo[l] + hi[l] + 1) >> 1;
                if (count_ge(k[l], mid) >= m) lo[l] = mid;
                else hi[l] = mid - 1;
            }
    }
    for (l = 0; l < LANES; l++) tau[l] = lo[l];
    return probes;
}

static double row_value(int kind, int col) {
    double c = 0;
    int j;
    switch (kind) {
    case 0: return nrand();                                    /* near-Gaussian (rotated rows) */
    case 1: return nrand() * (col % 17 == 3 ? 20 : 1);         /* bench_quantize's unrotated rows */
    case 2: return nrand() * (col == 3 || col == 77 ? 8 : 1);  /* two outlier channels */
    default:
        for (j = 0; j < 4; j++) {
            const double z = nrand();
            c += z * z;
        }
        return nrand() / sqrt(c / 4); /* Student-t, 4 degrees of freedom */
    }
}

int main(void) {
    static const char *names[] = {"near-Gaussian", "8 channels x 20 (bench)", "2 channels x 8", "Student-t(4)"};
    static uint16_t k[LANES][D];
    int kind, mi, w, l, i;
    printf("probes per warp of 32 rows (mean over %d warps): today's search | with the step-down\n", WARPS);
    for (kind = 0; kind < 4; kind++)
        for (mi = 0; mi < 2; mi++) {
            const int m = mi ? 11 : 6; /* clip .92 / .96 at head dim 128 */
            double today = 0, stepped = 0;
            for (w = 0; w < WARPS; w++) {
                unsigned t0[LANES], t1[LANES];
                for (l = 0; l < LANES; l++) {
                    const double scale = exp(0.5 * nrand());
                    for (i = 0; i < D; i++) k[l][i] = key_of((float)(scale * row_value(kind, i)));
                }
                today += warp_probes(k, m, 0, t0);
                stepped += warp_probes(k, m, 1, t1);
                for (l = 0; l < LANES; l++)
                    if (t0[l] != t1[l]) {
                        printf("the two searches disagree (lane %d): %u vs %u\n", l, t0[l], t1[l]);
                        return 1;
                    }
            }
            printf("%-24s m = %2d: %5.2f | %5.2f\n", names[kind], m, today / WARPS, stepped / WARPS);
        }
    return 0;
}
