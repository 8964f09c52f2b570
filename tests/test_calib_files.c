/* tests/test_calib_files.c -- rotation files: the real RotationZoo .pt
   checkpoints in tests/data load and report their published facts; round
   trips through safetensors and .pt for head dims 64/128/256 and sparse layer
   ids; torch files with string keys, no eigenvalues or f64/bf16 storages;
   and every truncated, corrupted or hostile input fails cleanly with
   OSCAR_STATUS_FORMAT_ERROR and a sentence (never a crash: run this suite
   under ASan/UBSan to be sure, see docs/calibration.md). */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"
#include "calib_ref.h"

#define ZOO OSCAR_TEST_DATA_DIR "/rotationzoo/qwen3-4b-thinking-2507/"

static uint8_t *slurp(const char *path, size_t *size) {
    uint8_t *buf;
    TU_OK(NULL, oscar__read_file(NULL, "test", path, &buf, size));
    return buf;
}

static oscar_rotation_set_info info_of(const oscar_rotation_set *s) {
    oscar_rotation_set_info i;
    memset(&i, 0, sizeof i);
    TU_OK(NULL, oscar_rotation_set_query(s, &i));
    return i;
}

static void assert_same_set(const oscar_rotation_set *a, const oscar_rotation_set *b) {
    oscar_rotation_set_info x = info_of(a), y = info_of(b);
    size_t L, D;
    cr_assert(x.num_layers == y.num_layers && x.head_dim == y.head_dim, "shape %d/%d vs %d/%d", x.num_layers, x.head_dim,
              y.num_layers, y.head_dim);
    L = (size_t)x.num_layers, D = (size_t)x.head_dim;
    cr_assert(memcmp(x.layer_ids, y.layer_ids, L * 4) == 0, "layer ids");
    cr_assert(memcmp(x.rotations, y.rotations, L * D * D * 4) == 0, "rotations bit for bit");
    cr_assert((x.eigenvalues == NULL) == (y.eigenvalues == NULL));
    if (x.eigenvalues) cr_assert(memcmp(x.eigenvalues, y.eigenvalues, L * D * 4) == 0, "eigenvalues bit for bit");
    cr_assert_str_eq(x.objective, y.objective);
}

/* ---- the real checkpoints ------------------------------------------------------------- */
static void check_zoo(const char *file, const char *objective, float eig0_lo, float eig0_hi, float eig35_lo,
                      float eig35_hi) {
    oscar_rotation_set *s = NULL;
    oscar_rotation_set_info i;
    double worst = 0;
    int l, d;
    TU_OK(NULL, oscar_rotation_set_load(NULL, file, &s));
    i = info_of(s);
    cr_assert_eq(i.num_layers, 36);
    cr_assert_eq(i.head_dim, 128);
    cr_assert_str_eq(i.objective, objective);
    cr_assert(i.eigenvalues != NULL);
    for (l = 0; l < 36; l++) {
        cr_assert_eq(i.layer_ids[l], l);
        worst = fmax(worst, oscar__orthogonality_error(i.rotations + (size_t)l * 128 * 128, 128));
        for (d = 1; d < 128; d++) cr_assert(i.eigenvalues[l * 128 + d - 1] <= i.eigenvalues[l * 128 + d], "ascending");
    }
    cr_assert(worst < 1e-7, "max|RRᵀ-I| = %g (published: about 2.3e-8)", worst);
    cr_assert(fabsf(i.eigenvalues[0] - eig0_lo) < 1e-3f * fabsf(eig0_lo) + 1e-9f, "layer 0 min %g", i.eigenvalues[0]);
    cr_assert(fabsf(i.eigenvalues[127] - eig0_hi) < 1e-3f * eig0_hi, "layer 0 max %g", i.eigenvalues[127]);
    cr_assert(fabsf(i.eigenvalues[35 * 128] - eig35_lo) < 1e-3f * eig35_lo, "layer 35 min %g", i.eigenvalues[35 * 128]);
    cr_assert(fabsf(i.eigenvalues[35 * 128 + 127] - eig35_hi) < 1e-3f * eig35_hi);
    cr_log_info("%s: 36 layers, D = 128, %s, max|RRᵀ-I| = %.2e, layer 0 eigenvalues %.3g..%.4g", file, i.objective, worst,
                i.eigenvalues[0], i.eigenvalues[127]);
    oscar_rotation_set_destroy(s);
}

