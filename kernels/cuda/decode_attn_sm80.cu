/*
 * decode_attn_sm80.cu -- the decode step's split attention and block scores
 * on mma.sync (f16 / bf16, G <= 16, padded dims 32/32, 64/64, 128/128 or
 * 192/128; every class), beside decode.cu's fp32 kernels, which run the rest.
 *
 * Why: a new row's G query heads of one KV head are 16 rows of an m16n8k16
 * MMA (padded where G < 16), so one CTA reads each key and value of its split
 * once for the whole group; decode.cu's kernel gives each head its own warp
 * and reads K/V once per head, with the dot products on the CUDA cores.
 *
 * CTA: one (new row, KV head, split) as decode.cu (grid x rows, y KV heads,
 * z splits; DecSplit with hc = 16), 4 warps. The Q rows (the group's heads,
 * zero past G) go to registers. Warp w takes the split's 16-key chunks w,
 * w + 4, ...: lanes 0-15 resolve a chunk's pool rows through the page tables
 * (Keys<MODE>::row, -1 for keys a row may not see), cp.async copies their K
 * (and V) rows into the warp's own double buffer, synchronised with
 * __syncwarp only. Then
 *   attention: S = Q K^T, one online softmax per row (warp_softmax_step, log2
 *     domain) and O += P V; the 4 warps' states merge in shared memory in warp
 *     order into the split's partial state (unnormalised o, max in natural
 *     units, sum), the layout decode.cu's merge kernel reads;
 *   block scores (PROBS, compressed keys): p = exp(scale q.k - lse_cmp) per
 *     (head, key), summed over the group's heads in a fixed lane order into
 *     pbuf (decode.cu's select kernel maps and ranks them).
 * Every sum runs in a fixed order: bitwise reproducible.
 */
#include <math.h>

#include "decode.h"
#include "decode_dev.cuh"
#include "tile_qk.cuh"

