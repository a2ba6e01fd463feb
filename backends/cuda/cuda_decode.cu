/*
 * cuda_decode.cu -- the CUDA backend's decode step (semantics section 10;
 * include/nsa.h "decoding"): the plan memory of a decode plan, the two decode
 * stages, and the status of the last step for nsa_decode_check.
 *
 * Everything a step needs is allocated when the plan is made (decode_prepare):
 *   the step's record (int32 [NSA_DR_FIELDS], decode.h), which the device checks
 *     write every step and nsa_decode_check reads back;
 *   the checks' flags and page counts (24 bytes + 4 per page), zeroed at the
 *     start of every step by a cudaMemsetAsync, or by the checks' own CTA where
 *     the batch's table columns and the counts fit one (dec_check_one_fits);
 *   the partial softmax states of the split attention
 *     (max_total_tokens x Hq x splits x (Dv + 2) floats, the largest split
 *     count of the three branches, plus the window's on the tensor-core path,
 *     which runs it beside the compressed branch);
 *   with a selected branch: the p_cmp group sums (max_total_tokens x Hkv x
 *     max_nc floats) and the score rows (max_total_tokens x Hkv x max_ns);
 *   on the tensor-core path: the splits' arrival counters (3 x max_total_tokens
 *     x Hkv ints, zero between steps) and, with a selected branch, the
 *     compressed keys' q.k products (max_total_tokens x Hkv x max_nc x G
 *     floats) where they take at most 1 GiB.
 * A step (run) only queues kernels (and at most one memset) on the context's stream:
 * no host synchronisation, no allocation, no read of device data, so a step
 * can be captured in a CUDA graph and replayed with new lengths and tables.
 *
 * Splits (flash decoding): each branch's keys of a row are cut into `ns`
 * splits of `chunk` keys, ns chosen once per plan (make_split's targets in
 * decode_prepare). The splits are fixed by the plan and merged in split
 * order, so results are bitwise the same run to run.
 *
 * A step on the tensor-core path (decode_attn_sm80.cu) is the checks (one
 * CTA where they fit it, else a memset and two kernels), the append of k and
 * v with the compressed rows the step completes, then the compressed branch
 * with the window beside it in one launch, decode_sm80_wide's ranking where it
 * runs, and the selected branch: four to six kernels. On sm_90 each kernel
 * after the first launches while its predecessor ends (programmatic dependent
 * launch, decode_dev.cuh); the attention kernels read the caller's q and page
 * tables before they wait for it. Each
 * branch's last CTA per (row, KV head) merges
 * its splits, the compressed one also ranking the blocks from the q.k
 * products its splits kept, and the selected one (the later of the compressed
 * and window ones when n = 0) combining the branches. decode.cu's kernels
 * (f32, other head dims, caches without 16-byte rows) add a merge kernel per
 * branch, the block scores, the select and the combine kernels.
 */
#include <stdio.h>
#include <string.h>

#include <algorithm>

#include "cuda_internal.h"
#include "decode.h"

