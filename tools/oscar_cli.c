/* tools/oscar_cli.c -- the `oscar` command-line tool.

       oscar calibrate [options] DUMP...         fit K/V rotations from activation dumps
       oscar rotations inspect FILE [--layers]   layers, head dim, orthogonality, eigenvalues
       oscar rotations convert IN OUT            .pt <-> .safetensors
       oscar rotations hadamard ...              the data-free Hadamard rotation file
       oscar kernels list [TEXT...]              the kernel instantiations (names containing TEXT)
       oscar kernels resources [--sm N] TEXT...  registers, spills, stack and shared memory of
                                                 those instantiations (NVRTC + ptxas; no GPU)
       oscar kernels cubin --out DIR [--sm N] TEXT...
                                                 their cubins as NVRTC builds them (for nvdisasm)

   Subcommands live in one table (`commands` below); add one with a
   function `int cmd_x(int argc, char **argv)` (argv[0] is its name) and a row.
   The tool is built with the oscar.h implementation in this file, so it may
   use the library's internal file readers (npy, safetensors, torch). */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cli_command {
    const char *name;
    const char *args;
    const char *summary;
    int (*run)(int argc, char **argv);
} cli_command;

static void die_status(oscar_ctx *ctx, oscar_status st, const char *what) {
    fprintf(stderr, "oscar: %s: %s: %s\n", what, oscar_status_string(st), oscar_last_error(ctx));
    exit(1);
}
#define CLI_OK(ctx, call, what)                                                                                       \
    do {                                                                                                               \
        oscar_status cli_st_ = (call);                                                                                 \
        if (cli_st_ != OSCAR_OK) die_status((ctx), cli_st_, (what));                                                   \
    } while (0)

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "oscar: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static const char *format_of(const uint8_t *b, size_t n) {
    if (n >= 4 && b[0] == 'P' && b[1] == 'K') return "torch.save zip (.pt)";
    if (n >= 9 && b[8] == '{') return "safetensors";
    return "unknown";
}

/* "0-35" or "3, 7, 11, 15 (4 layers)" */
static void print_ids(const int32_t *ids, int32_t n) {
    int32_t i, dense = 1;
    for (i = 1; i < n; i++) dense &= ids[i] == ids[i - 1] + 1;
    if (dense && n > 1) {
        printf("%d-%d", ids[0], ids[n - 1]);
        return;
    }
    for (i = 0; i < n && i < 24; i++) printf("%s%d", i ? ", " : "", ids[i]);
    if (n > 24) printf(", ... %d", ids[n - 1]);
}

/* ---- rotations inspect / convert / hadamard ------------------------------------------- */
static int inspect_set(const char *label, const oscar_rotation_set *s, const char *format, int per_layer) {
    oscar_rotation_set_info i;
    int32_t l, d, D, worst_l = 0, ascending = 1;
    double worst = 0, emin = INFINITY, emax = -INFINITY;
    oscar_rotation_set_query(s, &i);
    D = i.head_dim;
    printf("%s\n", label);
    if (format) printf("  format:        %s\n", format);
    printf("  objective:     %s\n", i.objective[0] ? i.objective : "(none)");
    printf("  layers:        %d (ids ", i.num_layers);
    print_ids(i.layer_ids, i.num_layers);
    printf(")\n  head dim:      %d\n", D);
    if (per_layer) printf("  %6s  %12s  %12s  %12s  %s\n", "layer", "max|RRt-I|", "eig min", "eig max", "ascending");
    for (l = 0; l < i.num_layers; l++) {
        double e = oscar__orthogonality_error(i.rotations + (size_t)l * D * D, D), lo = 0, hi = 0;
        int asc = 1;
        if (e > worst) worst = e, worst_l = l;
        if (i.eigenvalues) {
            const float *ev = i.eigenvalues + (size_t)l * D;
            lo = hi = ev[0];
            for (d = 1; d < D; d++) {
                asc &= ev[d - 1] <= ev[d];
                lo = fmin(lo, ev[d]);
                hi = fmax(hi, ev[d]);
            }
            ascending &= asc;
            emin = fmin(emin, lo);
            emax = fmax(emax, hi);
        }
        if (per_layer) {
            if (i.eigenvalues)
                printf("  %6d  %12.3e  %12.5g  %12.5g  %s\n", i.layer_ids[l], e, lo, hi, asc ? "yes" : "NO");
            else
                printf("  %6d  %12.3e  %12s  %12s\n", i.layer_ids[l], e, "-", "-");
        }
    }
    printf("  orthogonality: max |R·Rᵀ − I| = %.3e (worst: layer %d)%s\n", worst, i.layer_ids[worst_l],
           worst > 1e-5 ? "  WARNING: not orthogonal to fp32 precision" : "");
    if (i.eigenvalues)
        printf("  eigenvalues:   %.5g .. %.5g over all layers, %s\n", emin, emax,
               ascending ? "ascending in every layer" : "NOT ascending in some layer");
    else
        printf("  eigenvalues:   none stored\n");
    return worst > 1e-3;
}

