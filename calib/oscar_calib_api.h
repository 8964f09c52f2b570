/* calib/oscar_calib_api.h -- public declarations of calibration and rotation
   files (included by oscar.h inside its extern "C" block).

   CALIBRATION (OSCAR-SPEC.md §6.3, docs/calibration.md)
       OSCAR rotates K by R_k = U_Q·H·P_br and V by R_v = U_S·H·P_br per layer,
       where U_Q diagonalises the query covariance (GQA-aware) and U_S the
       score-weighted V covariance. oscar fits both from an engine's own
       prefill activations (post-RoPE, post-qk-norm Q, K and V):

           oscar_calib_create            one accumulator per model
           oscar_calib_accumulate        pass 1: Q of every layer, chunk after chunk
           oscar_calib_begin_score_pass  freezes each KV head's query covariance
           oscar_calib_accumulate        pass 2: K and V of the same tokens again
           oscar_calib_finish            -> K and V oscar_rotation_set

       Why two passes: the V target weights token t by w_t = k_t·C_qh·k_tᵀ,
       where C_qh is KV head h's query covariance over *all* calibration tokens,
       so no single pass can be exact. Pass 1 accumulates Σ q qᵀ per KV head;
       pass 2 uses the frozen C_qh and accumulates Σ w v vᵀ and Σ w per head;
       finish divides (the reference's "normalise w to mean 1" is exactly that
       division). A K rotation alone needs only pass 1.

       Statistics are float64 sums (on the device for the CUDA backend), exact
       up to float64 rounding for any chunking, and additive: several
       accumulators (one per GPU, or per shard of the data) combine by adding
       their statistics buffers (oscar_calib_stats_view for an in-place NCCL
       all-reduce, or export/import), which gives what one accumulator would
       have given on all their tokens.

   ROTATION SETS AND FILES
       An oscar_rotation_set holds per-layer fp32 D×D rotations (applied as
       x' = x @ R, row-major), their eigenvalues (ascending) when known, and the
       global layer ids, which may be sparse (e.g. 3, 7, 11, ... for hybrid
       models). Files: safetensors (read/write, any ecosystem reads them) and
       the OSCAR reference's torch.save checkpoints (.pt, read/write, schema of
       OSCAR-SPEC.md §6.2), parsed without Python or torch. Every file is
       treated as untrusted: a malformed one gives OSCAR_STATUS_FORMAT_ERROR
       and a sentence, never a crash or an out-of-bounds read. */

/* ---- rotation sets --------------------------------------------------------- */

typedef struct oscar_rotation_set oscar_rotation_set;

/* A read-only view of a rotation set; pointers stay valid until the set is
   destroyed. */
typedef struct oscar_rotation_set_info {
    int32_t num_layers;
    int32_t head_dim;
    const int32_t *layer_ids; /* [num_layers], strictly ascending global layer ids */
    const float *rotations;   /* [num_layers][head_dim][head_dim] fp32 row-major, x' = x @ R */
    const float *eigenvalues; /* [num_layers][head_dim] ascending, or NULL when the set has none */
    const char *objective;    /* e.g. "qqt_r_h_pbr", "sst_r_h_pbr", "hadamard"; "" if unknown */
} oscar_rotation_set_info;

/* oscar_rotation_set_desc: a rotation set from the caller's arrays (copied).
       num_layers       *must* be set, >= 1
       head_dim         *must* be set, 1..4096
       layer_ids        NULL: 0..num_layers-1; else strictly ascending, >= 0
       rotations        *must* be set: [num_layers][head_dim][head_dim] fp32
       eigenvalues      NULL (none) or [num_layers][head_dim] fp32
       objective        NULL: "" (at most 63 bytes) */
typedef struct oscar_rotation_set_desc {
    uint32_t _start_canary;
    int32_t num_layers;
    int32_t head_dim;
    const int32_t *layer_ids;
    const float *rotations;
    const float *eigenvalues;
    const char *objective;
    uint32_t _end_canary;
} oscar_rotation_set_desc;

