/* bench/clip_search_model.c -- a CPU model of quantize.cuh's clip-threshold
   search: how many counting probes a warp executes to find tau = the m-th
   largest |y| of each row of D values (one row per lane, 32 lanes per warp;
   m = D - floor(clip * D)). The GPU runs a probe for the whole warp while any
   lane still needs one, so a warp pays the maximum over its lanes. Keys are
   the bf16 bit patterns of |y| (ordered as the values); one binade is 2^7 keys.

   The search (quantize.cuh, after "s22: where m <= D / 16"): a first bracket
   [kmax - F binades, kmax]; where fewer than m keys lie in it (the lane
   "missed"), up to three step-downs of S1, S2, S3 binades below it; then
   halvings of [lo, hi] until lo == hi. Exact by construction: every probe
   keeps count(>= lo) >= m > count(>= hi + 1). A variant is written F|S1,S2,S3;
   its brackets span 2^k + 1 keys (the kernel's form: probe = kmax - F*128,
   step probe = hi - S*128 where hi > S*128) or, marked "p", exactly 2^k keys
   (probe = kmax - (F*128 - 1), step probe = hi - (S*128 - 1) where
   hi >= S*128). The variants printed, by kernel version:
     v13  2|2,2,2        v9 with the step-down (dc70f3b, session 10) to v13
     v14  1|2,2,2 for m <= 8, else 2|2,2,2 (session 22)
     v15  1|2,2,2 for m <= D / 16, else 2|2,2,2 (session 22; the kernel now)
     1|2,2,2, 1|1,2,2p, 2|2,2,2p   alternatives (v14/v15's first = 1 always;
                                   one-binade first step; 2^k-key brackets)
   (v9 as first shipped had no step-down: 2|-.) Every variant's tau is checked
   against the m-th largest key of the row found by sorting; a mismatch is
   reported and the program exits with status 1.

   Synthetic mode (no arguments): rows of D = 128, then D = 64 values (or the
   D given by --dim, repeatable: 64, 128, 256) drawn from one xorshift stream
   in the order printed: Gaussian, Student-t(5), Gaussian with outlier
   channels (every 32nd column x 8), Gaussian x 0.01 (every row), Gaussian
   with a per-row scale e^(N(0,1)/2); m for clip .96 and .92 and m = 6, 11;
   --warps N warps each (default 4000).

   Capture mode: --capture FILE --rot-k K.safetensors --rot-v V.safetensors
   [--max-tokens N]: the K and V rows of a QKVCAP1 capture
   (examples/llm/capture.h; bf16, or f32 rounded to bf16), the first N tokens
   of each layer (default: all), rows token-major within a layer (token *
   num_kv_heads + head), 32 rows per warp (a layer's last rows that do not
   fill a warp are left out of the probe counts); three row kinds: K rotated
   by the layer's K rotation, V raw, V rotated by its V rotation (oscar
   rotation files: F32 "rotations" [layers, D, D] and I32 "layer_ids";
   R rounded to bf16, y = x R accumulated in double and rounded to bf16, as
   oscar__cpu_rotate_row). m for clip .96 and .92 and m = 6, 11. Prints the
   probe table, the fraction of warps whose first probe missed in at least
   one lane, and per-row max|y| / tau statistics (all rows).

   Build: make -C build clip_search_model (bench/CMakeLists.txt), or
   standalone: cc -std=c11 -Wall -Wextra -O2 clip_search_model.c -lm.
   Run:   build/bench/clip_search_model [--dim D]... [--warps N]
          build/bench/clip_search_model --capture gpl3.qkv \
            --rot-k examples/llm/rotations/smollm2-135m.gpl2.k.safetensors \
            --rot-v examples/llm/rotations/smollm2-135m.gpl2.v.safetensors
   A capture (SmolLM2-135M from examples/llm/fetch_model.sh; 2 windows of 2048
   tokens: 4096 tokens x 30 layers x 3 KV heads of D 64, ~240 MB):
     build/examples/llm/llm_eval -m models/SmolLM2-135M-Instruct.Q4_1.gguf \
       -f /usr/share/common-licenses/GPL-3 --ctx 2048 --max-windows 2 \
       --capture FILE --capture-dtype bf16 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LANES = 32, BINADE = 1 << 7, MAXD = 256, MAXM = 4, NKIND = 5 };

typedef struct {
    const char *name;
    int first;    /* binades of the first bracket; 0: v15's rule, -1: v14's */
    int steps[3]; /* binades of each step-down; 0 ends them */
    int pow2;     /* brackets of exactly 2^k keys (else 2^k + 1) */
} variant;

