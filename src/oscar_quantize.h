/* src/oscar_quantize.h -- part of the oscar.h implementation:
   oscar_quantize_kv, validation and dispatch (kernel: quantize.cuh). */
#ifndef OSCAR_QUANTIZE_H_INCLUDED
#define OSCAR_QUANTIZE_H_INCLUDED

/* int(ratio * D) clamped to [0, D-1], as the reference; -1 when off. */
OSCAR__PRIVATE int32_t oscar__clip_index(float ratio, int head_dim) {
    double x;
    if (!(ratio > 0.0f)) return -1;
    x = floor(OSCAR__CAST(double, ratio) * head_dim);
    if (x < 0) x = 0;
    if (x > head_dim - 1) x = head_dim - 1;
    return OSCAR__CAST(int32_t, x);
}

/* Shared memory of one CTA (quantize.cuh): per warp a 3-deep ring of slot
   ids (3 x 32 lanes x 16 bytes) and a slice of rows x head_dim 16-bit
   values; R in the source dtype once per CTA; 1024 bytes of slack, which
   the sm_90a build uses to align its wgmma tiles to 1024 bytes. */
OSCAR__PRIVATE int64_t oscar__quant_smem_bytes(int head_dim, int rows, int warps, int with_rotation) {
    return OSCAR__CAST(int64_t, warps) * (3 * 32 * 16 + OSCAR__CAST(int64_t, rows) * head_dim * 2) +
           (with_rotation ? OSCAR__CAST(int64_t, head_dim) * head_dim * 2 : 0) + 1024;
}

/* A tile choice: rows per warp step, warps per CTA, CTAs per (layer, K|V)
   (0: as many as fill the device, never more than the work). */
typedef struct oscar__quant_tile {
    int32_t rows_per_warp;
    int32_t warps_per_cta;
    int32_t ctas;
} oscar__quant_tile;

/* Registered (compiled) and within the device's shared memory. */
OSCAR__PRIVATE int oscar__quant_tile_valid(const oscar_ctx *ctx, int head_dim, int rows, int warps, int with_rotation) {
    if (!oscar__quant_tile_registered(head_dim, rows, warps)) return 0;
    if (ctx->backend != OSCAR_BACKEND_CUDA || ctx->compile_only) return 1;
    return oscar__quant_smem_bytes(head_dim, rows, warps, with_rotation) <= ctx->max_smem_optin;
}

/* The heuristic. Head dim 256: 16 rows (two lanes of 128 values per row), 8
   warps where R plus 8 slices fit, else 2. Otherwise one lane per row: 8
   warps (16 warps per SM at 128 registers) from 12 32-row steps per SM on,
   4 warps from 6 on; below that (demotion of a few requests) 16-row steps
   on 4-warp CTAs, so more warps share the few rows and each finishes sooner.
   The middle tier is session 10's (quantize v9, whose 16-row tiles are
   slower than v8's): on the H200 the graph-timed tuner kept 32 x 4 for the
   demotion of 8 requests x 36 layers (36864 rows: 18.6 vs 24.3 us for 16 x
   4) and 32 x 8 for 14 (64512 rows: 27.0 vs 30.7); 16 x 4 stayed best up to 4
   requests (18432 rows). */
OSCAR__PRIVATE oscar__quant_tile oscar__quant_choose(const oscar_ctx *ctx, int head_dim, int64_t rows_per_side,
                                                    int32_t layer_sides, int with_rotation) {
    oscar__quant_tile t;
    int64_t total = rows_per_side * layer_sides, sms = OSCAR__MAX(ctx->num_sms, 1);
    t.ctas = 0;
    if (head_dim == 256) {
        t.rows_per_warp = 16;
        t.warps_per_cta = oscar__quant_tile_valid(ctx, head_dim, 16, 8, with_rotation) ? 8 : 2;
        return t;
    }
    if (total >= 32 * 12 * sms) t.rows_per_warp = 32, t.warps_per_cta = 8;
    else if (total >= 32 * 6 * sms) t.rows_per_warp = 32, t.warps_per_cta = 4;
    else t.rows_per_warp = 16, t.warps_per_cta = 4;
    if (!oscar__quant_tile_valid(ctx, head_dim, t.rows_per_warp, t.warps_per_cta, with_rotation)) t.warps_per_cta = 4;
    return t;
}

