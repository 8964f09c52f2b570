/* tune/oscar_tune_api.h -- public declarations of the autotuner (included by
   oscar.h inside its extern "C" block). Implementation: tune/oscar_tune.h;
   the manual: docs/tuning.md.

   AUTOTUNER
       Each tunable kernel family declares its parameters (a name and a list
       of candidate values) and a validity rule per problem class. Problem
       classes are buckets: for decode (head dim, group size, INT2 page size,
       GQA ratio, scale layout, window-token bucket, batch bucket, INT2
       context bucket), for quantize (head dim, group size, source dtype,
       scale layout, mode, sides rotated, sides clipped, rows of the launch),
       buckets being the next power of two.

       A tuning table maps (family, bucket) -> parameter values. It is a text
       file, one record per line, `key=value` fields:

           oscar-tune-table format=1
           provenance gpu="NVIDIA H200" sms=132 cc=90 nvrtc=13000 oscar=0.1.0 date=... tuning_s=41.2
           decode head_dim=128 group=128 page=16 ratio=4 scale=f16_scale_min window=512 batch=8
                  context=32768 src=9c1e... int2_splits=16 window_splits=2 default_us=476.2 tuned_us=455.0

       (an entry is one line). A parameter missing from an entry means "the
       heuristic's choice" (tuned, and the heuristic won). The table of a
       context is read at oscar_setup from desc.tune_table_path, else
       $OSCAR_TUNE_TABLE, else <JIT cache dir>/tune_table.txt; a missing file
       is not an error. A table whose provenance (GPU name, SM count, compute
       capability, NVRTC version, oscar version) differs from the context's
       is ignored with a log line, and so is an entry whose `src` digest (the
       kernel sources of its family) differs from the embedded sources. A
       malformed file is ignored as a whole, with a sentence naming the line.
       A compile-only context knows no GPU name or SM count: those two are
       not compared there. Shipped tables (tune/default_sm<XY>.txt, embedded)
       serve the shapes the context's own table does not hold, under the same
       rules. oscar_decode_plan consults the tables for every split count the
       desc leaves at 0, oscar_merge_states and oscar_quantize_kv for their
       tile; then the heuristic decides.

       Tuning is explicit (oscar_tune_decode, oscar_tune_merge,
       oscar_tune_quantize, the
       `oscar_tune` tool) and never runs inside a run call. Each valid
       candidate's output is first compared with the default candidate's (a
       wrong one is rejected and reported), then timed with CUDA events after
       warm-up on inputs rotating over more bytes than the L2, median of
       repeats. The best candidate is re-timed interleaved with the default
       and kept only if it beats it by more than the measured spread. */

typedef enum oscar_tune_family {
    OSCAR_TUNE_FAMILY_NONE = 0,
    OSCAR_TUNE_FAMILY_DECODE,       /* decode attention: int2_splits, window_splits */
    OSCAR_TUNE_FAMILY_MERGE_STATES, /* oscar_merge_states: rows_per_cta */
    OSCAR_TUNE_FAMILY_QUANTIZE,     /* oscar_quantize_kv: rows_per_warp, warps_per_cta */
    OSCAR__TUNE_FAMILY_COUNT,
    OSCAR__TUNE_FAMILY_FORCE_U32 = 0x7FFFFFFF
} oscar_tune_family;

/* Where a table comes from and what it is valid for. */
typedef struct oscar_tune_provenance {
    char gpu_name[128];    /* as cuDeviceGetName */
    int32_t num_sms;
    int32_t sm;            /* compute capability, e.g. 90 */
    int32_t nvrtc_version; /* major*1000 + minor*10 */
    char oscar_version[32];
    char date[32];         /* UTC, ISO 8601, of the last tuning run */
    double tuning_seconds; /* wall time of the tuning runs that made the table */
} oscar_tune_provenance;

/* What a context's tuning tables are. */
typedef struct oscar_tune_info {
    char path[1024];                 /* the context's table file ("" when none is configured) */
    int32_t has_table;               /* 1: a table is loaded (or was made by tuning) */
    int32_t num_entries;             /* entries of the context's table */
    int32_t num_builtin_entries;     /* entries of the shipped table in use (0 if none applies) */
    oscar_tune_provenance provenance;         /* of the context's table */
    oscar_tune_provenance builtin_provenance; /* of the shipped table in use */
} oscar_tune_info;

OSCAR_API oscar_status oscar_query_tune_info(const oscar_ctx *ctx, oscar_tune_info *out);
/* Replaces the context's table by the file's. OSCAR_STATUS_IO_ERROR (cannot
   read), OSCAR_STATUS_FORMAT_ERROR (malformed: the sentence names the line),
   OSCAR_STATUS_UNSUPPORTED (made on another GPU / SM count / arch / NVRTC /
   oscar version): the context's table is then unchanged. */
OSCAR_API oscar_status oscar_tune_table_load(oscar_ctx *ctx, const char *path);
/* Writes the context's table atomically (temporary file in the same folder,
   fsync, rename): readers see the old file or the new one, never a part.
   path NULL: the context's table path. On failure the old file is intact. */
OSCAR_API oscar_status oscar_tune_table_save(oscar_ctx *ctx, const char *path);
/* Forgets the context's table (plans fall back to shipped tables, then heuristics). */
OSCAR_API oscar_status oscar_tune_table_clear(oscar_ctx *ctx);

/* One problem of a tuning run. */
typedef struct oscar_tune_shape {
    int32_t batch_size;     /* requests (decode); layers in the launch (quantize, 0 = 1) */
    int64_t context_tokens; /* tokens per request, window included (decode); rows (merge); tokens (quantize) */
} oscar_tune_shape;

