/* llm_common.c — see llm_common.h. */
#define _POSIX_C_SOURCE 200809L
#include "llm_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

char *read_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap + 1);
    while (buf && (r = fread(buf + n, 1, cap - n, fp)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf && ferror(fp)) { free(buf); buf = NULL; }
    fclose(fp);
    if (!buf) return NULL;
    buf[n] = 0;
    *len = n;
    return buf;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int llm_open(llm *L, const char *path, int32_t max_batch, char *err, size_t errlen) {
    memset(L, 0, sizeof *L);
    if (gguf_open(&L->file, path, err, errlen) != 0) return -1;
    L->tok = tokenizer_load(&L->file, err, errlen);
    if (L->tok) L->model = model_load(&L->file, max_batch, err, errlen);
    if (!L->tok || !L->model) { llm_close(L); return -1; }
    return 0;
}

void llm_close(llm *L) {
    model_free(L->model);
    tokenizer_free(L->tok);
    gguf_close(&L->file);
    memset(L, 0, sizeof *L);
}

static int parse_int(const char *s, int32_t *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < -1 || v > (1 << 24)) return -1;
    *out = (int32_t)v;
    return 0;
}

static int parse_ratio(const char *s, float *out) {
    char *end;
    float v = strtof(s, &end);
    if (*s == 0 || *end != 0 || !(v >= 0.0f && v <= 1.0f)) return -1;
    *out = v;
    return 0;
}

int kv_parse_option(kv_options *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    int rc;
    if (!strcmp(a, "--kv")) rc = v && (!strcmp(v, "bf16") || !strcmp(v, "f32") || !strcmp(v, "int2") ||
                                      !strcmp(v, "int2-had")) ? (o->kind = v, 0) : -1;
    else if (!strcmp(a, "--sink")) rc = v ? parse_int(v, &o->sim.sink_tokens) : -1;
    else if (!strcmp(a, "--recent")) rc = v ? parse_int(v, &o->sim.recent_tokens) : -1;
    else if (!strcmp(a, "--demote")) rc = v ? parse_int(v, &o->sim.demote_interval) : -1;
    else if (!strcmp(a, "--group")) rc = v ? parse_int(v, &o->int2.group_size) : -1;
    else if (!strcmp(a, "--clip-k")) rc = v ? parse_ratio(v, &o->int2.k_clip_ratio) : -1;
    else if (!strcmp(a, "--clip-v")) rc = v ? parse_ratio(v, &o->int2.v_clip_ratio) : -1;
    else return 0;
    if (rc != 0) {
        fprintf(stderr, "bad value for %s: %s\n", a, v ? v : "(missing)");
        return -1;
    }
    (*i)++;
    return 1;
}

const char *kv_options_usage(void) {
    return "  --kv bf16|f32|int2|int2-had  KV cache (default bf16: dense, rows rounded to bf16)\n"
           "  --sink N --recent N           bf16 windows of the int2 caches (default 64, 256; -1 = none)\n"
           "  --demote N                    demote N tokens at a time (default 8)\n"
           "  --group N                     int2 group size along head_dim (default head_dim)\n"
           "  --clip-k R --clip-v R         int2 clip ratios in [0,1] (default 0 = off)\n";
}

kv_backend *kv_create(const kv_options *o, kv_shape shape) {
    const char *k = o->kind ? o->kind : "bf16";
    if (!strcmp(k, "bf16") || !strcmp(k, "f32")) return kv_backend_dense_create(shape, !strcmp(k, "bf16"));
    static qdq_int2_desc q; /* outlives the backend: one backend at a time in these tools */
    q = o->int2;
    q.hadamard = !strcmp(k, "int2-had");
    kv_sim_desc s = o->sim;
    s.qdq = qdq_int2;
    s.qdq_user = &q;
    return kv_backend_sim_create(shape, &s);
}

void kv_describe(const kv_options *o, char *buf, size_t n) {
    const char *k = o->kind ? o->kind : "bf16";
    char group[32] = "head_dim";
    if (!strcmp(k, "bf16") || !strcmp(k, "f32")) { snprintf(buf, n, "%s", k); return; }
    if (o->int2.group_size > 0) snprintf(group, sizeof group, "%d", o->int2.group_size);
#define DEF(v, d) ((v) == 0 ? (d) : (v) < 0 ? 0 : (v))
    snprintf(buf, n, "%s sink=%d recent=%d demote=%d group=%s clip_k=%.2f clip_v=%.2f", k,
             DEF(o->sim.sink_tokens, 64), DEF(o->sim.recent_tokens, 256),
             o->sim.demote_interval > 0 ? o->sim.demote_interval : 8, group, o->int2.k_clip_ratio,
             o->int2.v_clip_ratio);
#undef DEF
}