static const variant VARIANTS[] = {
    {"v13", 2, {2, 2, 2}, 0},      {"v14", -1, {2, 2, 2}, 0},     {"v15", 0, {2, 2, 2}, 0},
    {"1|2,2,2", 1, {2, 2, 2}, 0}, {"1|1,2,2p", 1, {1, 2, 2}, 1}, {"2|2,2,2p", 2, {2, 2, 2}, 1},
};
enum { NV = sizeof VARIANTS / sizeof VARIANTS[0] };

static int count_ge(const uint16_t *k, int D, unsigned key) {
    int c = 0, i;
    for (i = 0; i < D; i++) c += k[i] >= key;
    return c;
}

/* probes one warp executes on rows k[l * D ...]; tau per lane; *miss: the
   first bracket failed in some lane */
static int warp_probes(const uint16_t *k, int D, int m, const variant *v, unsigned tau[LANES], int *miss) {
    unsigned lo[LANES], hi[LANES];
    int down[LANES], probes = 1, l, i, s;
    const int first = v->first > 0 ? v->first : m <= (v->first ? 8 : D / 16) ? 1 : 2;
    const unsigned w0 = (unsigned)(first * BINADE - v->pow2);
    *miss = 0;
    for (l = 0; l < LANES; l++) {
        const uint16_t *r = k + (size_t)l * D;
        unsigned kmax = 0, p;
        for (i = 0; i < D; i++) kmax = r[i] > kmax ? r[i] : kmax;
        p = kmax > w0 ? kmax - w0 : 0;
        down[l] = count_ge(r, D, p) < m;
        lo[l] = down[l] ? 0 : p, hi[l] = down[l] ? p - 1 : kmax;
        *miss |= down[l];
    }
    for (s = 0; s < 3 && v->steps[s] > 0; s++) {
        const unsigned ws = (unsigned)(v->steps[s] * BINADE - v->pow2);
        int any = 0;
        for (l = 0; l < LANES; l++) any |= down[l] && hi[l] > ws;
        if (!any) break;
        probes++;
        for (l = 0; l < LANES; l++)
            if (down[l] && hi[l] > ws) {
                const unsigned p = hi[l] - ws;
                if (count_ge(k + (size_t)l * D, D, p) >= m) lo[l] = p, down[l] = 0;
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
                const unsigned mid = (lo[l] + hi[l] + 1) >> 1;
                if (count_ge(k + (size_t)l * D, D, mid) >= m) lo[l] = mid;
                else hi[l] = mid - 1;
            }
    }
    for (l = 0; l < LANES; l++) tau[l] = lo[l];
    return probes;
}