namespace nsa_cuda {

namespace {

constexpr int DM_WARPS = 4, DM_CK = 16, DM_NB = 2; /* warps, keys per chunk, chunk buffers per warp */

template <int DQK, int DV, bool PROBS> constexpr size_t dm_warp_elems()
{
    return (size_t)DM_NB * DM_CK * ((DQK + 8) + (PROBS ? 0 : DV + 8));
}

template <int DV>
NSA_DEV void dm_merge_warps(const DecGeom &g, const DecSplit &sp, const DecAttnIn &a, void *smem,
                            const float (&oacc)[DV / 8][4], const float (&m)[2], float (&ls)[2], int64_t r, int64_t h0,
                            int nh, int s, int warp, int lane);

template <typename T, int DQK, int DV, int MODE, bool PROBS>
__global__ void __launch_bounds__(DM_WARPS * 32)
    dec_attn_sm80_kernel(const DecGeom g, const DecSplit sp, const DecAttnIn a, const float *lse_cmp, int64_t lst,
                         int64_t lsh, float *pbuf, int64_t max_nc)
{
    constexpr int SQ = DQK + 8, SV = DV + 8;
    using LK = PadTile<SQ, 0>;
    using LV = PadTile<SV, 0>;
    extern __shared__ __align__(16) unsigned char smem_dyn[];
    T *const sQ = (T *)smem_dyn; /* [16][SQ] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    T *const wbuf = sQ + 16 * SQ + (size_t)warp * dm_warp_elems<DQK, DV, PROBS>();
    const int64_t r = blockIdx.x;
    if (dec_failed(g) || r >= dec_rows(g)) return;
    const int64_t gi = blockIdx.y, h0 = gi * g.G;
    const int nh = (int)g.G, s = (int)blockIdx.z;
    const Keys<MODE> ks = dec_keys<MODE>(g, a, r, gi);
    const int64_t nk = ks.count(g), k_lo = (int64_t)s * sp.chunk, k_hi = nsa_min64(k_lo + sp.chunk, nk);

    /* the group's Q rows */
    for (int c = threadIdx.x; c < 16 * (DQK / 8); c += DM_WARPS * 32) {
        const int i = c / (DQK / 8), e0 = (c % (DQK / 8)) * 8;
        const T *qr = (const T *)a.q.p + r * a.q.st + (h0 + i) * a.q.sh;
#pragma unroll
        for (int x = 0; x < 8; x++) sQ[i * SQ + e0 + x] = i < nh && e0 + x < g.Dqk ? qr[e0 + x] : T(0.f);
    }
    __syncthreads();
    uint32_t qf[DQK / 16][4];
    q_frags<SQ, true>(qf, sQ, lane);

    const float sl = g.scale * NSA_LOG2E;
    float oacc[DV / 8][4], m[2], ls[2];
    warp_state_init(oacc, m, ls);
    /* PROBS: this thread's rows' lse_cmp in the log2 domain (rows past G: none) */
    float lse2[2] = {INFINITY, INFINITY};
    if (PROBS) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int hr = (lane >> 2) + 8 * i;
            if (hr < nh) lse2[i] = lse_cmp[r * lst + (h0 + hr) * lsh] * NSA_LOG2E;
        }
    }
    const T *K = (const T *)a.k.p + gi * a.k.sh, *V = (const T *)a.v.p + gi * a.v.sh;
    /* chunk i of this warp: keys k_lo + (warp + DM_WARPS i) DM_CK .. + DM_CK - 1 */
    auto chunk_key = [&](int i) { return k_lo + (int64_t)(warp + DM_WARPS * i) * DM_CK; };
    const int nchunks = k_hi > k_lo ? (int)((k_hi - k_lo + DM_CK - 1) / DM_CK) : 0;
    const int mine = nchunks > warp ? (nchunks - warp + DM_WARPS - 1) / DM_WARPS : 0;
    auto load = [&](int i, int buf) {
        const int64_t c0 = chunk_key(i);
        const int64_t key = c0 + lane, row = lane < DM_CK && key < k_hi ? ks.row(g, key) : -1;
        T *const dk = wbuf + (size_t)buf * DM_CK * (SQ + (PROBS ? 0 : SV));
        T *const dv = dk + DM_CK * SQ;
        constexpr int CK = DQK / 8, CV = DV / 8;
#pragma unroll 2
        for (int x = lane; x < DM_CK * (CK + (PROBS ? 0 : CV)); x += 32) {
            const bool isk = x < DM_CK * CK;
            const int y = isk ? x : x - DM_CK * CK, cpr = isk ? CK : CV, kr = y / cpr, ch = y - kr * cpr;
            const int64_t pr = __shfl_sync(0xffffffffu, row, kr);
            const bool ok = pr >= 0 && ch * 8 < (isk ? g.Dqk : g.Dv);
            if (isk)
                cp_async16(dk + LK::off(kr, ch * 8), ok ? (const void *)(K + pr * a.k.st + ch * 8) : (const void *)K,
                           ok);
            else
                cp_async16(dv + LV::off(kr, ch * 8), ok ? (const void *)(V + pr * a.v.st + ch * 8) : (const void *)V,
                           ok);
        }
        return row;
    };
    /* the shuffles above need every lane: the loop bound is per warp (uniform) */
    int64_t rows_cur = -1, rows_next = -1;
    if (mine > 0) rows_cur = load(0, 0);
    cp_async_commit();
    for (int i = 0; i < mine; i++) {
        if (i + 1 < mine) rows_next = load(i + 1, (i + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncwarp();
        const int buf = i & 1;
        const T *const bk = wbuf + (size_t)buf * DM_CK * (SQ + (PROBS ? 0 : SV));
        float sc[DM_CK / 8][4];
#pragma unroll
        for (int j = 0; j < DM_CK / 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
        warp_qk_l<T, DQK, DM_CK / 8, SQ, true, LK>(sc, qf, sQ, bk, 0, lane);
        /* key columns this thread holds: j * 8 + 2 (lane & 3) + (e & 1); visible when its pool row is */
        bool kv[DM_CK / 8][2];
#pragma unroll
        for (int j = 0; j < DM_CK / 8; j++)
#pragma unroll
            for (int x = 0; x < 2; x++) kv[j][x] = __shfl_sync(0xffffffffu, rows_cur, j * 8 + 2 * (lane & 3) + x) >= 0;
        if (PROBS) {
            /* column sums over the group's rows: this thread's two rows, then lanes of equal lane & 3 */
            float cs[DM_CK / 8][2];
#pragma unroll
            for (int j = 0; j < DM_CK / 8; j++)
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    float p = 0.f;
#pragma unroll
                    for (int ii = 0; ii < 2; ii++)
                        if (kv[j][x] && lse2[ii] != INFINITY) p += exp2f(fmaf(sc[j][2 * ii + x], sl, -lse2[ii]));
                    cs[j][x] = p;
                }
#pragma unroll
            for (int o2 = 4; o2 < 32; o2 <<= 1)
#pragma unroll
                for (int j = 0; j < DM_CK / 8; j++)
#pragma unroll
                    for (int x = 0; x < 2; x++) cs[j][x] += __shfl_xor_sync(0xffffffffu, cs[j][x], o2);
            if (lane < 4) {
                float *prow = pbuf + (r * g.Hkv + gi) * max_nc;
                const int64_t c0 = chunk_key(i);
#pragma unroll
                for (int j = 0; j < DM_CK / 8; j++)
#pragma unroll
                    for (int x = 0; x < 2; x++) {
                        const int64_t key = c0 + j * 8 + 2 * lane + x;
                        if (key < k_hi) prow[key] = cs[j][x];
                    }
            }
        } else {
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < DM_CK / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float x = kv[j][e & 1] ? sc[j][e] : -INFINITY;
                    sc[j][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
            warp_softmax_step(sc, mx, m, ls, oacc, sl);
            warp_pv_l<T, DV, DM_CK / 16, LV>(oacc, sc, bk + DM_CK * SQ, 0, lane);
        }
        __syncwarp(); /* this buffer is refilled next */
        rows_cur = rows_next;
    }
    cp_async_wait<0>();
    if constexpr (!PROBS) dm_merge_warps<DV>(g, sp, a, sQ + 16 * SQ, oacc, m, ls, r, h0, nh, s, warp, lane);
}

/* the 4 warps' states (rows lane / 4 + 8 i), merged in warp order through shared
 * memory (smem: the warps' buffers, done with) into the split's partial state */
template <int DV>
NSA_DEV void dm_merge_warps(const DecGeom &g, const DecSplit &sp, const DecAttnIn &a, void *smem,
                            const float (&oacc)[DV / 8][4], const float (&m)[2], float (&ls)[2], int64_t r, int64_t h0,
                            int nh, int s, int warp, int lane)
{
    /* the warps' states, merged in warp order: (m, l) and o per warp in shared memory */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 1);
        ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 2);
    }
    __syncthreads(); /* every warp is done with its buffers: they hold the states now */
    float *const so = (float *)smem;            /* [warps][16][DV] */
    float *const sml = so + DM_WARPS * 16 * DV; /* [warps][16][2] */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int hr = (lane >> 2) + 8 * i;
#pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            const int col = j * 8 + 2 * (lane & 3);
            so[(warp * 16 + hr) * DV + col] = oacc[j][2 * i];
            so[(warp * 16 + hr) * DV + col + 1] = oacc[j][2 * i + 1];
        }
        if ((lane & 3) == 0) {
            sml[(warp * 16 + hr) * 2] = m[i];
            sml[(warp * 16 + hr) * 2 + 1] = ls[i];
        }
    }
    __syncthreads();
    for (int x = threadIdx.x; x < nh * DV; x += DM_WARPS * 32) {
        const int hr = x / DV, e = x % DV;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DM_WARPS; w++) M = fmaxf(M, sml[(w * 16 + hr) * 2]);
        float o = 0.f, L = 0.f;
        if (M != -INFINITY)