typedef enum oscar_rotation_file_format {
    OSCAR_ROTATION_FILE_DEFAULT = 0, /* save: by extension (.pt/.pth: TORCH, else SAFETENSORS); load: by content */
    OSCAR_ROTATION_FILE_SAFETENSORS, /* tensors "rotations" F32 [L,D,D], "eigenvalues" F32 [L,D], "layer_ids" I32 [L] */
    OSCAR_ROTATION_FILE_TORCH,       /* torch.save zip + pickle, OSCAR-SPEC.md §6.2 schema */
    OSCAR__ROTATION_FILE_COUNT,
    OSCAR__ROTATION_FILE_FORCE_U32 = 0x7FFFFFFF
} oscar_rotation_file_format;

/* Functions on rotation sets accept ctx == NULL (host allocator malloc/free,
   errors readable with oscar_last_error(NULL)); a set may outlive its ctx. */
OSCAR_API oscar_status oscar_rotation_set_create(oscar_ctx *ctx, const oscar_rotation_set_desc *desc,
                                                 oscar_rotation_set **out_set);
/* The data-free rotation of QuaRot-style baselines: R = H (normalised
   Sylvester Hadamard, head_dim a power of two) for every layer; no
   eigenvalues; objective "hadamard". layer_ids NULL: 0..num_layers-1. */
OSCAR_API oscar_status oscar_rotation_set_hadamard(oscar_ctx *ctx, int32_t head_dim, int32_t num_layers,
                                                   const int32_t *layer_ids, oscar_rotation_set **out_set);
OSCAR_API void oscar_rotation_set_destroy(oscar_rotation_set *set);
OSCAR_API oscar_status oscar_rotation_set_query(const oscar_rotation_set *set, oscar_rotation_set_info *out_info);
/* Index of a global layer id in the set, or -1. */
OSCAR_API int32_t oscar_rotation_set_find(const oscar_rotation_set *set, int32_t layer_id);
/* Loads a .pt (torch zip) or safetensors rotation file, recognised by its
   content. Rotations stored as f64/f16/bf16 are converted to fp32. */
OSCAR_API oscar_status oscar_rotation_set_load(oscar_ctx *ctx, const char *path, oscar_rotation_set **out_set);
OSCAR_API oscar_status oscar_rotation_set_load_memory(oscar_ctx *ctx, const void *data, size_t size,
                                                      oscar_rotation_set **out_set);
/* Writes atomically (temporary file + rename). */
OSCAR_API oscar_status oscar_rotation_set_save(oscar_ctx *ctx, const oscar_rotation_set *set, const char *path,
                                               oscar_rotation_file_format format);

/* ---- calibration ------------------------------------------------------------- */

typedef struct oscar_calib oscar_calib;

/* oscar_calib_desc: the model, for one accumulator.
       num_layers          *must* be set, >= 1
       layer_ids           NULL: 0..num_layers-1; else strictly ascending global ids (copied)
       head_dim            *must* be set: a power of two (CUDA backend: 64, 128 or 256; CPU: 2..1024)
       num_q_heads         *must* be set
       num_kv_heads        *must* be set, dividing num_q_heads (query head j belongs to KV head
                           j / (num_q_heads / num_kv_heads))
       skip_first_chunks   0: in each pass, the first N non-empty accumulate calls of each layer
                           are ignored (the reference drops its 6-token warm-up chunk: 1)
       tensor_targets      0; 1: pass 1 also accumulates KᵀK and VᵀV (the tensor-reconstruction
                           targets OSCAR_CALIB_TARGET_KEY / _VALUE, for comparisons)
   Device memory (CUDA backend), owned by the accumulator: float64 arrays of
   L·H_kv·D² (37.7 MB for 36 layers, 8 KV heads, D = 128), one in the query
   pass and three in the score pass (Σ q qᵀ, the frozen C_qh, Σ w v vᵀ), a
   Gram workspace of at most ~20 MB, and the staging buffer of host_memory
   batches. An accumulator is not thread-safe: order its calls on one stream. */