Test(calib_files, rotationzoo_k_checkpoint_facts) {
    check_zoo(ZOO "k_rotation_qqt_r_h_pbr.pt", "qqt_r_h_pbr", 1.978e-4f, 31.157f, 0.020293f, 133.02f);
}
Test(calib_files, rotationzoo_v_checkpoint_facts) {
    check_zoo(ZOO "v_rotation_sst_r_h_pbr.pt", "sst_r_h_pbr", 3.2796e-4f, 6.4228e-3f, 4.8271f, 63.252f);
}

Test(calib_files, rotationzoo_converts_to_safetensors_and_back) {
    char dir[256], st[320], pt[320];
    oscar_rotation_set *a, *b, *c;
    tu_tempdir(dir, sizeof dir, "calib");
    snprintf(st, sizeof st, "%s/k.safetensors", dir);
    snprintf(pt, sizeof pt, "%s/k_again.pt", dir);
    TU_OK(NULL, oscar_rotation_set_load(NULL, ZOO "k_rotation_qqt_r_h_pbr.pt", &a));
    TU_OK(NULL, oscar_rotation_set_save(NULL, a, st, OSCAR_ROTATION_FILE_DEFAULT));
    TU_OK(NULL, oscar_rotation_set_load(NULL, st, &b));
    assert_same_set(a, b);
    TU_OK(NULL, oscar_rotation_set_save(NULL, b, pt, OSCAR_ROTATION_FILE_DEFAULT));
    TU_OK(NULL, oscar_rotation_set_load(NULL, pt, &c));
    assert_same_set(a, c);
    {
        size_t n;
        uint8_t *bytes = slurp(pt, &n);
        cr_assert(n > 4 && memcmp(bytes, "PK\x03\x04", 4) == 0, "a .pt path gets a torch zip");
        free(bytes);
        bytes = slurp(st, &n);
        cr_assert(n > 9 && bytes[8] == '{', "a .safetensors path gets safetensors");
        free(bytes);
    }
    oscar_rotation_set_destroy(a), oscar_rotation_set_destroy(b), oscar_rotation_set_destroy(c);
    tu_rmtree(dir);
}

/* ---- round trips ----------------------------------------------------------------------- */
static oscar_rotation_set *random_set(tu_rng *r, int L, int D, const int32_t *ids, int with_eig, const char *objective) {
    oscar_rotation_set_desc d = {0};
    oscar_rotation_set *s;
    float *rot = (float *)tu_xmalloc(sizeof(float) * (size_t)L * D * D), *eig = (float *)tu_xmalloc(sizeof(float) * (size_t)L * D);
    double *U = cr_dalloc((size_t)D * D);
    int l, i;
    random_orthogonal(r, D, U);
    for (l = 0; l < L; l++) {
        for (i = 0; i < D * D; i++) rot[(size_t)l * D * D + i] = (float)U[(i + l * D) % (D * D)]; /* rows rotated */
        for (i = 0; i < D; i++) eig[(size_t)l * D + i] = (float)(0.001 * (i + 1) * (l + 1));
    }
    d.num_layers = L, d.head_dim = D, d.layer_ids = ids, d.rotations = rot, d.eigenvalues = with_eig ? eig : NULL;
    d.objective = objective;
    TU_OK(NULL, oscar_rotation_set_create(NULL, &d, &s));
    free(rot), free(eig), free(U);
    return s;
}

