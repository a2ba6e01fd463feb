/*
 * cuda_plan.cu -- per-plan work of the CUDA backend: which stages it offers
 * (supports), the kernel choice made once per plan (choose.h) and the memory
 * the chosen kernels need outside the workspace (plan_prepare), and the
 * kernel names the plan reports (stage_kernel).
 *
 * Memory outside the workspace, allocated once per plan (never in run()):
 *   the tile list of the tiled kernels (heavy, late tiles first), and for
 *     training plans on bwd_attn_sm80 its 64-row tiles and key tiles;
 *   the compressed keys/values in the input type, zero padded to the padded
 *     head dims, for the tensor-core kernels that read them
 *     (total_cmp * Hkv * (Dqk' + Dv') * 2 bytes);
 *   the score rows [T, Hkv, max_ns] f32 when the fused SCORES_TOPN stage is
 *     planned but the chosen scores kernel cannot hold its rows in shared
 *     memory (then the stage runs the scores kernel and topn on them); past
 *     the context's score_rows_max bytes (NSA_CUDA_SCORE_ROWS_MAX, 1 GiB;
 *     T = 524288 at the paper's shape would take 68.7 GB) the stage runs in
 *     chunks of consecutive tiles that fit it.
 */
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_internal.h"

namespace nsa_cuda {

/* cudaMalloc that adds the bytes to the plan's count (nsa_plan_info.backend_bytes) */
template <typename T> static cudaError_t palloc(size_t *acc, T **ptr, size_t bytes)
{
    const cudaError_t e = cudaMalloc((void **)ptr, bytes);
    if (e == cudaSuccess) *acc += bytes;
    return e;
}

int cu_supports(void *bctx, nsa_stage stage, const nsa_config *cfg)
{
    const CudaCtx *c = (const CudaCtx *)bctx;
    /* f32, f16 and bf16 kernels only: an f64 plan is refused (the core says
     * NSA_ERR_UNSUPPORTED, naming the backend and the dtype) */
    if (!cfg || (cfg->dtype != NSA_DTYPE_F32 && cfg->dtype != NSA_DTYPE_F16 && cfg->dtype != NSA_DTYPE_BF16)) return 0;
    if (stage == NSA_STAGE_SCORES_TOPN) return c && cfg && offers_scores_topn(c->lim, *cfg, c->force) ? 1 : 0;
    if (stage == NSA_STAGE_WIN_COMBINE) return c && cfg && offers_win_combine(c->lim, *cfg, c->force) ? 1 : 0;
    if (stage == NSA_STAGE_SLC_COMBINE) return c && offers_slc_combine(c->lim, *cfg, c->force, c->slc_combine) ? 1 : 0;
    /* the backward stages: bwd_sm80.cu's or bwd_ref.cu's kernels, every dtype and
     * head dim (LINEAR's limit is the forward's, checked by the chooser) */
    if (stage >= NSA_STAGE_BWD_CMP_ATTN && stage <= NSA_STAGE_BWD_STORE) return 1;
    if (stage == NSA_STAGE_DECODE_APPEND || stage == NSA_STAGE_DECODE_ATTN) return 1; /* cuda_decode.cu */
    return stage >= NSA_STAGE_COMPRESS && stage <= NSA_STAGE_COMBINE;
}

void cu_plan_release(void *bctx, nsa_bk_plan *plan)
{
    CudaCtx *c = (CudaCtx *)bctx;
    CudaPlan *p = (CudaPlan *)plan->backend_plan;
    if (!p) return;
    cudaSetDevice(c->device);
    if (p->tiles_dev) cudaFree(p->tiles_dev);
    if (p->sc_own_dev) cudaFree(p->sc_own_dev);
    for (int64_t *d : p->bwd_dev)
        if (d) cudaFree(d);
    void *bwd[] = {p->bwd.slc_nch, p->bwd.slc_nsl, p->bwd.slc_choff, p->bwd.slc_sloff, p->bwd.slc_tmp, p->bwd.scratch};
    for (void *x : bwd)
        if (x) cudaFree(x);
    void *f16[] = {p->q16, p->o16, p->k16, p->v16, p->f16s};
    for (void *x : f16)
        if (x) cudaFree(x);
    if (p->kc16) cudaFree(p->kc16);
    if (p->vc16) cudaFree(p->vc16);
    if (p->sc_rows) cudaFree(p->sc_rows);
    if (p->sc_tiles_dev) cudaFree(p->sc_tiles_dev);
    if (p->blk_o) cudaFree(p->blk_o);
    if (p->blk_ml) cudaFree(p->blk_ml);
    free(p->sc_chunks);
    decode_release(p);
    SlcMap &m = p->slc_map;
    void *maps[] = {(void *)m.blk_off, m.cnt, m.off, m.list_in, m.list_out, m.seg, m.seg_out, m.tmp};
    for (void *x : maps)
        if (x) cudaFree(x);
    free(p);
    plan->backend_plan = NULL;
}

/* Tiles of qt tokens of one sequence in token order: (first token, tokens,
 * sequence) triples. Throws std::bad_alloc (the callers catch it). */
static void token_tiles(const nsa_bk_plan *plan, int64_t qt, std::vector<int64_t> &t)
{
    for (int64_t b = 0; b < plan->batch; b++) {
        const int64_t s0 = plan->cu_seqlens[b], len = plan->cu_seqlens[b + 1] - s0;
        for (int64_t lt = 0; lt < len; lt += qt) {
            t.push_back(s0 + lt);
            t.push_back(std::min<int64_t>(qt, len - lt));
            t.push_back(b);
        }
    }
}

/* tiles [off, off + count) of t into the same places of out, heavy (late in
 * their sequence) first, ties in token order. Throws std::bad_alloc. */
static void heavy_first(const nsa_bk_plan *plan, const std::vector<int64_t> &t, int64_t off, int64_t count,
                        std::vector<int64_t> &out)
{
    std::vector<int64_t> order(count);
    for (int64_t i = 0; i < count; i++) order[i] = off + i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return t[3 * a] - plan->cu_seqlens[t[3 * a + 2]] > t[3 * b] - plan->cu_seqlens[t[3 * b + 2]];
    });
    for (int64_t i = 0; i < count; i++)
        for (int k = 0; k < 3; k++) out[3 * (off + i) + k] = t[3 * order[i] + k];
}