static int cmd_rotations_inspect(int argc, char **argv) {
    int i, per_layer = 0, rc = 0;
    const char *path = NULL;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--layers") == 0)
            per_layer = 1;
        else if (!path && argv[i][0] != '-')
            path = argv[i];
        else {
            fprintf(stderr, "usage: oscar rotations inspect FILE [--layers]\n");
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: oscar rotations inspect FILE [--layers]\n");
        return 2;
    }
    {
        uint8_t *buf;
        size_t n;
        oscar_rotation_set *s;
        CLI_OK(NULL, oscar__read_file(NULL, "oscar rotations inspect", path, &buf, &n), "read");
        CLI_OK(NULL, oscar_rotation_set_load_memory(NULL, buf, n, &s), path);
        rc = inspect_set(path, s, format_of(buf, n), per_layer);
        oscar_rotation_set_destroy(s);
        free(buf);
    }
    return rc;
}

static int cmd_rotations_convert(int argc, char **argv) {
    oscar_rotation_set *s;
    if (argc != 3) {
        fprintf(stderr, "usage: oscar rotations convert IN OUT   (OUT: .pt/.pth = torch zip, else safetensors)\n");
        return 2;
    }
    CLI_OK(NULL, oscar_rotation_set_load(NULL, argv[1], &s), argv[1]);
    CLI_OK(NULL, oscar_rotation_set_save(NULL, s, argv[2], OSCAR_ROTATION_FILE_DEFAULT), argv[2]);
    printf("wrote %s\n", argv[2]);
    oscar_rotation_set_destroy(s);
    return 0;
}

/* "3,7,11" -> ids; returns the count */
static int32_t parse_ids(const char *s, int32_t **out) {
    int32_t n = 1, i = 0;
    const char *p;
    char *end;
    for (p = s; *p; p++) n += *p == ',';
    *out = (int32_t *)xmalloc(sizeof(int32_t) * (size_t)n);
    for (p = s; i < n; i++) {
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "oscar: bad layer id list \"%s\"\n", s);
            exit(2);
        }
        (*out)[i] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

static int cmd_rotations_hadamard(int argc, char **argv) {
    int i;
    int32_t D = 0, L = 0, *ids = NULL;
    const char *out = NULL;
    oscar_rotation_set *s;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--head-dim") == 0 && i + 1 < argc)
            D = atoi(argv[++i]);
        else if (strcmp(argv[i], "--layers") == 0 && i + 1 < argc)
            L = atoi(argv[++i]);
        else if (strcmp(argv[i], "--layer-ids") == 0 && i + 1 < argc)
            L = parse_ids(argv[++i], &ids);
        else if ((strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--out") == 0) && i + 1 < argc)
            out = argv[++i];
        else {
            out = NULL;
            break;
        }
    }
    if (!out || D <= 0 || L <= 0) {
        fprintf(stderr, "usage: oscar rotations hadamard --head-dim D (--layers N | --layer-ids 3,7,11) -o FILE\n");
        free(ids);
        return 2;
    }
    CLI_OK(NULL, oscar_rotation_set_hadamard(NULL, D, L, ids, &s), "hadamard");
    CLI_OK(NULL, oscar_rotation_set_save(NULL, s, out, OSCAR_ROTATION_FILE_DEFAULT), out);
    printf("wrote %s: %d layers of the %d×%d normalised Sylvester Hadamard\n", out, L, D, D);
    oscar_rotation_set_destroy(s);
    free(ids);
    return 0;
}

static const cli_command rotation_commands[] = {
    {"inspect", "FILE [--layers]", "layers, head dim, orthogonality error, eigenvalue ranges", cmd_rotations_inspect},
    {"convert", "IN OUT", "convert between .pt (torch zip) and .safetensors", cmd_rotations_convert},
    {"hadamard", "--head-dim D (--layers N | --layer-ids a,b) -o FILE", "the data-free Hadamard rotation (QuaRot-style)",
     cmd_rotations_hadamard},
};

static int dispatch(const cli_command *table, int n, const char *prefix, int argc, char **argv) {
    int i;
    if (argc >= 1)
        for (i = 0; i < n; i++)
            if (strcmp(argv[0], table[i].name) == 0) return table[i].run(argc, argv);
    fprintf(stderr, "usage:\n");
    for (i = 0; i < n; i++) fprintf(stderr, "  %s %s %s\n      %s\n", prefix, table[i].name, table[i].args, table[i].summary);
    return argc >= 1 && (strcmp(argv[0], "help") == 0 || strcmp(argv[0], "--help") == 0) ? 0 : 2;
}

static int cmd_rotations(int argc, char **argv) {
    return dispatch(rotation_commands, (int)(sizeof rotation_commands / sizeof rotation_commands[0]), "oscar rotations",
                    argc - 1, argv + 1);
}

/* ---- calibrate ---------------------------------------------------------------------------- */
typedef struct tensor_src {
    char *path;
    char *name; /* tensor name inside a safetensors file, NULL for .npy/.pt */
} tensor_src;

typedef struct chunk {
    int32_t layer;
    tensor_src src[3]; /* q, k, v */
    long long order;   /* chunk order within the layer */
} chunk;

typedef struct chunk_list {
    chunk *c;
    int n, cap;
} chunk_list;

static void add_chunk(chunk_list *l, const chunk *c) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->c = (chunk *)realloc(l->c, sizeof(chunk) * (size_t)l->cap);
        if (!l->c) exit(1);
    }
    l->c[l->n++] = *c;
}

static char *dup_str(const char *s) {
    char *p = (char *)xmalloc(strlen(s) + 1);
    strcpy(p, s);
    return p;
}

static int has_ext(const char *name, const char *ext) {
    size_t n = strlen(name), e = strlen(ext);
    return n > e && strcmp(name + n - e, ext) == 0;
}