Test(calib_files, round_trips_any_head_dim_sparse_ids) {
    static const int dims[4] = {64, 128, 256, 8};
    int32_t sparse[8] = {3, 7, 11, 15, 19, 23, 27, 31};
    char dir[256], path[320];
    tu_rng r = tu_seed();
    int di, fmt, eig;
    tu_tempdir(dir, sizeof dir, "calib");
    for (di = 0; di < 4; di++)
        for (eig = 0; eig < 2; eig++)
            for (fmt = 1; fmt <= 2; fmt++) {
                oscar_rotation_set *a = random_set(&r, 8, dims[di], eig ? sparse : NULL, eig, "sst_r_h_pbr"), *b;
                oscar_rotation_set_info i;
                snprintf(path, sizeof path, "%s/r_%d_%d.%s", dir, dims[di], eig, fmt == 1 ? "safetensors" : "pt");
                TU_OK(NULL, oscar_rotation_set_save(NULL, a, path, (oscar_rotation_file_format)fmt));
                TU_OK(NULL, oscar_rotation_set_load(NULL, path, &b));
                assert_same_set(a, b);
                i = info_of(b);
                cr_assert_eq(i.layer_ids[1], eig ? 7 : 1);
                cr_assert_eq(oscar_rotation_set_find(b, eig ? 31 : 7), 7);
                oscar_rotation_set_destroy(a), oscar_rotation_set_destroy(b);
            }
    tu_rmtree(dir);
}

/* ---- torch files built by hand: what other published files look like ------------------ */
typedef struct torch_opts {
    int D, L;
    const int32_t *ids;
    int str_keys;     /* layer keys as strings ("3") */
    int no_eig;       /* no eigenvalues */
    int storage;      /* 0 FloatStorage, 1 DoubleStorage, 2 BFloat16Storage */
    int bad_layer_id; /* layer_id field differs from the key */
    int transposed;   /* rotation stored as a transposed view (stride (1, D)) */
} torch_opts;

