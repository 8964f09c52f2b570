/* capture.c — see capture.h. */
#include "capture.h"

#include <string.h>

#include "quant.h"

int qkv_capture_open(qkv_capture *c, const char *path, int32_t num_layers, int32_t num_heads,
                     int32_t num_kv_heads, int32_t head_dim, int dtype) {
    uint8_t hdr[64] = {0};
    uint32_t u[5] = {(uint32_t)num_layers, (uint32_t)num_heads, (uint32_t)num_kv_heads,
                     (uint32_t)head_dim, (uint32_t)dtype};
    memset(c, 0, sizeof *c);
    c->fp = fopen(path, "wb");
    if (!c->fp) return -1;
    c->num_layers = num_layers;
    c->num_heads = num_heads;
    c->num_kv_heads = num_kv_heads;
    c->head_dim = head_dim;
    c->dtype = dtype;
    memcpy(hdr, "QKVCAP1", 8);
    memcpy(hdr + 8, u, sizeof u);
    if (fwrite(hdr, 1, sizeof hdr, c->fp) != sizeof hdr) c->failed = 1;
    return 0;
}

static void put(qkv_capture *c, const float *x, int32_t n) {
    if (c->dtype == 1) {
        uint16_t b[512];
        for (int32_t i = 0; i < n; i += 512) {
            int32_t m = n - i < 512 ? n - i : 512;
            for (int32_t j = 0; j < m; j++) b[j] = f32_to_bf16(x[i + j]);
            if (fwrite(b, 2, (size_t)m, c->fp) != (size_t)m) c->failed = 1;
        }
    } else if (fwrite(x, 4, (size_t)n, c->fp) != (size_t)n) {
        c->failed = 1;
    }
}

void qkv_capture_write(void *user, int32_t layer, int64_t pos, const float *q, const float *k,
                       const float *v) {
    qkv_capture *c = user;
    uint8_t rec[16];
    uint32_t l = (uint32_t)layer;
    if (!c->fp || c->failed || (c->max_pos > 0 && pos >= c->max_pos)) return;
    memcpy(rec, &l, 4);
    memcpy(rec + 4, &c->seq, 4);
    memcpy(rec + 8, &pos, 8);
    if (fwrite(rec, 1, sizeof rec, c->fp) != sizeof rec) c->failed = 1;
    put(c, q, c->num_heads * c->head_dim);
    put(c, k, c->num_kv_heads * c->head_dim);
    put(c, v, c->num_kv_heads * c->head_dim);
    c->num_records++;
}

int qkv_capture_close(qkv_capture *c) {
    if (!c->fp) return -1;
    if (fseek(c->fp, 40, SEEK_SET) != 0 || fwrite(&c->num_records, 8, 1, c->fp) != 1) c->failed = 1;
    if (fclose(c->fp) != 0) c->failed = 1;
    c->fp = NULL;
    return c->failed ? -1 : 0;
}