/* A leading integer of a chunk file name ("12.pt" -> 12), else -1. */
static long long chunk_number(const char *name) {
    char *end;
    long long v = strtoll(name, &end, 10);
    return end != name && *end == '.' ? v : -1;
}

static int cmp_names(const void *a, const void *b) {
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    long long nx = chunk_number(x), ny = chunk_number(y);
    if (nx >= 0 && ny >= 0 && nx != ny) return nx < ny ? -1 : 1;
    return strcmp(x, y);
}

/* Sorted tensor files (.npy, .safetensors, .pt) of a folder; NULL if none. */
static char **list_chunks(const char *dir, int *count) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL;
    int n = 0, cap = 0;
    *count = 0;
    if (!d) return NULL;
    while ((e = readdir(d)) != NULL) {
        if (!(has_ext(e->d_name, ".npy") || has_ext(e->d_name, ".safetensors") || has_ext(e->d_name, ".pt"))) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = (char **)realloc(names, sizeof(char *) * (size_t)cap);
            if (!names) exit(1);
        }
        names[n++] = dup_str(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, (size_t)n, sizeof(char *), cmp_names);
    *count = n;
    return names;
}

/* layer_<id>/{q,k,v}/<chunk>.<ext>: the OSCAR reference's dump layout. */
static void scan_dump_dir(const char *dir, chunk_list *out, int need_kv) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    if (!d) {
        fprintf(stderr, "oscar: cannot open %s\n", dir);
        exit(1);
    }
    while ((e = readdir(d)) != NULL) {
        char *end, sub[3][4096];
        char **names[3];
        int counts[3], k, i;
        long id;
        if (strncmp(e->d_name, "layer_", 6) != 0) continue;
        id = strtol(e->d_name + 6, &end, 10);
        if (end == e->d_name + 6 || *end || id < 0 || id > INT32_MAX) continue;
        for (k = 0; k < 3; k++) {
            snprintf(sub[k], sizeof sub[k], "%s/%s/%c", dir, e->d_name, "qkv"[k]);
            names[k] = list_chunks(sub[k], &counts[k]);
        }
        if (!names[0] || (need_kv && (counts[1] != counts[0] || counts[2] != counts[0]))) {
            fprintf(stderr, "oscar: %s/%s: expected q/%s chunk files with matching names (found q %d, k %d, v %d)\n", dir,
                    e->d_name, need_kv ? ", k/ and v/" : "", counts[0], counts[1], counts[2]);
            exit(1);
        }
        for (i = 0; i < counts[0]; i++) {
            chunk c;
            char path[8300];
            memset(&c, 0, sizeof c);
            c.layer = (int32_t)id;
            c.order = i;
            for (k = 0; k < 3; k++) {
                if (!names[k] || i >= counts[k]) continue;
                if (k && strcmp(names[k][i], names[0][i]) != 0 && need_kv) {
                    fprintf(stderr, "oscar: %s: chunk %s has no match in %s (found %s)\n", sub[0], names[0][i], sub[k],
                            names[k][i]);
                    exit(1);
                }
                snprintf(path, sizeof path, "%s/%s", sub[k], names[k][i]);
                c.src[k].path = dup_str(path);
            }
            add_chunk(out, &c);
            found++;
        }
        for (k = 0; k < 3; k++) {
            for (i = 0; i < counts[k]; i++) free(names[k][i]);
            free(names[k]);
        }
    }
    closedir(d);
    if (!found) {
        fprintf(stderr, "oscar: %s holds no layer_<id>/q/<chunk> files\n", dir);
        exit(1);
    }
}

/* A safetensors file with layer_<id>.{q,k,v} / layers.<id>.{q,k,v} / layer_<id>/{q,k,v}: one chunk per layer. */
static void scan_safetensors(const char *path, long long order, chunk_list *out) {
    uint8_t *buf;
    size_t n;
    oscar__safetensors st;
    int32_t i, found = 0;
    CLI_OK(NULL, oscar__read_file(NULL, "oscar calibrate", path, &buf, &n), path);
    CLI_OK(NULL, oscar__st_open(NULL, "oscar calibrate", buf, n, &st), path);
    for (i = 0; i < st.count; i++) {
        const char *nm = st.tensors[i].name, *p;
        char *end, sep;
        long id;
        if (strncmp(nm, "layer_", 6) == 0)
            p = nm + 6;
        else if (strncmp(nm, "layers.", 7) == 0)
            p = nm + 7;
        else
            continue;
        id = strtol(p, &end, 10);
        if (end == p || id < 0 || id > INT32_MAX) continue;
        sep = *end;
        if ((sep != '.' && sep != '/') || strcmp(end + 1, "q") != 0) continue;
        {
            chunk c;
            char kname[300];
            int k;
            memset(&c, 0, sizeof c);
            c.layer = (int32_t)id;
            c.order = order;
            for (k = 0; k < 3; k++) {
                snprintf(kname, sizeof kname, "%.*s%c", (int)(end - nm + 1), nm, "qkv"[k]);
                if (k && !oscar__st_find(&st, kname)) continue;
                c.src[k].path = dup_str(path);
                c.src[k].name = dup_str(kname);
            }
            add_chunk(out, &c);
            found++;
        }
    }
    oscar__st_close(&st);
    free(buf);
    if (!found) {
        fprintf(stderr, "oscar: %s holds no layer_<id>.q / layers.<id>.q tensors\n", path);
        exit(1);
    }
}