/* Tiles of qt tokens x hc heads (`rows` rows: the forward's 128, the
 * backward's 64), heavy (late) tiles first: a host list (token, count,
 * sequence) uploaded once to *dev. */
static nsa_status make_tiles(const nsa_bk_plan *plan, int rows, Tiles *out, int64_t **dev, size_t *acc)
{
    const nsa_config *cfg = &plan->cfg;
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    const int hc = (int)(G < rows ? G : rows), qt = rows / hc;
    std::vector<int64_t> t, sorted;
    try {
        token_tiles(plan, qt, t);
        sorted.resize(t.size());
        heavy_first(plan, t, 0, (int64_t)t.size() / 3, sorted);
    } catch (...) {
        return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory for the tile list");
    }
    const int64_t count = (int64_t)t.size() / 3;
    if (count > 0) {
        CU(palloc(acc, dev, sorted.size() * sizeof(int64_t)), "plan_prepare (tile list)");
        CU(cudaMemcpy(*dev, sorted.data(), sorted.size() * sizeof(int64_t), cudaMemcpyHostToDevice),
           "plan_prepare (tile list)");
    }
    out->tiles = *dev;
    out->count = count;
    out->qt = qt;
    out->hc = hc;
    out->nchunk = (int)((G + hc - 1) / hc);
    out->row0 = 0;
    return NSA_SUCCESS;
}