namespace nsa_cuda {

struct CudaDec {
    int *rec;          /* [NSA_DR_FIELDS] */
    void *chk_mem;     /* flags, then page counts */
    size_t chk_bytes;
    DecCheckMem chk;
    float *part;       /* partial states: the branches launched one after another share them; mma: the
                        * window's, launched beside the compressed branch, follow at part_win */
    int64_t part_win;  /* floats */
    float *pbuf, *rows;
    int *cnt;          /* mma: the tails' arrival counters [3][MT x Hkv] (a branch, the window beside the
                        * compressed branch, the combine after both), then dec_rank_wide's [MT x Hkv] */
    int rank_parts;    /* decode_sm80_wide: dec_rank_wide's parts per (row, KV head); 0: the last CTAs rank */
    float *scores;     /* mma with a selected branch: the compressed keys' q.k [MT x Hkv][max_nc][G], or NULL */
    DecSplit sp[3];    /* per branch */
    int64_t max_nc;
    bool mma;          /* decode_attn_sm80.cu's kernels (f16 / bf16, G <= 16, tensor-core dims) */
    bool check_one;    /* the checks in one CTA, which zeroes their memory (no memset): dec_check_one */
    int dqkp, dvp;     /* their padded head dims */
};

namespace {

size_t dsize(nsa_dtype d) { return d == NSA_DTYPE_F16 || d == NSA_DTYPE_BF16 ? 2 : 4; }

char *ptr(const nsa_bk_tensor &t)
{
    return t.buf ? ((CudaBuf *)t.buf)->ptr + (size_t)t.offset * dsize(t.dtype) : nullptr;
}
DecIn din(const nsa_bk_tensor &t) { return DecIn{ptr(t), t.stride_token, t.stride_head}; }
DecCache dcache(const nsa_bk_tensor &t) { return DecCache{ptr(t), t.stride_token, t.stride_head}; }

bool same_cache(const nsa_bk_tensor &a, const nsa_bk_tensor &b)
{
    return a.buf && a.buf == b.buf && a.offset == b.offset && a.stride_token == b.stride_token &&
           a.stride_head == b.stride_head;
}

/* heads per CTA of the attention kernels: the group's 16 MMA rows, or 8 warps' heads of decode.cu's kernel */
int64_t heads_per_cta(int64_t G, bool mma) { return mma ? 16 : std::min<int64_t>(G, 8); }

/* the split of a branch whose rows see at most kmax keys into ns splits of a multiple of 32 keys */
DecSplit split_of(int64_t kmax, int64_t ns, int hc)
{
    DecSplit sp;
    sp.hc = hc;
    int64_t chunk = kmax > 0 ? (kmax + ns - 1) / ns : 32;
    chunk = (chunk + 31) / 32 * 32;
    sp.chunk = chunk;
    sp.ns = (int)std::max<int64_t>(1, kmax > 0 ? (kmax + chunk - 1) / chunk : 1);
    return sp;
}

/* the largest split count whose partial states (MT x Hq x ns x row_floats) stay under 1 GiB */
int64_t ns_cap(int64_t MT, int64_t Hq, int64_t row_floats, int64_t ns)
{
    const double per_split = (double)MT * (double)Hq * (double)row_floats * 4.0;
    while (ns > 1 && per_split * (double)ns > 1073741824.0) ns /= 2;
    return std::min<int64_t>(ns, 65535);
}

/* decode.cu's kernels: about `target` CTAs for a step of MT rows, at least 64 keys a split */
DecSplit make_split(int64_t kmax, int64_t ctas_per_split, int64_t target, int64_t row_floats, int64_t MT,
                    int64_t Hq, int64_t hc)
{
    const int64_t per_row = ctas_per_split * std::max<int64_t>(MT, 1);
    int64_t ns = std::max<int64_t>(1, (target + per_row - 1) / per_row);
    ns = std::min<int64_t>(ns, std::max<int64_t>(1, (kmax + 63) / 64));
    return split_of(kmax, ns_cap(MT, Hq, row_floats, ns), (int)hc);
}

/* decode_attn_sm80.cu's kernel: the split count of least modelled time for a step of MT rows on
 * `slots` resident CTAs, in key units: waves x (keys a CTA + 128, a CTA's fixed cost) + 16 per
 * split (the last CTA's merge reads every split's state). Ties go to fewer splits. */
DecSplit make_split_mma(int64_t kmax, int64_t ctas_per_split, int64_t slots, int64_t row_floats, int64_t MT,
                        int64_t Hq)
{
    const int64_t per_row = ctas_per_split * std::max<int64_t>(MT, 1);
    const int64_t hi = ns_cap(MT, Hq, row_floats,
                              std::min<int64_t>(DEC_SM80_MAX_SPLITS, std::max<int64_t>(1, (kmax + 31) / 32)));
    DecSplit best = split_of(kmax, 1, 16);
    double best_t = -1.0;
    for (int64_t ns = 1; ns <= hi; ns++) {
        const DecSplit sp = split_of(kmax, ns, 16);
        if (sp.ns != ns) continue; /* rounding gave a count already tried */
        const double waves = (double)((per_row * ns + slots - 1) / std::max<int64_t>(slots, 1));
        const double tm = waves * (double)(sp.chunk + 128) + 16.0 * (double)ns;
        if (best_t < 0 || tm < best_t) {
            best_t = tm;
            best = sp;
        }
    }
    return best;
}

template <typename T> cudaError_t dalloc(size_t *acc, T **p, size_t bytes)
{
    const cudaError_t e = cudaMalloc((void **)p, bytes ? bytes : 16);
    if (e == cudaSuccess) *acc += bytes ? bytes : 16;
    return e;
}

DecGeom dgeom(const CudaCtx *ctx, const nsa_bk_plan *pl, const CudaDec *d, const nsa_bk_args *a)
{
    const nsa_config &c = pl->cfg;
    const nsa_decode_limits &lim = pl->lim;
    DecGeom g = {};
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
    g.max_ns = pl->max_ns;
    g.scale = c.scale;
    g.dtype = (int)c.dtype;
    g.compress = (int)c.compress;
    g.cu = (const int *)ptr(a->dec_cu_seqlens_q);
    g.tk0 = (const int *)ptr(a->dec_cache_seqlens);
    g.bt = (const int *)ptr(a->dec_block_table);
    g.bt_st = a->dec_block_table.stride_token;
    g.cbt = (const int *)ptr(a->dec_cmp_block_table);
    g.cbt_st = a->dec_cmp_block_table.stride_token;
    g.rec = d->rec;
    g.status = (int *)ptr(a->dec_status);
    g.pdl = ctx->pdl;
    return g;
}

#define DNEED(t, name)                                                                                         \
    do {                                                                                                       \
        if (!(t).buf)                                                                                          \
            return FAIL(NSA_ERR_MISSING_TENSOR, "cuda backend: stage %s needs tensor %s, which is absent",    \
                        nsa_stage_name(stage), name);                                                          \
    } while (0)
#define DLAUNCH(expr)                                                                                          \
    do {                                                                                                       \
        const cudaError_t e_ = (expr);                                                                         \
        if (e_ != cudaSuccess) return cuda_fail(e_, nsa_stage_name(stage));                                    \
    } while (0)

nsa_status run_append(CudaCtx *c, const CudaDec *d, const nsa_bk_args *a)
{
    const nsa_stage stage = NSA_STAGE_DECODE_APPEND;
    const nsa_bk_plan *pl = a->plan;
    DNEED(a->dec_cu_seqlens_q, "cu_seqlens_q");
    DNEED(a->dec_cache_seqlens, "cache_seqlens");
    DNEED(a->dec_block_table, "block_table");
    if (pl->max_nc > 0 && pl->lim.max_cmp_pages > 0) DNEED(a->dec_cmp_block_table, "cmp_block_table");
    const DecGeom g = dgeom(c, pl, d, a);
    /* the checks first: they write the record every later kernel reads */
    if (!d->check_one) /* else the checks' one CTA zeroes the memory */
        CU(cudaMemsetAsync(d->chk_mem, 0, d->chk_bytes, c->stream), "decode_append (cudaMemsetAsync)");
    DLAUNCH(dec_check(g, d->chk, d->chk_bytes, d->check_one, c->stream));
    /* the new tokens into each distinct cache, once: every k cache, then every v cache */
    for (int br = 0; br < 3; br++) {
        if (!a->dec_k_cache[br].buf) continue;
        DNEED(a->k[br], "k (new tokens)");
        DNEED(a->v[br], "v (new tokens)");
        DNEED(a->dec_v_cache[br], "v_cache");
    }
    DecAppend ap = {};
    for (int kv = 0; kv < 2; kv++)
        for (int br = 0; br < 3; br++) {
            const nsa_bk_tensor *cache = kv ? a->dec_v_cache : a->dec_k_cache;
            if (!a->dec_k_cache[br].buf) continue;
            bool dup = false;
            for (int e = 0; e < br; e++) dup |= same_cache(cache[e], cache[br]);
            if (dup) continue;
            ap.src[ap.n] = din(kv ? a->v[br] : a->k[br]);
            ap.dst[ap.n] = dcache(cache[br]);
            ap.D[ap.n++] = kv ? g.Dv : g.Dqk;
        }
    /* the compressed rows the step completes (EXTERNAL: the caller wrote them), in the append's launch */
    const nsa_config &cfg = pl->cfg;
    DecCompress cp = {};
    /* (without compressed caches, num_cmp_pages = 0, a step that passes its checks forms no row) */
    if (cfg.compress != NSA_COMPRESS_EXTERNAL && pl->max_nc > 0 && a->dec_kc_cache.buf) {
        DNEED(a->dec_k_cache[NSA_BRANCH_CMP], "k_cache[cmp]");
        DNEED(a->dec_v_cache[NSA_BRANCH_CMP], "v_cache[cmp]");
        DNEED(a->k[NSA_BRANCH_CMP], "k (new tokens)");
        DNEED(a->v[NSA_BRANCH_CMP], "v (new tokens)");
        DNEED(a->dec_vc_cache, "vc_cache");
        if (cfg.compress == NSA_COMPRESS_LINEAR) {
            DNEED(a->w_k, "w_k");
            DNEED(a->w_v, "w_v");
        }
        cp.kraw = dcache(a->dec_k_cache[NSA_BRANCH_CMP]);
        cp.vraw = dcache(a->dec_v_cache[NSA_BRANCH_CMP]);
        cp.kc = dcache(a->dec_kc_cache);
        cp.vc = dcache(a->dec_vc_cache);
        cp.kin = din(a->k[NSA_BRANCH_CMP]);
        cp.vin = din(a->v[NSA_BRANCH_CMP]);
        cp.wk = ptr(a->w_k);
        cp.wv = ptr(a->w_v);
        cp.pek = ptr(a->pe_k);
        cp.pev = ptr(a->pe_v);
    }
    DLAUNCH(dec_append(g, ap, cp, c->stream));
    return NSA_SUCCESS;
}

DecAttnIn attn_in(const CudaDec *d, const nsa_bk_args *a, int br, const nsa_bk_tensor &k, const nsa_bk_tensor &v)
{
    DecAttnIn in = {};
    in.q = din(a->q);
    in.k = dcache(k);
    in.v = dcache(v);
    in.idx = din(a->indices);
    in.part = d->part;
    in.o = (float *)ptr(a->o_b[br]);
    in.ost = a->o_b[br].stride_token;
    in.osh = a->o_b[br].stride_head;
    in.lse = (float *)ptr(a->lse[br]);
    in.lst = a->lse[br].stride_token;
    in.lsh = a->lse[br].stride_head;
    return in;
}

nsa_status run_attn(CudaCtx *c, const CudaDec *d, const nsa_bk_args *a)
{
    const nsa_stage stage = NSA_STAGE_DECODE_ATTN;
    const nsa_bk_plan *pl = a->plan;
    const nsa_config &cfg = pl->cfg;
    DNEED(a->q, "q");
    DNEED(a->o, "o");
    DNEED(a->o_b[NSA_BRANCH_CMP], "o_b[cmp]");
    DNEED(a->lse[NSA_BRANCH_CMP], "lse[cmp]");
    DNEED(a->gate[NSA_BRANCH_CMP], "gate[cmp]");
    const bool slc = cfg.num_selected > 0, win = cfg.window > 0;
    if (slc) {
        DNEED(a->indices, "indices");
        DNEED(a->o_b[NSA_BRANCH_SLC], "o_b[slc]");
        DNEED(a->gate[NSA_BRANCH_SLC], "gate[slc]");
        DNEED(a->dec_k_cache[NSA_BRANCH_SLC], "k_cache[slc]");
        DNEED(a->dec_v_cache[NSA_BRANCH_SLC], "v_cache[slc]");
    }
    if (win) {
        DNEED(a->o_b[NSA_BRANCH_WIN], "o_b[win]");
        DNEED(a->gate[NSA_BRANCH_WIN], "gate[win]");
        DNEED(a->dec_k_cache[NSA_BRANCH_WIN], "k_cache[win]");
        DNEED(a->dec_v_cache[NSA_BRANCH_WIN], "v_cache[win]");
    }
    const DecGeom g = dgeom(c, pl, d, a);
    const DecAttnIn in[3] = {
        attn_in(d, a, NSA_BRANCH_CMP, a->dec_kc_cache, a->dec_vc_cache),
        slc ? attn_in(d, a, NSA_BRANCH_SLC, a->dec_k_cache[NSA_BRANCH_SLC], a->dec_v_cache[NSA_BRANCH_SLC]) : DecAttnIn{},
        win ? attn_in(d, a, NSA_BRANCH_WIN, a->dec_k_cache[NSA_BRANCH_WIN], a->dec_v_cache[NSA_BRANCH_WIN]) : DecAttnIn{}};
    int *const idx = slc ? (int *)ptr(a->indices) : nullptr;
    DecIn gate[3], ob[3];
    for (int b = 0; b < 3; b++) {
        ob[b] = din(a->o_b[b]);
        gate[b] = din(a->gate[b]);
    }
    /* decode_attn_sm80.cu's kernels when every branch's caches allow 16-byte row copies: each
     * branch merges its own splits, the compressed one ranks, the last one combines */
    bool rows16 = dec_rows16(in[0].k, cfg.head_dim_qk) && dec_rows16(in[0].v, cfg.head_dim_v);
    for (int b = 1; b < 3; b++)
        if ((b == 1 && slc) || (b == 2 && win))
            rows16 = rows16 && dec_rows16(in[b].k, cfg.head_dim_qk) && dec_rows16(in[b].v, cfg.head_dim_v);
    if (d->mma && rows16) {
        const int64_t cn = g.MT * g.Hkv;
        auto branch = [&](int mode, bool combine, bool rank) {
            DecBranch br = {};
            br.mode = mode;
            br.sp = d->sp[mode];
            br.a = in[mode];
            DecTail &u = br.t;
            u.cnt = d->cnt;
            u.pbuf = d->pbuf;
            u.rows = d->rows;
            u.max_nc = d->max_nc;
            u.combine = combine;
            u.nbranch = 1;
            if (combine) {
                for (int b = 0; b < 3; b++) {
                    u.gate[b] = gate[b];
                    u.ob[b] = ob[b];
                }
                u.o = ptr(a->o);
                u.ost = a->o.stride_token;
                u.osh = a->o.stride_head;
            }
            if (rank) {
                u.scores = d->scores;
                u.idx = idx;
                u.ist = a->indices.stride_token;
                u.ish = a->indices.stride_head;
            }
            return br;
        };
        /* the compressed branch (ranking) with the window beside it, then the selected branch,
         * which combines; without one, the later of the first two to finish a row combines */
        DecBranch b0 = branch(0, !slc, slc && d->scores), b1 = {};
        if (win) {
            b1 = branch(2, !slc, false);
            b1.t.cnt = d->cnt + cn;
            b1.a.part = d->part + d->part_win;
            if (!slc) {
                b0.t.nbranch = b1.t.nbranch = 2;
                b0.t.bdone = b1.t.bdone = d->cnt + 2 * cn;
            }
        }
        const bool wide = slc && d->scores && d->rank_parts > 0;
        b0.t.rank_wide = wide;
        DLAUNCH(dec_attn_sm80(g, false, d->dqkp, d->dvp, b0, win ? &b1 : nullptr, c->stream));
        if (wide) {
            DecRankWide w = {};
            w.scores = d->scores;
            w.max_nc = d->max_nc;
            w.lse_cmp = in[0].lse;
            w.lst = in[0].lst;
            w.lsh = in[0].lsh;
            w.rows = d->rows;
            w.cnt = d->cnt + 3 * cn;
            w.idx = idx;
            w.ist = a->indices.stride_token;
            w.ish = a->indices.stride_head;
            w.parts = d->rank_parts;
            DLAUNCH(dec_rank_wide(g, w, c->stream));
        }
        if (slc) {
            if (!d->scores) { /* no room for the products: a second pass over the compressed keys */
                DecBranch bp = branch(0, false, false);
                bp.t.lse_cmp = in[0].lse;
                bp.t.lst = in[0].lst;
                bp.t.lsh = in[0].lsh;
                if (d->max_nc > 0) DLAUNCH(dec_attn_sm80(g, true, d->dqkp, d->dvp, bp, nullptr, c->stream));
                DLAUNCH(dec_rank(g, d->pbuf, d->max_nc, d->rows, idx, a->indices.stride_token, a->indices.stride_head,
                                 c->stream));
            }
            DLAUNCH(dec_attn_sm80(g, false, d->dqkp, d->dvp, branch(1, true, false), nullptr, c->stream));
        }
        return NSA_SUCCESS;
    }
    /* decode.cu's kernels: a merge per branch, the select kernels, the combine kernel */
    DLAUNCH(dec_attn(g, 0, d->sp[0], in[0], c->stream));
    if (slc) {
        DLAUNCH(dec_select(g, d->sp[0], din(a->q), dcache(a->dec_kc_cache), din(a->lse[NSA_BRANCH_CMP]), d->pbuf,
                           d->max_nc, d->rows, idx, a->indices.stride_token, a->indices.stride_head, c->stream));
        DLAUNCH(dec_attn(g, 1, d->sp[1], in[1], c->stream));
    }
    if (win) DLAUNCH(dec_attn(g, 2, d->sp[2], in[2], c->stream));
    DLAUNCH(dec_combine(g, gate, ob, ptr(a->o), a->o.stride_token, a->o.stride_head, c->stream));
    return NSA_SUCCESS;
}

} // namespace

nsa_status decode_prepare(CudaCtx *c, nsa_bk_plan *plan, CudaPlan *p)
{
    const nsa_config &cfg = plan->cfg;
    const nsa_decode_limits &lim = plan->lim;
    const int64_t Hq = cfg.num_q_heads, Hkv = cfg.num_kv_heads, G = Hq / Hkv, MT = lim.max_total_tokens;
    const int64_t Dqk = cfg.head_dim_qk, Dv = cfg.head_dim_v;
    if (dec_attn_smem(Dqk, Dv) > 48 * 1024)
        return FAIL(NSA_ERR_UNSUPPORTED,
                    "cuda backend: the decode kernels' shared memory at head dims %lld / %lld (%zu bytes) exceeds "
                    "48 KB (Dqk + Dv up to about 2900)",
                    (long long)Dqk, (long long)Dv, dec_attn_smem(Dqk, Dv));
    int dqkp = 0, dvp = 0;
    tc_dims(Dqk, Dv, &dqkp, &dvp);
    const bool mma_ok = dec_attn_sm80_takes((int)cfg.dtype, G, dqkp, dvp) &&
                        (int64_t)dec_attn_sm80_smem(dqkp, dvp, false) <= c->lim.smem_block - SMEM_STATIC_MARGIN;
    /* NSA_CUDA_FORCE=decode_attn:K (or ref: decode_split) */
    const Kern forced = c->force.k[NSA_STAGE_DECODE_ATTN];
    if ((forced == K_DECODE_SM80 || forced == K_DECODE_SM80_WIDE || forced == K_DECODE_SM80_PROBS) && !mma_ok)
        return FAIL(NSA_ERR_UNSUPPORTED,
                    "cuda backend: NSA_CUDA_FORCE asks stage decode_attn to run %s, which takes f16 / bf16 with G <= 16 "
                    "and head dims padding to 32/32, 64/64, 128/128 or 192/128 (this plan: dtype %s, G %lld, dims "
                    "%lld / %lld)",
                    kern_name(forced), dsize(cfg.dtype) == 2 ? "16-bit" : "not 16-bit", (long long)G, (long long)Dqk,
                    (long long)Dv);
    const bool mma = mma_ok && forced != K_DECODE_SPLIT;
    const int64_t hc = heads_per_cta(G, mma), nhc = (G + hc - 1) / hc;
    if (Hkv * nhc > 65535 || MT >= ((int64_t)1 << 31))
        return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: a decode plan of %lld KV heads x %lld head chunks or %lld "
                    "rows exceeds a grid", (long long)Hkv, (long long)nhc, (long long)MT);
    CudaDec *d = (CudaDec *)calloc(1, sizeof *d);
    if (!d) return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: cannot allocate a decode plan record");
    p->dec = d;
    if (mma) CU(dec_attn_sm80_prepare((int)cfg.dtype, dqkp, dvp), "plan_prepare (decode kernels)");
    d->mma = mma;
    d->dqkp = dqkp;
    d->dvp = dvp;
    int sms = 0;
    CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c->device), "cudaDeviceGetAttribute");
    /* decode.cu's kernels: about two CTAs per SM (make_split); the tensor-core kernel: the modelled
     * best over its resident CTAs (make_split_mma) */
    int resident = 0;
    if (mma) CU(dec_attn_sm80_ctas_per_sm((int)cfg.dtype, dqkp, dvp, &resident), "plan_prepare (decode occupancy)");
    const int64_t sm = std::max(sms, 1), per = Hkv * nhc, slots = sm * std::max(resident, 1);
    d->max_nc = plan->max_nc;
    const int64_t kmax[3] = {plan->max_nc, cfg.num_selected * cfg.slc_block, std::min<int64_t>(cfg.window, lim.max_context)};
    int64_t ns_max = 1;
    for (int b = 0; b < 3; b++) {
        d->sp[b] = mma ? make_split_mma(kmax[b], per, slots, Dv + 2, MT, Hq)
                       : make_split(kmax[b], per, 2 * sm, Dv + 2, MT, Hq, hc);
        ns_max = std::max<int64_t>(ns_max, d->sp[b].ns);
    }
    /* the window's own partial states on the tensor-core path (launched beside the compressed branch) */
    const int64_t ns_win = mma && cfg.window > 0 ? d->sp[2].ns : 0;
    const double part = (double)MT * (double)Hq * (double)(ns_max + ns_win) * (double)(Dv + 2) * 4.0;
    const double pb = cfg.num_selected > 0 ? (double)MT * (double)Hkv * (double)plan->max_nc * 4.0 : 0.0;
    const double rw = cfg.num_selected > 0 ? (double)MT * (double)Hkv * (double)plan->max_ns * 4.0 : 0.0;
    const double chk = (double)DEC_CHECK_HEAD + 4.0 * ((double)lim.num_pages + (double)lim.num_cmp_pages);
    /* the tensor-core path's q.k of the compressed keys, kept for the ranking where they take at most
     * 1 GiB (past that, a second pass over the compressed keys forms the block scores) */
    const double sc = (double)MT * (double)Hkv * (double)plan->max_nc * (double)G * 4.0;
    const bool keep_scores =
        mma && cfg.num_selected > 0 && plan->max_nc > 0 && sc <= 1073741824.0 && forced != K_DECODE_SM80_PROBS;
    if ((forced == K_DECODE_SM80 || forced == K_DECODE_SM80_WIDE) && cfg.num_selected > 0 && plan->max_nc > 0 &&
        !keep_scores)
        return FAIL(NSA_ERR_UNSUPPORTED,
                    "cuda backend: NSA_CUDA_FORCE asks stage decode_attn to run %s, whose kept q.k products "
                    "would take %.3g bytes (more than 1 GiB: max_total_tokens x Hkv x compressed rows x G floats)",
                    kern_name(forced), sc);
    /* decode_sm80_wide where the rows x KV heads fill at most half the SMs (batch 1 at long context waited on
     * one last CTA per KV head ranking alone); forced, at least two parts */
    int rank_parts = 0;
    if (keep_scores && forced != K_DECODE_SM80) {
        rank_parts = dec_rank_wide_parts(MT, Hkv, plan->max_ns, cfg.cmp_block, cfg.cmp_stride, cfg.slc_block, sms,
                                         forced == K_DECODE_SM80_WIDE);
        if (forced == K_DECODE_SM80_WIDE && rank_parts == 0)
            return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: NSA_CUDA_FORCE asks stage decode_attn to run "
                        "decode_sm80_wide, which cannot split this plan's %lld selection blocks into at most 65535 "
                        "parts", (long long)plan->max_ns);
    }
    if (part > 1e14 || pb > 1e14 || rw > 1e14 || chk > 1e14)
        return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: a decode plan's scratch would take %.3g bytes",
                    part + pb + rw + chk);
    d->part_win = MT * Hq * ns_max * (Dv + 2); /* below 1e14 / 4 (checked above) */
    size_t *acc = &p->bytes;
    CU(dalloc(acc, &d->rec, NSA_DR_FIELDS * sizeof(int)), "plan_prepare (decode record)");
    CU(cudaMemsetAsync(d->rec, 0, NSA_DR_FIELDS * sizeof(int), c->stream), "plan_prepare (decode record)");
    if (mma) {
        CU(dalloc(acc, &d->cnt, (size_t)(4 * MT * Hkv) * sizeof(int)), "plan_prepare (decode counters)");
        CU(cudaMemsetAsync(d->cnt, 0, (size_t)(4 * MT * Hkv) * sizeof(int), c->stream), "plan_prepare (decode counters)");
    }
    if (keep_scores) CU(dalloc(acc, &d->scores, (size_t)sc), "plan_prepare (decode scores)");
    CU(cudaStreamSynchronize(c->stream), "plan_prepare (decode record)");
    d->chk_bytes = (size_t)chk;
    CU(dalloc(acc, (char **)&d->chk_mem, d->chk_bytes), "plan_prepare (decode checks)");
    d->chk.flags = (unsigned long long *)d->chk_mem;
    d->chk.arrive = (unsigned *)((char *)d->chk_mem + 16);
    d->chk.pcount = (int *)((char *)d->chk_mem + DEC_CHECK_HEAD);
    d->chk.ccount = d->chk.pcount + lim.num_pages;
    CU(dalloc(acc, &d->part, (size_t)part), "plan_prepare (decode partial states)");
    if (cfg.num_selected > 0) {
        CU(dalloc(acc, &d->pbuf, (size_t)pb), "plan_prepare (decode block scores)");
        CU(dalloc(acc, &d->rows, (size_t)rw), "plan_prepare (decode block scores)");
    }
    /* the checks in one CTA where the batch's table columns and the page counts fit it
     * (NSA_CUDA_FORCE=decode_append:decode_append keeps the two kernels and the memset) */
    const Kern fa = c->force.k[NSA_STAGE_DECODE_APPEND];
    const int64_t chk_cols = std::max<int64_t>(lim.max_pages, lim.max_cmp_pages);
    const bool one_fits = dec_check_one_fits(lim.batch, chk_cols, d->chk_bytes);
    if (fa == K_DECODE_APPEND_ONE && !one_fits)
        return FAIL(NSA_ERR_UNSUPPORTED,
                    "cuda backend: NSA_CUDA_FORCE asks stage decode_append to run decode_append_one, whose one CTA "
                    "takes at most %lld (sequence, table column) items and %zu bytes of page counts (this plan: %lld "
                    "x %lld, %zu bytes)",
                    (long long)DEC_CHECK_ONE_ITEMS, DEC_CHECK_ONE_BYTES, (long long)lim.batch, (long long)chk_cols,
                    d->chk_bytes);
    d->check_one = one_fits && fa != K_DECODE_APPEND;
    p->ch.st[NSA_STAGE_DECODE_APPEND].k = d->check_one ? K_DECODE_APPEND_ONE : K_DECODE_APPEND;
    p->ch.st[NSA_STAGE_DECODE_ATTN].k =
        !mma ? K_DECODE_SPLIT
             : rank_parts > 0                                             ? K_DECODE_SM80_WIDE
             : keep_scores || cfg.num_selected == 0 || plan->max_nc == 0 ? K_DECODE_SM80
                                                                         : K_DECODE_SM80_PROBS;
    d->rank_parts = rank_parts;
    return NSA_SUCCESS;
}