/* the fewest CTAs of W warps whose warps take at most time / cost steps each
   of `steps` (0: no count does) */
OSCAR__PRIVATE int64_t oscar__quant_min_ctas(int64_t steps, int64_t W, int64_t cost, int64_t time) {
    const int64_t q = time / cost;
    return q < 1 ? 0 : OSCAR__MAX(1, (steps + W * q - 1) / (W * q));
}

/* A side's cost per warp step, relative (H200, session 23: the 128K-token
   prefill with both sides alike, same call, per side: rotated 141 us without
   a clip and 166 with one, unrotated 105 and 114, the unrotated rows being
   the rotated rows' values, pre-rotated on the host, as an engine with V
   absorbed hands them over). Without a clip 28 : 21 = session 20's 4 : 3;
   with one the rotated side costs more (the clip's ALU work fills idle issue
   slots on the unrotated path, not on the rotated one): 33 : 23. */
OSCAR__PRIVATE int64_t oscar__quant_side_cost(int rotated, int clipped) {
    return rotated ? (clipped ? 33 : 28) : (clipped ? 23 : 21);
}

/* CTAs per layer for K (ctas[0]) and for V (ctas[1]). All the CTAs the
   device holds at once (registers: 128 per thread, 16 warps per SM; shared
   memory) are shared out among the layers, and a layer's share between K and
   V by their cost per step (oscar__quant_side_cost: a rotated side costs
   4/3 to 1.43 of an unrotated one). The split taken is the one whose slower side
   finishes first (steps per warp x cost; ties: the split closest to the cost
   ratio; V takes what K leaves), never more CTAs than the steps need. The
   grid is max(ck, cv) x layers x 2 (K, V); the smaller side's extra CTAs
   leave at once. The block scheduler hands out every K CTA (z = 0) before
   the V CTAs, so most SMs hold one K and one V CTA: measured faster than a
   grid of ck + cv K-then-V CTAs per layer (256-request demotion 189 against
   198 us), which pairs K with K on many SMs. Before session 20 each side
   took floor(resident / (2 x layers)) CTAs: at 36 layers 216 of the H200's
   264 two-CTA slots, and with V unrotated (V absorbed, as in production) the
   V CTAs sat idle while the K CTAs finished: 32-request demotion 38.7 -> 35.1 us, 256 requests 215 ->
   189, the V-absorbed prefill 358 -> 318 (same call, graph replay). Sessions
   20-22 costed both sides 4 : 3 whatever the clip, tuned on V rows with
   outlier channels, which an absorbed projection does not produce; the
   clipped costs took the V-absorbed prefill 289.3 -> 283.1 us (session 23,
   three same-call rounds). */
