/*
 * decode_stages.hip -- the HIP backend's decode step (docs/nsa-semantics.md section
 * 10; include/nsa.h "decoding"): the plan memory of a decode plan, the two
 * decode stages, and the status of the last step for nsa_decode_check. The
 * kernels are kernels/hip/decode.hip; this is the HIP side of what
 * backends/cuda/cuda_decode.cu does for CUDA, with the same plan memory,
 * splits, record and messages (kernels/common/nsa_decode_record.h).
 *
 * Everything a step needs is allocated when the plan is made:
 *   the step's record (int32 [NSA_DR_FIELDS]), which the device checks write
 *     every step and nsa_decode_check reads back;
 *   the checks' flags and page counts (16 bytes + 4 per page), zeroed by a
 *     hipMemsetAsync at the start of every step;
 *   the partial softmax states of the split attention
 *     (max_total_tokens x Hq x splits x (Dv + 2) floats, the largest split
 *     count of the three branches);
 *   with a selected branch: the p_cmp group sums (max_total_tokens x Hkv x
 *     max_nc floats) and the score rows (max_total_tokens x Hkv x max_ns).
 * A step (run) only queues kernels and one memset on the context's stream: no
 * host synchronisation, no allocation, no read of device data.
 *
 * Splits (flash decoding): each branch's keys of a row are cut into `ns`
 * splits of `chunk` keys (a multiple of 32, hence of the tile's keys), ns
 * chosen once per plan so that one row of a batch-1 step gives about two
 * blocks per compute unit (Hkv x head chunks x Dv chunks x ns), with at least
 * 64 keys a split. The splits are fixed by the plan, so results are bitwise
 * the same run to run. The attention runs the portable tile (no MFMA): a
 * decode step reads each key once per KV group and is bound by memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip_backend.h"
#include "nsa_decode_record.h"

struct hip_dec {
    int *rec;      /* [NSA_DR_FIELDS] */
    void *chk_mem; /* flags, then page counts */
    size_t chk_bytes;
    nsa_hip_dec_checkmem chk;
    float *part;   /* partial states */
    float *pbuf, *rows;
    nsa_hip_dec_split sp[3]; /* per branch */
};

/* Most rows of a step: the grid's x extent times the block size stays below
 * 2^32 work-items on AMD (HSA grid sizes are 32-bit), as the forward's token
 * launches do. */
#define NSA_HIP_DEC_MAX_ROWS ((int64_t)1 << 23)

static int decode_tiles(const hip_ctx *c, const nsa_config *cfg, nsa_hip_tile *attn, nsa_hip_tile *scores)
{
    const nsa_hip_dims d = nsa_hip_dims_of_config(cfg);
    return nsa_hip_attn_tile(&d, c->lds_bytes, 0, attn) == 0 &&
           (cfg->num_selected == 0 || nsa_hip_scores_tile(&d, c->lds_bytes, 0, scores) == 0);
}

int nsa_hip_decode_supports(const hip_ctx *c, const nsa_config *cfg)
{
    nsa_hip_tile a, s;
    return decode_tiles(c, cfg, &a, &s);
}

/* The split of a branch whose rows see at most kmax keys (cuda_decode.cu's rule). */
static nsa_hip_dec_split make_split(int64_t kmax, int64_t blocks_per_split, int64_t target, int64_t dv_chunks,
                                    int64_t row_floats, int64_t MT, int64_t Hq)
{
    int64_t ns = (target + blocks_per_split - 1) / blocks_per_split;
    if (ns < 1) ns = 1;
    ns = nsa_min64(ns, nsa_max64(1, (kmax + 63) / 64));
    /* the partial states of every row stay under 1 GiB */
    const double per_split = (double)MT * (double)Hq * (double)row_floats * 4.0;
    while (ns > 1 && per_split * (double)ns > 1073741824.0) ns /= 2;
    ns = nsa_min64(ns, nsa_max64(1, 65535 / dv_chunks)); /* grid z: splits x Dv chunks */
    int64_t chunk = kmax > 0 ? (kmax + ns - 1) / ns : 32;
    chunk = (chunk + 31) / 32 * 32;
    nsa_hip_dec_split sp;
    sp.chunk = chunk;
    sp.ns = (int)nsa_max64(1, kmax > 0 ? (kmax + chunk - 1) / chunk : 1);
    return sp;
}