/* A torch.save-like archive of layers with rotation R_l[i][j] = f(l, i, j). */
static uint8_t *build_torch(const torch_opts *o, size_t *size, const uint8_t *pickle_override, size_t override_len) {
    static const char *const storage_name[3] = {"FloatStorage", "DoubleStorage", "BFloat16Storage"};
    oscar__bytes pk = {0};
    oscar__zip_writer w;
    int l, i, j;
    char name[64];
    size_t es = o->storage == 1 ? 8 : o->storage == 2 ? 2 : 4;
    int64_t shape2[2] = {o->D, o->D}, stride2[2] = {o->D, 1}, shape1[1] = {o->D}, stride1[1] = {1};
    uint8_t *out;
    memset(&w, 0, sizeof w);
    if (o->transposed) stride2[0] = 1, stride2[1] = o->D;
    oscar__bytes_u8(&pk, 0x80), oscar__bytes_u8(&pk, 2), oscar__bytes_u8(&pk, '}'), oscar__bytes_u8(&pk, '(');
    oscar__pk_str(&pk, "objective"), oscar__pk_str(&pk, "qqt_r_h_pbr");
    oscar__pk_str(&pk, "layers"), oscar__bytes_u8(&pk, '}'), oscar__bytes_u8(&pk, '(');
    for (l = 0; l < o->L; l++) {
        char key[16];
        snprintf(key, sizeof key, "%d", o->ids[l]);
        if (o->str_keys)
            oscar__pk_str(&pk, key);
        else
            oscar__pk_int(&pk, o->ids[l]);
        oscar__bytes_u8(&pk, '}'), oscar__bytes_u8(&pk, '(');
        oscar__pk_str(&pk, "layer_id"), oscar__pk_int(&pk, o->ids[l] + (o->bad_layer_id && l == 1));
        oscar__pk_str(&pk, "rotation");
        oscar__pk_tensor(&pk, 2 * l, storage_name[o->storage], shape2, stride2, 2, (int64_t)o->D * o->D);
        if (!o->no_eig) {
            oscar__pk_str(&pk, "eigenvalues");
            oscar__pk_tensor(&pk, 2 * l + 1, storage_name[o->storage], shape1, stride1, 1, o->D);
        }
        oscar__bytes_u8(&pk, 'u');
    }
    oscar__bytes_u8(&pk, 'u'), oscar__bytes_u8(&pk, 'u'), oscar__bytes_u8(&pk, '.');
    if (pickle_override)
        oscar__zip_add(&w, "archive/data.pkl", pickle_override, override_len);
    else
        oscar__zip_add(&w, "archive/data.pkl", pk.p, pk.n);
    oscar__zip_add(&w, "archive/byteorder", "little", 6);
    for (l = 0; l < o->L; l++) {
        uint8_t *buf = (uint8_t *)tu_xmalloc((size_t)o->D * o->D * es);
        for (i = 0; i < o->D; i++)
            for (j = 0; j < o->D; j++) {
                double v = (l + 1) * 1000.0 + i + j / 1024.0; /* exact in bf16? no: checked per storage below */
                size_t at = ((size_t)i * o->D + j) * es;
                if (o->storage == 1)
                    memcpy(buf + at, &v, 8);
                else if (o->storage == 2) {
                    uint16_t h = oscar__f32_to_bf16((float)v);
                    memcpy(buf + at, &h, 2);
                } else {
                    float f = (float)v;
                    memcpy(buf + at, &f, 4);
                }
            }
        snprintf(name, sizeof name, "archive/data/%d", 2 * l);
        oscar__zip_add(&w, name, buf, (size_t)o->D * o->D * es);
        for (i = 0; i < o->D; i++) {
            double v = 0.5 * i + l;
            size_t at = (size_t)i * es;
            if (o->storage == 1)
                memcpy(buf + at, &v, 8);
            else if (o->storage == 2) {
                uint16_t h = oscar__f32_to_bf16((float)v);
                memcpy(buf + at, &h, 2);
            } else {
                float f = (float)v;
                memcpy(buf + at, &f, 4);
            }
        }
        snprintf(name, sizeof name, "archive/data/%d", 2 * l + 1);
        if (!o->no_eig) oscar__zip_add(&w, name, buf, (size_t)o->D * es);
        free(buf);
    }
    oscar__zip_add(&w, "archive/version", "3\n", 2);
    oscar__zip_finish(&w);
    cr_assert(!w.out.oom && !pk.oom);
    out = (uint8_t *)tu_xmalloc(w.out.n);
    memcpy(out, w.out.p, w.out.n);
    *size = w.out.n;
    oscar__bytes_free(&pk), oscar__bytes_free(&w.out), oscar__bytes_free(&w.cdir);
    return out;
}

static float expected_rot(const torch_opts *o, int l, int i, int j) {
    int si = o->transposed ? j : i, sj = o->transposed ? i : j; /* a transposed view reads element (j, i) */
    double v = (l + 1) * 1000.0 + si + sj / 1024.0;
    if (o->storage == 2) return oscar__bf16_to_f32(oscar__f32_to_bf16((float)v));
    return (float)v;
}

