/*
 * The planner: everything that depends only on (config, batch shape). It holds
 * the host side's only copy of the semantics page's block arithmetic, builds
 * the per-sequence tables every backend receives, the query-tile list, the
 * ordered stage list and the workspace layout.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

/* Semantics 1: Nc = floor((T - l) / d) + 1 when T >= l, else 0. */
int64_t nsa_num_cmp_blocks(int64_t len, int64_t l, int64_t d) { return len >= l ? (len - l) / d + 1 : 0; }

/* Semantics 3: Ns = ceil(T / l_s). */
int64_t nsa_num_slc_blocks(int64_t len, int64_t ls) { return (len + ls - 1) / ls; }

/* Largest token count a plan accepts: keeps T * H * D products inside int64. */
#define MAX_TOKENS (INT64_C(1) << 40)
#define WS_ALIGN 256

static int supports(const nsa_context *ctx, nsa_stage st, const nsa_config *cfg)
{
    if (!ctx->be->supports)
        return cfg->dtype != NSA_DTYPE_F64 && st != NSA_STAGE_SCORES_TOPN && st <= NSA_STAGE_COMBINE;
    return ctx->be->supports(ctx->bctx, st, cfg);
}

/* Appends `count` elements of `esize` bytes to the layout; -1 when unused. */
static nsa_status reserve(nsa_ws_layout *ws, int64_t count, size_t esize, int64_t *at)
{
    int64_t bytes, end;
    if (nsa_ck_mul(count, (int64_t)esize, &bytes) || nsa_ck_add(bytes, WS_ALIGN - 1, &bytes) ||
        nsa_ck_add((int64_t)ws->bytes, bytes / WS_ALIGN * WS_ALIGN, &end) || (uint64_t)end > (uint64_t)SIZE_MAX)
        return nsa_set_error(NSA_ERR_INVALID_SHAPE, "nsa_plan_create: the workspace would exceed 2^63 bytes");
    *at = (int64_t)ws->bytes;
    ws->bytes = (size_t)end;
    return NSA_SUCCESS;
}

static nsa_status plan_stages(nsa_plan *p)
{
    const nsa_config *c = &p->bk.cfg;
    nsa_stage want[NSA_MAX_STAGES];
    int n = 0;
    /* the dtype first, whatever the batch: COMBINE depends on nothing else, so a
     * backend that refuses it lacks the dtype (f64 on a GPU backend) */
    if (!supports(p->ctx, NSA_STAGE_COMBINE, c))
        return nsa_set_error(NSA_ERR_UNSUPPORTED, "nsa_plan_create: backend %s does not support dtype %s%s",
                             p->ctx->backend_name, nsa_dtype_name(c->dtype),
                             c->dtype == NSA_DTYPE_F64 ? " (f64 runs on the cpu backend only)" : "");
    if (p->bk.total_tokens == 0 && p->bk.total_keys == 0) { /* a shard without queries has key gradients */
        p->num_stages = 0;
        return NSA_SUCCESS;
    }
    if (p->bk.total_cmp > 0) want[n++] = NSA_STAGE_COMPRESS;
    want[n++] = NSA_STAGE_CMP_ATTN;
    if (c->num_selected > 0) {
        if (supports(p->ctx, NSA_STAGE_SCORES_TOPN, c)) {
            want[n++] = NSA_STAGE_SCORES_TOPN;
        } else {
            want[n++] = NSA_STAGE_BLOCK_SCORES;
            want[n++] = NSA_STAGE_SELECT_TOPN;
        }
        /* the fused stage where offered: no o_b[SLC] in the workspace */
        p->bk.slc_combined = supports(p->ctx, NSA_STAGE_SLC_COMBINE, c);
        want[n++] = p->bk.slc_combined ? NSA_STAGE_SLC_COMBINE : NSA_STAGE_SLC_ATTN;
    }
    if (c->window > 0 && supports(p->ctx, NSA_STAGE_WIN_COMBINE, c)) {
        want[n++] = NSA_STAGE_WIN_COMBINE; /* no o_b[WIN] in the workspace */
    } else {
        if (c->window > 0) want[n++] = NSA_STAGE_WIN_ATTN;
        want[n++] = NSA_STAGE_COMBINE;
    }
    for (int i = 0; i < n; i++) {
        if (!supports(p->ctx, want[i], c))
            return nsa_set_error(NSA_ERR_UNSUPPORTED,
                                 "nsa_plan_create: backend %s does not support stage %s for dtype %s, Dqk = %lld, "
                                 "Dv = %lld, G = %lld",
                                 p->ctx->backend_name, nsa_stage_name(want[i]), nsa_dtype_name(c->dtype),
                                 (long long)c->head_dim_qk, (long long)c->head_dim_v,
                                 (long long)(c->num_q_heads / c->num_kv_heads));
        p->stages[i] = want[i];
    }
    p->num_stages = n;
    p->num_bwd_stages = 0;
    if (!(c->flags & NSA_CONFIG_TRAINING)) return NSA_SUCCESS;
    /* backward (section 9): the compressed K/V again, then each branch's gradients */
    n = 0;
    if (p->bk.total_cmp > 0) want[n++] = NSA_STAGE_COMPRESS;
    want[n++] = NSA_STAGE_BWD_CMP_ATTN;
    if (p->bk.total_cmp > 0 && c->compress != NSA_COMPRESS_EXTERNAL) want[n++] = NSA_STAGE_BWD_COMPRESS;
    if (c->num_selected > 0) want[n++] = NSA_STAGE_BWD_SLC_ATTN;
    if (c->window > 0) want[n++] = NSA_STAGE_BWD_WIN_ATTN;
    want[n++] = NSA_STAGE_BWD_STORE;
    for (int i = 0; i < n; i++) {
        if (!supports(p->ctx, want[i], c))
            return nsa_set_error(NSA_ERR_UNSUPPORTED,
                                 "nsa_plan_create: cfg->flags has NSA_CONFIG_TRAINING, but backend %s has no backward "
                                 "stage %s for dtype %s, Dqk = %lld, Dv = %lld, G = %lld (the cpu backend has the "
                                 "backward)",
                                 p->ctx->backend_name, nsa_stage_name(want[i]), nsa_dtype_name(c->dtype),
                                 (long long)c->head_dim_qk, (long long)c->head_dim_v,
                                 (long long)(c->num_q_heads / c->num_kv_heads));
        p->bwd_stages[i] = want[i];
    }
    p->num_bwd_stages = n;
    return NSA_SUCCESS;
}