static nsa_status dalloc(const hip_ctx *c, nsa_bk_plan *plan, void **p, size_t bytes, const char *what)
{
    const size_t n = bytes ? bytes : 16;
    hipError_t e = hipMalloc(p, n);
    if (e != hipSuccess) {
        *p = NULL;
        (void)hipGetLastError(); /* clear the sticky error of a failed allocation */
        return nsa_hip_host->set_error(NSA_ERR_OUT_OF_MEMORY,
                                       "hip backend: hipMalloc of %zu bytes on device %d for a decode plan's %s: %s", n,
                                       c->device, what, hipGetErrorString(e));
    }
    plan->backend_bytes += n;
    return NSA_SUCCESS;
}

nsa_status nsa_hip_decode_prepare(const hip_ctx *c, nsa_bk_plan *plan, hip_plan *hp)
{
    const nsa_config &cfg = plan->cfg;
    const nsa_decode_limits &lim = plan->lim;
    const int64_t Hq = cfg.num_q_heads, Hkv = cfg.num_kv_heads, MT = lim.max_total_tokens;
    if (!decode_tiles(c, &cfg, &hp->attn, &hp->scores))
        return nsa_hip_host->set_error(NSA_ERR_UNSUPPORTED,
                                       "hip backend: the decode kernels' tiles at head dims Dqk = %lld, Dv = %lld do "
                                       "not fit the %zu bytes of LDS of this device",
                                       (long long)cfg.head_dim_qk, (long long)cfg.head_dim_v, c->lds_bytes);
    const nsa_hip_tile &t = hp->attn;
    if (Hkv * t.head_chunks > 65535 || MT > NSA_HIP_DEC_MAX_ROWS)
        return nsa_hip_host->set_error(NSA_ERR_UNSUPPORTED,
                                       "hip backend: a decode plan of %lld KV heads x %d head chunks or %lld rows "
                                       "(max_total_tokens) exceeds a grid (at most 65535 and %lld)",
                                       (long long)Hkv, t.head_chunks, (long long)MT,
                                       (long long)NSA_HIP_DEC_MAX_ROWS);
    hip_dec *d = (hip_dec *)calloc(1, sizeof *d);
    if (!d) return nsa_hip_host->set_error(NSA_ERR_OUT_OF_MEMORY, "hip backend: out of host memory for a decode plan");
    hp->dec = d;
    const int64_t target = 2 * (int64_t)c->cus, per = Hkv * t.head_chunks * t.dv_chunks;
    const int64_t kmax[3] = {plan->max_nc, cfg.num_selected * cfg.slc_block,
                             nsa_min64(cfg.window, lim.max_context)};
    int64_t ns_max = 1;
    for (int b = 0; b < 3; b++) {
        d->sp[b] = make_split(kmax[b], per, target, t.dv_chunks, cfg.head_dim_v + 2, MT, Hq);
        ns_max = nsa_max64(ns_max, d->sp[b].ns);
    }
    const double part = (double)MT * (double)Hq * (double)ns_max * (double)(cfg.head_dim_v + 2) * 4.0;
    const double pb = cfg.num_selected > 0 ? (double)MT * (double)Hkv * (double)plan->max_nc * 4.0 : 0.0;
    const double rw = cfg.num_selected > 0 ? (double)MT * (double)Hkv * (double)plan->max_ns * 4.0 : 0.0;
    const double chk = 16.0 + 4.0 * ((double)lim.num_pages + (double)lim.num_cmp_pages);
    if (part > 1e14 || pb > 1e14 || rw > 1e14 || chk > 1e14)
        return nsa_hip_host->set_error(NSA_ERR_UNSUPPORTED, "hip backend: a decode plan's scratch would take %.3g bytes",
                                       part + pb + rw + chk);
    nsa_status s;
    if ((s = dalloc(c, plan, (void **)&d->rec, NSA_DR_FIELDS * sizeof(int), "record"))) return s;
    hipError_t e = hipMemsetAsync(d->rec, 0, NSA_DR_FIELDS * sizeof(int), c->stream);
    if (e == hipSuccess) e = hipStreamSynchronize(c->stream);
    if (e != hipSuccess) return nsa_hip_fail(e, "plan_prepare (decode record)");
    d->chk_bytes = (size_t)chk;
    if ((s = dalloc(c, plan, &d->chk_mem, d->chk_bytes, "checks"))) return s;
    d->chk.flags = (unsigned long long *)d->chk_mem;
    d->chk.pcount = (int *)((char *)d->chk_mem + 16);
    d->chk.ccount = d->chk.pcount + lim.num_pages;
    if ((s = dalloc(c, plan, (void **)&d->part, (size_t)part, "partial states"))) return s;
    if (cfg.num_selected > 0 && ((s = dalloc(c, plan, (void **)&d->pbuf, (size_t)pb, "block scores")) ||
                                 (s = dalloc(c, plan, (void **)&d->rows, (size_t)rw, "block scores"))))
        return s;
    return NSA_SUCCESS;
}