Test(calib_files, torch_files_as_other_models_publish_them) {
    static const int32_t ids[8] = {31, 3, 27, 7, 11, 23, 15, 19}; /* sparse, out of order in the dict */
    torch_opts cases[5];
    int ci;
    memset(cases, 0, sizeof cases);
    cases[0].D = 256, cases[0].L = 8, cases[0].ids = ids;                           /* Qwen3.5 hybrid: D = 256 */
    cases[1].D = 64, cases[1].L = 3, cases[1].ids = ids, cases[1].str_keys = 1;    /* string keys */
    cases[2].D = 32, cases[2].L = 2, cases[2].ids = ids, cases[2].no_eig = 1;      /* no eigenvalues */
    cases[3].D = 16, cases[3].L = 4, cases[3].ids = ids, cases[3].storage = 1;     /* float64 storages */
    cases[4].D = 16, cases[4].L = 4, cases[4].ids = ids, cases[4].storage = 2, cases[4].transposed = 1;
    for (ci = 0; ci < 5; ci++) {
        const torch_opts *o = &cases[ci];
        size_t n;
        uint8_t *bytes = build_torch(o, &n, NULL, 0);
        oscar_rotation_set *s = NULL;
        oscar_rotation_set_info i;
        int l, a, b;
        TU_OK(NULL, oscar_rotation_set_load_memory(NULL, bytes, n, &s));
        i = info_of(s);
        cr_assert(i.num_layers == o->L && i.head_dim == o->D, "case %d", ci);
        cr_assert((i.eigenvalues == NULL) == (o->no_eig != 0));
        for (l = 0; l < o->L; l++) {
            int src = 0;
            cr_assert(l == 0 || i.layer_ids[l] > i.layer_ids[l - 1], "sorted ids");
            while (ids[src] != i.layer_ids[l]) src++;
            for (a = 0; a < o->D; a++)
                for (b = 0; b < o->D; b += 5)
                    cr_assert_eq(i.rotations[((size_t)l * o->D + a) * o->D + b], expected_rot(o, src, a, b),
                                 "case %d layer %d (%d,%d)", ci, i.layer_ids[l], a, b);
        }
        oscar_rotation_set_destroy(s);
        free(bytes);
    }
}

/* ---- hostile inputs ----------------------------------------------------------------------- */
static void expect_format_error(const uint8_t *bytes, size_t n, const char *needle, const char *what) {
    oscar_rotation_set *s = (oscar_rotation_set *)(uintptr_t)1;
    oscar_status st = oscar_rotation_set_load_memory(NULL, bytes, n, &s);
    cr_assert_eq(st, OSCAR_STATUS_FORMAT_ERROR, "%s: status %s", what, oscar_status_string(st));
    cr_assert(s == NULL, "%s: no set on failure", what);
    cr_assert(strlen(oscar_last_error(NULL)) > 10, "%s: a sentence", what);
    if (needle) cr_assert(strstr(oscar_last_error(NULL), needle) != NULL, "%s: %s", what, oscar_last_error(NULL));
}

/* A damaged file either fails with FORMAT_ERROR and a sentence, or (damage in
   bytes no reader uses: zip padding, records oscar does not read) loads the
   identical data. */
static int load_or_clean_error(const uint8_t *bytes, size_t n, const oscar_rotation_set *orig) {
    oscar_rotation_set *s = NULL;
    oscar_status st = oscar_rotation_set_load_memory(NULL, bytes, n, &s);
    if (st == OSCAR_OK) {
        if (orig) assert_same_set(orig, s);
        oscar_rotation_set_destroy(s);
        return 1;
    }
    cr_assert_eq(st, OSCAR_STATUS_FORMAT_ERROR, "status %s: %s", oscar_status_string(st), oscar_last_error(NULL));
    cr_assert(strlen(oscar_last_error(NULL)) > 10);
    return 0;
}

Test(calib_files, truncated_rotationzoo_files_fail_cleanly, .timeout = 600) {
    static const char *files[2] = {ZOO "k_rotation_qqt_r_h_pbr.pt", ZOO "v_rotation_sst_r_h_pbr.pt"};
    tu_rng r = tu_seed();
    int f, k;
    for (f = 0; f < 2; f++) {
        size_t n, len;
        uint8_t *bytes = slurp(files[f], &n);
        int tried = 0;
        for (len = 0; len < 300; len++, tried++) expect_format_error(bytes, len, NULL, "short prefix");
        for (len = n - 300; len < n; len++, tried++) expect_format_error(bytes, len, NULL, "missing tail");
        for (k = 0; k < 300; k++, tried++) {
            char what[64];
            len = (size_t)tu_int(&r, (int64_t)n);
            snprintf(what, sizeof what, "truncated to %zu of %zu bytes", len, n);
            expect_format_error(bytes, len, NULL, what);
        }
        cr_log_info("%s: %d truncations, all FORMAT_ERROR", files[f], tried);
        free(bytes);
    }
}

