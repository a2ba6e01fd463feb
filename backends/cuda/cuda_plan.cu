/*
 * cuda_plan.cu -- per-plan work of the CUDA backend: which stages it offers
 * (supports), the kernel choice made once per plan (choose.h) and the memory
 * the chosen kernels need outside the workspace (plan_prepare), and the
 * kernel names the plan reports (stage_kernel).
 *
 * Memory outside the workspace, allocated once per plan (never in run()):
 *   the tile list of the tiled kernels (heavy, late tiles first);
 *   the compressed keys/values in the input type, zero padded to the padded
 *     head dims, for the tensor-core kernels that read them
 *     (total_cmp * Hkv * (Dqk' + Dv') * 2 bytes);
 *   the score rows [T, Hkv, max_ns] f32 when the fused SCORES_TOPN stage is
 *     planned but the chosen scores kernel cannot hold its rows in shared
 *     memory (then the stage runs the scores kernel and topn on them).
 */
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_internal.h"

namespace nsa_cuda {

int cu_supports(void *bctx, nsa_stage stage, const nsa_config *cfg)
{
    const CudaCtx *c = (const CudaCtx *)bctx;
    if (stage == NSA_STAGE_SCORES_TOPN) return c && cfg && offers_scores_topn(c->lim, *cfg, c->force) ? 1 : 0;
    /* the backward stages: bwd_ref.cu's kernels, every dtype and head dim (LINEAR's
     * limit is the forward's, checked by the chooser) */
    if (stage >= NSA_STAGE_BWD_CMP_ATTN && stage <= NSA_STAGE_BWD_STORE) return 1;
    return stage >= NSA_STAGE_COMPRESS && stage <= NSA_STAGE_COMBINE;
}

void cu_plan_release(void *bctx, nsa_bk_plan *plan)
{
    CudaCtx *c = (CudaCtx *)bctx;
    CudaPlan *p = (CudaPlan *)plan->backend_plan;
    if (!p) return;
    cudaSetDevice(c->device);
    if (p->tiles_dev) cudaFree(p->tiles_dev);
    if (p->kc16) cudaFree(p->kc16);
    if (p->vc16) cudaFree(p->vc16);
    if (p->sc_rows) cudaFree(p->sc_rows);
    SlcMap &m = p->slc_map;
    void *maps[] = {(void *)m.blk_off, m.cnt, m.off, m.list_in, m.list_out, m.seg, m.seg_out, m.tmp};
    for (void *x : maps)
        if (x) cudaFree(x);
    free(p);
    plan->backend_plan = NULL;
}

/* Tiles of qt tokens x hc heads (128 rows), heavy (late) tiles first: a host
 * list (token, count, sequence) uploaded once. */
static nsa_status make_tiles(const nsa_bk_plan *plan, CudaPlan *p)
{
    const nsa_config *cfg = &plan->cfg;
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    const int hc = tile_heads(G), qt = tile_tokens(G);
    std::vector<int64_t> t, sorted;
    try {
        for (int64_t b = 0; b < plan->batch; b++) {
            const int64_t s0 = plan->cu_seqlens[b], len = plan->cu_seqlens[b + 1] - s0;
            for (int64_t lt = 0; lt < len; lt += qt) {
                t.push_back(s0 + lt);
                t.push_back(std::min<int64_t>(qt, len - lt));
                t.push_back(b);
            }
        }
        sorted.resize(t.size());
    } catch (...) {
        return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory for the tile list");
    }
    const int64_t count = (int64_t)t.size() / 3;
    std::vector<int64_t> order(count);
    for (int64_t i = 0; i < count; i++) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return t[3 * a] - plan->cu_seqlens[t[3 * a + 2]] > t[3 * b] - plan->cu_seqlens[t[3 * b + 2]];
    });
    for (int64_t i = 0; i < count; i++)
        for (int k = 0; k < 3; k++) sorted[3 * i + k] = t[3 * order[i] + k];
    if (count > 0) {
        CU(cudaMalloc((void **)&p->tiles_dev, sorted.size() * sizeof(int64_t)), "plan_prepare (tile list)");
        CU(cudaMemcpy(p->tiles_dev, sorted.data(), sorted.size() * sizeof(int64_t), cudaMemcpyHostToDevice),
           "plan_prepare (tile list)");
    }
    p->tiles.tiles = p->tiles_dev;
    p->tiles.count = count;
    p->tiles.qt = qt;
    p->tiles.hc = hc;
    p->tiles.nchunk = (int)((G + hc - 1) / hc);
    return NSA_SUCCESS;
}

/* The selected branch's inverse map (bwd_ref.cu, SlcMap): the batch's selection
 * block offsets on the device and the map's buffers, once per training plan. */
