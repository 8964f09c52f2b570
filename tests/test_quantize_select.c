/* tests/test_quantize_select.c -- the clip threshold of quantize.cuh's
   selection network (q_select_key) against the reference's sort, on the
   CPU (no GPU).

   The reference clips a row at tau = sorted(|y|)[clip_index] (ascending),
   i.e. the m-th largest |y|, m = D - clip_index. For m <= 16, and when
   every |y| pattern is below 0x7C00, the kernel finds it with a sorting
   network over the 16-bit patterns of |y| compared as f16 numbers: each
   lane sorts blocks of K = 8 or 16 of its words (two values per word, both
   halves at once) with Batcher's odd-even merge sort, merges each block
   into a running top-K list (max(top_i, block_{K-1-i}), a bitonic sequence,
   then a bitonic merge), merges its high-half list into its low-half list
   the same way, then (two lanes per row) the partner's list, and takes
   entry m - 1. This program mirrors that network step by step in C -- the
   same recursion, the same words (the kernel's column layout per lane), f16
   max/min as f16 numbers -- and checks the key against the reference's
   sort on hard rows: ties, many equal values, zeros of both signs, all-equal
   rows, one-valued rows with a spike, subnormals, tiny and huge values, for
   every m in 1..16, head dims 64/128/256, one and two lanes per row, bf16
   and f16. It also checks the network sorts every 0/1 input of 8 and 16
   (the 0-1 principle: then it sorts every input). */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"

/* ---- the C mirror of quantize.cuh's network --------------------------------
   Words are (lo, hi) pairs of 16-bit patterns; max/min compare them as f16
   numbers, as max.f16x2 / min.f16x2 do (NaN-ignoring; no NaN reaches here). */
typedef struct sw {
    uint16_t lo, hi;
} sw;
static float f16v(uint16_t p) { return oscar__to_f32(p, OSCAR_K_DTYPE_F16); }
static uint16_t hmax1(uint16_t a, uint16_t b) { return f16v(a) >= f16v(b) ? a : b; }
static uint16_t hmin1(uint16_t a, uint16_t b) { return f16v(a) <= f16v(b) ? a : b; }
static sw hmax(sw a, sw b) {
    sw r;
    r.lo = hmax1(a.lo, b.lo), r.hi = hmax1(a.hi, b.hi);
    return r;
}
static sw hmin(sw a, sw b) {
    sw r;
    r.lo = hmin1(a.lo, b.lo), r.hi = hmin1(a.hi, b.hi);
    return r;
}
static void ce(sw *x, int i, int j) {
    sw a = x[i], b = x[j];
    x[i] = hmax(a, b), x[j] = hmin(a, b);
}
static void oe_merge(sw *x, int lo, int n, int r) {
    if (2 * r < n) {
        int i;
        oe_merge(x, lo, n, 2 * r);
        oe_merge(x, lo + r, n, 2 * r);
        for (i = lo + r; i + r < lo + n; i += 2 * r) ce(x, i, i + r);
    } else {
        ce(x, lo, lo + r);
    }
}
static void oe_sort(sw *x, int lo, int n) {
    if (n > 1) {
        oe_sort(x, lo, n / 2);
        oe_sort(x, lo + n / 2, n / 2);
        oe_merge(x, lo, n, 1);
    }
}
static void bitonic_desc(sw *x, int n) {
    int d, i;
    for (d = n / 2; d > 0; d >>= 1)
        for (i = 0; i < n; i++)
            if ((i & d) == 0) ce(x, i, i + d);
}
static void merge_top(sw *top, const sw *b, int k) {
    int i;
    for (i = 0; i < k; i++) top[i] = hmax(top[i], b[k - 1 - i]);
    bitonic_desc(top, k);
}
/* one lane's sorted top-K list (both halves hold it after the half merge) */
static void lane_top(const sw *w, int nw, int k, sw *top) {
    int b, i;
    sw x[16], s[16];
    for (b = 0; b < nw / k; b++) {
        for (i = 0; i < k; i++) x[i].lo = w[b * k + i].lo & 0x7fffu, x[i].hi = w[b * k + i].hi & 0x7fffu;
        oe_sort(x, 0, k);
        if (b == 0)
            memcpy(top, x, sizeof(sw) * (size_t)k);
        else
            merge_top(top, x, k);
    }
    for (i = 0; i < k; i++) s[i].lo = top[i].hi, s[i].hi = top[i].lo; /* __byte_perm(t, 0, 0x1032) */
    merge_top(top, s, k);
}
/* the kernel's words of a row for lane h of lpr: w[q][jp] = columns
   q*Q4 + h*JW + 2jp (low half), + 1 (high half); flattened q * JP + jp */
static int row_words(const uint16_t *row, int D, int lpr, int h, sw *w) {
    int Q4 = D / 4, JW = Q4 / lpr, JP = JW / 2, q, jp;
    for (q = 0; q < 4; q++)
        for (jp = 0; jp < JP; jp++) {
            int c = q * Q4 + h * JW + 2 * jp;
            w[q * JP + jp].lo = row[c], w[q * JP + jp].hi = row[c + 1];
        }
    return 4 * JP;
}
/* q_select_key for a whole row: the key of the m-th largest |y| (m <= k) */
static uint16_t net_key(const uint16_t *row, int D, int lpr, int k, int m) {
    sw w[128], top[2][16];
    int h, nw = 0;
    for (h = 0; h < lpr; h++) {
        nw = row_words(row, D, lpr, h, w);
        lane_top(w, nw, k, top[h]);
    }
    if (lpr == 2) {
        sw o[16];
        memcpy(o, top[1], sizeof o);
        merge_top(top[0], o, k); /* lane 0's view; lane 1 merges the same lists */
    }
    (void)nw;
    return top[0][m - 1].lo;
}