Test(calib_files, corrupted_rotationzoo_files_fail_cleanly, .timeout = 600) {
    tu_rng r = tu_seed();
    size_t n, i;
    uint8_t *bytes = slurp(ZOO "v_rotation_sst_r_h_pbr.pt", &n), *copy = (uint8_t *)tu_xmalloc(n);
    oscar_rotation_set *orig;
    int k, loaded = 0, failed = 0;
    TU_OK(NULL, oscar_rotation_set_load_memory(NULL, bytes, n, &orig));
    /* single-byte damage: the pickle, the first storages, the central directory and the end records, then anywhere */
    for (k = 0; k < 1200; k++) {
        size_t at = k < 200 ? (size_t)tu_int(&r, 5600) : k < 400 ? n - 1 - (size_t)tu_int(&r, 6000) : (size_t)tu_int(&r, (int64_t)n);
        memcpy(copy, bytes, n);
        copy[at] ^= (uint8_t)(1 + tu_int(&r, 255));
        if (load_or_clean_error(copy, n, orig))
            loaded++;
        else
            failed++;
    }
    /* bursts of garbage */
    for (k = 0; k < 100; k++) {
        size_t at = (size_t)tu_int(&r, (int64_t)n), len = 1 + (size_t)tu_int(&r, 64);
        memcpy(copy, bytes, n);
        for (i = at; i < at + len && i < n; i++) copy[i] = (uint8_t)tu_next(&r);
        if (load_or_clean_error(copy, n, orig))
            loaded++;
        else
            failed++;
    }
    cr_log_info("1300 damaged copies: %d failed cleanly, %d loaded identical data (damage in unused bytes)", failed, loaded);
    cr_assert(failed > 1000);
    oscar_rotation_set_destroy(orig);
    free(bytes), free(copy);
}

/* Damaged pickles inside a well-formed zip (CRC recomputed), so the pickle
   machine itself sees every kind of garbage. */
Test(calib_files, damaged_pickles_fail_cleanly, .timeout = 600) {
    static const int32_t ids[3] = {0, 5, 9};
    torch_opts o;
    oscar__zip zip;
    tu_rng r = tu_seed();
    size_t n, pn, i;
    uint8_t *good, *pk;
    const uint8_t *pdata;
    int k, ok = 0;
    memset(&o, 0, sizeof o);
    o.D = 8, o.L = 3, o.ids = ids;
    good = build_torch(&o, &n, NULL, 0);
    TU_OK(NULL, oscar__zip_open(NULL, "t", good, n, &zip));
    TU_OK(NULL, oscar__zip_data(&zip, "t", &zip.entries[0], &pdata));
    pn = (size_t)zip.entries[0].size;
    pk = (uint8_t *)tu_xmalloc(pn);
    for (k = 0; k < 4000; k++) {
        size_t zn, flips = 1 + (size_t)tu_int(&r, 3);
        uint8_t *z;
        memcpy(pk, pdata, pn);
        for (i = 0; i < flips; i++) pk[tu_int(&r, (int64_t)pn)] = (uint8_t)tu_next(&r);
        z = build_torch(&o, &zn, pk, k % 10 == 9 ? (size_t)tu_int(&r, (int64_t)pn) : pn); /* some also truncated */
        ok += load_or_clean_error(z, zn, NULL);
        free(z);
    }
    cr_log_info("4000 damaged pickles: %d still described a valid rotation set, the rest failed cleanly", ok);
    oscar__zip_close(&zip);
    free(pk), free(good);
}

