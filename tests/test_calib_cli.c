/* tests/test_calib_cli.c -- the `oscar` tool end to end: `oscar calibrate`
   on dumps in the OSCAR reference's layout (layer_<id>/{q,k,v}/<chunk>.*,
   mixing .npy f32/f16 and torch .pt bf16 chunks, with a warm-up chunk) and
   on safetensors dumps gives bit for bit the rotations of the library API on
   the same data; `oscar rotations inspect|convert|hadamard` report and write
   what they should; bad input fails with a message and a non-zero status. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"
#include "calib_ref.h"

#include <sys/stat.h>

enum { D = 32, HQ = 4, HKV = 2 };
static const int32_t layer_ids[2] = {2, 9};
static const int chunk_tokens[3] = {6, 100, 57}; /* chunk 0 is the warm-up */

typedef struct dump {
    act_buf t[2][3][3]; /* [layer][chunk][q,k,v] as f32 values */
} dump;

static void make_dump(tu_rng *r, dump *d) {
    int l, c, k;
    size_t i;
    for (l = 0; l < 2; l++)
        for (c = 0; c < 3; c++)
            for (k = 0; k < 3; k++) {
                size_t n = (size_t)chunk_tokens[c] * (k ? HKV : HQ) * D;
                act_buf *a = &d->t[l][c][k];
                *a = act_alloc(n, OSCAR_DTYPE_F32);
                for (i = 0; i < n; i++) {
                    /* values exact in bf16 and f16, so every file format carries them unchanged */
                    double x = (double)oscar__bf16_to_f32(oscar__f32_to_bf16((float)(tu_normal(r) * (i % D == 5 ? 8 : 1))));
                    x = oscar__f16_to_f32(oscar__f32_to_f16((float)x));
                    act_set(a, i, c == 0 ? x * 100 : x);
                }
            }
}

static void free_dump(dump *d) {
    int l, c, k;
    for (l = 0; l < 2; l++)
        for (c = 0; c < 3; c++)
            for (k = 0; k < 3; k++) act_free(&d->t[l][c][k]);
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(data, 1, n, f) == n, "write %s", path);
    fclose(f);
}

/* .npy, descr <f4 or <f2 */
static void write_npy(const char *path, const act_buf *a, int heads, int tokens, int f16) {
    char header[128];
    int len = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%d, %d, %d), }",
                       f16 ? "<f2" : "<f4", tokens, heads, D);
    size_t total = 10 + (size_t)len + 1, pad = (64 - total % 64) % 64, n = a->count, i;
    uint8_t *b = (uint8_t *)tu_xmalloc(total + pad + n * 4);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (uint8_t)((len + 1 + pad) & 255), b[9] = (uint8_t)((len + 1 + pad) >> 8);
    memcpy(b + 10, header, (size_t)len);
    memset(b + 10 + len, ' ', pad);
    b[total + pad - 1] = '\n';
    for (i = 0; i < n; i++) {
        float f = ((const float *)a->data)[i];
        if (f16) {
            uint16_t h = oscar__f32_to_f16(f);
            memcpy(b + total + pad + 2 * i, &h, 2);
        } else
            memcpy(b + total + pad + 4 * i, &f, 4);
    }
    write_file(path, b, total + pad + n * (f16 ? 2 : 4));
    free(b);
}

/* torch.save(tensor) of a bf16 [tokens, heads, D] tensor */
static void write_pt(const char *path, const act_buf *a, int heads, int tokens) {
    oscar__bytes pk = {0};
    oscar__zip_writer w;
    uint16_t *bf = (uint16_t *)tu_xmalloc(a->count * 2);
    size_t i;
    memset(&w, 0, sizeof w);
    for (i = 0; i < a->count; i++) bf[i] = oscar__f32_to_bf16(((const float *)a->data)[i]);
    oscar__bytes_u8(&pk, 0x80), oscar__bytes_u8(&pk, 2);
    {
        int64_t shape[3];
        shape[0] = tokens, shape[1] = heads, shape[2] = D;
        oscar__pk_tensor(&pk, 0, "BFloat16Storage", shape, NULL, 3, (int64_t)a->count);
    }
    oscar__bytes_u8(&pk, '.');
    oscar__zip_add(&w, "chunk/data.pkl", pk.p, pk.n);
    oscar__zip_add(&w, "chunk/data/0", bf, a->count * 2);
    oscar__zip_add(&w, "chunk/version", "3\n", 2);
    oscar__zip_finish(&w);
    write_file(path, w.out.p, w.out.n);
    oscar__bytes_free(&pk), oscar__bytes_free(&w.out), oscar__bytes_free(&w.cdir);
    free(bf);
}

