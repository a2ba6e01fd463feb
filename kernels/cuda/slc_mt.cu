/*
 * slc_mt.cu -- version 3 of the selected branch (G = 16, l_s <= 64): several
 * query tokens per CTA share every fetch of a block that more than one of
 * them selected.
 *
 * slc_tc (v2) fetches n blocks per (token, group): 512 KB at the paper's
 * shape, and at T = 64k that stream (134 GB) keeps the L2 at 82 % of its
 * throughput -- the branch is bound by those bytes. Neighbouring tokens of one
 * selection block share the forced blocks (the first and the two local ones)
 * by construction, and on real inputs they pick many of the same top blocks
 * (the scores come from overlapping compressed blocks and similar queries).
 *
 * CTA = 4 warps = 4 consecutive tokens x the 16 query heads of one KV group;
 * warp w owns token t0 + w (16 MMA rows, all heads) and its whole softmax, so
 * no cross-warp merge is needed. Setup: the 4 tokens' selected blocks become
 * absolute key ranges [ka, ka + vis) (vis: the keys at or before the token);
 * their union, sorted ascending, is the CTA's block list, each entry with the
 * set of warps that selected it and the longest vis. Main loop: each union
 * block is fetched once (cp.async double buffer, 64 keys) and the warps that
 * selected it compute S = Q K^T (16 x 64), mask keys past their own vis, do
 * the online softmax step and O += P V. Every warp visits its blocks in
 * ascending order, so results are reproducible.
 *
 * Bytes: (union size) x 64 x (Dqk + Dv) x 2 per 4 tokens. With random inputs
 * the 13 unforced blocks of the 4 tokens rarely coincide: 55 of 64 fetches
 * (-14 %); with correlated selections up to -75 %.
 *
 * Measured (H200, bf16, T = 64k, paper shape, random inputs; NSA_CUDA_PROFILE):
 *   Dqk = 128: 34.1 ms against slc_tc's 23.0 -- slower: one warp computes a
 *              whole 64-key block while the CTA's other warps wait at the
 *              stage barrier, and two 4-warp CTAs per SM leave too little work
 *              in flight; the 14 % fewer bytes do not pay for that.
 *   Dqk = 192: 28.5 ms against 30.0 (one CTA per SM either way).
 * So the backend uses it for padded Dqk = 192 only (NSA_CUDA_SLC=tc / mt
 * force either kernel everywhere it applies). It is also the kernel for inputs
 * whose neighbouring tokens select the same blocks (not measured yet), and the
 * base for a version that splits each block's keys across the selecting warps.
 */
#include "tile_qk.cuh"