/* The score rows of an unfused SCORES_TOPN: one buffer of [T, Hkv, max_ns]
 * f32 where it takes at most `budget` bytes (p->tiles in one pass);
 * otherwise chunks of consecutive tiles (in token order, across sequences)
 * spanning at most `span` tokens, each chunk's tiles heavy (late) first like
 * make_tiles, and a buffer for one chunk's rows. The default budget, 1 GiB,
 * keeps a chunk's launch at thousands of CTAs on the paper's shape at
 * T = 524288 (8192 tokens x 4 groups, 64 chunks). */
static nsa_status make_score_rows(const nsa_bk_plan *plan, CudaPlan *p, int64_t budget)
{
    const nsa_config *cfg = &plan->cfg;
    const double row_bytes = (double)cfg->num_kv_heads * (double)plan->max_ns * 4.0;
    const int64_t T = plan->total_tokens, qt = p->sc_tiles.qt;
    if (row_bytes > 1e12)
        return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: score rows of %.3g bytes per token", row_bytes);
    const int64_t rb = (int64_t)row_bytes;
    const int64_t span = qt > 0 ? std::max<int64_t>(budget / rb / qt * qt, qt) : T;
    if (span >= T) { /* one pass over p->tiles (or the untiled kernels' own walk) */
        CU(palloc(&p->bytes, &p->sc_rows, (size_t)T * (size_t)rb), "plan_prepare (score rows)");
        return NSA_SUCCESS;
    }
    std::vector<int64_t> t, sorted;
    std::vector<ScoreChunk> ch;
    int64_t rows = 0;
    try {
        token_tiles(plan, qt, t);
        for (int64_t i = 0; 3 * i < (int64_t)t.size(); i++) {
            const int64_t t0 = t[3 * i], n = t[3 * i + 1];
            if (ch.empty() || t0 + n - ch.back().t0 > span) ch.push_back(ScoreChunk{i, 0, t0, t0});
            ch.back().count++;
            ch.back().t1 = t0 + n;
        }
        sorted.resize(t.size());
        for (const ScoreChunk &c : ch) {
            heavy_first(plan, t, c.off, c.count, sorted);
            rows = std::max(rows, c.t1 - c.t0);
        }
    } catch (...) {
        return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory for the score chunks");
    }
    p->sc_chunks = (ScoreChunk *)malloc(ch.size() * sizeof(ScoreChunk));
    if (!p->sc_chunks) return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory for the score chunks");
    memcpy(p->sc_chunks, ch.data(), ch.size() * sizeof(ScoreChunk));
    p->n_sc_chunks = (int64_t)ch.size();
    CU(palloc(&p->bytes, &p->sc_tiles_dev, sorted.size() * sizeof(int64_t)), "plan_prepare (score chunks)");
    CU(cudaMemcpy(p->sc_tiles_dev, sorted.data(), sorted.size() * sizeof(int64_t), cudaMemcpyHostToDevice),
       "plan_prepare (score chunks)");
    CU(palloc(&p->bytes, &p->sc_rows, (size_t)rows * (size_t)rb), "plan_prepare (score rows)");
    return NSA_SUCCESS;
}

/* Work items of bwd_attn_sm80's keys kernel (BWD_KEYS_BN keys: compressed rows
 * for mode 0, tokens for mode 2): six int64 per item (k0 local to the sequence,
 * keys, sequence, chunk, chunks, first scratch slot or -1), the items with the
 * most readers first. A compressed tile whose readers take more than cs steps
 * of BWD_KEYS_BM rows (cs chosen so that about BWD_CHUNK_TARGET CTAs run) is
 * split into chunks: the first compressed tiles are read by every later token
 * of the sequence, 32 times the average at 64k, and one CTA each made the
 * stage wait for them. Split tiles get scratch slots and a reduce item (k0,
 * keys, sequence, chunks, first slot). Window tiles have w + 63 readers and
 * are not split. */