static int cmp_chunks(const void *a, const void *b) {
    const chunk *x = (const chunk *)a, *y = (const chunk *)b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* A loaded tensor as the accumulator wants it: [tokens][heads][D], D contiguous, bf16/f16/f32. */
typedef struct loaded {
    uint8_t *file;   /* whole file */
    void *converted; /* f32 copy when the view is not directly usable */
    const void *data;
    oscar_dtype dtype;
    int64_t tokens, heads, dim, token_stride, head_stride;
} loaded;

static void load_tensor(const tensor_src *s, int64_t head_dim_hint, int64_t heads_hint, loaded *out) {
    size_t n;
    oscar__tensor t;
    oscar__safetensors st;
    oscar__torch_file tf;
    int64_t tokens, heads, dim, ts, hs, i;
    size_t es;
    memset(out, 0, sizeof *out);
    CLI_OK(NULL, oscar__read_file(NULL, "oscar calibrate", s->path, &out->file, &n), s->path);
    if (s->name) {
        const oscar__st_tensor *x;
        CLI_OK(NULL, oscar__st_open(NULL, "oscar calibrate", out->file, n, &st), s->path);
        x = oscar__st_find(&st, s->name);
        if (!x) {
            fprintf(stderr, "oscar: %s: no tensor %s\n", s->path, s->name);
            exit(1);
        }
        t = x->t;
        oscar__st_close(&st);
    } else if (has_ext(s->path, ".npy")) {
        CLI_OK(NULL, oscar__npy_open(NULL, "oscar calibrate", out->file, n, &t), s->path);
    } else if (has_ext(s->path, ".safetensors")) {
        CLI_OK(NULL, oscar__st_open(NULL, "oscar calibrate", out->file, n, &st), s->path);
        if (st.count != 1) {
            fprintf(stderr, "oscar: %s: expected one tensor per chunk file, found %d\n", s->path, st.count);
            exit(1);
        }
        t = st.tensors[0].t;
        oscar__st_close(&st);
    } else {
        CLI_OK(NULL, oscar__torch_open(NULL, "oscar calibrate", out->file, n, &tf), s->path);
        CLI_OK(NULL, oscar__torch_tensor(&tf, "oscar calibrate", tf.pk.root, "the saved object", &t), s->path);
        oscar__torch_close(&tf);
    }
    if (t.ndim == 3) {
        tokens = t.shape[0], heads = t.shape[1], dim = t.shape[2];
        ts = t.stride[0], hs = t.stride[1];
    } else if (t.ndim == 2 && head_dim_hint > 0 && t.shape[1] % head_dim_hint == 0) {
        tokens = t.shape[0], dim = head_dim_hint, heads = t.shape[1] / head_dim_hint;
        ts = t.stride[0], hs = head_dim_hint * t.stride[1];
    } else {
        char shape[96];
        oscar__shape_str(&t, shape, sizeof shape);
        fprintf(stderr, "oscar: %s%s%s: shape %s; expected [tokens, heads, head_dim] (or [tokens, heads*head_dim] with --head-dim)\n",
                s->path, s->name ? ":" : "", s->name ? s->name : "", shape);
        exit(1);
    }
    if (heads_hint > 0 && heads != heads_hint) {
        fprintf(stderr, "oscar: %s%s%s has %lld heads; earlier chunks had %lld\n", s->path, s->name ? ":" : "",
                s->name ? s->name : "", (long long)heads, (long long)heads_hint);
        exit(1);
    }
    es = oscar__el_size(t.el);
    out->tokens = tokens, out->heads = heads, out->dim = dim;
    if ((t.el == OSCAR__EL_BF16 || t.el == OSCAR__EL_F16 || t.el == OSCAR__EL_F32) &&
        (t.ndim == 3 ? t.stride[2] : t.stride[1]) == 1 && ((uintptr_t)(t.base + (size_t)t.offset * es)) % es == 0) {
        out->data = t.base + (size_t)t.offset * es;
        out->dtype = t.el == OSCAR__EL_BF16 ? OSCAR_DTYPE_BF16 : t.el == OSCAR__EL_F16 ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_F32;
        out->token_stride = ts, out->head_stride = hs;
        return;
    }
    if (!oscar__el_is_float(t.el)) {
        fprintf(stderr, "oscar: %s: element type %s is not a float type\n", s->path, oscar__el_name(t.el));
        exit(1);
    }
    /* f64, or a layout with strided head_dim: a contiguous f32 copy */
    {
        float *f = (float *)xmalloc(sizeof(float) * (size_t)(tokens * heads * dim));
        int64_t numel = tokens * heads * dim;
        oscar__tensor v = t;
        if (t.ndim == 2) { /* view [tokens, heads*dim] as [tokens, heads, dim] */
            v.ndim = 3;
            v.shape[0] = tokens, v.shape[1] = heads, v.shape[2] = dim;
            v.stride[0] = t.stride[0], v.stride[1] = dim * t.stride[1], v.stride[2] = t.stride[1];
        }
        for (i = 0; i < numel; i++) f[i] = (float)oscar__tensor_at(&v, i);
        out->converted = f;
        out->data = f;
        out->dtype = OSCAR_DTYPE_F32;
        out->token_stride = heads * dim, out->head_stride = dim;
    }
}
static void unload(loaded *l) {
    free(l->file);
    free(l->converted);
}

static int parse_choice(const char *v, const char *const *names, int n, const char *opt) {
    int i;
    for (i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0) return i;
    fprintf(stderr, "oscar: %s %s: expected one of", opt, v);
    for (i = 0; i < n; i++) fprintf(stderr, " %s", names[i]);
    fprintf(stderr, "\n");
    exit(2);
}

static const char *calibrate_usage =
    "usage: oscar calibrate [options] DUMP...\n"
    "  Fits OSCAR rotations (R = U·H·P_br) from post-RoPE Q, K, V activations of prefill.\n"
    "  DUMP is a folder in the OSCAR reference's dump layout, layer_<id>/{q,k,v}/<chunk>.{npy,safetensors,pt}\n"
    "  (chunks in numeric order), or a .safetensors file holding layer_<id>.{q,k,v} or layers.<id>.{q,k,v}\n"
    "  tensors (one chunk per layer per file, files in command-line order). Tensors are [tokens, heads,\n"
    "  head_dim] (or [tokens, heads*head_dim] with --head-dim), bf16/f16/f32/f64.\n"
    "options:\n"
    "  --out-k FILE            K rotations (.safetensors, or .pt for the OSCAR reference)\n"
    "  --out-v FILE            V rotations (needs K and V dumps: a second pass re-reads them)\n"
    "  --skip-first-chunks N   ignore the first N chunks of every layer (the reference's dumps: 1)\n"
    "  --composition NAME      r_h_pbr (default), r_h, plain, pbr, h_pbr, hadamard, identity\n"
    "  --k-target qqt|ktk      query covariance (default) or KᵀK\n"
    "  --v-target sst|vtv      score-weighted V covariance (default) or VᵀV\n"
    "  --backend auto|cpu|cuda accumulate on the GPU when one is present (default auto)\n"
    "  --eigensolver auto|lapack|cusolver\n"
    "  --head-dim D            only for 2-D tensors\n";

static int cmd_calibrate(int argc, char **argv) {
    static const char *const comps[] = {"", "r_h_pbr", "r_h", "plain", "pbr", "h_pbr", "hadamard", "identity"};
    static const char *const ktargets[] = {"qqt", "ktk"}, *const vtargets[] = {"sst", "vtv"};
    static const char *const backends[] = {"auto", "cpu", "cuda"}, *const solvers[] = {"auto", "lapack", "cusolver"};
    const char *out_k = NULL, *out_v = NULL;
    int skip = 0, comp = 1, kt = 0, vt = 0, backend = 0, solver = 0, i, ndumps = 0, need_kv, pass;
    int64_t head_dim = 0, Hq = 0, Hkv = 0;
    chunk_list chunks = {0};
    oscar_desc od = {0};
    oscar_ctx *ctx = NULL;
    oscar_calib_desc cd = {0};
    oscar_calib_finish_desc fd = {0};
    oscar_calib *calib = NULL;
    oscar_rotation_set *rk = NULL, *rv = NULL;
    int32_t *ids = NULL, nids = 0;
    double t0 = oscar__now_ms();
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(calibrate_usage, stdout);
            return 0;
        }
        if (a[0] == '-' && !v) {
            fprintf(stderr, "oscar: %s needs a value\n%s", a, calibrate_usage);
            return 2;
        }
        if (strcmp(a, "--out-k") == 0)
            out_k = v, i++;
        else if (strcmp(a, "--out-v") == 0)
            out_v = v, i++;
        else if (strcmp(a, "--skip-first-chunks") == 0)
            skip = atoi(v), i++;
        else if (strcmp(a, "--composition") == 0)
            comp = parse_choice(v, comps, 8, a), i++;
        else if (strcmp(a, "--k-target") == 0)
            kt = parse_choice(v, ktargets, 2, a), i++;
        else if (strcmp(a, "--v-target") == 0)
            vt = parse_choice(v, vtargets, 2, a), i++;
        else if (strcmp(a, "--backend") == 0)
            backend = parse_choice(v, backends, 3, a), i++;
        else if (strcmp(a, "--eigensolver") == 0)
            solver = parse_choice(v, solvers, 3, a), i++;
        else if (strcmp(a, "--head-dim") == 0)
            head_dim = atoi(v), i++;
        else if (a[0] == '-') {
            fprintf(stderr, "oscar: unknown option %s\n%s", a, calibrate_usage);
            return 2;
        } else {
            struct stat sb;
            if (stat(a, &sb) != 0) {
                fprintf(stderr, "oscar: %s: %s\n", a, strerror(errno));
                return 1;
            }
            ndumps++;
        }
    }
    if (!ndumps || (!out_k && !out_v) || comp == 0) {
        fputs(calibrate_usage, stderr);
        return 2;
    }
    need_kv = (out_v != NULL) || kt == 1;
    for (i = 1; i < argc; i++) {
        struct stat sb;
        if (argv[i][0] == '-') {
            i++;
            continue;
        }
        stat(argv[i], &sb);
        if (S_ISDIR(sb.st_mode))
            scan_dump_dir(argv[i], &chunks, need_kv);
        else
            scan_safetensors(argv[i], i, &chunks);
    }
    qsort(chunks.c, (size_t)chunks.n, sizeof(chunk), cmp_chunks);
    for (i = 0; i < chunks.n; i++) {
        if (need_kv && (!chunks.c[i].src[1].path || !chunks.c[i].src[2].path)) {
            fprintf(stderr, "oscar: layer %d chunk %lld has no k or v tensor (needed for --out-v / ktk)\n",
                    chunks.c[i].layer, chunks.c[i].order);
            return 1;
        }
        if (i == 0 || chunks.c[i].layer != chunks.c[i - 1].layer) {
            ids = (int32_t *)realloc(ids, sizeof(int32_t) * (size_t)(nids + 1));
            ids[nids++] = chunks.c[i].layer;
        }
    }
    /* shapes from the first chunk */
    {
        loaded q, k;
        load_tensor(&chunks.c[0].src[0], head_dim, 0, &q);
        Hq = q.heads, head_dim = q.dim;
        unload(&q);
        if (chunks.c[0].src[1].path) {
            load_tensor(&chunks.c[0].src[1], head_dim, 0, &k);
            Hkv = k.heads;
            unload(&k);
        } else {
            Hkv = Hq; /* K target only, no K dumps: the grouping does not change C_Q */
        }
    }
    od.backend = backend == 1 ? OSCAR_BACKEND_CPU : OSCAR_BACKEND_CUDA;
    {
        oscar_status st = oscar_setup(&od, &ctx);
        if (st != OSCAR_OK && backend == 0) {
            fprintf(stderr, "oscar: no GPU (%s); accumulating on the CPU\n", oscar_last_error(NULL));
            od.backend = OSCAR_BACKEND_CPU;
            st = oscar_setup(&od, &ctx);
        }
        if (st != OSCAR_OK) die_status(NULL, st, "oscar_setup");
    }
    cd.num_layers = nids, cd.layer_ids = ids, cd.head_dim = (int32_t)head_dim, cd.num_q_heads = (int32_t)Hq;
    cd.num_kv_heads = (int32_t)Hkv, cd.skip_first_chunks = skip, cd.tensor_targets = kt == 1 || vt == 1;
    CLI_OK(ctx, oscar_calib_create(ctx, &cd, &calib), "oscar_calib_create");
    printf("calibrating %d layers (ids ", nids);
    print_ids(ids, nids);
    printf("), head dim %lld, %lld query / %lld KV heads, %d chunks, on the %s\n", (long long)head_dim, (long long)Hq,
           (long long)Hkv, chunks.n, od.backend == OSCAR_BACKEND_CPU ? "CPU" : "GPU");
    for (pass = 1; pass <= (out_v && vt == 0 ? 2 : 1); pass++) {
        int64_t tokens = 0;
        for (i = 0; i < chunks.n; i++) {
            const chunk *c = &chunks.c[i];
            loaded t[3];
            int k, use[3];
            oscar_calib_batch_desc b = {0};
            use[0] = pass == 1;
            use[1] = use[2] = pass == 2 || (pass == 1 && cd.tensor_targets);
            memset(t, 0, sizeof t);
            for (k = 0; k < 3; k++)
                if (use[k]) {
                    load_tensor(&c->src[k], head_dim, k ? Hkv : Hq, &t[k]);
                    if (t[k].dim != head_dim || (k && t[k].tokens != t[0].tokens && use[0]) ||
                        (k == 2 && t[2].tokens != t[1].tokens)) {
                        fprintf(stderr, "oscar: layer %d chunk %lld: q/k/v disagree on tokens or head dim\n", c->layer,
                                c->order);
                        return 1;
                    }
                }
            /* one dtype per call: convert the odd one out to f32 */
            for (k = 0; k < 3; k++) {
                int j;
                for (j = 0; j < 3; j++)
                    if (use[k] && use[j] && t[k].dtype != t[j].dtype && t[k].dtype != OSCAR_DTYPE_F32) {
                        size_t cnt = (size_t)(t[k].tokens * t[k].heads * t[k].dim), e;
                        float *f = (float *)xmalloc(sizeof(float) * cnt);
                        int64_t tok, h, d;
                        for (tok = 0, e = 0; tok < t[k].tokens; tok++)
                            for (h = 0; h < t[k].heads; h++)
                                for (d = 0; d < t[k].dim; d++, e++)
                                    f[e] = oscar__to_f32(((const uint16_t *)t[k].data)[tok * t[k].token_stride +
                                                                                       h * t[k].head_stride + d],
                                                         oscar__k_dtype16(t[k].dtype));
                        free(t[k].converted);
                        t[k].converted = f, t[k].data = f, t[k].dtype = OSCAR_DTYPE_F32;
                        t[k].token_stride = t[k].heads * t[k].dim, t[k].head_stride = t[k].dim;
                    }
            }
            b.layer_id = c->layer;
            b.num_tokens = use[0] ? t[0].tokens : t[1].tokens;
            b.dtype = use[0] ? t[0].dtype : t[1].dtype;
            b.q = t[0].data, b.q_token_stride = t[0].token_stride, b.q_head_stride = t[0].head_stride;
            b.k = t[1].data, b.k_token_stride = t[1].token_stride, b.k_head_stride = t[1].head_stride;
            b.v = t[2].data, b.v_token_stride = t[2].token_stride, b.v_head_stride = t[2].head_stride;
            b.host_memory = od.backend == OSCAR_BACKEND_CUDA;
            CLI_OK(ctx, oscar_calib_accumulate(calib, &b, NULL), c->src[use[0] ? 0 : 1].path);
            tokens += b.num_tokens;
            for (k = 0; k < 3; k++) unload(&t[k]);
        }
        printf("pass %d (%s): %lld token rows read in %.1f s\n", pass,
               pass == 1 ? "query covariance" : "score-weighted V covariance", (long long)tokens,
               (oscar__now_ms() - t0) / 1000);
        if (pass == 1 && out_v && vt == 0) CLI_OK(ctx, oscar_calib_begin_score_pass(calib, NULL), "begin_score_pass");
    }
    fd.composition = (oscar_rotation_composition)comp;
    fd.k_target = kt ? OSCAR_CALIB_TARGET_KEY : OSCAR_CALIB_TARGET_QUERY;
    fd.v_target = vt ? OSCAR_CALIB_TARGET_VALUE : OSCAR_CALIB_TARGET_SCORE;
    fd.eigensolver = (oscar_eigensolver)solver;
    CLI_OK(ctx, oscar_calib_finish(calib, &fd, out_k ? &rk : NULL, out_v ? &rv : NULL, NULL), "oscar_calib_finish");
    if (rk) {
        CLI_OK(ctx, oscar_rotation_set_save(ctx, rk, out_k, OSCAR_ROTATION_FILE_DEFAULT), out_k);
        inspect_set(out_k, rk, NULL, 0);
    }
    if (rv) {
        CLI_OK(ctx, oscar_rotation_set_save(ctx, rv, out_v, OSCAR_ROTATION_FILE_DEFAULT), out_v);
        inspect_set(out_v, rv, NULL, 0);
    }
    printf("done in %.1f s\n", (oscar__now_ms() - t0) / 1000);
    oscar_rotation_set_destroy(rk), oscar_rotation_set_destroy(rv);
    oscar_calib_destroy(calib);
    oscar_shutdown(ctx);
    for (i = 0; i < chunks.n; i++) {
        int k;
        for (k = 0; k < 3; k++) free(chunks.c[i].src[k].path), free(chunks.c[i].src[k].name);
    }
    free(chunks.c);
    free(ids);
    return 0;
}