namespace nsa_cuda {

constexpr int SMT_THREADS = 128, SMT_TOK = 4, SMT_KB = 64, SMT_MAXN = 32;

template <typename T, int DQK, int DV>
__global__ void __launch_bounds__(SMT_THREADS)
    slc_mt_kernel(const Geom g, const T *__restrict__ q, int64_t qst, int64_t qsh, const T *__restrict__ k,
                  int64_t kst, int64_t ksh, const T *__restrict__ v, int64_t vst, int64_t vsh, bool qvec,
                  const int *idx, int64_t ist, int64_t ish, float *o, int64_t ost, int64_t osh, float *lse,
                  int64_t lst, int64_t lsh)
{
    constexpr int NT = SMT_THREADS, KB = SMT_KB, SQ = DQK + 8, SV = DV + 8;
    constexpr int NC = SMT_TOK * SMT_MAXN; /* candidate slots: 4 tokens x n <= 32 */
    constexpr bool QREG = DQK <= 192;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = (T *)smem_raw;          /* [4 * 16][SQ] */
    T *sK = sQ + SMT_TOK * 16 * SQ; /* [2][KB][SQ] */
    T *sV = sK + 2 * KB * SQ;       /* [2][KB][SV] */
    __shared__ int64_t sCand[NC];   /* absolute first key of a selected block, -1: none */
    __shared__ int sVis[NC];
    __shared__ unsigned char sFirst[NC];
    __shared__ int64_t sU[NC]; /* the union, ascending */
    __shared__ int sUcnt[NC];
    __shared__ unsigned sUmask[NC];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t t0 = (int64_t)blockIdx.x * SMT_TOK, gi = blockIdx.y, h0 = gi * 16;
    const int n = (int)g.n, ncand = SMT_TOK * n;

    /* candidates: slot c = token (c / n), selection slot (c % n) */
    for (int c = tid; c < NC; c += NT) {
        int64_t ka = -1;
        int vis = 0;
        if (c < ncand) {
            const int64_t t = t0 + c / n;
            if (t < g.T) {
                const int64_t s0 = g.cu_seqlens[g.tok_seq[t]], tl = t - s0;
                const int64_t j = idx[t * ist + gi * ish + c % n];
                if (j >= 0 && j <= nsa_slc_last(tl, g.ls)) {
                    ka = s0 + j * g.ls;
                    vis = (int)nsa_min64(g.ls, tl + 1 - j * g.ls);
                }
            }
        }
        sCand[c] = ka;
        sVis[c] = vis;
    }
    /* Q rows: warp w's 16 rows are token t0 + w, heads h0 .. h0 + 15 */
    load_tile<T, SMT_TOK * 16, DQK, SQ, NT>(sQ, q, g.Dqk, qvec, [&](int r) -> int64_t {
        const int64_t t = t0 + r / 16;
        return t < g.T ? t * qst + (h0 + r % 16) * qsh : -1;
    });
    cp_async_commit();
    __syncthreads();
    for (int c = tid; c < NC; c += NT) {
        const int64_t ka = sCand[c];
        bool first = ka >= 0;
        for (int x = 0; x < c && first; x++) first = sCand[x] != ka;
        sFirst[c] = first;
    }
    __syncthreads();
    for (int c = tid; c < NC; c += NT) {
        if (!sFirst[c]) continue;
        const int64_t ka = sCand[c];
        int rank = 0, cnt = 0;
        unsigned mask = 0;
        for (int x = 0; x < ncand; x++) {
            const int64_t kx = sCand[x];
            rank += sFirst[x] && kx < ka;
            if (kx == ka) {
                mask |= 1u << (x / n);
                cnt = max(cnt, sVis[x]);
            }
        }
        sU[rank] = ka;
        sUcnt[rank] = cnt;
        sUmask[rank] = mask;
    }
    int nu = 0;
    for (int c = 0; c < ncand; c++) nu += sFirst[c]; /* every thread, same count */
    __syncthreads();

    const T *kg = k + gi * ksh, *vg = v + gi * vsh;
    auto load_kv = [&](int u, int buf) {
        const int64_t ka = sU[u];
        const int cnt = sUcnt[u];
        load_rows_vec<T, KB, DQK, SQ, NT>(sK + buf * KB * SQ, kg + ka * kst, (int)kst, cnt, (int)g.Dqk);
        load_rows_vec<T, KB, DV, SV, NT>(sV + buf * KB * SV, vg + ka * vst, (int)vst, cnt, (int)g.Dv);
    };
    if (nu > 0) load_kv(0, 0);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const int64_t t = t0 + warp;
    const T *sQw = sQ + warp * 16 * SQ;
    uint32_t qf[QREG ? DQK / 16 : 1][4];
    q_frags<SQ, QREG>(qf, sQw, lane);
    const float sl = g.scale * NSA_LOG2E;
    float oacc[DV / 8][4], m[2], ls[2];
    warp_state_init(oacc, m, ls);

    for (int u = 0; u < nu; u++) {
        if (u + 1 < nu) load_kv(u + 1, (u + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const int buf = u & 1;
        if ((sUmask[u] >> warp) & 1u) {
            /* keys of the block at or before t (>= 1: the warp selected it). The block has
             * l_s <= KB keys: min with KB counted the zero rows past them as keys wherever
             * l_s < KB and the block lay wholly before t (found reading the code, v6) */
            const int vis = (int)nsa_min64(g.ls, t + 1 - sU[u]);
            float s[KB / 8][4];
#pragma unroll
            for (int j = 0; j < KB / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            warp_qk<T, DQK, KB / 8, SQ, QREG>(s, qf, sQw, sK + buf * KB * SQ, 0, lane);
            float mx[2];
            warp_mask_keys(s, vis, lane, mx);
            warp_softmax_step(s, mx, m, ls, oacc, sl);
            warp_pv<T, DV, KB / 16, SV>(oacc, s, sV + buf * KB * SV, 0, lane);
        }
        __syncthreads();
    }
    cp_async_wait<0>();

    if (t >= g.T) return;
    warp_store_rows(
        oacc, m, ls, g.Dv, lane, [&](int i) { return o + t * ost + (h0 + (lane >> 2) + 8 * i) * osh; },
        [&](int i) { return lse ? lse + t * lst + (h0 + (lane >> 2) + 8 * i) * lsh : (float *)nullptr; });
}

size_t slc_mt_smem(int dqkp, int dvp)
{
    return 2 * (size_t)(SMT_TOK * 16 * (dqkp + 8) + 2 * SMT_KB * (dqkp + 8) + 2 * SMT_KB * (dvp + 8));
}

bool slc_mt_ok(const Geom &g, int dqkp, int dvp, View k, View v)
{
    return g.G == 16 && g.ls <= SMT_KB && g.n >= 1 && g.n <= SMT_MAXN && dvp <= 128 && dqkp <= 192 &&
           (int64_t)slc_mt_smem(dqkp, dvp) <= g.smem_optin && vec_ok(k.p, k.st, k.sh, g.Dqk) &&
           vec_ok(v.p, v.st, v.sh, g.Dv) && rs32_ok(k.st, SMT_KB) && rs32_ok(v.st, SMT_KB);
}

template <typename T, int DQK, int DV>
static cudaError_t launch_mt(const Geom &g, View q, View k, View v, View idx, MView o, MView lse, cudaStream_t s)
{
    return launch_slc_tokens<T>(slc_mt_kernel<T, DQK, DV>, SMT_TOK, SMT_THREADS, slc_mt_smem(DQK, DV), g, q, k, v,
                                idx, o, lse, s);
}

cudaError_t slc_mt(const Geom &g, int dqkp, int dvp, View q, View k, View v, View idx, MView o, MView lse,
                   cudaStream_t s)
{
    if (g.T == 0) return cudaSuccess;
    if (!slc_mt_ok(g, dqkp, dvp, k, v)) return cudaErrorInvalidValue;
    NSA_SLC_DISPATCH(launch_mt, g, dqkp, dvp, g, q, k, v, idx, o, lse, s);
}

} // namespace nsa_cuda