OSCAR__PRIVATE void oscar__quant_ctas(const oscar_ctx *ctx, int head_dim, const oscar__quant_tile *t, int64_t rows_per_side,
                                      int32_t num_layers, int rot_k, int rot_v, int clip_k, int clip_v, int32_t ctas[2]) {
    const int64_t W = t->warps_per_cta, cost_k = oscar__quant_side_cost(rot_k, clip_k), cost_v = oscar__quant_side_cost(rot_v, clip_v);
    const int64_t steps = OSCAR__MAX((rows_per_side + t->rows_per_warp - 1) / t->rows_per_warp, 1), need = (steps + W - 1) / W;
    int64_t per_sm, smem, P, lo, hi, ak, av, top, best_a = 1, best_f = -1;
    int i;
    if (t->ctas > 0) {
        ctas[0] = ctas[1] = OSCAR__CAST(int32_t, OSCAR__MIN(OSCAR__CAST(int64_t, t->ctas), need));
        return;
    }
    smem = oscar__quant_smem_bytes(head_dim, t->rows_per_warp, t->warps_per_cta, rot_k || rot_v) + 1024;
    per_sm = head_dim == 256 ? 1 : OSCAR__MAX(1, 16 / t->warps_per_cta);
    per_sm = OSCAR__MIN(per_sm, OSCAR__MAX(1, (OSCAR__CAST(int64_t, ctx->max_smem_optin) + 1024) / smem));
    P = OSCAR__MAX(2, per_sm * OSCAR__MAX(ctx->num_sms, 1) / OSCAR__MAX(num_layers, 1)); /* CTAs per layer */
    /* the least time (steps per warp x cost) that both sides meet with P CTAs
       between them, by bisection (one CTA each meets need x cost) -- a scan of
       every split took 1-2.5 us of host time per single-layer launch */
    lo = 1, hi = need * OSCAR__MAX(cost_k, cost_v);
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        ak = oscar__quant_min_ctas(steps, W, cost_k, mid), av = oscar__quant_min_ctas(steps, W, cost_v, mid);
        if (ak && av && ak + av <= P) hi = mid;
        else lo = mid + 1;
    }
    ak = oscar__quant_min_ctas(steps, W, cost_k, lo), av = oscar__quant_min_ctas(steps, W, cost_v, lo);
    /* K may take [ak, top] CTAs, V the rest (up to need); the count nearest the
       cost ratio (ak x cost_v = av x cost_k), which lies near P cost_k / (cost_k
       + cost_v) while V can use what K leaves, else near need cost_k / cost_v */
    top = OSCAR__MIN(need, P - av);
    {
        const int64_t cand[4] = {P * cost_k / (cost_k + cost_v), P * cost_k / (cost_k + cost_v) + 1, need * cost_k / cost_v,
                                 need * cost_k / cost_v + 1};
        for (i = 0; i < 4; i++) {
            const int64_t a = OSCAR__MIN(OSCAR__MAX(cand[i], ak), top), b = OSCAR__MIN(P - a, need);
            const int64_t f = a * cost_v - b * cost_k, af = f < 0 ? -f : f;
            if (best_f < 0 || af < best_f || (af == best_f && a < best_a)) best_f = af, best_a = a;
        }
    }
    ctas[0] = OSCAR__CAST(int32_t, best_a), ctas[1] = OSCAR__CAST(int32_t, OSCAR__MIN(P - best_a, need));
}

/* oscar_quantize_kv with an explicit tile (force != NULL: the tests and the
   autotuner; an unregistered or too large tile is INVALID_ARGUMENT). */