typedef struct oscar_calib_desc {
    uint32_t _start_canary;
    int32_t num_layers;
    const int32_t *layer_ids;
    int32_t head_dim;
    int32_t num_q_heads;
    int32_t num_kv_heads;
    int32_t skip_first_chunks;
    int32_t tensor_targets;
    uint32_t _end_canary;
} oscar_calib_desc;

/* oscar_calib_batch_desc: one chunk of one layer's activations.
       layer_id            a global layer id of the accumulator
       num_tokens          0 is a no-op
       dtype               OSCAR_DTYPE_BF16 (or F16, F32), all three tensors
       q                   [num_tokens][num_q_heads][head_dim]: needed in pass 1
       k, v                [num_tokens][num_kv_heads][head_dim]: needed in pass 2 (and in pass 1
                           with tensor_targets); ignored otherwise
       *_token_stride      elements; default heads*head_dim (contiguous)
       *_head_stride       elements; default head_dim. The head_dim elements of a row are contiguous.
       host_memory         CUDA backend: 0: q/k/v are device pointers; 1: host pointers, copied
                           through a device staging buffer (the call then returns when they
                           have been read). The CPU backend always reads host memory.
   The call is asynchronous on `stream` for device pointers; the tensors must
   stay valid until the stream reaches that point. */
typedef struct oscar_calib_batch_desc {
    uint32_t _start_canary;
    int32_t layer_id;
    int64_t num_tokens;
    oscar_dtype dtype;
    const void *q;
    const void *k;
    const void *v;
    int64_t q_token_stride;
    int64_t q_head_stride;
    int64_t k_token_stride;
    int64_t k_head_stride;
    int64_t v_token_stride;
    int64_t v_head_stride;
    int32_t host_memory;
    uint32_t _end_canary;
} oscar_calib_batch_desc;

typedef enum oscar_calib_pass {
    OSCAR_CALIB_PASS_QUERY = 1, /* pass 1: Σ q qᵀ per KV head (and KᵀK, VᵀV) */
    OSCAR_CALIB_PASS_SCORE = 2, /* pass 2: Σ w v vᵀ and Σ w per KV head */
    OSCAR__CALIB_PASS_FORCE_U32 = 0x7FFFFFFF
} oscar_calib_pass;

/* The statistics of the current pass: one flat float64 array, additive.
   Layout, layer by layer in ascending layer id order (D = head_dim, H = num_kv_heads):
       pass 1: [tokens] [Σ q qᵀ: H][D][D] (query heads of KV head h)
               and with tensor_targets: [Σ k kᵀ over heads: D][D] [Σ v vᵀ: D][D]
       pass 2: [tokens] [Σ w: H] [Σ w v vᵀ: H][D][D]
   Matrices are full, symmetric, row-major. */
typedef struct oscar_calib_stats {
    double *data;      /* device memory (CUDA backend) or host memory (CPU), owned by the accumulator */
    int64_t count;     /* number of doubles */
    oscar_calib_pass pass;
    int32_t on_device; /* 1 when data is device memory */
} oscar_calib_stats;

typedef enum oscar_rotation_composition {
    OSCAR_ROTATION_DEFAULT = 0, /* = OSCAR_ROTATION_U_H_PBR */
    OSCAR_ROTATION_U_H_PBR,     /* R = U·H·P_br: OSCAR ("r_h_pbr", the validated configuration) */
    OSCAR_ROTATION_U_H,         /* R = U·H ("r_h") */
    OSCAR_ROTATION_U,           /* R = U ("plain") */
    OSCAR_ROTATION_U_PBR,       /* R = U·P_br ("pbr") */
    OSCAR_ROTATION_H_PBR,       /* R = H·P_br ("h_pbr": no attention-aware U) */
    OSCAR_ROTATION_H,           /* R = H ("hadamard", QuaRot-style, data-free) */
    OSCAR_ROTATION_IDENTITY,    /* R = I ("identity": no rotation, for comparisons) */
    OSCAR__ROTATION_COUNT,
    OSCAR__ROTATION_FORCE_U32 = 0x7FFFFFFF
} oscar_rotation_composition;

