/* llm_oscar_util.c — see llm_oscar_util.h. */
#define _POSIX_C_SOURCE 200809L
#include "llm_oscar_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

oscar_ctx *llm_oscar_setup(oscar_backend backend, char *err, size_t errlen) {
    oscar_desc d = {0};
    oscar_ctx *ctx = NULL;
    d.backend = backend;
    oscar_status st = oscar_setup(&d, &ctx);
    if (st != OSCAR_OK) {
        snprintf(err, errlen, "oscar_setup(%s): %s: %s", backend == OSCAR_BACKEND_CPU ? "CPU" : "CUDA",
                 oscar_status_string(st), oscar_last_error(NULL));
        return NULL;
    }
    return ctx;
}

static float *set_to_array(oscar_rotation_set *set, int32_t num_layers, int32_t head_dim, const char *what, char *err,
                           size_t errlen) {
    oscar_rotation_set_info info;
    if (oscar_rotation_set_query(set, &info) != OSCAR_OK) {
        snprintf(err, errlen, "%s: cannot query the rotation set", what);
        return NULL;
    }
    if (info.head_dim != head_dim) {
        snprintf(err, errlen, "%s: head_dim %d; the model has %d", what, info.head_dim, head_dim);
        return NULL;
    }
    const size_t DD = (size_t)head_dim * (size_t)head_dim;
    float *out = malloc(sizeof(float) * DD * (size_t)num_layers);
    if (!out) { snprintf(err, errlen, "out of memory"); return NULL; }
    for (int32_t l = 0; l < num_layers; l++) {
        int32_t i = oscar_rotation_set_find(set, l);
        if (i < 0) {
            snprintf(err, errlen, "%s: no rotation for layer %d (the set has %d layers)", what, l, info.num_layers);
            free(out);
            return NULL;
        }
        memcpy(out + (size_t)l * DD, info.rotations + (size_t)i * DD, sizeof(float) * DD);
    }
    return out;
}

float *llm_load_rotations(const char *path, int32_t num_layers, int32_t head_dim, char *err, size_t errlen) {
    oscar_rotation_set *set = NULL;
    oscar_status st = oscar_rotation_set_load(NULL, path, &set);
    if (st != OSCAR_OK) {
        snprintf(err, errlen, "%s: %s", path, oscar_last_error(NULL));
        return NULL;
    }
    float *r = set_to_array(set, num_layers, head_dim, path, err, errlen);
    oscar_rotation_set_destroy(set);
    return r;
}

float *llm_hadamard_rotations(int32_t num_layers, int32_t head_dim, char *err, size_t errlen) {
    oscar_rotation_set *set = NULL;
    oscar_status st = oscar_rotation_set_hadamard(NULL, head_dim, num_layers, NULL, &set);
    if (st != OSCAR_OK) {
        snprintf(err, errlen, "oscar_rotation_set_hadamard: %s", oscar_last_error(NULL));
        return NULL;
    }
    float *r = set_to_array(set, num_layers, head_dim, "hadamard", err, errlen);
    oscar_rotation_set_destroy(set);
    return r;
}

int llm_save_rotations(const char *path, const float *rot, const float *eig, int32_t num_layers, int32_t head_dim,
                       const char *objective, char *err, size_t errlen) {
    oscar_rotation_set_desc d = {0};
    oscar_rotation_set *set = NULL;
    d.num_layers = num_layers;
    d.head_dim = head_dim;
    d.rotations = rot;
    d.eigenvalues = eig;
    d.objective = objective;
    oscar_status st = oscar_rotation_set_create(NULL, &d, &set);
    if (st == OSCAR_OK) st = oscar_rotation_set_save(NULL, set, path, OSCAR_ROTATION_FILE_SAFETENSORS);
    oscar_rotation_set_destroy(set);
    if (st != OSCAR_OK) {
        snprintf(err, errlen, "%s: %s", path, oscar_last_error(NULL));
        return -1;
    }
    return 0;
}

void llm_rotation_covariance(const float *R, const float *eig, int32_t D, double *C, double *U_out) {
    int32_t bits = 0, perm[256], inv[256];
    double *U = U_out ? U_out : malloc(sizeof(double) * (size_t)D * D);
    if (!U) return;
    while ((1 << bits) < D) bits++;
    for (int32_t i = 0; i < D; i++) {
        int32_t r = 0;
        for (int32_t b = 0; b < bits; b++) r |= ((i >> b) & 1) << (bits - 1 - b);
        perm[r] = D - 1 - i; /* sorted descending = ascending index D-1-i */
    }
    for (int32_t j = 0; j < D; j++) inv[perm[j]] = j;
    for (int32_t a = 0; a < D; a++) {
        double row[256];
        for (int32_t c = 0; c < D; c++) row[c] = R[(size_t)a * D + inv[c]];
        /* row · H, H the normalised Sylvester Hadamard (symmetric, H·H = I) */
        for (int32_t len = 1; len < D; len <<= 1)
            for (int32_t i = 0; i < D; i += 2 * len)
                for (int32_t j = i; j < i + len; j++) {
                    const double x = row[j], y = row[j + len];
                    row[j] = x + y, row[j + len] = x - y;
                }
        for (int32_t c = 0; c < D; c++) U[(size_t)a * D + c] = row[c] / sqrt((double)D);
    }
    for (int32_t a = 0; a < D; a++)
        for (int32_t b = 0; b < D; b++) {
            double s = 0;
            for (int32_t k = 0; k < D; k++) s += U[(size_t)a * D + k] * eig[k] * U[(size_t)b * D + k];
            C[(size_t)a * D + b] = s;
        }
    if (!U_out) free(U);
}

int llm_tokenize_file(const llm *L, const char *path, int32_t **ids, size_t *n_ids, size_t *n_bytes) {
    size_t len;
    char *text = read_file(path, &len);
    if (!text) return -1;
    int rc = tokenizer_encode(L->tok, text, len, 0, ids, n_ids);
    free(text);
    if (n_bytes) *n_bytes = len;
    return rc;
}

void llm_run_date(char *buf, size_t n) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void llm_run_commit(char *buf, size_t n) {
    const char *e = getenv("OSCAR_COMMIT");
    if (e && *e) { snprintf(buf, n, "%s", e); return; }
    snprintf(buf, n, "unknown");
    FILE *p = popen("git rev-parse --short HEAD 2>/dev/null", "r");
    if (!p) return;
    char line[64] = {0};
    if (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0]) snprintf(buf, n, "%s", line);
    }
    pclose(p);
}

void llm_run_command(int argc, char **argv, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < argc && used + 1 < n; i++) {
        int w = snprintf(buf + used, n - used, "%s%s", i ? " " : "", argv[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
}

double llm_log_prob(const float *logits, int32_t n, int32_t target) {
    float mx = logits[0];
    for (int32_t i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double s = 0.0;
    for (int32_t i = 0; i < n; i++) s += exp((double)logits[i] - mx);
    return (double)logits[target] - mx - log(s);
}

int32_t llm_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}