void nsa_hip_decode_release(hip_plan *hp)
{
    hip_dec *d = hp->dec;
    if (!d) return;
    void *m[] = {d->rec, d->chk_mem, d->part, d->pbuf, d->rows};
    for (void *x : m)
        if (x) (void)hipFree(x);
    free(d);
    hp->dec = NULL;
}

/* ------------------------------------------------------------------ the step */

static nsa_hip_dec_geom dec_geom(const nsa_bk_plan *pl, const hip_dec *d, const nsa_bk_args *a)
{
    const nsa_config &c = pl->cfg;
    const nsa_decode_limits &lim = pl->lim;
    const nsa_hip_dims dims = nsa_hip_dims_of_config(&c);
    nsa_hip_dec_geom g;
    memset(&g, 0, sizeof g);
    g.B = lim.batch;
    g.MT = lim.max_total_tokens;
    g.Hq = c.num_q_heads;
    g.Hkv = c.num_kv_heads;
    g.G = c.num_q_heads / c.num_kv_heads;
    g.Dqk = c.head_dim_qk;
    g.Dv = c.head_dim_v;
    g.l = c.cmp_block;
    g.d = c.cmp_stride;
    g.ls = c.slc_block;
    g.n = c.num_selected;
    g.n_init = c.num_init;
    g.n_local = c.num_local;
    g.w = c.window;
    g.max_step = lim.max_step_tokens;
    g.max_context = lim.max_context;
    g.ps = lim.page_size;
    g.num_pages = lim.num_pages;
    g.max_pages = lim.max_pages;
    g.cps = lim.cmp_page_size;
    g.num_cmp_pages = lim.num_cmp_pages;
    g.max_cmp_pages = lim.max_cmp_pages;
    g.max_nc = pl->max_nc;
    g.max_ns = pl->max_ns;
    g.scale_log2 = dims.scale_log2;
    g.dtype = dims.dtype;
    g.compress = (int)c.compress;
    g.cu = (const int *)nsa_hip_view(a->dec_cu_seqlens_q).ptr;
    g.tk0 = (const int *)nsa_hip_view(a->dec_cache_seqlens).ptr;
    g.bt = (const int *)nsa_hip_view(a->dec_block_table).ptr;
    g.bt_st = a->dec_block_table.stride_token;
    g.cbt = (const int *)nsa_hip_view(a->dec_cmp_block_table).ptr;
    g.cbt_st = a->dec_cmp_block_table.stride_token;
    g.rec = d->rec;
    g.status = (int *)nsa_hip_view(a->dec_status).ptr;
    return g;
}

static bool same_cache(const nsa_bk_tensor &x, const nsa_bk_tensor &y)
{
    return x.buf && x.buf == y.buf && x.offset == y.offset && x.stride_token == y.stride_token &&
           x.stride_head == y.stride_head;
}

#define DEC_NEED(t, name)                                                                                          \
    do {                                                                                                           \
        nsa_status s_ = nsa_hip_need((t), (name), stage);                                                          \
        if (s_ != NSA_SUCCESS) return s_;                                                                          \
    } while (0)
#define DEC_LAUNCH(expr)                                                                                           \
    do {                                                                                                           \
        hipError_t e_ = (expr);                                                                                    \
        if (e_ != hipSuccess) return nsa_hip_fail(e_, nsa_stage_name(stage));                                      \
    } while (0)