static int cmpu16(const void *a, const void *b) { return (int)*(const uint16_t *)a - (int)*(const uint16_t *)b; }
static int cmpd(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* every variant on one warp: adds to tot[] / miss[]; 0, or 1 on a wrong tau */
static int run_warp(const uint16_t *k, int D, int m, double tot[NV], double miss[NV], const char *what, long long warp) {
    unsigned truth[LANES], tau[LANES];
    int l, v, ms;
    for (l = 0; l < LANES; l++) {
        uint16_t s[MAXD];
        memcpy(s, k + (size_t)l * D, (size_t)D * 2);
        qsort(s, (size_t)D, 2, cmpu16);
        truth[l] = s[D - m];
    }
    for (v = 0; v < NV; v++) {
        tot[v] += warp_probes(k, D, m, &VARIANTS[v], tau, &ms);
        miss[v] += ms;
        for (l = 0; l < LANES; l++)
            if (tau[l] != truth[l]) {
                fprintf(stderr, "MISMATCH: %s, D %d, m %d, warp %lld, lane %d, variant %s: tau %u, m-th largest %u\n", what, D,
                        m, warp, l, VARIANTS[v].name, tau[l], truth[l]);
                return 1;
            }
    }
    return 0;
}

/* m of clip .96 and .92 and m = 6, 11, ascending, without repeats */
static int m_values(int D, int ms[MAXM]) {
    const int c[MAXM] = {D - 96 * D / 100, D - 92 * D / 100, 6, 11};
    int n = 0, i, j;
    for (i = 0; i < MAXM; i++) {
        for (j = 0; j < n && ms[j] != c[i]; j++) {}
        if (j == n) ms[n++] = c[i];
    }
    for (i = 1; i < n; i++)
        for (j = i; j > 0 && ms[j - 1] > ms[j]; j--) {
            const int t = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = t;
        }
    return n;
}

static void table_header(const char *what) {
    int v;
    printf("%-26s %3s |", what, "m");
    for (v = 0; v < NV; v++) printf(" %8s", VARIANTS[v].name);
    printf("\n");
}
static void table_row(const char *what, int m, const double x[NV], double n, int prec) {
    int v;
    printf("%-26s %3d |", what, m);
    for (v = 0; v < NV; v++) printf(" %8.*f", prec, x[v] / n);
    printf("\n");
}

/* ---- synthetic rows */
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

static int synthetic(const int *dims, int ndims, int warps) {
    static const char *names[NKIND] = {"gauss", "student-t5", "outlier ch x8 (1 in 32)", "gauss x 0.01",
                                       "gauss x e^(N/2) per row"};
    static uint16_t k[LANES * MAXD];
    int di, kind, mi, w, l, i, j;
    printf("clip search model: mean probes per warp of %d rows, %d warps per line\n", LANES, warps);
    printf("v13 = 2|2,2,2; v14 = 1|2,2,2 if m <= 8 else v13; v15 = 1|2,2,2 if m <= D/16 else v13 (p: 2^k-key brackets)\n");
    for (di = 0; di < ndims; di++) {
        const int D = dims[di];
        int ms[MAXM];
        const int nm = m_values(D, ms);
        char title[64];
        snprintf(title, sizeof title, "D %d", D);
        printf("\n");
        table_header(title);
        for (kind = 0; kind < NKIND; kind++)
            for (mi = 0; mi < nm; mi++) {
                double tot[NV] = {0}, miss[NV] = {0};
                for (w = 0; w < warps; w++) {
                    for (l = 0; l < LANES; l++) {
                        const double scale = kind == 4 ? exp(0.5 * nrand()) : kind == 3 ? 0.01 : 1;
                        for (i = 0; i < D; i++) {
                            double x = nrand();
                            if (kind == 1) {
                                double c = 0;
                                for (j = 0; j < 5; j++) {
                                    const double z = nrand();
                                    c += z * z;
                                }
                                x /= sqrt(c / 5);
                            }
                            if (kind == 2 && i % 32 == 7) x *= 8;
                            k[l * D + i] = key_of((float)(x * scale));
                        }
                    }
                    if (run_warp(k, D, ms[mi], tot, miss, names[kind], w)) return 1;
                }
                table_row(names[kind], ms[mi], tot, warps, 2);
            }
    }
    return 0;
}

/* ---- capture mode */
static float bf2f(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void die(const char *a, const char *b) {
    fprintf(stderr, "clip_search_model: %s%s\n", a, b);
    exit(1);
}

/* one tensor of a safetensors header: dtype must be dt; shape into shape[nd]; byte offsets */
static void st_tensor(const char *hdr, const char *name, const char *dt, int nd, long long *shape, long long off[2],
                      const char *path) {
    char key[64], want[32];
    const char *p, *e, *q;
    int i;
    snprintf(key, sizeof key, "\"%s\":{", name);
    snprintf(want, sizeof want, "\"dtype\":\"%s\"", dt);
    p = strstr(hdr, key);
    if (!p) die("no tensor named so in ", path);
    p += strlen(key);
    e = strchr(p, '}');
    if (!e) die("bad header in ", path);
    q = strstr(p, want);
    if (!q || q > e) die("unexpected dtype in ", path);
    q = strstr(p, "\"shape\":[");
    if (!q || q > e) die("no shape in ", path);
    q += 9;
    for (i = 0; i < nd; i++) {
        char *t;
        shape[i] = strtoll(q, &t, 10);
        if (t == q || *t != (i + 1 < nd ? ',' : ']')) die("unexpected shape in ", path);
        q = t + 1;
    }
    q = strstr(p, "\"data_offsets\":[");
    if (!q || q > e || sscanf(q + 16, "%lld,%lld", &off[0], &off[1]) != 2) die("no data_offsets in ", path);
}

/* rotations of a rotation file, rounded to bf16, by layer: R[layer][D][D] */
static float *load_rot(const char *path, int NL, int D) {
    FILE *f = fopen(path, "rb");
    uint64_t n;
    char *hdr;
    long long rs[3], rof[2], is[1], iof[2];
    float *R, *M;
    int32_t *ids;
    int i;
    if (!f || fread(&n, 8, 1, f) != 1 || n > (1u << 20)) die("cannot read ", path);
    hdr = malloc(n + 1);
    if (!hdr || fread(hdr, 1, n, f) != n) die("short header in ", path);
    hdr[n] = 0;
    st_tensor(hdr, "rotations", "F32", 3, rs, rof, path);
    st_tensor(hdr, "layer_ids", "I32", 1, is, iof, path);
    if (rs[0] != NL || rs[1] != D || rs[2] != D || is[0] != NL) die("rotation shape differs from the capture's: ", path);
    if (rof[1] - rof[0] != (long long)NL * D * D * 4 || iof[1] - iof[0] != (long long)NL * 4) die("bad offsets in ", path);
    M = malloc((size_t)NL * D * D * 4), R = malloc((size_t)NL * D * D * 4), ids = malloc((size_t)NL * 4);
    if (!M || !R || !ids) die("out of memory", "");
    if (fseek(f, (long)(8 + n + rof[0]), SEEK_SET) || fread(M, 4, (size_t)NL * D * D, f) != (size_t)NL * D * D ||
        fseek(f, (long)(8 + n + iof[0]), SEEK_SET) || fread(ids, 4, (size_t)NL, f) != (size_t)NL)
        die("short data in ", path);
    fclose(f);
    for (i = 0; i < NL; i++) { /* matrix i belongs to layer ids[i]: each layer once */
        int j;
        if (ids[i] < 0 || ids[i] >= NL) die("layer_ids out of range in ", path);
        for (j = 0; j < i; j++)
            if (ids[j] == ids[i]) die("a layer twice in layer_ids of ", path);
        for (j = 0; j < D * D; j++)
            R[(size_t)ids[i] * D * D + j] = bf2f(f2bf(M[(size_t)i * D * D + j])); /* R in the source dtype (bf16) */
    }
    free(M), free(ids), free(hdr);
    return R;
}

/* y = x R (row vector times R, R[i][j] row-major), double accumulation, rounded to bf16 (oscar__cpu_rotate_row) */
static void rotate(const uint16_t *x, const float *R, int D, uint16_t *y) {
    int i, j;
    for (j = 0; j < D; j++) {
        double a = 0;
        for (i = 0; i < D; i++) a += (double)bf2f(x[i]) * R[i * D + j];
        y[j] = f2bf((float)a);
    }
}

static int capture(const char *path, const char *rk, const char *rv, long long max_tokens) {
    static const char *kn[3] = {"K rotated", "V raw", "V rotated"};
    FILE *f = fopen(path, "rb");
    uint8_t hdr[64];
    uint32_t u[5];
    uint64_t nrec, r;
    int NL, NH, NKV, D, dt, l, kd, mi, nm, ms[MAXM];
    long long ntok_max, ntok, nrows, nwarps_l, *nt;
    uint32_t *lseq;
    int64_t *lpos;
    float *Rk, *Rv, *xf;
    uint16_t *keys[3], *xb;
    size_t qn, kvn, es;
    if (!f || fread(hdr, 1, 64, f) != 64 || memcmp(hdr, "QKVCAP1", 8)) die("not a QKVCAP1 file: ", path);
    memcpy(u, hdr + 8, 20), memcpy(&nrec, hdr + 40, 8);
    NL = (int)u[0], NH = (int)u[1], NKV = (int)u[2], D = (int)u[3], dt = (int)u[4];
    if (D != 64 && D != 128 && D != 256) die("head_dim must be 64, 128 or 256: ", path);
    if (dt != 0 && dt != 1) die("unknown dtype in ", path);
    if (NL <= 0 || NH <= 0 || NKV <= 0 || nrec % (uint64_t)NL) die("bad header in ", path);
    Rk = load_rot(rk, NL, D), Rv = load_rot(rv, NL, D);
    ntok_max = (long long)(nrec / (uint64_t)NL);
    if (max_tokens > 0 && max_tokens < ntok_max) ntok_max = max_tokens;
    es = dt ? 2 : 4, qn = (size_t)NH * D, kvn = (size_t)NKV * D;
    xb = malloc((qn + 2 * kvn) * 2), xf = malloc((qn + 2 * kvn) * 4);
    nt = calloc((size_t)NL, sizeof *nt), lseq = calloc((size_t)NL, 4), lpos = calloc((size_t)NL, 8);
    for (kd = 0; kd < 3; kd++) keys[kd] = malloc((size_t)NL * ntok_max * kvn * 2);
    if (!xb || !xf || !nt || !lseq || !lpos || !keys[0] || !keys[1] || !keys[2]) die("out of memory", "");
    /* keys of the three row kinds: [kind][layer][token * NKV + head][D] */
    for (r = 0; r < nrec; r++) {
        uint8_t rec[16];
        uint32_t layer, seq;
        int64_t pos;
        long long t;
        size_t i;
        int h;
        if (fread(rec, 1, 16, f) != 16) die("short capture ", path);
        memcpy(&layer, rec, 4), memcpy(&seq, rec + 4, 4), memcpy(&pos, rec + 8, 8);
        if (layer >= (uint32_t)NL) die("layer out of range in ", path);
        if (fread(dt ? (void *)xb : (void *)xf, es, qn + 2 * kvn, f) != qn + 2 * kvn) die("short capture ", path);
        t = nt[layer]++;
        if (t >= ntok_max) continue;
        if (t > 0 && !(seq > lseq[layer] || (seq == lseq[layer] && pos == lpos[layer] + 1))) die("tokens out of order in ", path);
        lseq[layer] = seq, lpos[layer] = pos;
        if (!dt)
            for (i = qn; i < qn + 2 * kvn; i++) xb[i] = f2bf(xf[i]);
        for (h = 0; h < NKV; h++) {
            const uint16_t *k = xb + qn + (size_t)h * D, *v = k + kvn;
            const size_t o = (((size_t)layer * ntok_max + t) * NKV + h) * D;
            uint16_t y[3][MAXD];
            int i2;
            rotate(k, Rk + (size_t)layer * D * D, D, y[0]);
            memcpy(y[1], v, (size_t)D * 2);
            rotate(v, Rv + (size_t)layer * D * D, D, y[2]);
            for (kd = 0; kd < 3; kd++)
                for (i2 = 0; i2 < D; i2++) {
                    const uint16_t key = y[kd][i2] & 0x7fff; /* |y| key: bf16 bits without the sign */
                    if (key > 0x7f80) die("NaN in ", path);
                    keys[kd][o + i2] = key;
                }
        }
    }
    fclose(f);
    for (l = 1; l < NL; l++)
        if (nt[l] != nt[0]) die("layers with different token counts in ", path);
    ntok = nt[0] < ntok_max ? nt[0] : ntok_max, nrows = ntok * NKV, nwarps_l = nrows / LANES;
    if (nwarps_l == 0) die("fewer rows per layer than a warp in ", path);
    printf("capture %s: %llu records, %d layers, %lld tokens/layer used, %d kv heads, D %d -> %lld rows/layer, %lld "
           "warps/layer (%lld total)\n",
           path, (unsigned long long)nrec, NL, ntok, NKV, D, nrows, nwarps_l, nwarps_l * NL);
    printf("v13 = 2|2,2,2; v14 = 1|2,2,2 if m <= 8 else v13; v15 = 1|2,2,2 if m <= D/16 else v13 (p: 2^k-key brackets)\n");
    nm = m_values(D, ms);
    {
        double tot[3][MAXM][NV] = {{{0}}}, miss[3][MAXM][NV] = {{{0}}};
        const double nw = (double)(nwarps_l * NL);
        for (kd = 0; kd < 3; kd++)
            for (mi = 0; mi < nm; mi++)
                for (l = 0; l < NL; l++) {
                    long long w;
                    for (w = 0; w < nwarps_l; w++)
                        if (run_warp(keys[kd] + ((size_t)l * ntok_max * NKV + (size_t)w * LANES) * D, D, ms[mi], tot[kd][mi],
                                     miss[kd][mi], kn[kd], l * nwarps_l + w))
                            return 1;
                }
        printf("\nmean probes per warp\n");
        table_header("rows");
        for (kd = 0; kd < 3; kd++)
            for (mi = 0; mi < nm; mi++) table_row(kn[kd], ms[mi], tot[kd][mi], nw, 2);
        printf("\nfraction of warps whose first probe missed in >= 1 lane\n");
        table_header("rows");
        for (kd = 0; kd < 3; kd++)
            for (mi = 0; mi < nm; mi++) table_row(kn[kd], ms[mi], miss[kd][mi], nw, 3);
    }
    /* per-row max|y| / tau over every row */
    printf("\nper-row max|y|/tau (tau = m-th largest |y|): mean, p50, p90, p99, max; and frac rows with ratio >= 2, >= 4\n");
    {
        double *rt = malloc((size_t)NL * nrows * sizeof(double));
        uint16_t *s = malloc((size_t)D * 2);
        if (!rt || !s) die("out of memory", "");
        for (kd = 0; kd < 3; kd++)
            for (mi = 0; mi < nm; mi++) {
                const int m = ms[mi];
                long long n = 0, ge1 = 0, ge2 = 0, zero = 0, t;
                double sum = 0;
                for (l = 0; l < NL; l++)
                    for (t = 0; t < nrows; t++) {
                        double x;
                        memcpy(s, keys[kd] + ((size_t)l * ntok_max * NKV + (size_t)t) * D, (size_t)D * 2);
                        qsort(s, (size_t)D, 2, cmpu16);
                        if (s[D - m] == 0) {
                            zero++;
                            continue;
                        }
                        x = bf2f(s[D - 1]) / bf2f(s[D - m]); /* a float quotient */
                        rt[n++] = x, sum += x, ge1 += x >= 2, ge2 += x >= 4;
                    }
                if (!n) {
                    printf("%-10s m=%2d: every tau is 0\n", kn[kd], m);
                    continue;
                }
                qsort(rt, (size_t)n, sizeof(double), cmpd);
                printf("%-10s m=%2d: mean %.3f  p50 %.3f  p90 %.3f  p99 %.3f  max %.2f  | >=2x %.4f  >=4x %.4f%s\n", kn[kd], m,
                       sum / n, rt[n / 2], rt[(long long)(0.9 * n)], rt[(long long)(0.99 * n)], rt[n - 1], (double)ge1 / n,
                       (double)ge2 / n, zero ? " (zero-tau rows skipped)" : "");
            }
        free(rt), free(s);
    }
    for (kd = 0; kd < 3; kd++) free(keys[kd]);
    free(Rk), free(Rv), free(xb), free(xf), free(nt), free(lseq), free(lpos);
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: clip_search_model [--dim 64|128|256]... [--warps N]\n"
                    "       clip_search_model --capture FILE --rot-k K.safetensors --rot-v V.safetensors [--max-tokens N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *cap = NULL, *rk = NULL, *rv = NULL;
    long long max_tokens = 0;
    int dims[8], ndims = 0, warps = 4000, i;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage();
        if (!strcmp(a, "--capture")) cap = v;
        else if (!strcmp(a, "--rot-k")) rk = v;
        else if (!strcmp(a, "--rot-v")) rv = v;
        else if (!strcmp(a, "--max-tokens")) max_tokens = atoll(v);
        else if (!strcmp(a, "--warps")) warps = atoi(v);
        else if (!strcmp(a, "--dim") && ndims < 8) {
            dims[ndims] = atoi(v);
            if (dims[ndims] != 64 && dims[ndims] != 128 && dims[ndims] != 256) usage();
            ndims++;
        } else usage();
        i++;
    }
    if (cap || rk || rv) {
        if (!cap || !rk || !rv || ndims) usage();
        return capture(cap, rk, rv, max_tokens);
    }
    if (max_tokens || warps <= 0) usage();
    if (!ndims) dims[0] = 128, dims[1] = 64, ndims = 2;
    return synthetic(dims, ndims, warps);
}
