/*
 * attn_sm90.cu -- the compressed and window branches on Hopper (the sm90
 * class: wgmma.mma_async and the TMA, sm_90a code): the attn_sm80 tile (128
 * query rows = tokens x heads of one KV group) with its two products on the
 * warpgroup MMA and its K/V tiles fetched by the tensor memory accelerator:
 *
 *   S = Q K^T   one m64nBNk16 wgmma per 16 dims, Q and K both read by the
 *               tensor cores from 128-byte-swizzled shared memory;
 *   O += P V    one m64nDVk16 wgmma per 16 keys, P from the registers that
 *               hold S (rounded to the input type, as in attn_sm80), V from
 *               shared memory (MN-major, transposed by the MMA).
 *
 * The CTA is two warpgroups (rows 0-63 and 64-127). Thread 0 asks the TMA
 * for each K/V tile (tma.cuh) into one of two buffers, completing on the
 * buffer's "full" mbarrier; every warp arrives on its "empty" barrier once
 * its products have read the tile, and thread 0 waits on that before it
 * refills the buffer with the tile after next. No CTA barrier is left in the
 * loop. Where no tensor map can be made (window K/V rows not 16-byte aligned,
 * or D not the padded dim) the same loop fetches with cp.async and a CTA
 * barrier per tile. Masks, the online softmax (warp_softmax_step), the
 * epilogue and the fused COMBINE are attn_sm80's, so both kernels compute the
 * same function; only the fp32 summation order inside the MMAs differs.
 *
 * Tiles (tiles.h, pick_attn_sm90): the compressed branch one CTA per SM of
 * 128-key tiles (161 KB at D 128), the window branch two CTAs per SM of 64-key
 * tiles (32 at Dqk 192; 97 / 89 KB, registers capped at 128).
 */
#include "tile_qk.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace nsa_cuda {