/* ---- oscar kernels ---------------------------------------------------------------------------- */
/* 1 if name contains one of the texts (every name when there are none) */
static int name_matches(const char *name, int ntexts, char **texts) {
    int i;
    if (ntexts == 0) return 1;
    for (i = 0; i < ntexts; i++)
        if (strstr(name, texts[i])) return 1;
    return 0;
}

static int cmd_kernels_list(int argc, char **argv) {
    const int32_t n = oscar_jit_instantiation_count();
    int32_t i, shown = 0;
    for (i = 0; i < n; i++) {
        const char *program = NULL, *name = NULL;
        if (oscar_jit_instantiation(i, &program, &name) != OSCAR_OK || !name_matches(name, argc - 1, argv + 1)) continue;
        printf("%-16s %s\n", program, name);
        shown++;
    }
    printf("%d of %d instantiations\n", shown, n);
    return 0;
}

/* The number before `unit` on the ptxas line that has it, in the log piece
   [from, to); -1 if none. */
static long ptxas_number(const char *from, const char *to, const char *unit) {
    const char *u = from;
    while ((u = strstr(u, unit)) && u < to) {
        const char *d = u;
        while (d > from && d[-1] == ' ') d--;
        while (d > from && d[-1] >= '0' && d[-1] <= '9') d--;
        if (d < u && *d >= '0' && *d <= '9') return strtol(d, NULL, 10);
        u += strlen(unit);
    }
    return -1;
}