static nsa_status make_key_tiles(const nsa_bk_plan *plan, int mode, CudaPlan *p, int64_t *slots)
{
    const nsa_config *cfg = &plan->cfg;
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    std::vector<int64_t> t, order, items, red;
    auto readers = [&](int64_t b, int64_t k0, int64_t nk) { /* tokens that may read keys k0 .. k0 + nk - 1 */
        const int64_t len = plan->cu_seqlens[b + 1] - plan->cu_seqlens[b];
        const int64_t r = mode == 0 ? len - (k0 * cfg->cmp_stride + cfg->cmp_block - 1)
                                    : std::min(k0 + nk - 1 + cfg->window, len) - k0;
        return r > 0 ? r : 0;
    };
    int64_t total = 0;
    try {
        for (int64_t b = 0; b < plan->batch; b++) {
            const int64_t len = plan->cu_seqlens[b + 1] - plan->cu_seqlens[b];
            const int64_t nrows = mode == 0 ? plan->cu_cmp[b + 1] - plan->cu_cmp[b] : len;
            for (int64_t k0 = 0; k0 < nrows; k0 += BWD_KEYS_BN) {
                const int64_t nk = std::min<int64_t>(BWD_KEYS_BN, nrows - k0);
                const int64_t steps = bwd_steps(readers(b, k0, nk), G);
                if (steps == 0) continue; /* nothing reads these keys */
                t.insert(t.end(), {k0, nk, b, steps});
                total += steps;
            }
        }
        order.resize(t.size() / 4);
    } catch (...) {
        return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory for the backward's key tiles");
    }
    const int64_t n = (int64_t)order.size();
    for (int64_t i = 0; i < n; i++) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t[4 * a + 3] > t[4 * b + 3]; });
    const int64_t per_head = std::max<int64_t>(1, BWD_CHUNK_TARGET / cfg->num_kv_heads);
    const int64_t cs = mode == 0 ? bwd_chunk_steps(total, per_head) : INT64_MAX;
    int64_t slot = 0;
    try {
        for (int64_t i = 0; i < n; i++) {
            const int64_t *e = &t[4 * order[i]];
            const int64_t nch = mode == 0 ? (e[3] + cs - 1) / cs : 1;
            for (int64_t c = 0; c < nch; c++) items.insert(items.end(), {e[0], e[1], e[2], c, nch, nch > 1 ? slot + c : -1});
            if (nch > 1) {
                red.insert(red.end(), {e[0], e[1], e[2], nch, slot});
                slot += nch;
            }
        }
    } catch (...) {
        return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory for the backward's key tiles");
    }
    const int64_t count = (int64_t)items.size() / 6;
    if (count >= ((int64_t)1 << 31))
        return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: the backward's key tiles (%lld) exceed a grid", (long long)count);
    int64_t *&dev = p->bwd_dev[mode == 0 ? 1 : 2];
    if (count > 0) {
        CU(palloc(&p->bytes, &dev, items.size() * sizeof(int64_t)), "plan_prepare (backward key tiles)");
        CU(cudaMemcpy(dev, items.data(), items.size() * sizeof(int64_t), cudaMemcpyHostToDevice),
           "plan_prepare (backward key tiles)");
    }
    if (mode == 0) {
        p->bwd.kt_cmp = dev;
        p->bwd.n_cmp = count;
        p->bwd.cmp_cs = cs;
        p->bwd.n_red_cmp = (int64_t)red.size() / 5;
        if (!red.empty()) {
            CU(palloc(&p->bytes, &p->bwd_dev[3], red.size() * sizeof(int64_t)), "plan_prepare (backward key tiles)");
            CU(cudaMemcpy(p->bwd_dev[3], red.data(), red.size() * sizeof(int64_t), cudaMemcpyHostToDevice),
               "plan_prepare (backward key tiles)");
        }
        p->bwd.red_cmp = p->bwd_dev[3];
        *slots = slot * cfg->num_kv_heads;
    } else {
        p->bwd.kt_win = dev;
        p->bwd.n_win = count;
        *slots = 0;
    }
    return NSA_SUCCESS;
}