template <typename T, int DQK, int DV, int MODE, int BN, int MINB, bool TMA>
__global__ void __launch_bounds__(TC_THREADS, MINB)
    attn_sm90_kernel(const Geom g, const Tiles tl, const T *__restrict__ q, int64_t qst, int64_t qsh,
                   const T *__restrict__ k, int64_t kst, int64_t ksh, const T *__restrict__ v, int64_t vst,
                   int64_t vsh, int64_t kd, int64_t vd, bool qvec, bool kvvec, float *o, int64_t ost, int64_t osh,
                   float *lse, int64_t lst, int64_t lsh, const FuseCombine fz, const __grid_constant__ TmaKV tm)
{
#ifdef NSA_WGMMA
    constexpr int BM = TC_BM, NT = TC_THREADS;
    constexpr uint32_t QB = BM * DQK * 2, KB = BN * DQK * 2, VB = BN * DV * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* swizzle atoms need 1024-byte alignment; the launcher added 1 KB */
    unsigned char *const sQ = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    constexpr int NB = 2; /* K/V buffers */
    unsigned char *const sK = sQ + QB;
    unsigned char *const sV = sK + NB * KB;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
    const TileCtx c = tile_ctx(g, tl);
    int64_t klo, khi, kbase;
    tile_keys<MODE>(g, c, klo, khi, kbase);
    const T *kg = k + kbase * kst + c.gi * ksh;
    const T *vg = v + kbase * vst + c.gi * vsh;

    load_tile_to<T, BM, DQK, NT>([&](int r, int cc) { return (T *)(sQ + sw128_off(r, cc, BM)); }, q, g.Dqk, qvec,
                                 [&](int r) -> int64_t {
                                     return r < c.nrows ? (c.t0 + r / c.hca) * qst + (c.h0 + r % c.hca) * qsh : -1;
                                 });
    cp_async_commit();
    const int64_t nkt = khi >= klo ? (khi - klo + BN) / BN : 0;
    auto load_kv = [&](int64_t kt, int buf) {
        const int64_t ks = klo + kt * BN;
        unsigned char *dk = sK + buf * KB, *dv = sV + buf * VB;
        auto kdst = [&](int r, int cc) { return (T *)(dk + sw128_off(r, cc, BN)); };
        auto vdst = [&](int r, int cc) { return (T *)(dv + sw128_off(r, cc, BN)); };
        if (kvvec) { /* the launcher checked alignment and rs32_ok */
            const int nv = (int)nsa_min64(BN, khi - ks + 1);
            load_rows_vec_to<T, BN, DQK, NT>(kdst, kg + ks * kst, (int)kst, nv, (int)kd);
            load_rows_vec_to<T, BN, DV, NT>(vdst, vg + ks * vst, (int)vst, nv, (int)vd);
        } else {
            load_tile_to<T, BN, DQK, NT>(kdst, kg, kd, false,
                                         [&](int r) -> int64_t { return ks + r <= khi ? (ks + r) * kst : -1; });
            load_tile_to<T, BN, DV, NT>(vdst, vg, vd, false,
                                        [&](int r) -> int64_t { return ks + r <= khi ? (ks + r) * vst : -1; });
        }
    };
    /* TMA: bar[b] tile in buffer b landed, bar[2 + b] every warp done with it (tile kt in buffer kt % NB) */
    __shared__ __align__(8) uint64_t bar[4];
    auto tma_k = [&](int64_t kt, int buf, uint64_t *b) {
        tma_tile<BN, DQK>(sK + buf * KB, &tm.k, b, (int)c.gi, kbase + klo + kt * BN);
    };
    auto tma_v = [&](int64_t kt, int buf, uint64_t *b) {
        tma_tile<BN, DV>(sV + buf * VB, &tm.v, b, (int)c.gi, kbase + klo + kt * BN);
    };
    if constexpr (TMA) {
        if (tid == 0) {
            for (int i = 0; i < 2; i++) {
                mbar_init(&bar[i], 1);
                mbar_init(&bar[2 + i], NT / 32);
            }
            mbar_init_fence();
            for (int b = 0; b < NB && b < nkt; b++) {
                mbar_expect_tx(&bar[b], tma_tile_bytes<BN, DQK>() + tma_tile_bytes<BN, DV>());
                tma_k(b, b, &bar[b]);
                tma_v(b, b, &bar[b]);
            }
        }
        cp_async_wait<0>(); /* Q */
        fence_async_smem();
        __syncthreads(); /* Q and the barriers' initialisation are visible */
    } else {
        if (nkt > 0) load_kv(0, 0);
        cp_async_commit();
    }

    const WarpRanges<MODE> wr(g, c, warp, lane);
    /* the warpgroup's key range: row ranges grow with the token, and rows
     * are token-major, so its first and last rows bound it (uniform over
     * the warpgroup, as the wgmma instructions require) */
    const int rf = wg * 64, rl = (int)min(wg * 64 + 63, c.nrows - 1);
    int64_t gminlo = 1, gmaxhi = 0, tmp;
    if (rf < c.nrows) {
        row_range<MODE>(g, c.tl0 + rf / c.hca, gminlo, tmp);
        row_range<MODE>(g, c.tl0 + rl / c.hca, tmp, gmaxhi);
    }

    const float sl = g.scale * NSA_LOG2E;
    float oacc[DV / 8][4], m[2], ls[2];
    warp_state_init(oacc, m, ls);
    const uint64_t qd = sw128_desc(smem_u32(sQ) + wg * 64 * 128, 16); /* this warpgroup's 64 rows of every panel */

    /* does tile kt touch this warpgroup's rows? (uniform over the warpgroup) */
    auto active = [&](int64_t kt) {
        const int64_t ks = klo + kt * BN;
        return kt < nkt && ks <= gmaxhi && ks + BN - 1 >= gminlo;
    };
    /* S = Q K^T of tile kt (buffer buf), queued as one wgmma group */
    auto issue_qk = [&](float(&s)[BN / 8][4], int buf) {
        wg_qk<T, BN, DQK, BM>(s, qd, sw128_desc(smem_u32(sK + buf * KB), 16));
    };
    /* online softmax of tile kt in s (masked, row maxima mx), then
     * O += P V queued */
    auto issue_pv = [&](float(&s)[BN / 8][4], int buf) {
        wg_pv<T, DV, BN>(oacc, s, sw128_desc(smem_u32(sV + buf * VB), BN * 128));
    };
    auto softmax_pv = [&](float(&s)[BN / 8][4], float(&mx)[2], int buf) {
        warp_softmax_step(s, mx, m, ls, oacc, sl);
        issue_pv(s, buf);
    };

    /* one arrival per warp on an empty barrier, once its reads of the buffer are complete */
    auto release = [&](uint64_t *b) {
        __syncwarp();
        if (lane == 0) mbar_arrive(b);
    };
    if constexpr (TMA) {
        for (int64_t kt = 0; kt < nkt; kt++) {
            const int buf = (int)(kt % NB);
            /* the buffer of tile kt - 1 takes tile kt - 1 + NB once every warp is done with it (the producer's
             * branch stays out of the span between a softmax and its P V product: ptxas serialises every wgmma of
             * the kernel where divergent code sits there, C7520) */
            const int64_t nt = kt - 1 + NB;
            if (tid == 0 && kt > 0 && nt < nkt) {
                const int b = (int)((kt - 1) % NB);
                mbar_wait(&bar[2 + b], (uint32_t)(((kt - 1) / NB) & 1));
                mbar_expect_tx(&bar[b], tma_tile_bytes<BN, DQK>() + tma_tile_bytes<BN, DV>());
                tma_k(nt, b, &bar[b]);
                tma_v(nt, b, &bar[b]);
            }
            mbar_wait(&bar[buf], (uint32_t)((kt / NB) & 1));
            if (active(kt)) {
                float s[BN / 8][4];
                issue_qk(s, buf);
                wg_wait<0>();
                wg_hold(s);
                float mx[2];
                wr.tile_max(s, klo + kt * BN, lane, mx);
                softmax_pv(s, mx, buf);
                wg_wait<0>();
                wg_hold(oacc);
            }
            release(&bar[2 + buf]);
        }
    } else {
        for (int64_t kt = 0; kt < nkt; kt++) {
            if (kt + 1 < nkt) load_kv(kt + 1, (int)((kt + 1) & 1));
            cp_async_commit();
            cp_async_wait<1>();
            fence_async_smem();
            __syncthreads();
            const int buf = (int)(kt & 1);
            if (active(kt)) {
                float s[BN / 8][4];
                issue_qk(s, buf);
                wg_wait<0>();
                wg_hold(s);
                float mx[2];
                wr.tile_max(s, klo + kt * BN, lane, mx);
                softmax_pv(s, mx, buf);
                wg_wait<0>();
                wg_hold(oacc);
            }
            __syncthreads(); /* the buffer is free for the next fetch */
        }
    }
    attn_epilogue<T, MODE>(g, c, warp, lane, oacc, m, ls, o, ost, osh, lse, lst, lsh, fz);
#endif
}