static int has_stage(const nsa_plan *p, nsa_stage st)
{
    for (int i = 0; i < p->num_stages; i++)
        if (p->stages[i] == st) return 1;
    return 0;
}

static nsa_status plan_workspace(nsa_plan *p)
{
    const nsa_config *c = &p->bk.cfg;
    const int64_t T = p->bk.total_tokens, hq = c->num_q_heads, hkv = c->num_kv_heads;
    nsa_ws_layout *ws = &p->ws;
    nsa_status s;
    *ws = (nsa_ws_layout){.kc = -1, .vc = -1, .lse_cmp = -1, .scores = -1, .indices = -1, .o_b = {-1, -1, -1},
                          .dq_acc = -1, .dk_acc = {-1, -1, -1}, .dv_acc = {-1, -1, -1}, .dkc_acc = -1,
                          .dvc_acc = -1, .dw_k_acc = -1, .dw_v_acc = -1, .dpe_k_acc = -1, .dpe_v_acc = -1,
                          .delta = -1};
    if (T == 0 && p->bk.total_keys == 0) return NSA_SUCCESS;
    /* the float type's elements (4 bytes, 8 in an f64 call: nsa_bk_float_dtype);
     * scores and indices are 4 bytes in every call */
    const size_t fe = nsa_dtype_size(nsa_bk_float_dtype(c->dtype));
    int64_t nk, nv, nt, ns, ni, no, ck, tk, kk;
    if (nsa_ck_mul(p->bk.total_cmp, hkv, &ck) || nsa_ck_mul(ck, c->head_dim_qk, &nk) ||
        nsa_ck_mul(ck, c->head_dim_v, &nv) || nsa_ck_mul(T, hq, &nt) || nsa_ck_mul(T, hkv, &tk) ||
        nsa_ck_mul(p->bk.total_keys, hkv, &kk) ||
        nsa_ck_mul(tk, p->bk.max_ns, &ns) || nsa_ck_mul(tk, c->num_selected, &ni) ||
        nsa_ck_mul(nt, c->head_dim_v, &no))
        return nsa_set_error(NSA_ERR_INVALID_SHAPE, "nsa_plan_create: the workspace size overflows 64 bits");
    if ((s = reserve(ws, nk, fe, &ws->kc)) || (s = reserve(ws, nv, fe, &ws->vc)) ||
        (s = reserve(ws, nt, fe, &ws->lse_cmp)) || (s = reserve(ws, no, fe, &ws->o_b[NSA_BRANCH_CMP])))
        return s;
    if (c->num_selected > 0) {
        if (!has_stage(p, NSA_STAGE_SCORES_TOPN) && (s = reserve(ws, ns, 4, &ws->scores))) return s;
        if ((s = reserve(ws, ni, 4, &ws->indices)) ||
            (!has_stage(p, NSA_STAGE_SLC_COMBINE) && (s = reserve(ws, no, fe, &ws->o_b[NSA_BRANCH_SLC]))))
            return s;
    }
    if (c->window > 0 && !has_stage(p, NSA_STAGE_WIN_COMBINE) && (s = reserve(ws, no, fe, &ws->o_b[NSA_BRANCH_WIN])))
        return s;
    if (!(c->flags & NSA_CONFIG_TRAINING)) return NSA_SUCCESS;
    /* backward: the float accumulators (zero-filled as one range; f64 in an f64
     * call, so its gradients keep fp64 accuracy between stages), then delta */
    const int64_t l = c->cmp_block, dk = c->head_dim_qk, dv = c->head_dim_v;
    /* hkv * l (< 2^36) and dk * dk, dv * dv (< 2^28) cannot overflow: config.c
     * bounds heads by 2^16, l by 2^20 and head dims by 2^14 */
    int64_t nq, tkk, tkv, wk, wv, pk, pv;
    if (nsa_ck_mul(nt, dk, &nq) || nsa_ck_mul(kk, dk, &tkk) || nsa_ck_mul(kk, dv, &tkv) ||
        nsa_ck_mul(hkv * l, dk * dk, &wk) || nsa_ck_mul(hkv * l, dv * dv, &wv) || nsa_ck_mul(hkv * l, dk, &pk) ||
        nsa_ck_mul(hkv * l, dv, &pv))
        return nsa_set_error(NSA_ERR_INVALID_SHAPE, "nsa_plan_create: the backward workspace size overflows 64 bits");
    ws->acc_begin = (int64_t)ws->bytes;
    if ((s = reserve(ws, nq, fe, &ws->dq_acc)) || (s = reserve(ws, nk, fe, &ws->dkc_acc)) ||
        (s = reserve(ws, nv, fe, &ws->dvc_acc)))
        return s;
    const int on[3] = {1, c->num_selected > 0, c->window > 0};
    for (int b = 0; b < 3; b++) {
        ws->dk_acc[b] = ws->dv_acc[b] = -1;
        if (!on[b] || (b == NSA_BRANCH_CMP && c->compress == NSA_COMPRESS_EXTERNAL)) continue;
        if ((s = reserve(ws, tkk, fe, &ws->dk_acc[b])) || (s = reserve(ws, tkv, fe, &ws->dv_acc[b]))) return s;
    }
    ws->dw_k_acc = ws->dw_v_acc = ws->dpe_k_acc = ws->dpe_v_acc = -1;
    if (c->compress == NSA_COMPRESS_LINEAR &&
        ((s = reserve(ws, wk, fe, &ws->dw_k_acc)) || (s = reserve(ws, wv, fe, &ws->dw_v_acc)) ||
         (s = reserve(ws, pk, fe, &ws->dpe_k_acc)) || (s = reserve(ws, pv, fe, &ws->dpe_v_acc))))
        return s;
    ws->acc_end = (int64_t)ws->bytes;
    return reserve(ws, nt, fe, &ws->delta);
}