static nsa_status run_append(const hip_ctx *c, const hip_dec *d, const nsa_bk_args *a)
{
    const nsa_stage stage = NSA_STAGE_DECODE_APPEND;
    const nsa_bk_plan *pl = a->plan;
    const nsa_config &cfg = pl->cfg;
    DEC_NEED(a->dec_cu_seqlens_q, "cu_seqlens_q");
    DEC_NEED(a->dec_cache_seqlens, "cache_seqlens");
    DEC_NEED(a->dec_block_table, "block_table");
    if (pl->max_nc > 0 && pl->lim.max_cmp_pages > 0) DEC_NEED(a->dec_cmp_block_table, "cmp_block_table");
    const nsa_hip_dec_geom g = dec_geom(pl, d, a);
    /* the checks first: they write the record every later kernel reads */
    DEC_LAUNCH(hipMemsetAsync(d->chk_mem, 0, d->chk_bytes, c->stream));
    DEC_LAUNCH(nsa_hip_dec_check(&g, &d->chk, c->stream));
    /* the new tokens into each distinct cache, once */
    for (int br = 0; br < 3; br++) {
        if (!a->dec_k_cache[br].buf) continue;
        DEC_NEED(a->k[br], "k (new tokens)");
        DEC_NEED(a->v[br], "v (new tokens)");
        DEC_NEED(a->dec_v_cache[br], "v_cache");
        bool kdup = false, vdup = false;
        for (int e = 0; e < br; e++) {
            kdup |= same_cache(a->dec_k_cache[e], a->dec_k_cache[br]);
            vdup |= same_cache(a->dec_v_cache[e], a->dec_v_cache[br]);
        }
        if (!kdup)
            DEC_LAUNCH(nsa_hip_dec_append(&g, nsa_hip_view(a->k[br]), nsa_hip_view(a->dec_k_cache[br]), g.Dqk,
                                          c->stream));
        if (!vdup)
            DEC_LAUNCH(nsa_hip_dec_append(&g, nsa_hip_view(a->v[br]), nsa_hip_view(a->dec_v_cache[br]), g.Dv,
                                          c->stream));
    }
    /* the compressed rows the step completes (EXTERNAL: the caller wrote them; without
     * compressed caches, num_cmp_pages = 0, a step that passes its checks forms no row) */
    if (cfg.compress != NSA_COMPRESS_EXTERNAL && pl->max_nc > 0 && a->dec_kc_cache.buf) {
        const int C = NSA_BRANCH_CMP;
        DEC_NEED(a->dec_k_cache[C], "k_cache[cmp]");
        DEC_NEED(a->dec_v_cache[C], "v_cache[cmp]");
        DEC_NEED(a->dec_vc_cache, "vc_cache");
        if (cfg.compress == NSA_COMPRESS_LINEAR) {
            DEC_NEED(a->w_k, "w_k");
            DEC_NEED(a->w_v, "w_v");
        }
        DEC_LAUNCH(nsa_hip_dec_compress(&g, nsa_hip_view(a->dec_k_cache[C]), nsa_hip_view(a->w_k),
                                        nsa_hip_view(a->pe_k), nsa_hip_view(a->dec_kc_cache), g.Dqk, c->stream));
        DEC_LAUNCH(nsa_hip_dec_compress(&g, nsa_hip_view(a->dec_v_cache[C]), nsa_hip_view(a->w_v),
                                        nsa_hip_view(a->pe_v), nsa_hip_view(a->dec_vc_cache), g.Dv, c->stream));
    }
    return NSA_SUCCESS;
}