__global__ void sm90a_probe(int *out)
{
#ifdef NSA_WGMMA
    *out = 1;
#else
    *out = 0;
#endif
}

bool sm90a_available()
{
    int *d = nullptr, h = 0;
    if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    sm90a_probe<<<1, 1>>>(d);
    const bool ok = cudaGetLastError() == cudaSuccess && cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) ==
                                                             cudaSuccess;
    cudaFree(d);
    cudaGetLastError();
    return ok && h == 1;
}

/* The K / V tensor maps of a launch (tma.cuh): the packed compressed rows
 * [total_cmp][Hkv][DP] (MODE 0) or the caller's K / V [T][Hkv][D] with their
 * strides (the window), where D is the padded dim and the TMA can address
 * them; tm.ok = 0 otherwise (the cp.async loop runs). */
template <int DQK, int DV, int MODE>
static TmaKV sm90_maps(const Geom &g, int BN, View k, View v)
{
    TmaKV tm = {};
    const int64_t rows = MODE == 0 ? g.total_cmp : g.T;
    tm.ok = (MODE == 0 || (g.Dqk == DQK && g.Dv == DV)) && tma_map_rows(&tm.k, k.p, rows, g.Hkv, DQK, k.st, k.sh, BN) &&
            tma_map_rows(&tm.v, v.p, rows, g.Hkv, DV, v.st, v.sh, BN);
    return tm;
}