/* The same data through the API, chunk by chunk. */
static void api_calibrate(const dump *d, int first_chunk, int skip, oscar_rotation_set **k, oscar_rotation_set **v) {
    oscar_desc od = {0};
    oscar_ctx *ctx;
    oscar_calib_desc cd = {0};
    oscar_calib_finish_desc fd = {0};
    oscar_calib *c;
    int pass, l, ch;
    od.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&od, &ctx));
    cd.num_layers = 2, cd.layer_ids = layer_ids, cd.head_dim = D, cd.num_q_heads = HQ, cd.num_kv_heads = HKV;
    cd.skip_first_chunks = skip;
    TU_OK(ctx, oscar_calib_create(ctx, &cd, &c));
    for (pass = 0; pass < 2; pass++) {
        for (l = 0; l < 2; l++)
            for (ch = first_chunk; ch < 3; ch++) {
                oscar_calib_batch_desc b = {0};
                b.layer_id = layer_ids[l], b.num_tokens = chunk_tokens[ch], b.dtype = OSCAR_DTYPE_F32;
                b.q = d->t[l][ch][0].data, b.k = d->t[l][ch][1].data, b.v = d->t[l][ch][2].data;
                TU_OK(ctx, oscar_calib_accumulate(c, &b, NULL));
            }
        if (pass == 0) TU_OK(ctx, oscar_calib_begin_score_pass(c, NULL));
    }
    TU_OK(ctx, oscar_calib_finish(c, &fd, k, v, NULL));
    oscar_calib_destroy(c);
    oscar_shutdown(ctx);
}

static void assert_same(const oscar_rotation_set *a, const oscar_rotation_set *b) {
    oscar_rotation_set_info x, y;
    oscar_rotation_set_query(a, &x), oscar_rotation_set_query(b, &y);
    cr_assert(x.num_layers == y.num_layers && x.head_dim == y.head_dim);
    cr_assert(memcmp(x.layer_ids, y.layer_ids, 4 * (size_t)x.num_layers) == 0);
    cr_assert(memcmp(x.rotations, y.rotations, 4 * (size_t)x.num_layers * D * D) == 0, "rotations bit for bit");
    cr_assert(memcmp(x.eigenvalues, y.eigenvalues, 4 * (size_t)x.num_layers * D) == 0);
    cr_assert_str_eq(x.objective, y.objective);
}

static int run(const char *cmd, char *out, size_t cap) {
    char full[4096];
    FILE *p;
    size_t n = 0;
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    p = popen(full, "r");
    cr_assert(p != NULL);
    while (n + 1 < cap && fgets(out + n, (int)(cap - n), p)) n += strlen(out + n);
    out[n] = 0;
    return WEXITSTATUS(pclose(p));
}


