/*
 * cuda_run.cu -- the CUDA backend's run(): one short function per stage,
 * each launching the kernel the plan chose (CudaPlan::ch, choose.h) on the
 * context's stream. Nothing here chooses, allocates or synchronizes, except
 * the NSA_CUDA_PROFILE events (which wait once per forward, after COMBINE).
 */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

namespace nsa_cuda {

namespace {

size_t esize(nsa_dtype d) { return d == NSA_DTYPE_F16 || d == NSA_DTYPE_BF16 ? 2 : 4; }

View view(const nsa_bk_tensor &t)
{
    View v = {NULL, t.stride_token, t.stride_head};
    if (t.buf) v.p = ((CudaBuf *)t.buf)->ptr + (size_t)t.offset * esize(t.dtype);
    return v;
}
MView mview(const nsa_bk_tensor &t)
{
    MView v = {NULL, t.stride_token, t.stride_head};
    if (t.buf) v.p = ((CudaBuf *)t.buf)->ptr + (size_t)t.offset * esize(t.dtype);
    return v;
}

Geom geom(const nsa_bk_plan *pl)
{
    const nsa_config &c = pl->cfg;
    Geom g = {};
    g.T = pl->total_tokens;
    g.B = pl->batch;
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
    g.total_cmp = pl->total_cmp;
    g.max_ns = pl->max_ns;
    g.scale = c.scale;
    g.dtype = (int)c.dtype;
    const int64_t *tab = (const int64_t *)((CudaBuf *)pl->dev_tables)->ptr;
    g.cu_seqlens = tab + pl->dev_cu_seqlens;
    g.cu_cmp = tab + pl->dev_cu_cmp;
    g.tok_seq = tab + pl->dev_tok_seq;
    return g;
}

/* One stage's call: the context, the plan, its arguments and the kernel's inputs. */
struct Run {
    CudaCtx *c;
    const CudaPlan *p;
    const nsa_bk_args *a;
    nsa_stage stage;
    Geom g;
    cudaStream_t s;
    const StageChoice &ch() const { return p->ch.st[stage]; }
    View kc16() const { return View{p->kc16, g.Hkv * p->ch.dqkp, p->ch.dqkp}; }
    View vc16() const { return View{p->vc16, g.Hkv * p->ch.dvp, p->ch.dvp}; }
};

/* A stage's argument check: the tensor must be given. */
#define NEED(t, name)                                                                                          \
    do {                                                                                                       \
        if (!(t).buf)                                                                                          \
            return FAIL(NSA_ERR_MISSING_TENSOR, "cuda backend: stage %s needs tensor %s, which is absent",    \
                        nsa_stage_name(r.stage), name);                                                        \
    } while (0)

/* returns the stage's status; a launch error becomes a message naming the stage */
#define LAUNCH(expr)                                                                                           \
    do {                                                                                                       \
        const cudaError_t e_ = (expr);                                                                         \
        if (e_ != cudaSuccess) return cuda_fail(e_, nsa_stage_name(r.stage));                                  \
    } while (0)

bool is_tc_attn(Kern k) { return k == K_ATTN_SM80 || k == K_ATTN_SM90; }

nsa_status run_compress(const Run &r)
{
    const nsa_bk_args *a = r.a;
    NEED(a->kc, "kc");
    NEED(a->vc, "vc");
    switch (r.ch().k) {
    case K_COMPRESS_MEAN:
        NEED(a->k[NSA_BRANCH_CMP], "k[cmp]");
        NEED(a->v[NSA_BRANCH_CMP], "v[cmp]");
        LAUNCH(compress_mean(r.g, view(a->k[NSA_BRANCH_CMP]), r.g.Dqk, mview(a->kc), r.s));
        LAUNCH(compress_mean(r.g, view(a->v[NSA_BRANCH_CMP]), r.g.Dv, mview(a->vc), r.s));
        return NSA_SUCCESS;
    case K_COMPRESS_LINEAR:
        NEED(a->k[NSA_BRANCH_CMP], "k[cmp]");
        NEED(a->v[NSA_BRANCH_CMP], "v[cmp]");
        NEED(a->w_k, "w_k");
        NEED(a->w_v, "w_v");
        LAUNCH(compress_linear(r.g, view(a->k[NSA_BRANCH_CMP]), r.g.Dqk, view(a->w_k).p, view(a->pe_k).p,
                               mview(a->kc), r.s));
        LAUNCH(compress_linear(r.g, view(a->v[NSA_BRANCH_CMP]), r.g.Dv, view(a->w_v).p, view(a->pe_v).p,
                               mview(a->vc), r.s));
        return NSA_SUCCESS;
    default:
        NEED(a->kc_in, "kc_in");
        NEED(a->vc_in, "vc_in");
        LAUNCH(compress_copy(r.g, view(a->kc_in), r.g.Dqk, mview(a->kc), r.s));
        LAUNCH(compress_copy(r.g, view(a->vc_in), r.g.Dv, mview(a->vc), r.s));
        return NSA_SUCCESS;
    }
}

nsa_status run_cmp(const Run &r)
{
    const nsa_bk_args *a = r.a;
    NEED(a->q, "q");
    NEED(a->o_b[NSA_BRANCH_CMP], "o_b[cmp]");
    NEED(a->lse[NSA_BRANCH_CMP], "lse[cmp]");
    if (r.g.total_cmp > 0) {
        NEED(a->kc, "kc");
        NEED(a->vc, "vc");
    }
    const Kern k = r.ch().k;
    const MView o = mview(a->o_b[NSA_BRANCH_CMP]), lse = mview(a->lse[NSA_BRANCH_CMP]);
    if (!is_tc_attn(k)) {
        const View none = {NULL, 0, 0};
        LAUNCH(attn_ref(r.g, 0, view(a->q), view(a->kc), view(a->vc), none, o, lse, r.s));
        return NSA_SUCCESS;
    }
    const int dqkp = r.p->ch.dqkp, dvp = r.p->ch.dvp;
    LAUNCH(pack_cmp16(r.g, view(a->kc), r.g.Dqk, dqkp, r.p->kc16, r.s));
    LAUNCH(pack_cmp16(r.g, view(a->vc), r.g.Dv, dvp, r.p->vc16, r.s));
    auto fn = k == K_ATTN_SM90 ? attn_sm90 : attn_sm80;
    LAUNCH(fn(r.g, r.c->dev, r.ch().attn, 0, r.p->tiles, dqkp, dvp, view(a->q), r.kc16(), r.vc16(), o, lse, r.s,
              nullptr));
    return NSA_SUCCESS;
}

/* BLOCK_SCORES (fused = false: the rows into a->scores) or SCORES_TOPN (the
 * indices; the rows in shared memory, or in the plan's buffer then topn) */
nsa_status run_scores(const Run &r, bool fused)
{
    const nsa_bk_args *a = r.a;
    NEED(a->q, "q");
    NEED(a->lse[NSA_BRANCH_CMP], "lse[cmp]");
    if (fused)
        NEED(a->indices, "indices");
    else
        NEED(a->scores, "scores");
    if (r.g.total_cmp > 0) NEED(a->kc, "kc");
    const StageChoice &c = r.ch();
    const View q = view(a->q), lse = view(a->lse[NSA_BRANCH_CMP]);
    const MView none = {nullptr, 0, 0};
    if (c.k == K_SCORES_REF) {
        if (fused) return FAIL(NSA_ERR_INTERNAL, "cuda backend: stage scores_topn planned on the reference kernel");
        LAUNCH(scores_ref(r.g, q, view(a->kc), lse, mview(a->scores), r.s));
        return NSA_SUCCESS;
    }
    /* the packed keys: cmp_attn made them when it ran a tensor-core kernel */
    if (!is_tc_attn(r.p->ch.st[NSA_STAGE_CMP_ATTN].k))
        LAUNCH(pack_cmp16(r.g, view(a->kc), r.g.Dqk, r.p->ch.dqkp, r.p->kc16, r.s));
    /* where the scores land and whether the kernel ranks them */
    const MView sc = fused ? none : mview(a->scores), idx = fused ? mview(a->indices) : none;
    /* a ring (scores_sm80_kq ranking as it goes) serves SCORES_TOPN only: BLOCK_SCORES keeps whole rows, in sc */
    auto scores = [&](const Tiles &tl, MView rows, MView out) {
        const bool rows_smem = c.rows_smem && (out.p != nullptr || !c.scores.ring);
        return c.k == K_SCORES_SM90_G16
                   ? scores_sm90_g16(r.g, r.c->dev, c.scores, tl, r.p->ch.dqkp, q, r.kc16(), lse, rows, out, r.s)
                   : scores_sm80(r.g, r.c->dev, c.scores,
                                 c.k == K_SCORES_SM80_G16  ? 16
                                 : c.k == K_SCORES_SM80_KQ ? scores_kq_gp(r.g.G)
                                                           : 0,
                                 rows_smem, tl, r.p->ch.dqkp, q, r.kc16(), lse, rows, out, r.s);
    };
    if (!fused || c.rows_smem) {
        LAUNCH(scores(r.p->sc_tiles, sc, idx));
        return NSA_SUCCESS;
    }
    /* the rows in the plan's buffer, then topn on them: in one pass, or chunk by chunk (make_score_rows) */
    const MView rows = {r.p->sc_rows, r.g.Hkv * r.g.max_ns, r.g.max_ns};
    const View rows_in = {rows.p, rows.st, rows.sh};
    if (r.p->n_sc_chunks == 0) {
        LAUNCH(scores(r.p->sc_tiles, rows, none));
        LAUNCH(select_topn(r.g, rows_in, 0, r.g.T, mview(a->indices), r.s));
        return NSA_SUCCESS;
    }
    for (int64_t i = 0; i < r.p->n_sc_chunks; i++) {
        const ScoreChunk &ck = r.p->sc_chunks[i];
        Tiles tl = r.p->sc_tiles;
        tl.tiles = r.p->sc_tiles_dev + 3 * ck.off;
        tl.count = ck.count;
        tl.row0 = ck.t0;
        LAUNCH(scores(tl, rows, none));
        LAUNCH(select_topn(r.g, rows_in, ck.t0, ck.t1, mview(a->indices), r.s));
    }
    return NSA_SUCCESS;
}

nsa_status run_topn(const Run &r)
{
    NEED(r.a->scores, "scores");
    NEED(r.a->indices, "indices");
    LAUNCH(select_topn(r.g, view(r.a->scores), 0, r.g.T, mview(r.a->indices), r.s));
    return NSA_SUCCESS;
}

/* SLC_ATTN, and SLC_COMBINE (fused: the kernel adds g_slc o_slc into o_b[CMP]'s
 * gated term, slc_store; no o_b[SLC] exists) */
nsa_status run_slc(const Run &r, char *ran, size_t ran_size)
{
    const nsa_bk_args *a = r.a;
    const bool fused = r.stage == NSA_STAGE_SLC_COMBINE;
    NEED(a->q, "q");
    NEED(a->k[NSA_BRANCH_SLC], "k[slc]");
    NEED(a->v[NSA_BRANCH_SLC], "v[slc]");
    NEED(a->indices, "indices");
    SlcSum z = {};
    if (fused) {
        if (!r.a->plan->slc_combined)
            return FAIL(NSA_ERR_INTERNAL, "cuda backend: stage slc_combine on a plan without slc_combined");
        NEED(a->o_b[NSA_BRANCH_CMP], "o_b[cmp]");
        NEED(a->gate[NSA_BRANCH_CMP], "gate[cmp]");
        NEED(a->gate[NSA_BRANCH_SLC], "gate[slc]");
        z.gc = view(a->gate[NSA_BRANCH_CMP]);
        z.gs = view(a->gate[NSA_BRANCH_SLC]);
    } else {
        NEED(a->o_b[NSA_BRANCH_SLC], "o_b[slc]");
    }
    const View q = view(a->q), k = view(a->k[NSA_BRANCH_SLC]), v = view(a->v[NSA_BRANCH_SLC]), idx = view(a->indices);
    const MView o = mview(a->o_b[fused ? NSA_BRANCH_CMP : NSA_BRANCH_SLC]), lse = mview(a->lse[NSA_BRANCH_SLC]);
    Kern kern = r.ch().k;
    /* slc_sm80_g16 copies K/V rows 16 bytes at a time; rows that do not allow that go to the plan's other kernel */
    if (kern == K_SLC_SM80_G16 && !slc_sm80_g16_loads(r.g, k, v)) {
        kern = r.p->ch.slc_unaligned;
        if (ran) snprintf(ran, ran_size, "%s (K/V rows not 16-byte aligned)", kern_name(kern));
    }
    const int dqkp = r.p->ch.dqkp, dvp = r.p->ch.dvp;
    switch (kern) {
    case K_SLC_SM80_G16:
        LAUNCH(slc_sm80_g16(r.g, r.c->dev, r.ch().slc, dqkp, dvp, q, k, v, idx, o, lse, z, r.s));
        break;
    case K_SLC_SM80: LAUNCH(slc_sm80(r.g, r.c->dev, dqkp, dvp, q, k, v, idx, o, lse, z, r.s)); break;
    case K_SLC_SM80_BLK:
    case K_SLC_SM90_BLK: {
        SlcMap m = r.p->slc_map; /* the plan's buffers (run() writes their contents, not the record) */
        auto fn = kern == K_SLC_SM90_BLK ? slc_sm90_blk : slc_sm80_blk;
        LAUNCH(fn(r.g, r.c->dev, dqkp, dvp, q, k, v, idx, o, lse, z, m, r.p->blk_pass, r.p->blk_o, r.p->blk_ml, r.s));
        break;
    }
    default: LAUNCH(attn_ref(r.g, 1, q, k, v, idx, o, lse, r.s, z)); break;
    }
    return NSA_SUCCESS;
}

/* Does WIN_ATTN write the final o itself (COMBINE folded into its epilogue)?
 * Both stages ask, with the same arguments, so they agree: the plan chose
 * combine_in_win, o given, and every enabled branch's gate present (else
 * COMBINE runs and reports the missing gate). */
bool win_combines(const CudaPlan *p, const nsa_bk_args *a)
{
    if (p->ch.st[NSA_STAGE_COMBINE].k != K_COMBINE_IN_WIN || !a->o.buf || !a->o_b[NSA_BRANCH_WIN].buf) return false;
    for (int b = 0; b < 3; b++)
        if (a->o_b[b].buf && !a->gate[b].buf && !(b == NSA_BRANCH_CMP && a->plan->slc_combined)) return false;
    return true;
}

/* WIN_ATTN, and WIN_COMBINE (the plan's combine_in_win as its own stage: no
 * o_b[WIN] exists, so the window kernel must write o) */
nsa_status run_win(const Run &r)
{
    const nsa_bk_args *a = r.a;
    const bool fused = r.stage == NSA_STAGE_WIN_COMBINE;
    NEED(a->q, "q");
    NEED(a->k[NSA_BRANCH_WIN], "k[win]");
    NEED(a->v[NSA_BRANCH_WIN], "v[win]");
    if (!fused) NEED(a->o_b[NSA_BRANCH_WIN], "o_b[win]");
    const View none = {NULL, 0, 0};
    const View q = view(a->q), k = view(a->k[NSA_BRANCH_WIN]), v = view(a->v[NSA_BRANCH_WIN]);
    const MView o = mview(a->o_b[NSA_BRANCH_WIN]), lse = mview(a->lse[NSA_BRANCH_WIN]);
    const Kern kern = r.ch().k;
    if (fused && (!is_tc_attn(kern) || r.p->ch.st[NSA_STAGE_COMBINE].k != K_COMBINE_IN_WIN))
        return FAIL(NSA_ERR_INTERNAL, "cuda backend: win_combine planned, but the plan's window kernel (%s) does not "
                    "combine", kern_name(kern));
    if (!is_tc_attn(kern)) {
        LAUNCH(attn_ref(r.g, 2, q, k, v, none, o, lse, r.s));
        return NSA_SUCCESS;
    }
    FuseCombine fz = {};
    if (fused || win_combines(r.p, a)) {
        if (fused) NEED(a->o, "o");
        const bool cmp_sum = a->plan->slc_combined; /* o_b[CMP] is SLC_COMBINE's sum: its gate is not read */
        for (int b = 0; b < 3; b++) {
            const bool on = (b == NSA_BRANCH_WIN || a->o_b[b].buf) && !(b == NSA_BRANCH_CMP && cmp_sum);
            if (fused && on && !a->gate[b].buf)
                return FAIL(NSA_ERR_MISSING_TENSOR, "cuda backend: stage win_combine: branch %d is on but its gate is "
                            "absent", b);
            fz.gate[b] = on ? view(a->gate[b]) : none;
        }
        fz.ob[0] = view(a->o_b[NSA_BRANCH_CMP]);
        fz.ob[1] = view(a->o_b[NSA_BRANCH_SLC]);
        fz.out = mview(a->o);
        fz.cmp_sum = cmp_sum;
    }
    auto fn = kern == K_ATTN_SM90 ? attn_sm90 : attn_sm80;
    LAUNCH(fn(r.g, r.c->dev, r.ch().attn, 2, r.p->tiles, r.p->ch.dqkp, r.p->ch.dvp, q, k, v, o, lse, r.s, &fz));
    return NSA_SUCCESS;
}

nsa_status run_combine(const Run &r)
{
    const nsa_bk_args *a = r.a;
    NEED(a->o, "o");
    View gate[3], ob[3];
    for (int b = 0; b < 3; b++) {
        ob[b] = view(a->o_b[b]);
        gate[b] = view(a->gate[b]);
        if (ob[b].p && !gate[b].p && !(b == NSA_BRANCH_CMP && a->plan->slc_combined))
            return FAIL(NSA_ERR_MISSING_TENSOR, "cuda backend: stage combine: branch %d is on but its gate is absent", b);
    }
    /* after SLC_COMBINE, o_b[CMP] holds the first two terms' sum */
    if (!win_combines(r.p, a)) /* else WIN_ATTN wrote o */
        LAUNCH(combine(r.g, gate, ob, a->plan->slc_combined != 0, mview(a->o), r.s));
    return NSA_SUCCESS;
}

/* NSA_CUDA_PROFILE: after COMBINE (forward) or BWD_STORE (backward), the pass's
 * last stage, wait and print every stage's time and kernel */
void print_profile(CudaCtx *c, const nsa_bk_plan *pl, nsa_stage last)
{
    cudaEventSynchronize(c->ev[2 * last + 1]);
    const Cls cls = c->lim.cls;
    fprintf(stderr, "nsa-cuda profile (class %s%s, T=%lld):", class_name(cls),
            c->dev.emulate ? " emulated (NSA_CUDA_TARGET)" : "", (long long)pl->total_tokens);
    float total = 0.f;
    for (int i = 0; i < NSA_STAGE_COUNT; i++) {
        if (!c->ev_used[i]) continue;
        float ms = 0.f;
        cudaEventElapsedTime(&ms, c->ev[2 * i], c->ev[2 * i + 1]);
        total += ms;
        fprintf(stderr, " %s %s %.3f |", nsa_stage_name((nsa_stage)i), c->ran[i], ms);
        c->ev_used[i] = false;
    }
    fprintf(stderr, " sum %.3f ms\n", total);
}

/* ---- backward (bwd_sm80.cu, bwd_ref.cu) */

/* bf16 plans with f16 copies (bwd_f16.cu): the compressed stage, which runs
 * first in every backward call (core/backend.h), converts q and dO for the
 * call, whichever kernel it runs itself */
static nsa_status f16_q_dout(const Run &r)
{
    const nsa_bk_args *a = r.a;
    F16Scale *f = r.p->f16s;
    LAUNCH(cudaMemsetAsync(f->mx, 0, 2 * sizeof(unsigned), r.s));
    LAUNCH(f16_amax(false, view(a->q), r.g.T, r.g.Hq, r.g.Dqk, &f->mx[0], r.s));
    LAUNCH(f16_amax(false, view(a->dout), r.g.T, r.g.Hq, r.g.Dv, &f->mx[1], r.s));
    LAUNCH(f16_scales(f, 0, r.g.scale, r.g.Dv, r.s));
    LAUNCH(f16_convert(false, view(a->q), r.g.T, r.g.Hq, r.g.Dqk, r.p->dq8, &f->ex[0], r.p->q16, r.s));
    LAUNCH(f16_convert(false, view(a->dout), r.g.T, r.g.Hq, r.g.Dv, r.p->dv8, &f->ex[1], r.p->o16, r.s));
    return NSA_SUCCESS;
}

/* and each stage its branch's keys, values and factors; *out: the views the keys kernels read */
static nsa_status f16_branch(const Run &r, int mode, View k, View v, View gate, BwdF16 *out)
{
    F16Scale *f = r.p->f16s;
    const bool cmp = mode == 0;
    const int64_t rows = cmp ? r.g.total_cmp : r.g.T;
    const int dk = cmp ? r.p->ch.dqkp : r.p->dq8, dv = cmp ? r.p->ch.dvp : r.p->dv8;
    LAUNCH(cudaMemsetAsync(&f->mx[2], 0, 3 * sizeof(unsigned), r.s));
    LAUNCH(f16_amax(cmp, k, rows, r.g.Hkv, r.g.Dqk, &f->mx[2], r.s));
    LAUNCH(f16_amax(cmp, v, rows, r.g.Hkv, r.g.Dv, &f->mx[3], r.s));
    LAUNCH(f16_amax(true, gate, r.g.T, r.g.Hq, 1, &f->mx[4], r.s));
    LAUNCH(f16_scales(f, 1, r.g.scale, r.g.Dv, r.s));
    LAUNCH(f16_convert(cmp, k, rows, r.g.Hkv, r.g.Dqk, dk, &f->ex[2], r.p->k16, r.s));
    LAUNCH(f16_convert(cmp, v, rows, r.g.Hkv, r.g.Dv, dv, &f->ex[3], r.p->v16, r.s));
    out->ks = f->ks;
    out->q = View{r.p->q16, r.g.Hq * r.p->dq8, r.p->dq8};
    out->dout = View{r.p->o16, r.g.Hq * r.p->dv8, r.p->dv8};
    out->k = View{r.p->k16, r.g.Hkv * dk, dk};
    out->v = View{r.p->v16, r.g.Hkv * dv, dv};
    return NSA_SUCCESS;
}

nsa_status run_bwd_attn(const Run &r, int b)
{
    const nsa_bk_args *a = r.a;
    NEED(a->q, "q");
    NEED(a->dout, "dout");
    NEED(a->lse[b], "lse");
    NEED(a->gate[b], "gate");
    NEED(a->delta, "delta");
    const nsa_bk_tensor &k = b == NSA_BRANCH_CMP ? a->kc : a->k[b], &v = b == NSA_BRANCH_CMP ? a->vc : a->v[b];
    if (b != NSA_BRANCH_CMP || r.g.total_cmp > 0) {
        NEED(k, "k");
        NEED(v, "v");
    }
    if (b == NSA_BRANCH_SLC) NEED(a->indices, "indices");
    BwdIn in = {view(a->q), view(a->dout), view(a->lse[b]), view(a->gate[b]), view(a->indices), mview(a->dgate[b]),
                mview(a->delta)};
    const MView dk = mview(b == NSA_BRANCH_CMP ? a->dkc_acc : a->dk_acc[b]);
    const MView dv = mview(b == NSA_BRANCH_CMP ? a->dvc_acc : a->dv_acc[b]);
    const SlcMap *map = nullptr;
    if (b == NSA_BRANCH_SLC && (dk.p || dv.p)) {
        if (!r.p->has_slc_map)
            return FAIL(NSA_ERR_INTERNAL, "cuda backend: %s on a plan without the selection map (not a training plan?)",
                        nsa_stage_name(r.stage));
        SlcMap m = r.p->slc_map; /* the plan's buffers (run() writes their contents, not the record) */
        LAUNCH(slc_map_build(r.g, view(a->indices), m, 0, r.g.T, false, r.s));
        map = &r.p->slc_map;
    }
    const int mode = b == NSA_BRANCH_CMP ? 0 : b == NSA_BRANCH_SLC ? 1 : 2;
    nsa_status st;
    if (mode == 0 && r.p->f16s && (st = f16_q_dout(r)) != NSA_SUCCESS) return st;
    if (r.ch().k != K_BWD_ATTN_SM80 && r.ch().k != K_BWD_ATTN_SM90) {
        LAUNCH(bwd_attn_ref(r.g, mode, in, view(k), view(v), mview(a->dq_acc), dk, dv, map, r.s));
        return NSA_SUCCESS;
    }
    const int dqkp = r.p->ch.dqkp, dvp = r.p->ch.dvp;
    View kk = view(k), vv = view(v);
    if (mode == 0 && r.g.total_cmp > 0) { /* the keys kernel and dq read the compressed rows packed to 16 bits */
        LAUNCH(pack_cmp16(r.g, view(a->kc), r.g.Dqk, dqkp, r.p->kc16, r.s));
        LAUNCH(pack_cmp16(r.g, view(a->vc), r.g.Dv, dvp, r.p->vc16, r.s));
        kk = r.kc16();
        vv = r.vc16();
    }
    BwdF16 f16 = {};
    if (r.p->f16s && (dk.p || dv.p) && (st = f16_branch(r, mode, mode == 0 ? view(a->kc) : kk, mode == 0 ? view(a->vc) : vv,
                                                        view(a->gate[b]), &f16)) != NSA_SUCCESS)
        return st;
    LAUNCH(bwd_attn_sm80(r.g, r.c->dev, mode, dqkp, dvp, r.p->bwd, in, kk, vv, mview(a->dq_acc), dk, dv, map,
                         r.ch().k == K_BWD_ATTN_SM90, f16, r.s));
    return NSA_SUCCESS;
}

nsa_status run_bwd_compress(const Run &r)
{
    const nsa_bk_args *a = r.a;
    if (r.g.total_cmp == 0 || r.a->plan->cfg.compress == NSA_COMPRESS_EXTERNAL) return NSA_SUCCESS;
    NEED(a->dkc_acc, "dkc_acc");
    NEED(a->dvc_acc, "dvc_acc");
    const bool lin = r.ch().k == K_BWD_COMPRESS_LINEAR;
    if (lin) {
        NEED(a->w_k, "w_k");
        NEED(a->w_v, "w_v");
        if (a->dw_k_acc.buf || a->dw_v_acc.buf) {
            NEED(a->k[NSA_BRANCH_CMP], "k[cmp]");
            NEED(a->v[NSA_BRANCH_CMP], "v[cmp]");
        }
    }
    LAUNCH(bwd_compress(r.g, lin, r.g.Dqk, view(a->dkc_acc), view(a->k[NSA_BRANCH_CMP]), view(a->w_k), view(a->pe_k),
                        mview(a->dk_acc[NSA_BRANCH_CMP]), mview(a->dw_k_acc), mview(a->dpe_k_acc), r.s));
    LAUNCH(bwd_compress(r.g, lin, r.g.Dv, view(a->dvc_acc), view(a->v[NSA_BRANCH_CMP]), view(a->w_v), view(a->pe_v),
                        mview(a->dv_acc[NSA_BRANCH_CMP]), mview(a->dw_v_acc), mview(a->dpe_v_acc), r.s));
    return NSA_SUCCESS;
}

nsa_status run_bwd_store(const Run &r)
{
    const nsa_bk_args *a = r.a;
    for (int i = 0; i < a->num_store; i++) {
        const nsa_bk_store &st = a->store[i];
        NEED(st.acc, "acc");
        NEED(st.out, "out");
        LAUNCH(bwd_store((int)st.out.dtype, view(st.acc), mview(st.out), st.rows, st.heads, st.dim, r.s));
    }
    return NSA_SUCCESS;
}

} // namespace

nsa_status cu_run(void *bctx, nsa_stage stage, const nsa_bk_args *a)
{
    CudaCtx *c = (CudaCtx *)bctx;
    if (!c || !a || !a->plan) return FAIL(NSA_ERR_INTERNAL, "cuda backend: run() without a context, arguments or plan");
    const nsa_bk_plan *pl = a->plan;
    const CudaPlan *p = (const CudaPlan *)pl->backend_plan;
    if (p && pl->decode) { /* decode plans have no token tables: cuda_decode.cu */
        CU(cudaSetDevice(c->device), "cudaSetDevice");
        return decode_run(c, p, stage, a);
    }
    if (!p || !pl->dev_tables) return FAIL(NSA_ERR_INTERNAL, "cuda backend: plan was not prepared");
    if (stage < 0 || stage >= NSA_STAGE_COUNT)
        return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: stage %d is not implemented", (int)stage);
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    const Run r = {c, p, a, stage, geom(pl), c->stream};
    char *ran = c->profile ? c->ran[stage] : nullptr;
    if (ran) {
        describe(p->ch.st[stage], stage, ran, sizeof c->ran[stage]);
        cudaEventRecord(c->ev[2 * stage], r.s);
    }
    nsa_status s;
    switch (stage) {
    case NSA_STAGE_COMPRESS: s = run_compress(r); break;
    case NSA_STAGE_CMP_ATTN: s = run_cmp(r); break;
    case NSA_STAGE_BLOCK_SCORES: s = run_scores(r, false); break;
    case NSA_STAGE_SCORES_TOPN: s = run_scores(r, true); break;
    case NSA_STAGE_SELECT_TOPN: s = run_topn(r); break;
    case NSA_STAGE_SLC_ATTN:
    case NSA_STAGE_SLC_COMBINE: s = run_slc(r, ran, sizeof c->ran[stage]); break;
    case NSA_STAGE_WIN_ATTN:
    case NSA_STAGE_WIN_COMBINE: s = run_win(r); break;
    case NSA_STAGE_COMBINE: s = run_combine(r); break;
    case NSA_STAGE_BWD_CMP_ATTN: s = run_bwd_attn(r, NSA_BRANCH_CMP); break;
    case NSA_STAGE_BWD_COMPRESS: s = run_bwd_compress(r); break;
    case NSA_STAGE_BWD_SLC_ATTN: s = run_bwd_attn(r, NSA_BRANCH_SLC); break;
    case NSA_STAGE_BWD_WIN_ATTN: s = run_bwd_attn(r, NSA_BRANCH_WIN); break;
    case NSA_STAGE_BWD_STORE: s = run_bwd_store(r); break;
    default: s = FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: stage %s is not implemented", nsa_stage_name(stage));
    }
    if (s != NSA_SUCCESS || !ran) return s;
    cudaEventRecord(c->ev[2 * stage + 1], r.s);
    c->ev_used[stage] = true;
    if (stage == NSA_STAGE_COMBINE || stage == NSA_STAGE_WIN_COMBINE || stage == NSA_STAGE_BWD_STORE)
        print_profile(c, pl, stage);
    return NSA_SUCCESS;
}

} // namespace nsa_cuda