typedef enum oscar_calib_target {
    OSCAR_CALIB_TARGET_DEFAULT = 0, /* K: QUERY, V: SCORE */
    OSCAR_CALIB_TARGET_QUERY,       /* K: query covariance, GQA-aware ("qqt") */
    OSCAR_CALIB_TARGET_KEY,         /* K: KᵀK ("ktk", tensor reconstruction; needs tensor_targets) */
    OSCAR_CALIB_TARGET_SCORE,       /* V: score-weighted V covariance ("sst") */
    OSCAR_CALIB_TARGET_VALUE,       /* V: VᵀV ("vtv"; needs tensor_targets) */
    OSCAR__CALIB_TARGET_COUNT,
    OSCAR__CALIB_TARGET_FORCE_U32 = 0x7FFFFFFF
} oscar_calib_target;

typedef enum oscar_eigensolver {
    OSCAR_EIGENSOLVER_DEFAULT = 0, /* CUDA backend: cuSOLVER, else LAPACK; CPU backend: LAPACK */
    OSCAR_EIGENSOLVER_LAPACK,      /* dsyevd from liblapack.so.3 (or $OSCAR_LAPACK_PATH), opened at run time */
    OSCAR_EIGENSOLVER_CUSOLVER,    /* cusolverDnDsyevd from libcusolver (or $OSCAR_CUSOLVER_PATH), at run time */
    OSCAR__EIGENSOLVER_COUNT,
    OSCAR__EIGENSOLVER_FORCE_U32 = 0x7FFFFFFF
} oscar_eigensolver;

/* oscar_calib_finish_desc: how to turn the statistics into rotations.
       composition      OSCAR_ROTATION_U_H_PBR
       k_target         OSCAR_CALIB_TARGET_QUERY
       v_target         OSCAR_CALIB_TARGET_SCORE
       eigensolver      OSCAR_EIGENSOLVER_DEFAULT
   Eigendecompositions are float64; each eigenvector's sign is fixed so that
   its largest-magnitude component is positive, so solvers agree. */
typedef struct oscar_calib_finish_desc {
    uint32_t _start_canary;
    oscar_rotation_composition composition;
    oscar_calib_target k_target;
    oscar_calib_target v_target;
    oscar_eigensolver eigensolver;
    uint32_t _end_canary;
} oscar_calib_finish_desc;

OSCAR_API oscar_status oscar_calib_create(oscar_ctx *ctx, const oscar_calib_desc *desc, oscar_calib **out_calib);
/* Must be called before oscar_shutdown of its ctx. */
OSCAR_API void oscar_calib_destroy(oscar_calib *calib);
OSCAR_API oscar_status oscar_calib_accumulate(oscar_calib *calib, const oscar_calib_batch_desc *batch,
                                              oscar_stream stream);
/* Ends pass 1: freezes C_qh = Σ q qᵀ / (tokens · group size) of every layer
   and KV head (synchronises `stream`). Pass-1 statistics are kept. */
OSCAR_API oscar_status oscar_calib_begin_score_pass(oscar_calib *calib, oscar_stream stream);
/* The current pass's statistics in place (e.g. for ncclAllReduce(sum) on all
   ranks before oscar_calib_begin_score_pass and before finish). */
OSCAR_API oscar_status oscar_calib_stats_view(oscar_calib *calib, oscar_calib_stats *out_stats);
/* Copies the current pass's statistics to / from host memory (count must be
   the view's count); import replaces them. Both synchronise `stream`. */
OSCAR_API oscar_status oscar_calib_export_stats(oscar_calib *calib, double *host_dst, int64_t count,
                                                oscar_stream stream);
OSCAR_API oscar_status oscar_calib_import_stats(oscar_calib *calib, const double *host_src, int64_t count,
                                                oscar_stream stream);
/* Fits the rotations (synchronises `stream`); out_k and/or out_v may be
   NULL. V with the SCORE target needs the score pass. May be called again
   with another desc; the statistics are unchanged. */
OSCAR_API oscar_status oscar_calib_finish(oscar_calib *calib, const oscar_calib_finish_desc *desc,
                                          oscar_rotation_set **out_k, oscar_rotation_set **out_v,
                                          oscar_stream stream);