OSCAR__PRIVATE oscar_status oscar__quantize_kv_tiled(oscar_ctx *ctx, const oscar_quantize_desc *desc, oscar_stream stream,
                                                     const oscar__quant_tile *force) {
    oscar__validator v;
    oscar_int2_pool_desc pool;
    oscar_quantize_desc d;
    oscar_quantize_layer_desc single;
    const oscar_quantize_layer_desc *layers;
    oscar_quantize_params params; /* 3.2 KB: on the stack, no allocation per call */
    oscar_quantize_params *p = &params;
    oscar_status st;
    int32_t l, any_rot = 0;
    int H, D;

    OSCAR__REQUIRE_CTX(ctx, "oscar_quantize_kv");
    if (!desc) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_quantize_kv: desc = NULL");
    if (!desc->pool) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_quantize_kv: desc.pool = NULL (*must* be set)");
    pool = oscar__pool_defaults(desc->pool);
    H = pool.num_kv_heads, D = pool.head_dim;
    d = *desc;
    d.num_layers = oscar__def(d.num_layers, 1);
    d.src_dtype = oscar__def(d.src_dtype, OSCAR_DTYPE_BF16);
    d.slot_dtype = oscar__def(d.slot_dtype, OSCAR_DTYPE_I32);
    d.mode = oscar__def(d.mode, OSCAR_QUANT_MODE_UNIFORM);
    d.src_page_size = oscar__def(d.src_page_size, 1);
    d.src_head_stride = oscar__def(d.src_head_stride, D);
    d.src_token_stride = oscar__def(d.src_token_stride, OSCAR__CAST(int64_t, H) * D);
    d.src_page_stride = oscar__def(d.src_page_stride, d.src_token_stride * d.src_page_size);
    if (!d.layers) {
        single.src_k = d.src_k, single.src_v = d.src_v;
        single.k_rotation = d.k_rotation, single.v_rotation = d.v_rotation;
        single.k_codes = pool.k_codes, single.v_codes = pool.v_codes;
        single.k_scales = pool.k_scales, single.v_scales = pool.v_scales;
        layers = &single;
    } else {
        layers = d.layers;
    }

    oscar__validate_begin(&v, ctx, "oscar_quantize_kv");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    if (!d.layers) oscar__pool_validate(&v, &pool, "desc.pool");
    else {
        /* the geometry comes from pool; the arrays from layers[] */
        oscar_int2_pool_desc geo = pool;
        geo.k_codes = geo.v_codes = layers[0].k_codes;
        geo.k_scales = geo.v_scales = layers[0].k_scales;
        oscar__pool_validate(&v, &geo, "desc.pool");
    }
    OSCAR__VALIDATE(&v, d.num_layers >= 1 && (d.layers || d.num_layers == 1),
                    "desc.num_layers = %d; expected 1, or >= 1 with desc.layers set", d.num_layers);
    OSCAR__VALIDATE(&v, d.num_tokens >= 0, "desc.num_tokens = %lld; expected >= 0", OSCAR__CAST(long long, d.num_tokens));
    OSCAR__VALIDATE(&v, d.src_dtype == OSCAR_DTYPE_BF16 || d.src_dtype == OSCAR_DTYPE_F16,
                    "desc.src_dtype = %s; expected bf16 or f16", oscar__dtype_name(d.src_dtype));
    OSCAR__VALIDATE(&v, oscar__is_index_dtype(d.slot_dtype), "desc.slot_dtype = %s; expected i32 or i64",
                    oscar__dtype_name(d.slot_dtype));
    OSCAR__VALIDATE(&v, d.dst_slots || d.num_tokens == 0, "desc.dst_slots = NULL; *must* be set");
    OSCAR__VALIDATE(&v, d.src_page_size >= 1, "desc.src_page_size = %d; expected >= 1", d.src_page_size);
    OSCAR__VALIDATE(&v,
                    d.src_head_stride > 0 && d.src_token_stride > 0 && d.src_page_stride > 0 &&
                        d.src_head_stride % 8 == 0 && d.src_token_stride % 8 == 0 && d.src_page_stride % 8 == 0,
                    "desc.src_{page,token,head}_stride = %lld, %lld, %lld; expected positive multiples of 8 elements "
                    "(16-byte rows)",
                    OSCAR__CAST(long long, d.src_page_stride), OSCAR__CAST(long long, d.src_token_stride),
                    OSCAR__CAST(long long, d.src_head_stride));
    OSCAR__VALIDATE(&v, d.k_clip_ratio >= 0.0f && d.k_clip_ratio <= 1.0f, "desc.k_clip_ratio = %g; expected 0 <= ratio <= 1",
                    OSCAR__CAST(double, d.k_clip_ratio));
    OSCAR__VALIDATE(&v, d.v_clip_ratio >= 0.0f && d.v_clip_ratio <= 1.0f, "desc.v_clip_ratio = %g; expected 0 <= ratio <= 1",
                    OSCAR__CAST(double, d.v_clip_ratio));
    OSCAR__VALIDATE(&v, d.mode > 0 && d.mode < OSCAR__QUANT_MODE_COUNT, "desc.mode = %d; expected an oscar_quant_mode",
                    OSCAR__CAST(int, d.mode));
    OSCAR__VALIDATE(&v, d.mode != OSCAR_QUANT_MODE_LLOYD_MAX || pool.group_size == pool.head_dim,
                    "desc.mode = LLOYD_MAX with pool.group_size = %d; Lloyd-Max codes need one group per row "
                    "(group_size = head_dim = %d)",
                    pool.group_size, pool.head_dim);
    for (l = 0; l < d.num_layers && l < 4096; l++) {
        const oscar_quantize_layer_desc *L = &layers[l];
        const void *kp = d.k_rotation_prepared ? d.k_rotation_prepared[l] : NULL;
        const void *vp = d.v_rotation_prepared ? d.v_rotation_prepared[l] : NULL;
        uintptr_t align = OSCAR__RCAST(uintptr_t, L->src_k) | OSCAR__RCAST(uintptr_t, L->src_v) |
                          OSCAR__RCAST(uintptr_t, L->k_rotation) | OSCAR__RCAST(uintptr_t, L->v_rotation);
        OSCAR__VALIDATE(&v, L->src_k && L->src_v, "layers[%d]: src_k = %p, src_v = %p; both *must* be set", l, L->src_k,
                        L->src_v);
        OSCAR__VALIDATE(&v, L->k_codes && L->v_codes && L->k_scales && L->v_scales,
                        "layers[%d]: k_codes, v_codes, k_scales and v_scales *must* be set", l);
        OSCAR__VALIDATE(&v, align % 16 == 0, "layers[%d]: sources and rotations must be 16-byte aligned", l);
        OSCAR__VALIDATE(&v, (OSCAR__RCAST(uintptr_t, kp) | OSCAR__RCAST(uintptr_t, vp)) % 16 == 0,
                        "desc.k_rotation_prepared[%d] = %p, desc.v_rotation_prepared[%d] = %p; expected 16-byte aligned",
                        l, kp, l, vp);
        OSCAR__VALIDATE(&v, !kp || L->k_rotation,
                        "desc.k_rotation_prepared[%d] = %p without layer %d's k_rotation; the f32 matrix *must* be set "
                        "with its image (a CTA that finds the image foreign stages from it)",
                        l, kp, l);
        OSCAR__VALIDATE(&v, !vp || L->v_rotation,
                        "desc.v_rotation_prepared[%d] = %p without layer %d's v_rotation; the f32 matrix *must* be set "
                        "with its image (a CTA that finds the image foreign stages from it)",
                        l, vp, l);
        OSCAR__VALIDATE(&v,
                        ((OSCAR__RCAST(uintptr_t, L->k_codes) | OSCAR__RCAST(uintptr_t, L->v_codes)) % 16 == 0) &&
                            ((OSCAR__RCAST(uintptr_t, L->k_scales) | OSCAR__RCAST(uintptr_t, L->v_scales)) %
                                 OSCAR__CAST(uintptr_t, oscar__scale_pair_bytes(pool.scale_layout)) ==
                             0),
                        "layers[%d]: pool arrays misaligned (codes 16 bytes, scales %d bytes)", l,
                        OSCAR__CAST(int, oscar__scale_pair_bytes(pool.scale_layout)));
        any_rot |= L->k_rotation != NULL || L->v_rotation != NULL;
    }
    if (ctx->backend == OSCAR_BACKEND_CUDA && !ctx->compile_only && any_rot &&
        oscar__quant_smem_bytes(D, 16, D == 256 ? 2 : 4, 1) > ctx->max_smem_optin)
        oscar__verr(&v, OSCAR_STATUS_UNSUPPORTED,
                    "head_dim %d with a rotation needs %lld bytes of shared memory per block; this device allows %d", D,
                    OSCAR__CAST(long long, oscar__quant_smem_bytes(D, 16, D == 256 ? 2 : 4, 1)), ctx->max_smem_optin);
    if (force && ctx->backend == OSCAR_BACKEND_CUDA)
        OSCAR__VALIDATE(&v, oscar__quant_tile_valid(ctx, D, force->rows_per_warp, force->warps_per_cta, any_rot),
                        "tile rows_per_warp = %d, warps_per_cta = %d: not a compiled candidate for head_dim %d, or too "
                        "much shared memory",
                        force->rows_per_warp, force->warps_per_cta, D);
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK || d.num_tokens == 0) return st;

    memset(p, 0, sizeof *p);
    p->pool = oscar__pool_params(&pool);
    p->src_slots = OSCAR__RCAST(uint64_t, d.src_slots);
    p->dst_slots = OSCAR__RCAST(uint64_t, d.dst_slots);
    p->num_tokens = d.num_tokens;
    p->src_page_stride = d.src_page_stride;
    p->src_token_stride = d.src_token_stride;
    p->src_head_stride = d.src_head_stride;
    p->src_page_size = d.src_page_size;
    p->slot_dtype = d.slot_dtype == OSCAR_DTYPE_I64 ? OSCAR_K_DTYPE_I64 : OSCAR_K_DTYPE_I32;
    p->k_clip_index = oscar__clip_index(d.k_clip_ratio, D);
    p->v_clip_index = oscar__clip_index(d.v_clip_ratio, D);
    p->lloyd_max = d.mode == OSCAR_QUANT_MODE_LLOYD_MAX;

    st = OSCAR_OK;
    for (l = 0; l < d.num_layers && st == OSCAR_OK; l += OSCAR_K_MAX_QUANT_LAYERS) {
        int32_t i, n = OSCAR__MIN(d.num_layers - l, OSCAR_K_MAX_QUANT_LAYERS), rot_here = 0, rot_k = 0, rot_v = 0;
        p->num_layers = n;
        for (i = 0; i < n; i++) {
            const oscar_quantize_layer_desc *L = &layers[l + i];
            oscar_quantize_layer *K = &p->layers[i];
            K->src_k = OSCAR__RCAST(uint64_t, L->src_k), K->src_v = OSCAR__RCAST(uint64_t, L->src_v);
            K->rot_k = OSCAR__RCAST(uint64_t, L->k_rotation), K->rot_v = OSCAR__RCAST(uint64_t, L->v_rotation);
            K->rot_k_prepared = OSCAR__RCAST(uint64_t, d.k_rotation_prepared ? d.k_rotation_prepared[l + i] : NULL);
            K->rot_v_prepared = OSCAR__RCAST(uint64_t, d.v_rotation_prepared ? d.v_rotation_prepared[l + i] : NULL);
            K->k_codes = OSCAR__RCAST(uint64_t, L->k_codes), K->v_codes = OSCAR__RCAST(uint64_t, L->v_codes);
            K->k_scales = OSCAR__RCAST(uint64_t, L->k_scales), K->v_scales = OSCAR__RCAST(uint64_t, L->v_scales);
            rot_k |= K->rot_k != 0, rot_v |= K->rot_v != 0;
        }
        rot_here = rot_k || rot_v;
        if (ctx->backend == OSCAR_BACKEND_CPU) {
            oscar__cpu_quantize(p, D, pool.group_size, oscar__k_dtype16(d.src_dtype));
        } else {
            char name[192];
            oscar__kernel *k;
            int64_t rows = d.num_tokens * H;
            oscar__quant_tile t;
            if (force) {
                t = *force;
            } else {
                /* the heuristic, unless the tuning table has this bucket */
                int32_t key[OSCAR__TUNE_MAX_KEYS];
                t = oscar__quant_choose(ctx, D, rows, 2 * n, rot_here);
                oscar__tune_quant_key(key, D, pool.group_size, d.src_dtype, pool.scale_layout, d.mode, rot_k + rot_v,
                                      (p->k_clip_index >= 0) + (p->v_clip_index >= 0), rows * 2 * n);
                oscar__tune_quant_apply(ctx, key, rot_here, &t.rows_per_warp, &t.warps_per_cta);
            }
            oscar__tune_last_quant[0] = t.rows_per_warp, oscar__tune_last_quant[1] = t.warps_per_cta;
            oscar__quant_ctas(ctx, D, &t, rows, n, rot_k, rot_v, p->k_clip_index >= 0, p->v_clip_index >= 0, p->side_ctas);
            oscar__name_quantize(name, sizeof name, D, pool.group_size, d.src_dtype, t.rows_per_warp, t.warps_per_cta);
            st = oscar__jit_get(ctx, "quantize.cuh", name, &k);
            if (st != OSCAR_OK) break;
            st = oscar__launch3(ctx, k, OSCAR__CAST(unsigned, OSCAR__MAX(p->side_ctas[0], p->side_ctas[1])), OSCAR__CAST(unsigned, n), 2,
                                OSCAR__CAST(unsigned, 32 * t.warps_per_cta),
                                OSCAR__CAST(unsigned, oscar__quant_smem_bytes(D, t.rows_per_warp, t.warps_per_cta, rot_here)),
                                stream, p);
        }
    }
    return st;
}