void decode_release(CudaPlan *p)
{
    CudaDec *d = p->dec;
    if (!d) return;
    void *m[] = {d->rec, d->chk_mem, d->part, d->pbuf, d->rows, d->cnt, d->scores};
    for (void *x : m)
        if (x) cudaFree(x);
    free(d);
    p->dec = nullptr;
}

void decode_describe(const CudaPlan *p, nsa_stage stage, char *buf, size_t size)
{
    const CudaDec *d = p->dec;
    if (stage == NSA_STAGE_DECODE_ATTN && d)
        snprintf(buf, size, "%s[splits cmp %dx%lld, slc %dx%lld, win %dx%lld; %d heads/cta%s%.0d]",
                 kern_name(p->ch.st[NSA_STAGE_DECODE_ATTN].k), d->sp[0].ns, (long long)d->sp[0].chunk, d->sp[1].ns,
                 (long long)d->sp[1].chunk, d->sp[2].ns, (long long)d->sp[2].chunk, d->sp[0].hc,
                 d->rank_parts ? "; rank parts " : "", d->rank_parts);
    else
        describe(p->ch.st[stage], stage, buf, size);
}

nsa_status decode_run(CudaCtx *c, const CudaPlan *p, nsa_stage stage, const nsa_bk_args *a)
{
    if (!p->dec) return FAIL(NSA_ERR_INTERNAL, "cuda backend: a decode stage on a plan without decode memory");
    if (stage == NSA_STAGE_DECODE_APPEND) return run_append(c, p->dec, a);
    if (stage == NSA_STAGE_DECODE_ATTN) return run_attn(c, p->dec, a);
    return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: stage %s is not a decode stage", nsa_stage_name(stage));
}

/* The record of the plan's last step as the cpu reference words it. */
nsa_status cu_decode_status(void *bctx, const nsa_bk_plan *plan)
{
    CudaCtx *c = (CudaCtx *)bctx;
    const CudaPlan *p = plan ? (const CudaPlan *)plan->backend_plan : nullptr;
    if (!c || !p || !p->dec) return NSA_SUCCESS;
    int32_t r[NSA_DR_FIELDS];
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    CU(cudaMemcpyAsync(r, p->dec->rec, sizeof r, cudaMemcpyDeviceToHost, c->stream), "cudaMemcpyAsync (decode record)");
    CU(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize (decode record)");
#ifdef NSA_DEC_TRACE
    dec_attn_sm80_trace_dump();
#endif
    char msg[1024];
    const nsa_status s = nsa_dec_record_message(r, &plan->lim, msg, sizeof msg);
    return s == NSA_SUCCESS ? NSA_SUCCESS : FAIL(s, "%s", msg);
}

} // namespace nsa_cuda