template <typename T, int DQK, int DV, int MODE, int BN, int MINB>
static cudaError_t launch_sm90(const Dev &dev, const Geom &g, const Tiles &tl, View q, View k, View v, MView o,
                               MView lse, cudaStream_t s, const FuseCombine &fz)
{
    const TmaKV tm = sm90_maps<DQK, DV, MODE>(g, BN, k, v);
    auto kern = tm.ok ? attn_sm90_kernel<T, DQK, DV, MODE, BN, MINB, true>
                      : attn_sm90_kernel<T, DQK, DV, MODE, BN, MINB, false>;
    return launch_attn_tiles<T, DQK, DV, MODE>(kern, BN, TC_THREADS, attn_sm90_smem(DQK, DV, BN), dev, g, tl, q, k, v, o, lse, s,
                                               fz, tm);
}

/* the instances: mode 0 on its 128-key tile, mode 2 on two CTAs of 64 (32 at Dqk 192) keys (tiles.h) */
template <typename T, int DQK, int DV, int MODE>
static cudaError_t launch_sm90_dims(const Dev &dev, const Geom &g, const Tiles &tl, View q, View k, View v, MView o,
                                    MView lse, cudaStream_t s, const FuseCombine &fz)
{
    constexpr int BN = MODE == 0 ? 128 : (DQK > 128 ? 32 : 64), MINB = MODE == 0 ? 1 : 2;
    return launch_sm90<T, DQK, DV, MODE, BN, MINB>(dev, g, tl, q, k, v, o, lse, s, fz);
}

template <typename T, int MODE>
static cudaError_t attn_sm90_t(const AttnTile &t, const Dev &dev, const Geom &g, const Tiles &tl, int dqkp, int dvp,
                               View q, View k, View v, MView o, MView lse, cudaStream_t s, const FuseCombine &fz)
{
    const AttnTile want = pick_attn_sm90(MODE, dqkp, dvp, INT64_MAX);
    if (t.bn != want.bn || t.minb != want.minb) return cudaErrorInvalidValue;
    switch (dqkp * 1000 + dvp) {
    case 64064: return launch_sm90_dims<T, 64, 64, MODE>(dev, g, tl, q, k, v, o, lse, s, fz);
    case 128128: return launch_sm90_dims<T, 128, 128, MODE>(dev, g, tl, q, k, v, o, lse, s, fz);
    case 192128: return launch_sm90_dims<T, 192, 128, MODE>(dev, g, tl, q, k, v, o, lse, s, fz);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t attn_sm90(const Geom &g, const Dev &dev, const AttnTile &tile, int mode, const Tiles &tl, int dqkp,
                      int dvp, View q, View k, View v, MView o, MView lse, cudaStream_t s, const FuseCombine *fzp)
{
    if (tl.count == 0) return cudaSuccess;
    const FuseCombine fz = fuse_combine_args(g, mode, fzp);
    NSA_ATTN_DISPATCH(attn_sm90_t, g, mode, tile, dev, g, tl, dqkp, dvp, q, k, v, o, lse, s, fz);
}

} // namespace nsa_cuda