#pragma unroll
            for (int w = 0; w < DM_WARPS; w++) {
                const float mw = sml[(w * 16 + hr) * 2];
                if (mw == -INFINITY) continue;
                const float f = exp2f(mw - M);
                o += f * so[(w * 16 + hr) * DV + e];
                L += f * sml[(w * 16 + hr) * 2 + 1];
            }
        float *pp = a.part + ((r * g.Hq + h0 + hr) * sp.ns + s) * (g.Dv + 2);
        if (e < g.Dv) pp[e] = o;
        if (e == 0) {
            pp[g.Dv] = M == -INFINITY ? -INFINITY : M * NSA_LN2; /* natural units, as decode.cu's kernel writes */
            pp[g.Dv + 1] = L;
        }
    }
}

template <typename T, int DQK, int DV, bool PROBS>
static cudaError_t launch_dm(const DecGeom &g, int mode, const DecSplit &sp, const DecAttnIn &a, const float *lse,
                             int64_t lst, int64_t lsh, float *pbuf, int64_t max_nc, cudaStream_t s, bool prep)
{
    const size_t smem = dec_attn_sm80_smem(DQK, DV, PROBS);
    const dim3 grid((unsigned)g.MT, (unsigned)g.Hkv, (unsigned)sp.ns);
    cudaError_t e = cudaSuccess;
    /* prep: set the kernel's shared-memory opt-in (once per plan, outside any capture), launch nothing */
    auto run = [&](auto kern) {
        if (prep) e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        else kern<<<grid, DM_WARPS * 32, smem, s>>>(g, sp, a, lse, lst, lsh, pbuf, max_nc);
    };
    if (PROBS)
        run(dec_attn_sm80_kernel<T, DQK, DV, 0, true>);
    else if (mode == 0)
        run(dec_attn_sm80_kernel<T, DQK, DV, 0, false>);
    else if (mode == 1)
        run(dec_attn_sm80_kernel<T, DQK, DV, 1, false>);
    else
        run(dec_attn_sm80_kernel<T, DQK, DV, 2, false>);
    return e != cudaSuccess || prep ? e : cudaGetLastError();
}