/* The selected keys kernel's chunks (bwd_attn_sm80): its items are (KV head,
 * batch selection block, 64-key sub-tile), split on the device at slc_cs steps
 * from the inverse map's counts. The forced blocks (the first, the local ones)
 * are read by every token that follows them. Sizes are bounds from the entries
 * T Hkv n: at most slc_grid chunks and *slots scratch slots. */
static nsa_status make_slc_chunks(const nsa_bk_plan *plan, CudaPlan *p, int64_t *slots)
{
    const nsa_config *cfg = &plan->cfg;
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads, nsub = (cfg->slc_block + BWD_KEYS_BN - 1) / BWD_KEYS_BN;
    const int64_t items = cfg->num_kv_heads * p->slc_map.nb * nsub;
    const int64_t entries = plan->total_tokens * cfg->num_kv_heads * cfg->num_selected;
    const BwdSlcChunks ch = bwd_slc_chunks(entries, G, items, nsub); /* the bounds: tiles.h */
    if (items + 1 >= ((int64_t)1 << 31) || ch.grid >= ((int64_t)1 << 31))
        return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: the backward's selected items (%lld) exceed a grid",
                    (long long)items);
    BwdTiles &bt = p->bwd;
    bt.slc_nsub = (int)nsub;
    bt.slc_cs = ch.cs;
    bt.slc_grid = ch.grid;
    bt.slc_tmp_bytes = bwd_slc_scan_bytes(items);
    const size_t n4 = (size_t)(items + 1) * sizeof(int);
    int **arr[] = {&bt.slc_nch, &bt.slc_nsl, &bt.slc_choff, &bt.slc_sloff};
    for (int **a : arr) CU(palloc(&p->bytes, a, n4), "plan_prepare (backward selected chunks)");
    CU(palloc(&p->bytes, &bt.slc_tmp, bt.slc_tmp_bytes ? bt.slc_tmp_bytes : 16), "plan_prepare (backward selected chunks)");
    *slots = ch.slots;
    return NSA_SUCCESS;
}

/* The selected branch's inverse map (bwd_ref.cu, SlcMap): the batch's selection
 * block offsets on the device and the map's buffers for `tokens` tokens' entries:
 * every token's for a training plan (the backward maps the whole batch), a
 * pass's for slc_sm80_blk (which maps one pass of tokens at a time). */
static nsa_status make_slc_map(const nsa_bk_plan *plan, CudaPlan *p, int64_t tokens)
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
    const int64_t entries = tokens * cfg->num_kv_heads * cfg->num_selected;
    const int64_t segments = cfg->num_kv_heads * m.nb;
    if (plan->total_tokens >= ((int64_t)1 << 31) || entries >= ((int64_t)1 << 31) - 1 || segments >= ((int64_t)1 << 30))
        return FAIL(NSA_ERR_UNSUPPORTED,
                    "cuda backend: the selection map holds %lld tokens * Hkv * n = %lld entries and %lld blocks * "
                    "Hkv; at most 2^31 - 2 entries, 2^30 blocks and T < 2^31 are supported",
                    (long long)tokens, (long long)entries, (long long)segments);
    m.tmp_bytes = slc_map_tmp_bytes(entries, segments);
    const size_t e4 = (size_t)entries * sizeof(int), s4 = (size_t)(segments + 1) * sizeof(int);
    CU(palloc(&p->bytes, &m.blk_off, off.size() * sizeof(int64_t)), "plan_prepare (selection map)");
    CU(cudaMemcpy((void *)m.blk_off, off.data(), off.size() * sizeof(int64_t), cudaMemcpyHostToDevice),
       "plan_prepare (selection map)");
    CU(palloc(&p->bytes, &m.cnt, s4), "plan_prepare (selection map)");
    CU(palloc(&p->bytes, &m.off, s4), "plan_prepare (selection map)");
    CU(palloc(&p->bytes, &m.list_in, e4), "plan_prepare (selection map)");
    CU(palloc(&p->bytes, &m.list_out, e4), "plan_prepare (selection map)");
    CU(palloc(&p->bytes, &m.seg, e4), "plan_prepare (selection map)");
    CU(palloc(&p->bytes, &m.seg_out, e4), "plan_prepare (selection map)");
    CU(palloc(&p->bytes, &m.tmp, m.tmp_bytes ? m.tmp_bytes : 16), "plan_prepare (selection map)");
    p->has_slc_map = true;
    return NSA_SUCCESS;
}