static nsa_status make_slc_map(const nsa_bk_plan *plan, CudaPlan *p)
{
    const nsa_config *cfg = &plan->cfg;
    std::vector<int64_t> off;
    try {
        off.resize((size_t)plan->batch + 1);
    } catch (...) {
        return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory for the selection block offsets");
    }
    off[0] = 0;
    for (int64_t b = 0; b < plan->batch; b++) {
        const int64_t len = plan->cu_seqlens[b + 1] - plan->cu_seqlens[b];
        off[b + 1] = off[b] + (len + cfg->slc_block - 1) / cfg->slc_block;
    }
    SlcMap &m = p->slc_map;
    m.nb = off[plan->batch];
    const int64_t entries = plan->total_tokens * cfg->num_kv_heads * cfg->num_selected;
    const int64_t segments = cfg->num_kv_heads * m.nb;
    if (plan->total_tokens >= ((int64_t)1 << 31) || entries >= ((int64_t)1 << 31) - 1 || segments >= ((int64_t)1 << 30))
        return FAIL(NSA_ERR_UNSUPPORTED,
                    "cuda backend: the backward's selection map holds T * Hkv * n = %lld entries; at most 2^31 - 2 "
                    "(and T < 2^31) are supported",
                    (long long)entries);
    m.tmp_bytes = slc_map_tmp_bytes(entries, segments);
    const size_t e4 = (size_t)entries * sizeof(int), s4 = (size_t)(segments + 1) * sizeof(int);
    CU(cudaMalloc((void **)&m.blk_off, off.size() * sizeof(int64_t)), "plan_prepare (selection map)");
    CU(cudaMemcpy((void *)m.blk_off, off.data(), off.size() * sizeof(int64_t), cudaMemcpyHostToDevice),
       "plan_prepare (selection map)");
    CU(cudaMalloc((void **)&m.cnt, s4), "plan_prepare (selection map)");
    CU(cudaMalloc((void **)&m.off, s4), "plan_prepare (selection map)");
    CU(cudaMalloc((void **)&m.list_in, e4), "plan_prepare (selection map)");
    CU(cudaMalloc((void **)&m.list_out, e4), "plan_prepare (selection map)");
    CU(cudaMalloc((void **)&m.seg, e4), "plan_prepare (selection map)");
    CU(cudaMalloc((void **)&m.seg_out, e4), "plan_prepare (selection map)");
    CU(cudaMalloc(&m.tmp, m.tmp_bytes ? m.tmp_bytes : 16), "plan_prepare (selection map)");
    p->has_slc_map = true;
    return NSA_SUCCESS;
}

static nsa_status prepare(CudaCtx *c, nsa_bk_plan *plan, CudaPlan *p)
{
    const nsa_config *cfg = &plan->cfg;
    char msg[512];
    nsa_status s = choose(c->lim, *cfg, plan->max_ns, c->force, &p->ch, msg, sizeof msg);
    if (s != NSA_SUCCESS) return FAIL(s, "%s", msg);
    p->scores_topn = cfg->num_selected > 0 && offers_scores_topn(c->lim, *cfg, c->force);
    if (p->ch.tiles && (s = make_tiles(plan, p)) != NSA_SUCCESS) return s;
    const size_t rows = (size_t)plan->total_cmp * (size_t)cfg->num_kv_heads;
    if (p->ch.kc16 && rows > 0) {
        CU(cudaMalloc(&p->kc16, rows * p->ch.dqkp * 2), "plan_prepare (packed compressed keys)");
        const Kern ck = p->ch.st[NSA_STAGE_CMP_ATTN].k;
        if (ck == K_ATTN_SM80 || ck == K_ATTN_SM90)
            CU(cudaMalloc(&p->vc16, rows * p->ch.dvp * 2), "plan_prepare (packed compressed values)");
    }
    if ((cfg->flags & NSA_CONFIG_TRAINING) && cfg->num_selected > 0 && plan->total_tokens > 0 &&
        (s = make_slc_map(plan, p)) != NSA_SUCCESS)
        return s;
    if (p->scores_topn && !p->ch.fused_topn && plan->total_tokens > 0) {
        /* the bytes the core reserves for the unfused stages (it checked the product) */
        const size_t bytes = (size_t)plan->total_tokens * (size_t)cfg->num_kv_heads * (size_t)plan->max_ns * 4;
        CU(cudaMalloc((void **)&p->sc_rows, bytes), "plan_prepare (score rows)");
    }
    return NSA_SUCCESS;
}

nsa_status cu_plan_prepare(void *bctx, nsa_bk_plan *plan)
{
    CudaCtx *c = (CudaCtx *)bctx;
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    CudaPlan *p = (CudaPlan *)calloc(1, sizeof *p);
    if (!p) return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: cannot allocate a plan record");
    plan->backend_plan = p;
    const nsa_status s = prepare(c, plan, p);
    if (s != NSA_SUCCESS) {
        cudaGetLastError(); /* a failed allocation is not sticky; clear it for the next call */
        cu_plan_release(bctx, plan);
    }
    return s;
}

nsa_status cu_stage_kernel(void *bctx, const nsa_bk_plan *plan, nsa_stage stage, char *name, size_t size)
{
    (void)bctx;
    const CudaPlan *p = plan ? (const CudaPlan *)plan->backend_plan : nullptr;
    if (!p || stage < 0 || stage >= NSA_STAGE_COUNT)
        return FAIL(NSA_ERR_INTERNAL, "cuda backend: stage_kernel without a prepared plan or with stage %d",
                    (int)stage);
    describe(p->ch.st[stage], stage, name, size);
    return NSA_SUCCESS;
}

} // namespace nsa_cuda