template <typename T, int DQK, int DV>
static cudaError_t launch_dm_dims(const DecGeom &g, int mode, bool probs, const DecSplit &sp, const DecAttnIn &a,
                                  const float *lse, int64_t lst, int64_t lsh, float *pbuf, int64_t max_nc,
                                  cudaStream_t s, bool prep)
{
    return probs ? launch_dm<T, DQK, DV, true>(g, mode, sp, a, lse, lst, lsh, pbuf, max_nc, s, prep)
                 : launch_dm<T, DQK, DV, false>(g, mode, sp, a, lse, lst, lsh, pbuf, max_nc, s, prep);
}

} // namespace

size_t dec_attn_sm80_smem(int dqkp, int dvp, bool probs)
{
    const size_t q = 2 * (size_t)16 * (dqkp + 8);
    const size_t bufs = 2 * (size_t)DM_WARPS * DM_NB * DM_CK * ((dqkp + 8) + (probs ? 0 : dvp + 8));
    const size_t states = probs ? 0 : (size_t)DM_WARPS * 16 * (dvp + 2) * 4;
    return q + (bufs > states ? bufs : states);
}

bool dec_attn_sm80_takes(int dtype, int64_t G, int dqkp, int dvp)
{
    return (dtype == 1 || dtype == 2) && G >= 1 && G <= 16 && tc_pair_dims(dqkp, dvp);
}

cudaError_t dec_attn_sm80_prepare(int dtype, int dqkp, int dvp)
{
    if (!dec_attn_sm80_takes(dtype, 1, dqkp, dvp)) return cudaErrorInvalidValue;
    DecGeom g = {};
    g.dtype = dtype;
    const DecSplit sp = {1, 16, 16};
    const DecAttnIn a = {};
    Geom gg = {};
    gg.dtype = dtype;
    for (int mode = 0; mode < 4; mode++) { /* mode 3: the block scores */
        const cudaError_t e = [&]() -> cudaError_t {
            NSA_SLC_DISPATCH(launch_dm_dims, gg, dqkp, dvp, g, mode == 3 ? 0 : mode, mode == 3, sp, a, nullptr, 0, 0,
                             nullptr, 0, (cudaStream_t) nullptr, true);
        }();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t dec_attn_sm80(const DecGeom &g, int mode, bool probs, int dqkp, int dvp, const DecSplit &sp,
                          const DecAttnIn &a, const float *lse_cmp, int64_t lst, int64_t lsh, float *pbuf,
                          int64_t max_nc, cudaStream_t s)
{
    if (g.MT == 0) return cudaSuccess; /* s may be the legacy default stream (0): a caller's choice */
    if (!dec_attn_sm80_takes(g.dtype, g.G, dqkp, dvp) || sp.hc != 16 || (probs && mode != 0))
        return cudaErrorInvalidValue;
    Geom gg = {};
    gg.dtype = g.dtype;
    NSA_SLC_DISPATCH(launch_dm_dims, gg, dqkp, dvp, g, mode, probs, sp, a, lse_cmp, lst, lsh, pbuf, max_nc, s, false);
}

} // namespace nsa_cuda