/* A file name from an instantiation's name: letters, digits and '_' kept,
   runs of anything else one '_' ("oscar::quantize_kernel<128, 128, 1, 32, 8>"
   -> "oscar_quantize_kernel_128_128_1_32_8"). */
static void file_name_of(const char *name, char *out, size_t cap) {
    size_t n = 0;
    int gap = 0;
    for (; *name && n + 2 < cap; name++) {
        const int keep = (*name >= 'a' && *name <= 'z') || (*name >= 'A' && *name <= 'Z') || (*name >= '0' && *name <= '9');
        if (keep) {
            if (gap && n) out[n++] = '_';
            out[n++] = *name, gap = 0;
        } else
            gap = 1;
    }
    out[n] = 0;
}

/* `kernels resources` and `kernels cubin`: each instantiation whose name has
   one of the texts, compiled alone through NVRTC for sm_N as a context for
   that device would (oscar__nvrtc_compile; a compile-only context, no GPU).
   out_dir NULL: ptxas -v, and its numbers read back from the entry's lines
   of the log; else write the cubin to out_dir/<name>.sm<N>.cubin, for nvdisasm
   or cuobjdump (the SASS the GPU would run, without a GPU). */
static int kernels_compile_each(int argc, char **argv, const char *out_dir) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    int sm = 90, ntexts, shown = 0, failed = 0;
    char **texts;
    int32_t k, n = oscar_jit_instantiation_count();
    if (argc >= 3 && strcmp(argv[1], "--sm") == 0) {
        sm = atoi(argv[2]);
        argc -= 2, argv += 2;
    }
    ntexts = argc - 1, texts = argv + 1;
    if (ntexts < 1 || sm < 50) {
        fprintf(stderr, "usage: oscar kernels %s [--sm N (e.g. 90)] TEXT...  (instantiations whose name has TEXT; "
                        "`oscar kernels list` names them)\n", out_dir ? "cubin --out DIR" : "resources");
        return 2;
    }
    desc.compile_only_sm = sm;
    CLI_OK(NULL, oscar_setup(&desc, &ctx), "oscar kernels resources / cubin need NVRTC");
    if (!out_dir) {
        oscar__nvrtc_extra_option = "--ptxas-options=-v";
        printf("sm_%d, one NVRTC program per instantiation, ptxas -v:\n", sm);
        printf("%9s %12s %11s %10s %10s  %s\n", "registers", "spill stores", "spill loads", "stack (B)", "static smem", "instantiation");
    }
    for (k = 0; k < n; k++) {
        const char *program = NULL, *name = NULL, *log, *entry, *next;
        char *cubin = NULL, *lowered[1] = {NULL}, marker[512];
        size_t size = 0;
        oscar_status st;
        if (oscar_jit_instantiation(k, &program, &name) != OSCAR_OK || !name_matches(name, ntexts, texts)) continue;
        shown++;
        pthread_mutex_lock(&ctx->lock);
        st = oscar__nvrtc_compile(ctx, program, &name, 1, &cubin, &size, lowered);
        pthread_mutex_unlock(&ctx->lock);
        if (st != OSCAR_OK) {
            fprintf(stderr, "oscar: %s: %s\n", name, oscar_last_error(ctx));
            failed++;
            continue;
        }
        if (out_dir) {
            char file[300], path[1400];
            FILE *fp;
            file_name_of(name, file, sizeof file);
            snprintf(path, sizeof path, "%s/%s.sm%d.cubin", out_dir, file, sm);
            fp = fopen(path, "wb");
            if (!fp || fwrite(cubin, 1, size, fp) != size) {
                fprintf(stderr, "oscar: cannot write %s\n", path);
                failed++;
            } else
                printf("%s  (%s, %zu bytes, entry %s)\n", path, name, size, lowered[0]);
            if (fp) fclose(fp);
        } else {
            log = oscar_jit_log(ctx);
            snprintf(marker, sizeof marker, "Compiling entry function '%s'", lowered[0]);
            entry = strstr(log, marker);
            next = entry ? strstr(entry + 1, "Compiling entry function") : NULL;
            if (!next) next = log + strlen(log);
            if (!entry) {
                fprintf(stderr, "oscar: %s: ptxas reported no entry %s\n", name, lowered[0]);
                failed++;
            } else
                printf("%9ld %12ld %11ld %10ld %10ld  %s\n", ptxas_number(entry, next, "registers"),
                       ptxas_number(entry, next, "bytes spill stores"), ptxas_number(entry, next, "bytes spill loads"),
                       ptxas_number(entry, next, "bytes stack frame"), OSCAR__MAX(0L, ptxas_number(entry, next, "bytes smem")),
                       name);
        }
        oscar__free(ctx, cubin);
        oscar__free(ctx, lowered[0]);
    }
    oscar__nvrtc_extra_option = NULL;
    oscar_shutdown(ctx);
    if (shown == 0) {
        fprintf(stderr, "oscar: no instantiation's name contains the text given (`oscar kernels list` names them)\n");
        return 1;
    }
    return failed ? 1 : 0;
}
static int cmd_kernels_resources(int argc, char **argv) { return kernels_compile_each(argc, argv, NULL); }
/* oscar kernels cubin --out DIR [--sm N] TEXT... */
static int cmd_kernels_cubin(int argc, char **argv) {
    const char *dir = NULL;
    if (argc >= 3 && strcmp(argv[1], "--out") == 0) {
        dir = argv[2];
        argv[2] = argv[0], argc -= 2, argv += 2;
    }
    if (!dir) {
        fprintf(stderr, "usage: oscar kernels cubin --out DIR [--sm N (e.g. 90)] TEXT...  (DIR must exist; then e.g. "
                        "nvdisasm -c DIR/FILE.cubin)\n");
        return 2;
    }
    return kernels_compile_each(argc, argv, dir);
}