/* The keys kernels' f16 copies of a bf16 training plan (bwd_f16.cu): q and dO
 * [T, Hq, D rounded up to 8], one branch's keys and values at a time (the
 * larger of [T, Hkv, D8] and the packed compressed rows), the scale block. */
static nsa_status make_f16_copies(const nsa_bk_plan *plan, CudaPlan *p)
{
    const nsa_config *cfg = &plan->cfg;
    p->dq8 = (int)((cfg->head_dim_qk + 7) / 8 * 8);
    p->dv8 = (int)((cfg->head_dim_v + 7) / 8 * 8);
    const double T = (double)plan->total_tokens, Hq = (double)cfg->num_q_heads, Hkv = (double)cfg->num_kv_heads;
    const double nc = (double)plan->total_cmp;
    const double qb = T * Hq * p->dq8 * 2.0, ob = T * Hq * p->dv8 * 2.0;
    const double kb = std::max(T * Hkv * p->dq8, nc * Hkv * p->ch.dqkp) * 2.0;
    const double vb = std::max(T * Hkv * p->dv8, nc * Hkv * p->ch.dvp) * 2.0;
    if (qb + ob + kb + vb > 1e15)
        return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: the backward's f16 copies would take %.3g bytes",
                    qb + ob + kb + vb);
    CU(palloc(&p->bytes, &p->q16, (size_t)qb), "plan_prepare (backward f16 copy of q)");
    CU(palloc(&p->bytes, &p->o16, (size_t)ob), "plan_prepare (backward f16 copy of dO)");
    CU(palloc(&p->bytes, &p->k16, (size_t)kb), "plan_prepare (backward f16 copy of the keys)");
    CU(palloc(&p->bytes, &p->v16, (size_t)vb), "plan_prepare (backward f16 copy of the values)");
    CU(palloc(&p->bytes, &p->f16s, sizeof(F16Scale)), "plan_prepare (backward f16 scales)");
    return NSA_SUCCESS;
}