/* ---- the reference ----------------------------------------------------------- */
static float ref_tau(const uint16_t *row, int D, int dt, int clip_index) {
    float s[256];
    int d;
    for (d = 0; d < D; d++) s[d] = fabsf(oscar__to_f32(row[d], dt));
    qsort(s, (size_t)D, sizeof(float), oscar__cmp_float);
    return s[clip_index];
}

static uint16_t pat(double x, int dt) { return oscar__from_f32((float)x, dt); }

/* a hard row of kind `kind` (0..11) */
static void make_row(tu_rng *r, uint16_t *row, int D, int dt, int kind) {
    int d, f16 = dt == OSCAR_K_DTYPE_F16;
    for (d = 0; d < D; d++) {
        double x = tu_normal(r);
        switch (kind) {
        case 0: break;                                                    /* Gaussian */
        case 1: x *= (d % 17 == 3 ? 20 : 1) * (tu_uniform(r) < 0.01 ? 100 : 1); break; /* outliers */
        case 2: x = (double)(tu_int(r, 5) - 2); break;                    /* {-2..2}: ties, zeros */
        case 3: x = tu_uniform(r) < 0.5 ? 1.5 : -1.5; break;              /* all |y| equal */
        case 4: x = 0.0; break;                                           /* all zero */
        case 5: x = tu_uniform(r) < 0.5 ? -0.0 : 0.0; break;              /* zeros of both signs */
        case 6: x = d == 7 ? 3e4 : (tu_uniform(r) < 0.5 ? -0.0 : 1e-3); break; /* a spike */
        case 7: x = floor(x * 2) / 2; break;                              /* grid of 1/2 */
        case 8: x *= f16 ? 1e-6 : 1e-37; break;                           /* subnormal (f16) / tiny */
        case 9: x *= f16 ? 1e4 : 1e30; break;                             /* large (below 0x7C00 patterns, mostly) */
        case 10: x = tu_int(r, 3) == 0 ? x : (tu_uniform(r) < 0.5 ? -2.0 : 2.0); break; /* a tie at the top */
        default: x = (double)(d % 8) * (d % 2 ? -0.25 : 0.25); break;     /* exact ties, one per residue */
        }
        if (kind == 5 || kind == 6 || kind == 4) {
            row[d] = x == 0.0 && signbit(x) ? 0x8000u : pat(x, dt);
            continue;
        }
        row[d] = pat(x, dt);
    }
}

static int keys_below_inf(const uint16_t *row, int D) {
    int d;
    for (d = 0; d < D; d++)
        if ((row[d] & 0x7fffu) >= 0x7c00u) return 0;
    return 1;
}

Test(quantize_select, network_sorts_every_01_input) {
    int k, v, i;
    for (k = 8; k <= 16; k += 8)
        for (v = 0; v < (1 << k); v++) {
            sw x[16];
            for (i = 0; i < k; i++) x[i].lo = (v >> i) & 1 ? 0x3c00u : 0u, x[i].hi = (v >> (k - 1 - i)) & 1 ? 0x3c00u : 0u;
            oe_sort(x, 0, k);
            for (i = 0; i + 1 < k; i++) {
                cr_assert(f16v(x[i].lo) >= f16v(x[i + 1].lo), "K=%d input 0x%x: not sorted at %d", k, v, i);
                cr_assert(f16v(x[i].hi) >= f16v(x[i + 1].hi), "K=%d input 0x%x: not sorted at %d", k, v, i);
            }
        }
}

Test(quantize_select, network_key_equals_sort_threshold) {
    static const int dims[] = {64, 128, 256};
    tu_rng r = tu_seed();
    long cases = 0, skipped = 0;
    int di, dti, lpr, kind, m, rep;
    for (di = 0; di < 3; di++)
        for (dti = 0; dti < 2; dti++)
            for (lpr = 1; lpr <= 2; lpr++)
                for (kind = 0; kind < 12; kind++)
                    for (rep = 0; rep < 60; rep++) {
                        int D = dims[di], dt = dti ? OSCAR_K_DTYPE_F16 : OSCAR_K_DTYPE_BF16;
                        uint16_t row[256];
                        make_row(&r, row, D, dt, kind);
                        if (!keys_below_inf(row, D)) {
                            skipped++; /* the kernel counts such rows by bisection */
                            continue;
                        }
                        for (m = 1; m <= 16; m++) {
                            int k = m <= 8 ? 8 : 16;
                            float want = ref_tau(row, D, dt, D - m);
                            float got = oscar__to_f32(net_key(row, D, lpr, k, m), dt);
                            cr_assert(memcmp(&got, &want, sizeof got) == 0,
                                      "D=%d %s lpr=%d kind=%d m=%d: network %a, sort %a", D, dti ? "f16" : "bf16", lpr,
                                      kind, m, (double)got, (double)want);
                            cases++;
                        }
                    }
    cr_log_info("selection network: %ld (row, m) cases equal to the sort threshold (%ld rows left to the bisection)",
                cases, skipped);
    cr_assert(cases > 100000);
}