static nsa_status run_attn(const hip_ctx *c, const hip_plan *hp, const nsa_bk_args *a)
{
    const nsa_stage stage = NSA_STAGE_DECODE_ATTN;
    const hip_dec *d = hp->dec;
    const nsa_bk_plan *pl = a->plan;
    const nsa_config &cfg = pl->cfg;
    const int C = NSA_BRANCH_CMP, S = NSA_BRANCH_SLC, W = NSA_BRANCH_WIN;
    const nsa_hip_tensor none = {NULL, 0, 0};
    DEC_NEED(a->q, "q");
    DEC_NEED(a->o, "o");
    DEC_NEED(a->o_b[C], "o_b[cmp]");
    DEC_NEED(a->lse[C], "lse[cmp]");
    DEC_NEED(a->gate[C], "gate[cmp]");
    const nsa_hip_dec_geom g = dec_geom(pl, d, a);
    const nsa_hip_tensor q = nsa_hip_view(a->q);
    DEC_LAUNCH(nsa_hip_dec_attention(&g, NSA_HIP_CMP, &hp->attn, &d->sp[C], q, nsa_hip_view(a->dec_kc_cache),
                                     nsa_hip_view(a->dec_vc_cache), none, d->part, nsa_hip_view(a->o_b[C]),
                                     nsa_hip_view(a->lse[C]), c->stream));
    if (cfg.num_selected > 0) {
        DEC_NEED(a->indices, "indices");
        DEC_NEED(a->o_b[S], "o_b[slc]");
        DEC_NEED(a->gate[S], "gate[slc]");
        DEC_NEED(a->dec_k_cache[S], "k_cache[slc]");
        DEC_NEED(a->dec_v_cache[S], "v_cache[slc]");
        DEC_LAUNCH(nsa_hip_dec_select(&g, &hp->scores, &d->sp[C], q, nsa_hip_view(a->dec_kc_cache),
                                      nsa_hip_view(a->lse[C]), d->pbuf, d->rows, nsa_hip_view(a->indices), c->stream));
        DEC_LAUNCH(nsa_hip_dec_attention(&g, NSA_HIP_SLC, &hp->attn, &d->sp[S], q, nsa_hip_view(a->dec_k_cache[S]),
                                         nsa_hip_view(a->dec_v_cache[S]), nsa_hip_view(a->indices), d->part,
                                         nsa_hip_view(a->o_b[S]), nsa_hip_view(a->lse[S]), c->stream));
    }
    if (cfg.window > 0) {
        DEC_NEED(a->o_b[W], "o_b[win]");
        DEC_NEED(a->gate[W], "gate[win]");
        DEC_NEED(a->dec_k_cache[W], "k_cache[win]");
        DEC_NEED(a->dec_v_cache[W], "v_cache[win]");
        DEC_LAUNCH(nsa_hip_dec_attention(&g, NSA_HIP_WIN, &hp->attn, &d->sp[W], q, nsa_hip_view(a->dec_k_cache[W]),
                                         nsa_hip_view(a->dec_v_cache[W]), none, d->part, nsa_hip_view(a->o_b[W]),
                                         nsa_hip_view(a->lse[W]), c->stream));
    }
    nsa_hip_tensor gate[3], ob[3];
    for (int b = 0; b < 3; b++) {
        ob[b] = nsa_hip_view(a->o_b[b]);
        gate[b] = ob[b].ptr ? nsa_hip_view(a->gate[b]) : none; /* a disabled branch's gate is not read */
    }
    DEC_LAUNCH(nsa_hip_dec_combine(&g, gate, ob, nsa_hip_view(a->o), c->stream));
    return NSA_SUCCESS;
}

nsa_status nsa_hip_decode_run(const hip_ctx *c, const nsa_bk_plan *plan, nsa_stage stage, const nsa_bk_args *a)
{
    const hip_plan *hp = (const hip_plan *)plan->backend_plan;
    if (!hp || !hp->dec)
        return nsa_hip_host->set_error(NSA_ERR_INTERNAL, "hip backend: a decode stage on a plan without decode memory");
    if (stage == NSA_STAGE_DECODE_APPEND) return run_append(c, hp->dec, a);
    if (stage == NSA_STAGE_DECODE_ATTN) return run_attn(c, hp, a);
    return nsa_hip_host->set_error(NSA_ERR_UNSUPPORTED, "hip backend: stage %s on a decode plan",
                                   nsa_stage_name(stage));
}

/* The record of the plan's last step, worded as the cpu reference words it. */
nsa_status nsa_hip_decode_status(void *bctx, const nsa_bk_plan *plan)
{
    const hip_ctx *c = (const hip_ctx *)bctx;
    const hip_plan *hp = plan ? (const hip_plan *)plan->backend_plan : NULL;
    if (!c || !hp || !hp->dec) return NSA_SUCCESS;
    int32_t r[NSA_DR_FIELDS];
    hipError_t e = hipSetDevice(c->device);
    if (e == hipSuccess) e = hipMemcpyAsync(r, hp->dec->rec, sizeof r, hipMemcpyDeviceToHost, c->stream);
    if (e == hipSuccess) e = hipStreamSynchronize(c->stream);
    if (e != hipSuccess) return nsa_hip_fail(e, "reading the decode step's record");
    char msg[1024];
    const nsa_status s = nsa_dec_record_message(r, &plan->lim, msg, sizeof msg);
    return s == NSA_SUCCESS ? NSA_SUCCESS : nsa_hip_host->set_error(s, "%s", msg);
}