/* Every count the plan needs, from the offsets alone (cu: the queries', ck: the
 * keys'): allocates nothing, so that the stage list and the workspace are
 * validated before any host table exists. Block counts are the keys'; query
 * tiles cover the query rows. */
static nsa_status plan_shape(nsa_plan *p, const int64_t *cu, const int64_t *ck, int64_t B)
{
    const nsa_config *c = &p->bk.cfg;
    const int64_t tile = p->ctx->be->query_tile;
    int64_t total_cmp = 0, ntiles = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t len = ck[b + 1] - ck[b], tq = cu[b + 1] - cu[b]; /* 0 <= tq <= len <= 2^40: checked by the caller */
        int64_t nc = nsa_num_cmp_blocks(len, c->cmp_block, c->cmp_stride);
        int64_t ns = nsa_num_slc_blocks(len, c->slc_block);
        if (nsa_ck_add(total_cmp, nc, &total_cmp) || (tile > 0 && nsa_ck_add(ntiles, tq / tile + (tq % tile != 0), &ntiles)))
            return nsa_set_error(NSA_ERR_INVALID_SHAPE, "nsa_plan_create: the block counts of cu_seqlens overflow 64 bits");
        if (len > p->bk.max_len) p->bk.max_len = len;
        if (nc > p->bk.max_nc) p->bk.max_nc = nc;
        if (ns > p->bk.max_ns) p->bk.max_ns = ns;
    }
    p->bk.batch = B;
    p->bk.total_tokens = cu[B];
    p->bk.total_keys = ck[B];
    p->bk.total_cmp = total_cmp;
    p->bk.query_tile = tile > 0 ? tile : 0;
    p->bk.num_tiles = tile > 0 ? ntiles : 0;
    return NSA_SUCCESS;
}

/* Host tables, and their device copy when the backend wants one. Sizes are
 * checked here before the first allocation. */