Test(calib_files, hostile_and_malformed_inputs) {
    static const int32_t ids[3] = {0, 5, 9};
    torch_opts o;
    size_t n;
    uint8_t *bytes;
    tu_rng r = tu_seed();
    int k;
    memset(&o, 0, sizeof o);
    o.D = 8, o.L = 3, o.ids = ids;

    /* a pickle that would run os.system under pickle.load: recognised, not executed */
    {
        static const uint8_t evil[] = "\x80\x02" "cos\nsystem\n" "X\x02\x00\x00\x00ls" "\x85" "R.";
        bytes = build_torch(&o, &n, evil, sizeof evil - 1);
        expect_format_error(bytes, n, "not executed", "os.system");
        free(bytes);
    }
    /* layer_id field differs from the key */
    o.bad_layer_id = 1;
    bytes = build_torch(&o, &n, NULL, 0);
    expect_format_error(bytes, n, "layer_id differs", "layer_id");
    free(bytes);
    o.bad_layer_id = 0;
    /* two entries for one layer id */
    {
        static const int32_t dup[3] = {0, 5, 5};
        o.ids = dup;
        bytes = build_torch(&o, &n, NULL, 0);
        expect_format_error(bytes, n, "appears twice", "duplicate layer");
        free(bytes);
        o.ids = ids;
    }
    /* legacy torch.save and plain junk */
    expect_format_error((const uint8_t *)"\x80\x02\x8a\x0a", 4, "legacy", "legacy torch");
    expect_format_error((const uint8_t *)"hello world, not a file", 23, "neither", "junk");
    expect_format_error((const uint8_t *)"", 0, NULL, "empty");
    /* safetensors: offsets outside, sizes that do not match, overflowing shapes, bad JSON, huge header */
    {
        static const char *headers[] = {
            "{\"rotations\":{\"dtype\":\"F32\",\"shape\":[1,2,2],\"data_offsets\":[0,1600]}}",
            "{\"rotations\":{\"dtype\":\"F32\",\"shape\":[1,2,2],\"data_offsets\":[0,12]}}",
            "{\"rotations\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776,2],\"data_offsets\":[0,16]}}",
            "{\"rotations\":{\"dtype\":\"F32\",\"shape\":[1,2,2],\"data_offsets\":[0,16]}",
            "{\"rotations\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}",
            "{\"rotations\":{\"dtype\":\"Q99\",\"shape\":[1,2,2],\"data_offsets\":[0,16]}}",
            "{\"rotations\":{\"dtype\":\"F32\",\"shape\":[-1,2,2],\"data_offsets\":[0,16]}}",
            "{\"other\":{\"dtype\":\"F32\",\"shape\":[1,2,2],\"data_offsets\":[0,16]}}",
            "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]",
            "{\"rotations\":{\"dtype\":\"F32\",\"shape\":[1,2,2],\"data_offsets\":[0,16]},\"rotations\\u0000x\":1}",
            "{\"a\":\"\\q\"}",
            "{\"a\":tru}",
        };
        for (k = 0; k < (int)(sizeof headers / sizeof headers[0]); k++) {
            size_t h = strlen(headers[k]);
            uint8_t *f = (uint8_t *)tu_xmalloc(8 + h + 16);
            char what[32];
            oscar__put_u64(f, h);
            memcpy(f + 8, headers[k], h);
            memset(f + 8 + h, 0, 16);
            snprintf(what, sizeof what, "safetensors header %d", k);
            expect_format_error(f, 8 + h + 16, NULL, what);
            free(f);
        }
        {
            uint8_t f[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
            expect_format_error(f, sizeof f, "header length", "huge header length");
        }
    }
    /* random garbage with each format's magic */
    for (k = 0; k < 3000; k++) {
        size_t len = (size_t)tu_int(&r, 400), i;
        uint8_t *f = (uint8_t *)tu_xmalloc(len + 16);
        for (i = 0; i < len + 16; i++) f[i] = (uint8_t)tu_next(&r);
        if (k % 3 == 0 && len >= 4) memcpy(f, "PK\x03\x04", 4);
        if (k % 3 == 1 && len >= 9) oscar__put_u64(f, len - 8), f[8] = '{';
        if (k % 3 == 2 && len >= 22) memcpy(f + len - 22, "PK\x05\x06", 4);
        load_or_clean_error(f, len, NULL);
        free(f);
    }
    /* files that are not there */
    {
        oscar_rotation_set *s;
        cr_assert_eq(oscar_rotation_set_load(NULL, "/nonexistent/dir/rot.pt", &s), OSCAR_STATUS_IO_ERROR);
        cr_assert(strstr(oscar_last_error(NULL), "/nonexistent/dir/rot.pt") != NULL, "%s", oscar_last_error(NULL));
        cr_assert_eq(oscar_rotation_set_load(NULL, "/", &s), OSCAR_STATUS_IO_ERROR);
    }
}

/* The pickle machine on the real data.pkl with damage, directly (fast). */
Test(calib_files, pickle_machine_fuzz_on_the_real_pickle, .timeout = 600) {
    oscar__zip zip;
    const uint8_t *pdata;
    size_t n, pn;
    uint8_t *bytes = slurp(ZOO "k_rotation_qqt_r_h_pbr.pt", &n), *pk;
    tu_rng r = tu_seed();
    int k, ran = 0;
    TU_OK(NULL, oscar__zip_open(NULL, "t", bytes, n, &zip));
    TU_OK(NULL, oscar__zip_data(&zip, "t", &zip.entries[0], &pdata));
    pn = (size_t)zip.entries[0].size;
    pk = (uint8_t *)tu_xmalloc(pn);
    for (k = 0; k < 20000; k++) {
        oscar__pickle p;
        size_t len = k % 7 == 0 ? (size_t)tu_int(&r, (int64_t)pn) : pn;
        oscar_status st;
        memcpy(pk, pdata, pn);
        pk[tu_int(&r, (int64_t)pn)] = (uint8_t)tu_next(&r);
        if (k % 2) pk[tu_int(&r, (int64_t)pn)] = (uint8_t)tu_next(&r);
        memset(&p, 0, sizeof p);
        st = oscar__pickle_run(&p, "fuzz", pk, len);
        cr_assert(st == OSCAR_OK || st == OSCAR_STATUS_FORMAT_ERROR, "status %s", oscar_status_string(st));
        ran += st == OSCAR_OK;
        oscar__pickle_free(&p);
    }
    cr_log_info("20000 damaged real pickles: %d still parsed, the rest failed cleanly", ran);
    oscar__zip_close(&zip);
    free(pk), free(bytes);
}

Test(calib_files, save_is_atomic_and_validates) {
    char dir[256], path[320], cmd[600];
    tu_rng r = tu_seed();
    oscar_rotation_set *a = random_set(&r, 2, 16, NULL, 1, "x\"y\\z");
    oscar_rotation_set *b;
    tu_tempdir(dir, sizeof dir, "calib");
    snprintf(path, sizeof path, "%s/out.safetensors", dir);
    TU_OK(NULL, oscar_rotation_set_save(NULL, a, path, OSCAR_ROTATION_FILE_DEFAULT));
    TU_OK(NULL, oscar_rotation_set_save(NULL, a, path, OSCAR_ROTATION_FILE_DEFAULT)); /* replaces */
    TU_OK(NULL, oscar_rotation_set_load(NULL, path, &b));
    assert_same_set(a, b); /* the objective's quote and backslash survive JSON escaping */
    snprintf(cmd, sizeof cmd, "test $(ls '%s' | wc -l) -eq 1", dir);
    cr_assert(system(cmd) == 0, "no temporary file left behind");
    snprintf(path, sizeof path, "%s/no/such/dir/out.pt", dir);
    cr_assert_eq(oscar_rotation_set_save(NULL, a, path, OSCAR_ROTATION_FILE_DEFAULT), OSCAR_STATUS_IO_ERROR);
    cr_assert_eq(oscar_rotation_set_save(NULL, a, path, (oscar_rotation_file_format)7), OSCAR_STATUS_INVALID_ARGUMENT);
    oscar_rotation_set_destroy(a), oscar_rotation_set_destroy(b);
    tu_rmtree(dir);
}