static nsa_status prepare(CudaCtx *c, nsa_bk_plan *plan, CudaPlan *p)
{
    const nsa_config *cfg = &plan->cfg;
    char msg[512];
    nsa_status s = choose(c->lim, *cfg, plan->max_ns, c->force, &p->ch, msg, sizeof msg);
    if (s != NSA_SUCCESS) return FAIL(s, "%s", msg);
    p->scores_topn = cfg->num_selected > 0 && offers_scores_topn(c->lim, *cfg, c->force);
    if (p->ch.tiles && (s = make_tiles(plan, TC_BM, &p->tiles, &p->tiles_dev, &p->bytes)) != NSA_SUCCESS) return s;
    p->sc_tiles = p->tiles;
    if (p->ch.sc_tokens > 0 && (s = make_tiles(plan, p->ch.sc_tokens * (int)(cfg->num_q_heads / cfg->num_kv_heads),
                                               &p->sc_tiles, &p->sc_own_dev, &p->bytes)) != NSA_SUCCESS)
        return s;
    if (cfg->num_selected > 0 && plan->total_tokens > 0) {
        const bool training = (cfg->flags & NSA_CONFIG_TRAINING) != 0;
        if (p->ch.slc_blk)
            p->blk_pass = slc_sm80_blk_pass_tokens(plan->total_tokens, cfg->num_q_heads, cfg->num_selected, p->ch.dvp,
                                                   c->slc_pass_max);
        if ((training || p->ch.slc_blk) &&
            (s = make_slc_map(plan, p, training ? plan->total_tokens : p->blk_pass)) != NSA_SUCCESS)
            return s;
        if (p->ch.slc_blk) { /* one pass's partial states: bounded by SBK_PASS_BYTES */
            const size_t prow = (size_t)p->blk_pass * (size_t)cfg->num_q_heads * (size_t)cfg->num_selected;
            CU(palloc(&p->bytes, &p->blk_o, prow * (size_t)p->ch.dvp * sizeof(uint16_t)), /* o_s / l_s: the 16-bit dtype */
               "plan_prepare (selected partial states)");
            CU(palloc(&p->bytes, &p->blk_ml, prow * 2 * sizeof(float)), "plan_prepare (selected partial states)");
        }
    }
    if (p->ch.bwd_tiles) {
        int64_t cmp_slots = 0, win_slots = 0, slc_slots = 0;
        if ((s = make_tiles(plan, BWD_ROWS_BM, &p->bwd.rows, &p->bwd_dev[0], &p->bytes)) != NSA_SUCCESS) return s;
        if (plan->total_cmp > 0 && (s = make_key_tiles(plan, 0, p, &cmp_slots)) != NSA_SUCCESS) return s;
        if (cfg->window > 0 && (s = make_key_tiles(plan, 2, p, &win_slots)) != NSA_SUCCESS) return s;
        if (p->has_slc_map && (s = make_slc_chunks(plan, p, &slc_slots)) != NSA_SUCCESS) return s;
        /* one scratch for the stages (they run in turn on the stream) */
        const int64_t slots = std::max(cmp_slots, std::max(win_slots, slc_slots));
        const double bytes = (double)slots * BWD_KEYS_BN * (double)(cfg->head_dim_qk + cfg->head_dim_v) * 4.0;
        if (bytes > 1e15)
            return FAIL(NSA_ERR_UNSUPPORTED, "cuda backend: the backward's partial sums would take %.3g bytes", bytes);
        if (slots > 0) CU(palloc(&p->bytes, &p->bwd.scratch, (size_t)bytes), "plan_prepare (backward partial sums)");
        if (cfg->dtype == NSA_DTYPE_BF16 && plan->total_tokens > 0 && (s = make_f16_copies(plan, p)) != NSA_SUCCESS)
            return s;
    }
    const size_t rows = (size_t)plan->total_cmp * (size_t)cfg->num_kv_heads;
    if (p->ch.kc16 && rows > 0) {
        CU(palloc(&p->bytes, &p->kc16, rows * p->ch.dqkp * 2), "plan_prepare (packed compressed keys)");
        const Kern ck = p->ch.st[NSA_STAGE_CMP_ATTN].k;
        if (ck == K_ATTN_SM80 || ck == K_ATTN_SM90 || p->ch.bwd_tiles)
            CU(palloc(&p->bytes, &p->vc16, rows * p->ch.dvp * 2), "plan_prepare (packed compressed values)");
    }
    if (p->scores_topn && !p->ch.fused_topn && plan->total_tokens > 0 && (s = make_score_rows(plan, p, c->score_rows_max)) != NSA_SUCCESS)
        return s;
    return NSA_SUCCESS;
}

nsa_status cu_plan_prepare(void *bctx, nsa_bk_plan *plan)
{
    CudaCtx *c = (CudaCtx *)bctx;
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    CudaPlan *p = (CudaPlan *)calloc(1, sizeof *p);
    if (!p) return FAIL(NSA_ERR_OUT_OF_MEMORY, "cuda backend: cannot allocate a plan record");
    plan->backend_plan = p;
    const nsa_status s = plan->decode ? decode_prepare(c, plan, p) : prepare(c, plan, p);
    plan->backend_bytes = p->bytes;
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
    if (plan->decode)
        decode_describe(p, stage, name, size);
    else
        describe(p->ch.st[stage], stage, name, size);
    return NSA_SUCCESS;
}

} // namespace nsa_cuda