Test(calib_cli, calibrate_reference_dump_layout, .timeout = 300) {
    char dir[256], path[512], cmd[2048], out[8192];
    dump d;
    tu_rng r = tu_seed();
    oscar_rotation_set *ak, *av, *ck, *cv;
    int l, c, k, rc;
    calib_need_lapack();
    make_dump(&r, &d);
    tu_tempdir(dir, sizeof dir, "cli");
    for (l = 0; l < 2; l++)
        for (k = 0; k < 3; k++) {
            snprintf(path, sizeof path, "%s/dump/layer_%d/%c", dir, layer_ids[l], "qkv"[k]);
            snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
            cr_assert(system(cmd) == 0);
            for (c = 0; c < 3; c++) {
                char file[700];
                int heads = k ? HKV : HQ;
                if (l == 0) { /* .npy: q and v float32, k float16 */
                    snprintf(file, sizeof file, "%s/%d.npy", path, c);
                    write_npy(file, &d.t[l][c][k], heads, chunk_tokens[c], k == 1);
                } else { /* torch.save'd bf16 tensors, as the reference's dump hook writes them */
                    snprintf(file, sizeof file, "%s/%d.pt", path, c);
                    write_pt(file, &d.t[l][c][k], heads, chunk_tokens[c]);
                }
            }
        }
    snprintf(cmd, sizeof cmd,
             "'%s' calibrate --backend cpu --skip-first-chunks 1 --out-k '%s/k.safetensors' --out-v '%s/v.pt' '%s/dump'",
             OSCAR_CLI_PATH, dir, dir, dir);
    rc = run(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "%s\n%s", cmd, out);
    cr_assert(strstr(out, "calibrating 2 layers (ids 2, 9), head dim 32, 4 query / 2 KV heads, 6 chunks") != NULL, "%s", out);
    snprintf(path, sizeof path, "%s/k.safetensors", dir);
    TU_OK(NULL, oscar_rotation_set_load(NULL, path, &ck));
    snprintf(path, sizeof path, "%s/v.pt", dir);
    TU_OK(NULL, oscar_rotation_set_load(NULL, path, &cv));
    api_calibrate(&d, 1, 0, &ak, &av);
    assert_same(ak, ck);
    assert_same(av, cv);
    oscar_rotation_set_destroy(ak), oscar_rotation_set_destroy(av);
    oscar_rotation_set_destroy(ck), oscar_rotation_set_destroy(cv);
    /* inspect the result */
    snprintf(cmd, sizeof cmd, "'%s' rotations inspect '%s/v.pt' --layers", OSCAR_CLI_PATH, dir);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "objective:     sst_r_h_pbr") && strstr(out, "layers:        2 (ids 2, 9)") &&
                  strstr(out, "head dim:      32") && strstr(out, "ascending in every layer"),
              "%s", out);
    free_dump(&d);
    tu_rmtree(dir);
}

Test(calib_cli, calibrate_safetensors_dumps, .timeout = 300) {
    char dir[256], path[512], cmd[2048], out[8192];
    dump d;
    tu_rng r = tu_seed();
    oscar_rotation_set *ak, *av, *ck, *cv;
    int l, c, k;
    calib_need_lapack();
    make_dump(&r, &d);
    tu_tempdir(dir, sizeof dir, "cli");
    for (c = 1; c < 3; c++) { /* one file per chunk, tensors layers.<id>.{q,k,v} */
        oscar__st_out t[6];
        oscar__bytes b = {0};
        char names[6][32];
        int n = 0;
        for (l = 0; l < 2; l++)
            for (k = 0; k < 3; k++, n++) {
                snprintf(names[n], sizeof names[n], "layers.%d.%c", layer_ids[l], "qkv"[k]);
                memset(&t[n], 0, sizeof t[n]);
                t[n].name = names[n], t[n].dtype = "F32", t[n].ndim = 3;
                t[n].shape[0] = chunk_tokens[c], t[n].shape[1] = k ? HKV : HQ, t[n].shape[2] = D;
                t[n].data = d.t[l][c][k].data, t[n].nbytes = d.t[l][c][k].count * 4;
            }
        oscar__st_write(&b, t, 6, NULL, 0);
        snprintf(path, sizeof path, "%s/chunk%d.safetensors", dir, c);
        write_file(path, b.p, b.n);
        oscar__bytes_free(&b);
    }
    snprintf(cmd, sizeof cmd,
             "'%s' calibrate --backend cpu --out-k '%s/k.pt' --out-v '%s/v.safetensors' '%s/chunk1.safetensors' "
             "'%s/chunk2.safetensors'",
             OSCAR_CLI_PATH, dir, dir, dir, dir);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s\n%s", cmd, out);
    snprintf(path, sizeof path, "%s/k.pt", dir);
    TU_OK(NULL, oscar_rotation_set_load(NULL, path, &ck));
    snprintf(path, sizeof path, "%s/v.safetensors", dir);
    TU_OK(NULL, oscar_rotation_set_load(NULL, path, &cv));
    api_calibrate(&d, 1, 0, &ak, &av);
    assert_same(ak, ck);
    assert_same(av, cv);
    oscar_rotation_set_destroy(ak), oscar_rotation_set_destroy(av);
    oscar_rotation_set_destroy(ck), oscar_rotation_set_destroy(cv);
    free_dump(&d);
    tu_rmtree(dir);
}