static nsa_status plan_tables(nsa_plan *p, const int64_t *cu, const int64_t *ck, int64_t B)
{
    const nsa_config *c = &p->bk.cfg;
    const int64_t T = p->bk.total_tokens, tile = p->bk.query_tile, ntiles = p->bk.num_tiles;
    const int split = ck != cu; /* the keys' offsets differ from the queries' */
    /* B <= 2^32, T <= 2^40, ntiles <= T: no overflow */
    const int64_t n = (2 + split) * (B + 1) + T + 2 * ntiles;
    size_t cu_bytes, tok_bytes, tile_bytes, dev_bytes = 0;
    if (nsa_ck_bytes(B + 1, sizeof(int64_t), &cu_bytes) || nsa_ck_bytes(T > 0 ? T : 1, sizeof(int64_t), &tok_bytes) ||
        nsa_ck_bytes(ntiles > 0 ? 2 * ntiles : 2, sizeof(int64_t), &tile_bytes) ||
        nsa_ck_bytes(n, sizeof(int64_t), &dev_bytes))
        return nsa_set_error(NSA_ERR_INVALID_SHAPE, "nsa_plan_create: the plan's tables for %lld tokens would not fit "
                             "in memory addresses", (long long)T);
    p->cu_seqlens = malloc(cu_bytes);
    p->cu_cmp = malloc(cu_bytes);
    p->tok_seq = malloc(tok_bytes);
    if (split) p->cu_seqlens_k = malloc(cu_bytes);
    if (!p->cu_seqlens || !p->cu_cmp || !p->tok_seq || (split && !p->cu_seqlens_k))
        return nsa_set_error(NSA_ERR_OUT_OF_MEMORY, "nsa_plan_create: out of host memory for %lld tokens",
                             (long long)T);
    p->cu_cmp[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        p->cu_seqlens[b] = cu[b];
        if (split) p->cu_seqlens_k[b] = ck[b];
        p->cu_cmp[b + 1] = p->cu_cmp[b] + nsa_num_cmp_blocks(ck[b + 1] - ck[b], c->cmp_block, c->cmp_stride);
        for (int64_t t = cu[b]; t < cu[b + 1]; t++) p->tok_seq[t] = b;
    }
    p->cu_seqlens[B] = T;
    if (split) p->cu_seqlens_k[B] = ck[B];
    if (tile > 0) {
        p->tiles = malloc(tile_bytes);
        if (!p->tiles) return nsa_set_error(NSA_ERR_OUT_OF_MEMORY, "nsa_plan_create: out of host memory for tiles");
        int64_t k = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t0 = 0; t0 < cu[b + 1] - cu[b]; t0 += tile) {
                p->tiles[2 * k] = b;
                p->tiles[2 * k + 1] = t0;
                k++;
            }
    }
    p->bk.cu_seqlens = p->cu_seqlens;
    p->bk.cu_seqlens_k = split ? p->cu_seqlens_k : p->cu_seqlens;
    p->bk.cu_cmp = p->cu_cmp;
    p->bk.tok_seq = p->tok_seq;
    p->bk.tiles = p->tiles;
    p->bk.dev_tables = NULL;
    p->bk.dev_cu_seqlens = p->bk.dev_cu_cmp = p->bk.dev_tok_seq = p->bk.dev_tiles = p->bk.dev_cu_seqlens_k = -1;

    if (!p->ctx->be->wants_device_tables) return NSA_SUCCESS;
    nsa_status s = nsa_buffer_alloc(p->ctx, dev_bytes, &p->tables);
    if (s != NSA_SUCCESS) return s;
    nsa_buffer_mark_internal(p->tables);
    /* one host image of the four tables, uploaded with one write */
    int64_t *img = malloc(dev_bytes);
    if (!img) return nsa_set_error(NSA_ERR_OUT_OF_MEMORY, "nsa_plan_create: out of host memory for the tables");
    p->bk.dev_cu_seqlens = 0;
    p->bk.dev_cu_cmp = B + 1;
    p->bk.dev_tok_seq = 2 * (B + 1);
    p->bk.dev_tiles = 2 * (B + 1) + T;
    p->bk.dev_cu_seqlens_k = split ? 2 * (B + 1) + T + 2 * ntiles : p->bk.dev_cu_seqlens;
    if (split) memcpy(img + p->bk.dev_cu_seqlens_k, p->cu_seqlens_k, cu_bytes);
    memcpy(img + p->bk.dev_cu_seqlens, p->cu_seqlens, cu_bytes);
    memcpy(img + p->bk.dev_cu_cmp, p->cu_cmp, cu_bytes);
    if (T > 0) memcpy(img + p->bk.dev_tok_seq, p->tok_seq, (size_t)T * sizeof(int64_t));
    if (ntiles > 0) memcpy(img + p->bk.dev_tiles, p->tiles, (size_t)(2 * ntiles) * sizeof(int64_t));
    s = nsa_buffer_write(p->tables, 0, img, dev_bytes);
    free(img);
    if (s != NSA_SUCCESS) return s;
    p->bk.dev_tables = p->tables->bbuf;
    return NSA_SUCCESS;
}

static void plan_free(nsa_plan *p)
{
    if (p->prepared && p->ctx->be->plan_release) p->ctx->be->plan_release(p->ctx->bctx, &p->bk);
    nsa_buffer_release(p->tables);
    nsa_buffer_release(p->own_ws);
    free(p->cu_seqlens);
    free(p->cu_seqlens_k);
    free(p->cu_cmp);
    free(p->tok_seq);
    free(p->tiles);
    free(p);
}

nsa_status (nsa_plan_create)(nsa_context *ctx, const nsa_config *cfg, const int64_t *cu_seqlens, int64_t batch,
                             nsa_plan **out)
{
    return nsa_plan_create_sized(ctx, cfg, NSA_CONFIG_SIZE_FIRST, cu_seqlens, batch, out);
}

static void log_plan(const nsa_plan *p);

/* The plan's stage names, space-separated (nsa_plan_info.stages, the log) */
static void stage_names(const nsa_stage *st, int count, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < count; i++) {
        int n = snprintf(buf + used, size - used, "%s%s", i ? " " : "", nsa_stage_name(st[i]));
        if (n > 0 && (size_t)n < size - used) used += (size_t)n;
    }
}

static void stage_list(const nsa_plan *p, char *buf, size_t size) { stage_names(p->stages, p->num_stages, buf, size); }