OSCAR_API oscar_status oscar_quantize_kv(oscar_ctx *ctx, const oscar_quantize_desc *desc, oscar_stream stream) {
    return oscar__quantize_kv_tiled(ctx, desc, stream, NULL);
}

/* ---- prepared rotations -------------------------------------------------- */
OSCAR_API size_t oscar_rotation_prepared_bytes(int32_t head_dim) {
    if (head_dim != 64 && head_dim != 128 && head_dim != 256) return 0;
    return OSCAR_K_ROT_PREP_HEADER + 4 * OSCAR__CAST(size_t, head_dim) * OSCAR__CAST(size_t, head_dim);
}

OSCAR_API oscar_status oscar_prepare_rotation(oscar_ctx *ctx, const oscar_rotation_prepare_desc *desc, oscar_stream stream) {
    oscar__validator v;
    oscar_rotation_prepare_desc d;
    size_t need;
    OSCAR__REQUIRE_CTX(ctx, "oscar_prepare_rotation");
    if (!desc) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_prepare_rotation: desc = NULL");
    d = *desc;
    d.src_dtype = oscar__def(d.src_dtype, OSCAR_DTYPE_BF16);
    need = oscar_rotation_prepared_bytes(d.head_dim);
    oscar__validate_begin(&v, ctx, "oscar_prepare_rotation");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    OSCAR__VALIDATE(&v, need > 0, "desc.head_dim = %d; expected 64, 128 or 256", d.head_dim);
    OSCAR__VALIDATE(&v, d.src_dtype == OSCAR_DTYPE_BF16 || d.src_dtype == OSCAR_DTYPE_F16,
                    "desc.src_dtype = %s; expected bf16 or f16", oscar__dtype_name(d.src_dtype));
    OSCAR__VALIDATE(&v, d.rotation != NULL, "desc.rotation = NULL; *must* be set");
    OSCAR__VALIDATE(&v, OSCAR__RCAST(uintptr_t, d.rotation) % 16 == 0, "desc.rotation = %p; expected 16-byte aligned",
                    OSCAR__CAST(const void *, d.rotation));
    OSCAR__VALIDATE(&v, d.out != NULL, "desc.out = NULL; *must* be set");
    OSCAR__VALIDATE(&v, OSCAR__RCAST(uintptr_t, d.out) % 16 == 0, "desc.out = %p; expected 16-byte aligned", d.out);
    OSCAR__VALIDATE(&v, need == 0 || d.out_bytes >= need,
                    "desc.out_bytes = %llu; expected >= %llu (oscar_rotation_prepared_bytes(%d))",
                    OSCAR__CAST(unsigned long long, d.out_bytes), OSCAR__CAST(unsigned long long, need), d.head_dim);
    {
        const oscar_status st = oscar__validate_end(&v);
        if (st != OSCAR_OK) return st;
    }
    {
        const int dk = oscar__k_dtype16(d.src_dtype);
        oscar_rotation_prepare_params p;
        char name[96];
        oscar__kernel *k;
        oscar_status st;
        if (ctx->backend == OSCAR_BACKEND_CPU) {
            oscar__cpu_rotation_image(d.rotation, d.head_dim, dk, OSCAR__CAST(uint8_t *, d.out));
            return OSCAR_OK;
        }
        p.rotation = OSCAR__RCAST(uint64_t, d.rotation), p.out = OSCAR__RCAST(uint64_t, d.out);
        oscar__name_rotation_prepare(name, sizeof name, d.head_dim, d.src_dtype);
        st = oscar__jit_get(ctx, "quantize.cuh", name, &k);
        if (st != OSCAR_OK) return st;
        return oscar__launch(ctx, k, OSCAR__CAST(unsigned, (d.head_dim * d.head_dim / 8 + 255) / 256), 256, 0, stream, &p);
    }
}

#endif /* OSCAR_QUANTIZE_H_INCLUDED */