Test(calib_cli, rotations_inspect_convert_hadamard) {
    char dir[256], cmd[2048], out[16384], path[512];
    oscar_rotation_set *a, *b;
    tu_tempdir(dir, sizeof dir, "cli");
    snprintf(cmd, sizeof cmd, "'%s' rotations inspect '%s/rotationzoo/qwen3-4b-thinking-2507/k_rotation_qqt_r_h_pbr.pt'",
             OSCAR_CLI_PATH, OSCAR_TEST_DATA_DIR);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "format:        torch.save zip (.pt)") && strstr(out, "objective:     qqt_r_h_pbr") &&
                  strstr(out, "layers:        36 (ids 0-35)") && strstr(out, "head dim:      128") &&
                  strstr(out, "orthogonality: max |R·Rᵀ − I| = 2.9") && strstr(out, "ascending in every layer"),
              "%s", out);
    snprintf(cmd, sizeof cmd,
             "'%s' rotations convert '%s/rotationzoo/qwen3-4b-thinking-2507/v_rotation_sst_r_h_pbr.pt' '%s/v.safetensors'",
             OSCAR_CLI_PATH, OSCAR_TEST_DATA_DIR, dir);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(path, sizeof path, "%s/rotationzoo/qwen3-4b-thinking-2507/v_rotation_sst_r_h_pbr.pt", OSCAR_TEST_DATA_DIR);
    TU_OK(NULL, oscar_rotation_set_load(NULL, path, &a));
    snprintf(path, sizeof path, "%s/v.safetensors", dir);
    TU_OK(NULL, oscar_rotation_set_load(NULL, path, &b));
    {
        oscar_rotation_set_info x, y;
        oscar_rotation_set_query(a, &x), oscar_rotation_set_query(b, &y);
        cr_assert(memcmp(x.rotations, y.rotations, 4 * 36 * 128 * 128) == 0);
    }
    oscar_rotation_set_destroy(a), oscar_rotation_set_destroy(b);
    snprintf(cmd, sizeof cmd, "'%s' rotations hadamard --head-dim 256 --layer-ids 3,7,11,15 -o '%s/h.pt' && '%s' rotations inspect '%s/h.pt' --layers",
             OSCAR_CLI_PATH, dir, OSCAR_CLI_PATH, dir);
    cr_assert_eq(run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "layers:        4 (ids 3, 7, 11, 15)") && strstr(out, "head dim:      256") &&
                  strstr(out, "eigenvalues:   none stored") && strstr(out, "objective:     hadamard"),
              "%s", out);
    /* failures: a message and a non-zero status */
    snprintf(cmd, sizeof cmd, "'%s' rotations inspect /nonexistent.pt", OSCAR_CLI_PATH);
    cr_assert_neq(run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "/nonexistent.pt") != NULL, "%s", out);
    snprintf(cmd, sizeof cmd, "'%s' calibrate --out-k x.safetensors --frobnicate '%s'", OSCAR_CLI_PATH, dir);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    snprintf(cmd, sizeof cmd, "'%s' calibrate --out-k '%s/k.safetensors' '%s'", OSCAR_CLI_PATH, dir, dir);
    cr_assert_neq(run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "no layer_<id>/q/<chunk> files") != NULL, "%s", out);
    snprintf(cmd, sizeof cmd, "'%s' frobnicate", OSCAR_CLI_PATH);
    cr_assert_eq(run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "oscar calibrate") != NULL, "the usage lists the subcommands: %s", out);
    tu_rmtree(dir);
}