/* What a tuning run found for one shape. */
typedef struct oscar_tune_report {
    char key[256];            /* the bucket, as in the table file */
    char default_params[128]; /* the heuristic's choice, e.g. "int2_splits=32 window_splits=2" */
    char params[128];         /* the kept choice (= default_params when the default won) */
    double default_us, default_spread_us; /* median and interquartile range, interleaved re-timing */
    double tuned_us, tuned_spread_us;
    int32_t num_candidates;   /* valid candidates checked (the default included) */
    int32_t num_rejected;     /* candidates whose output differed from the default's */
    int32_t improved;         /* 1: a candidate beat the default by more than the spread */
    int32_t graph_timed;      /* 1: timed as CUDA-graph replays; 0: direct launches (no graph API, or a capture failed) */
    char rejected[256];       /* which, and by how much ("" when none) */
    double seconds;           /* wall time of this shape (inputs, compile, checks, timing) */
} oscar_tune_report;

/* oscar_tune_decode_desc: the decode shapes to tune (inputs are random,
   allocated and freed by the call).
       num_q_heads, num_kv_heads, head_dim   *must* be set
       group_size        head_dim
       page_size         16 (INT2 pool)
       scale_layout      OSCAR_SCALE_LAYOUT_F16_SCALE_MIN
       int2_layout       OSCAR_KV_LAYOUT_HND
       window_page_size  16
       window_tokens     320 (64 sink + 256 recent, bf16); < 0: no window tier
       shapes            *must* be set: num_shapes (batch, tokens per request)
       warmup            3 runs per candidate before timing
       repeats           15 timed runs per candidate (and 2x that in the re-timing)
       min_bytes         2x the L2: inputs rotate over at least this many bytes
   Results are stored in the context's table (save it with oscar_tune_table_save). */
typedef struct oscar_tune_decode_desc {
    uint32_t _start_canary;
    int32_t num_q_heads;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t group_size;
    int32_t page_size;
    oscar_scale_layout scale_layout;
    oscar_kv_layout int2_layout;
    int32_t window_page_size;
    int32_t window_tokens;
    int32_t num_shapes;
    const oscar_tune_shape *shapes;
    int32_t warmup;
    int32_t repeats;
    int64_t min_bytes;
    uint32_t _end_canary;
} oscar_tune_decode_desc;

/* out_reports: num_shapes reports (may be NULL). Needs a device. */
OSCAR_API oscar_status oscar_tune_decode(oscar_ctx *ctx, const oscar_tune_decode_desc *desc,
                                         oscar_tune_report *out_reports);

/* oscar_tune_merge_desc: merge_states shapes (shape.context_tokens = rows).
       head_dim      *must* be set
       num_states    2
       dtype         bf16
       shapes, warmup, repeats, min_bytes   as for decode */
typedef struct oscar_tune_merge_desc {
    uint32_t _start_canary;
    int32_t head_dim;
    int32_t num_states;
    oscar_dtype dtype;
    int32_t num_shapes;
    const oscar_tune_shape *shapes;
    int32_t warmup;
    int32_t repeats;
    int64_t min_bytes;
    uint32_t _end_canary;
} oscar_tune_merge_desc;

OSCAR_API oscar_status oscar_tune_merge(oscar_ctx *ctx, const oscar_tune_merge_desc *desc,
                                        oscar_tune_report *out_reports);

/* oscar_tune_quantize_desc: oscar_quantize_kv shapes (shape.batch_size =
   layers in one launch, 1..48; shape.context_tokens = tokens; every KV head
   of each token, K and V). Inputs are random bf16|f16 rows with a few large
   columns, a normalised Hadamard R per layer; allocated and freed by the call.
       num_kv_heads, head_dim   *must* be set
       group_size        head_dim
       src_dtype         OSCAR_DTYPE_BF16
       scale_layout      OSCAR_SCALE_LAYOUT_F16_SCALE_MIN
       mode              OSCAR_QUANT_MODE_UNIFORM
       rotation          0: K and V rotated; 1: K only (V absorbed); < 0: none
       k_clip_ratio, v_clip_ratio   0 (off); in (0, 1], as oscar_quantize_desc
       src_page_size     0: dense source rows (a prefill chunk); >= 1: rows
                         gathered through slot ids from a paged cache of that
                         page size, 8 consecutive tokens per request at
                         shuffled places, written to shuffled pool slots
                         (demotion out of the recent window)
       page_size         16 (INT2 pool)
       shapes, warmup, repeats, min_bytes   as for decode
   Every registered tile that fits the device's shared memory is a
   candidate; its codes and scales must be bit-identical to the default
   tile's (the heuristic's), else it is rejected. */
typedef struct oscar_tune_quantize_desc {
    uint32_t _start_canary;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t group_size;
    oscar_dtype src_dtype;
    oscar_scale_layout scale_layout;
    oscar_quant_mode mode;
    int32_t rotation;
    float k_clip_ratio, v_clip_ratio;
    int32_t src_page_size;
    int32_t page_size;
    int32_t num_shapes;
    const oscar_tune_shape *shapes;
    int32_t warmup;
    int32_t repeats;
    int64_t min_bytes;
    uint32_t _end_canary;
} oscar_tune_quantize_desc;

OSCAR_API oscar_status oscar_tune_quantize(oscar_ctx *ctx, const oscar_tune_quantize_desc *desc,
                                           oscar_tune_report *out_reports);