static const cli_command kernel_commands[] = {
    {"list", "[TEXT...]", "the kernel instantiations oscar can compile (names containing TEXT)", cmd_kernels_list},
    {"resources", "[--sm N] TEXT...", "registers, spills, stack and shared memory per instantiation (NVRTC, no GPU)",
     cmd_kernels_resources},
    {"cubin", "--out DIR [--sm N] TEXT...", "each instantiation's cubin as NVRTC builds it, for nvdisasm (no GPU)",
     cmd_kernels_cubin},
};

static int cmd_kernels(int argc, char **argv) {
    return dispatch(kernel_commands, (int)(sizeof kernel_commands / sizeof kernel_commands[0]), "oscar kernels", argc - 1,
                    argv + 1);
}

/* ---- the table ------------------------------------------------------------------------------ */
static const cli_command commands[] = {
    {"calibrate", "[options] DUMP...", "fit K and V rotations from activation dumps (.npy, .safetensors, .pt)",
     cmd_calibrate},
    {"rotations", "inspect|convert|hadamard ...", "inspect, convert or create rotation files", cmd_rotations},
    {"kernels", "list|resources|cubin ...", "the kernel instantiations, their registers / spills and cubins (no GPU)", cmd_kernels},
};

int main(int argc, char **argv) {
    if (argc >= 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0)) {
        printf("oscar %s\n", OSCAR_VERSION_STRING);
        return 0;
    }
    return dispatch(commands, (int)(sizeof commands / sizeof commands[0]), "oscar", argc - 1, argv + 1);
}