/* cu_seqlens-style offsets: [0] == 0, non-decreasing, at most MAX_TOKENS in all */
static nsa_status check_offsets(const int64_t *cu, int64_t batch, const char *fn, const char *name)
{
    if (cu[0] != 0)
        return nsa_set_error(NSA_ERR_INVALID_SHAPE, "%s: %s[0] = %lld, but it must be 0", fn, name, (long long)cu[0]);
    for (int64_t b = 0; b < batch; b++)
        if (cu[b + 1] < cu[b])
            return nsa_set_error(NSA_ERR_INVALID_SHAPE,
                                 "%s: %s decreases at index %lld (%lld -> %lld); offsets must be non-decreasing", fn,
                                 name, (long long)(b + 1), (long long)cu[b], (long long)cu[b + 1]);
    if (cu[batch] > MAX_TOKENS)
        return nsa_set_error(NSA_ERR_INVALID_SHAPE,
                             "%s: %s[%lld] = %lld: the batch's total token count exceeds the limit of 2^40", fn, name,
                             (long long)batch, (long long)cu[batch]);
    return NSA_SUCCESS;
}

/* nsa_plan_create and nsa_plan_create_varlen; ck == cu for the former */
static nsa_status plan_create(nsa_context *ctx, const nsa_config *cfg_in, size_t cfg_size, const int64_t *cu,
                              const int64_t *ck, int64_t batch, nsa_plan **out, int varlen)
{
    const char *fn = varlen ? "nsa_plan_create_varlen" : "nsa_plan_create";
    nsa_clear_error();
    if (!out) return nsa_set_error(NSA_ERR_NULL_POINTER, "%s: out is NULL", fn);
    *out = NULL;
    if (!ctx) return nsa_set_error(NSA_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    if (!cfg_in) return nsa_set_error(NSA_ERR_NULL_POINTER, "%s: cfg is NULL", fn);
    const char *qname = varlen ? "cu_seqlens_q" : "cu_seqlens";
    if (!cu) return nsa_set_error(NSA_ERR_NULL_POINTER, "%s: %s is NULL", fn, qname);
    if (!ck) ck = cu;
    nsa_config cfg_full;
    const nsa_config *cfg = &cfg_full;
    nsa_status s = nsa_config_take(cfg_in, cfg_size, &cfg_full, fn);
    if (s != NSA_SUCCESS) return s;
    s = nsa_config_check(cfg, fn);
    if (s != NSA_SUCCESS) return s;
    if (batch < 0 || batch > (INT64_C(1) << 32))
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "%s: batch = %lld must be in [0, 2^32]", fn, (long long)batch);
    if ((s = check_offsets(cu, batch, fn, qname)) != NSA_SUCCESS) return s;
    int shard = 0; /* some sequence has fewer queries than keys */
    if (ck != cu) {
        if ((s = check_offsets(ck, batch, fn, "cu_seqlens_k")) != NSA_SUCCESS) return s;
        for (int64_t b = 0; b < batch; b++) {
            const int64_t tq = cu[b + 1] - cu[b], tk = ck[b + 1] - ck[b];
            if (tq > tk)
                return nsa_set_error(NSA_ERR_INVALID_SHAPE,
                                     "%s: sequence %lld has %lld queries (cu_seqlens_q) but %lld keys (cu_seqlens_k); "
                                     "its queries are the last positions of its keys, so it needs at least as many "
                                     "keys as queries",
                                     fn, (long long)b, (long long)tq, (long long)tk);
            shard |= tq < tk;
        }
        if (!shard) ck = cu; /* the same shape as nsa_plan_create's */
    }
    if (shard && !ctx->be->shards)
        return nsa_set_error(NSA_ERR_UNSUPPORTED,
                             "%s: backend %s does not run plans whose queries sit at an offset of their keys (a "
                             "sequence with fewer queries in cu_seqlens_q than keys in cu_seqlens_k); the cpu and "
                             "opencl backends do",
                             fn, ctx->backend_name);

    nsa_plan *p = calloc(1, sizeof *p);
    if (!p) return nsa_set_error(NSA_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    p->ctx = ctx;
    p->bk.cfg = *cfg;
    if (p->bk.cfg.scale == 0.0f) p->bk.cfg.scale = (float)(1.0 / sqrt((double)cfg->head_dim_qk));
    /* counts, stages and workspace first (no allocation), host tables last */
    if ((s = plan_shape(p, cu, ck, batch)) || (s = plan_stages(p)) || (s = plan_workspace(p)) ||
        (s = plan_tables(p, cu, ck, batch))) {
        plan_free(p);
        return s;
    }
    if (ctx->be->plan_prepare) {
        if ((s = ctx->be->plan_prepare(ctx->bctx, &p->bk)) != NSA_SUCCESS) {
            nsa_backend_error(s, ctx->backend_name, "preparing a plan");
            plan_free(p);
            return s;
        }
        p->prepared = 1;
    }
    ctx->live_plans++;
    log_plan(p);
    nsa_clear_error();
    *out = p;
    return NSA_SUCCESS;
}

nsa_status nsa_plan_create_sized(nsa_context *ctx, const nsa_config *cfg_in, size_t cfg_size,
                                 const int64_t *cu_seqlens, int64_t batch, nsa_plan **out)
{
    return plan_create(ctx, cfg_in, cfg_size, cu_seqlens, cu_seqlens, batch, out, 0);
}

nsa_status nsa_plan_create_varlen_sized(nsa_context *ctx, const nsa_config *cfg, size_t cfg_size,
                                        const int64_t *cu_seqlens_q, const int64_t *cu_seqlens_k, int64_t batch,
                                        nsa_plan **out)
{
    return plan_create(ctx, cfg, cfg_size, cu_seqlens_q, cu_seqlens_k, batch, out, 1);
}

/* INFO: the plan's size, stages and workspace; DEBUG: each stage's kernel */
static void log_plan(const nsa_plan *p)
{
    if (!nsa_log_enabled(NSA_LOG_INFO)) return;
    char stages[sizeof ((nsa_plan_info *)0)->stages];
    stage_list(p, stages, sizeof stages);
    nsa_log(NSA_LOG_INFO, "plan on %s: %lld tokens in %lld sequences, stages %s, workspace %zu bytes",
            p->ctx->backend_name, (long long)p->bk.total_tokens, (long long)p->bk.batch, stages, p->ws.bytes);
    for (int i = 0; i < p->num_stages && p->prepared && p->ctx->be->stage_kernel && nsa_log_enabled(NSA_LOG_DEBUG);
         i++) {
        char k[128];
        if (p->ctx->be->stage_kernel(p->ctx->bctx, &p->bk, p->stages[i], k, sizeof k) == NSA_SUCCESS) {
            k[sizeof k - 1] = '\0';
            nsa_log(NSA_LOG_DEBUG, "plan: stage %s runs %s", nsa_stage_name(p->stages[i]), k);
        }
    }
}

nsa_status nsa_plan_destroy(nsa_plan *plan)
{
    nsa_clear_error();
    if (!plan) return NSA_SUCCESS;
    plan->ctx->live_plans--;
    plan_free(plan);
    return NSA_SUCCESS;
}

nsa_status (nsa_plan_get_info)(const nsa_plan *plan, nsa_plan_info *info)
{
    return nsa_plan_get_info_sized(plan, info, NSA_PLAN_INFO_SIZE_FIRST);
}

nsa_status nsa_plan_get_info_sized(const nsa_plan *plan, nsa_plan_info *out, size_t info_size)
{
    nsa_clear_error();
    if (!plan) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_plan_get_info: plan is NULL");
    if (!out) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_plan_get_info: info is NULL");
    nsa_plan_info full, *info = &full;
    memset(info, 0, sizeof *info);
    info->batch = plan->bk.batch;
    info->total_tokens = plan->bk.total_tokens;
    info->total_cmp_blocks = plan->bk.total_cmp;
    info->max_cmp_blocks = plan->bk.max_nc;
    info->max_slc_blocks = plan->bk.max_ns;
    info->workspace_bytes = plan->ws.bytes;
    /* the core's device tables (sequence offsets, each token's sequence) and the backend's own */
    info->backend_bytes = (plan->tables ? plan->tables->size : 0) + plan->bk.backend_bytes;
    info->num_stages = plan->num_stages;
    stage_list(plan, info->stages, sizeof info->stages);
    info->num_bwd_stages = plan->num_bwd_stages;
    stage_names(plan->bwd_stages, plan->num_bwd_stages, info->bwd_stages, sizeof info->bwd_stages);
    info->total_keys = plan->bk.total_keys;
    return nsa_struct_out(out, info_size, NSA_PLAN_INFO_SIZE_FIRST, info, sizeof *info, "nsa_plan_get_info", "info");
}

nsa_status nsa_plan_stage_kernel(const nsa_plan *plan, int index, char *name, size_t size)
{
    nsa_clear_error();
    if (!plan) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_plan_stage_kernel: plan is NULL");
    if (!name) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_plan_stage_kernel: name is NULL");
    if (size == 0) return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_plan_stage_kernel: size is 0");
    name[0] = '\0';
    if (index < 0 || index >= plan->num_stages + plan->num_bwd_stages)
        return nsa_set_error(NSA_ERR_INVALID_VALUE,
                             "nsa_plan_stage_kernel: index = %d, but the plan has %d stages (%d forward, %d backward)",
                             index, plan->num_stages + plan->num_bwd_stages, plan->num_stages, plan->num_bwd_stages);
    const nsa_stage st = index < plan->num_stages ? plan->stages[index] : plan->bwd_stages[index - plan->num_stages];
    if (!plan->ctx->be->stage_kernel || !plan->prepared) {
        snprintf(name, size, "%s", nsa_stage_name(st));
        return NSA_SUCCESS;
    }
    nsa_status s = nsa_backend_error(plan->ctx->be->stage_kernel(plan->ctx->bctx, &plan->bk, st, name, size),
                                     plan->ctx->backend_name, "naming the kernel of stage %s", nsa_stage_name(st));
    name[size - 1] = '\0';
    if (s == NSA_SUCCESS) nsa_clear_error();
    return s;
}

/* ------------------------------------------------------------------ decode plans */

/* The decode stages and workspace (semantics 10): the packed step rows' float
 * per-branch outputs o_b, lse_cmp and (n > 0) the selected indices, for
 * lim.max_total_tokens rows. */
static nsa_status decode_plan_shape(nsa_plan *p)
{
    const nsa_config *c = &p->bk.cfg;
    const nsa_decode_limits *lim = &p->bk.lim;
    const int64_t hq = c->num_q_heads, hkv = c->num_kv_heads, MT = lim->max_total_tokens;
    nsa_status s;
    /* the dtype first (COMBINE), as for a forward plan, then the decode stages */
    if (!supports(p->ctx, NSA_STAGE_COMBINE, c))
        return nsa_set_error(NSA_ERR_UNSUPPORTED, "nsa_decode_plan_create: backend %s does not support dtype %s%s",
                             p->ctx->backend_name, nsa_dtype_name(c->dtype),
                             c->dtype == NSA_DTYPE_F64 ? " (f64 runs on the cpu backend only)" : "");
    const nsa_stage want[2] = {NSA_STAGE_DECODE_APPEND, NSA_STAGE_DECODE_ATTN};
    for (int i = 0; i < 2; i++) {
        if (!supports(p->ctx, want[i], c))
            return nsa_set_error(NSA_ERR_UNSUPPORTED,
                                 "nsa_decode_plan_create: backend %s has no decode step yet (stage %s; the cpu "
                                 "backend has it)",
                                 p->ctx->backend_name, nsa_stage_name(want[i]));
        p->stages[i] = want[i];
    }
    p->num_stages = 2;
    p->num_bwd_stages = 0;
    /* block counts of the longest context: what a step may read */
    p->bk.batch = lim->batch;
    p->bk.total_tokens = MT;
    p->bk.max_len = lim->max_context;
    p->bk.max_nc = nsa_num_cmp_blocks(lim->max_context, c->cmp_block, c->cmp_stride);
    p->bk.max_ns = nsa_num_slc_blocks(lim->max_context, c->slc_block);
    p->bk.total_cmp = 0;
    p->bk.query_tile = 0;
    p->bk.num_tiles = 0;
    p->bk.dev_cu_seqlens = p->bk.dev_cu_cmp = p->bk.dev_tok_seq = p->bk.dev_tiles = p->bk.dev_cu_seqlens_k = -1;
    p->bk.total_keys = MT;
    /* the caches' and tables' element counts must fit 64 bits (the views are
     * checked against their buffers at each step) */
    int64_t x;
    const int64_t dmax = c->head_dim_qk > c->head_dim_v ? c->head_dim_qk : c->head_dim_v;
    const int64_t f1[4] = {lim->num_pages, lim->page_size, hkv, dmax};
    const int64_t f2[4] = {lim->num_cmp_pages, lim->cmp_page_size, hkv, dmax};
    const int64_t f3[2] = {lim->batch, lim->max_pages}, f4[2] = {lim->batch, lim->max_cmp_pages};
    const int64_t f5[2] = {lim->max_pages, lim->page_size}, f6[2] = {lim->max_cmp_pages, lim->cmp_page_size};
    const int64_t f7[4] = {lim->max_context, hkv, dmax, 8};
    if (nsa_ck_prod(f1, 4, &x) || nsa_ck_prod(f2, 4, &x) || nsa_ck_prod(f3, 2, &x) || nsa_ck_prod(f4, 2, &x) ||
        nsa_ck_prod(f5, 2, &x) || nsa_ck_prod(f6, 2, &x) || nsa_ck_prod(f7, 4, &x))
        return nsa_set_error(NSA_ERR_INVALID_SHAPE,
                             "nsa_decode_plan_create: the caches or page tables of lim (num_pages = %lld, page_size = "
                             "%lld, max_pages = %lld, num_cmp_pages = %lld, cmp_page_size = %lld, max_cmp_pages = %lld, "
                             "max_context = %lld, batch = %lld) hold more elements than 64 bits count",
                             (long long)lim->num_pages, (long long)lim->page_size, (long long)lim->max_pages,
                             (long long)lim->num_cmp_pages, (long long)lim->cmp_page_size,
                             (long long)lim->max_cmp_pages, (long long)lim->max_context, (long long)lim->batch);
    /* workspace: o_b per enabled branch, lse_cmp, indices (4 bytes) */
    nsa_ws_layout *ws = &p->ws;
    *ws = (nsa_ws_layout){.kc = -1, .vc = -1, .lse_cmp = -1, .scores = -1, .indices = -1, .o_b = {-1, -1, -1},
                          .dq_acc = -1, .dk_acc = {-1, -1, -1}, .dv_acc = {-1, -1, -1}, .dkc_acc = -1,
                          .dvc_acc = -1, .dw_k_acc = -1, .dw_v_acc = -1, .dpe_k_acc = -1, .dpe_v_acc = -1,
                          .delta = -1};
    const size_t fe = nsa_dtype_size(nsa_bk_float_dtype(c->dtype));
    int64_t nt, no, ni;
    if (nsa_ck_mul(MT, hq, &nt) || nsa_ck_mul(nt, c->head_dim_v, &no) || nsa_ck_mul(MT, hkv, &ni) ||
        nsa_ck_mul(ni, c->num_selected, &ni))
        return nsa_set_error(NSA_ERR_INVALID_SHAPE, "nsa_decode_plan_create: the workspace size overflows 64 bits");
    if ((s = reserve(ws, nt, fe, &ws->lse_cmp)) || (s = reserve(ws, no, fe, &ws->o_b[NSA_BRANCH_CMP])))
        return s;
    if (c->num_selected > 0 &&
        ((s = reserve(ws, ni, 4, &ws->indices)) || (s = reserve(ws, no, fe, &ws->o_b[NSA_BRANCH_SLC]))))
        return s;
    if (c->window > 0 && (s = reserve(ws, no, fe, &ws->o_b[NSA_BRANCH_WIN]))) return s;
    return NSA_SUCCESS;
}

nsa_status nsa_decode_plan_create_sized(nsa_context *ctx, const nsa_config *cfg_in, size_t cfg_size,
                                        const nsa_decode_limits *lim_in, size_t lim_size, nsa_plan **out)
{
    static const char *const FN = "nsa_decode_plan_create";
    nsa_clear_error();
    if (!out) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_decode_plan_create: out is NULL");
    *out = NULL;
    if (!ctx) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_decode_plan_create: ctx is NULL");
    if (!cfg_in) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_decode_plan_create: cfg is NULL");
    if (!lim_in) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_decode_plan_create: lim is NULL");
    nsa_config cfg;
    nsa_status s = nsa_config_take(cfg_in, cfg_size, &cfg, FN);
    if (s != NSA_SUCCESS || (s = nsa_config_check(&cfg, FN)) != NSA_SUCCESS) return s;
    if (cfg.flags & NSA_CONFIG_TRAINING)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_decode_plan_create: cfg->flags has NSA_CONFIG_TRAINING, but a "
                             "decode step has no gradient (make a training plan with nsa_plan_create)");
    nsa_decode_limits lim;
    memset(&lim, 0, sizeof lim);
    if ((s = nsa_struct_in(&lim, sizeof lim, NSA_DECODE_LIMITS_SIZE_FIRST, lim_in, lim_size, FN, "lim")))
        return s;
    /* each capacity on its own, then the ones that bound each other */
    const struct {
        const char *name;
        int64_t v, lo, hi;
    } r[] = {
        {"batch", lim.batch, 1, INT64_C(1) << 32},
        {"max_step_tokens", lim.max_step_tokens, 1, MAX_TOKENS},
        {"max_total_tokens", lim.max_total_tokens, 1, MAX_TOKENS},
        {"max_context", lim.max_context, 1, MAX_TOKENS},
        {"page_size", lim.page_size, 1, MAX_TOKENS},
        {"num_pages", lim.num_pages, 1, (INT64_C(1) << 31)}, /* int32 table entries */
        {"max_pages", lim.max_pages, 1, MAX_TOKENS},
        {"cmp_page_size", lim.cmp_page_size, 1, MAX_TOKENS},
        {"num_cmp_pages", lim.num_cmp_pages, 0, (INT64_C(1) << 31)},
        {"max_cmp_pages", lim.max_cmp_pages, 0, MAX_TOKENS},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_decode_plan_create: lim->%s = %lld must be in [%lld, %lld]",
                                 r[i].name, (long long)r[i].v, (long long)r[i].lo, (long long)r[i].hi);
    if (lim.max_total_tokens < lim.max_step_tokens)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_decode_plan_create: lim->max_total_tokens = %lld is below "
                             "lim->max_step_tokens = %lld (one sequence's step is part of the batch's)",
                             (long long)lim.max_total_tokens, (long long)lim.max_step_tokens);

    nsa_plan *p = calloc(1, sizeof *p);
    if (!p) return nsa_set_error(NSA_ERR_OUT_OF_MEMORY, "nsa_decode_plan_create: out of host memory");
    p->ctx = ctx;
    p->bk.cfg = cfg;
    if (p->bk.cfg.scale == 0.0f) p->bk.cfg.scale = (float)(1.0 / sqrt((double)cfg.head_dim_qk));
    p->bk.decode = 1;
    p->bk.lim = lim;
    p->dec_status = NSA_SUCCESS;
    if ((s = decode_plan_shape(p))) {
        plan_free(p);
        return s;
    }
    if (ctx->be->plan_prepare) {
        if ((s = ctx->be->plan_prepare(ctx->bctx, &p->bk)) != NSA_SUCCESS) {
            nsa_backend_error(s, ctx->backend_name, "preparing a decode plan");
            plan_free(p);
            return s;
        }
        p->prepared = 1;
    }
    ctx->live_plans++;
    if (nsa_log_enabled(NSA_LOG_INFO))
        nsa_log(NSA_LOG_INFO,
                "decode plan on %s: %lld sequences, at most %lld tokens a step (%lld per sequence), contexts up to "
                "%lld, workspace %zu bytes",
                ctx->backend_name, (long long)lim.batch, (long long)lim.max_total_tokens,
                (long long)lim.max_step_tokens, (long long)lim.max_context, p->ws.bytes);
    nsa_clear_error();
    *out = p;
    return NSA_SUCCESS;
}
