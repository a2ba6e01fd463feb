/*
 * attn_wg.cu -- version 5 of the compressed and window branches: the attn_tc
 * tile (128 query rows = tokens x heads of one KV group, K/V tiles of BN keys
 * double-buffered with cp.async) with its two products on Hopper's warpgroup
 * MMA (wgmma.mma_async, sm_90a) instead of mma.sync:
 *
 *   S = Q K^T   one m64nBNk16 wgmma per 16 dims, Q and K both read by the
 *               tensor cores from 128-byte-swizzled shared memory;
 *   O += P V    one m64nDVk16 wgmma per 16 keys, P from the registers that
 *               hold S (rounded to the input type, as in attn_tc), V from
 *               shared memory (MN-major, transposed by the MMA).
 *
 * The CTA is two warpgroups (rows 0-63 and 64-127). One could run its
 * softmax while the other's MMAs use the tensor cores, but the CTA barrier
 * per K tile keeps them in step (ncu at 64k: tensor pipe 35 % busy, 2 warps
 * per scheduler, latency-bound); NOTES.md says what was tried. TWO (v6) runs
 * two CTAs per SM instead (registers capped at 128, 64- or 32-key tiles), so
 * that one CTA's softmax overlaps the other's products. Masks, the online
 * softmax (warp_softmax_step), the epilogue and the fused COMBINE are the
 * attn_tc ones, so both kernels compute the same function; only the fp32
 * summation order inside the MMAs differs (within the testkit tolerances).
 *
 * Runs where the device executes sm_90a code (H100 / H200 / GH200, module
 * built with nvcc_archs containing 90a; attn_wg_available() asks a probe
 * kernel) for padded dims 64/64, 128/128 and 192/128, for the compressed and
 * the window branch (NSA_CUDA_WGMMA=0 turns it off, nowin keeps the window on
 * attn_tc). attn_wg_loop picks the loop per branch (BN = 128 for the
 * compressed branch with the TMA, ONE without; TWO for the window) unless
 * NSA_CUDA_WG_BN or NSA_CUDA_WG_CMP says.
 *
 * Shared memory (D = 128): BN = 128: Q 32 KB + K 2 x 32 KB + V 2 x 32 KB
 * + 1 KB of alignment = 161 KB, one CTA (8 warps) per SM; TWO, BN = 64: 97 KB;
 * ONE (one 64-key K/V buffer): 65 KB (91 KB at Dqk 192, so two CTAs fit).
 *
 * Measured (H200, T = 64k, bf16, ms, D 128 / D 192):
 *   compressed: attn_tc 18.8 / 23.6; attn_wg BN = 64 14.8 / 16.7; BN = 128
 *     13.1 / 15.1 (the v5 default); pipelined 13.9 / 16.5; TWO (v6) 11.8 at
 *     D 128 (64 keys; 32 keys: 14.0), 17.7 at D 192 (32 keys), so D 192 keeps
 *     BN = 128; with descriptors built once per tile (desc_at) 11.3 / 14.8;
 *     ONE (v7) 11.0 / 13.7; v8, K/V through the TMA (tma.cuh): BN = 128 with
 *     two buffers, one CTA per SM, 9.7 / 10.9 (the default), TWO 10.0 / 14.3,
 *     ONE 10.2 / 12.4 (NSA_CUDA_WG_CMP picks the loop of this branch alone).
 *   window (+ COMBINE): attn_tc 7.2 / 8.6; attn_wg one CTA 8.9 / -; TWO 5.5 /
 *     6.7; with the epilogue's loads batched 4.6 / 5.6; ONE 4.65 / 6.2; v8
 *     with the TMA: TWO 3.9 / 4.8 (the default), ONE 4.4 / 5.2.
 * Details: backends/cuda/NOTES.md ("v5", "v6", "v7").
 */
#include "tile_qk.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace nsa_cuda {

/* BN: keys per K/V tile, 128, 64 or 32 (TWO); NB: K/V buffers of the plain
 * loop (2, or 1 for ONE); the bytes attn_wg_kernel asks for. */
template <int DQK, int DV, int BN, bool PIPE, int NB = 2> constexpr size_t attn_wg_smem_t()
{
    return 1024 + 2 * (size_t)(TC_BM * DQK + (PIPE ? 3 : NB) * BN * (DQK + DV));
}

/* PIPE (v5.1): the product of tile kt+1's S = Q K^T runs on the tensor
 * cores while the warpgroup does tile kt's softmax (FlashAttention-3's
 * intra-warpgroup overlap); S of two tiles live in registers and K/V take
 * three buffers, so BN = 64. Without PIPE every wgmma is waited for at once
 * and the CTA's barrier per tile keeps both warpgroups in step: while they
 * both run their softmax the tensor cores idle. */
/* TMA (v8, tma.cuh; the plain loop only): thread 0 fetches the K / V tiles
 * through the tensor maps tm into mbarrier-tracked buffers, and no CTA
 * barrier is left in the loop. With two buffers tile kt+1 is fetched while
 * tile kt is worked on; with one (ONE) a CTA waits for its own fetch, as
 * with cp.async. (ONE with K and V on barriers of their own, K of tile kt+1
 * fetched during tile kt's softmax, ran out of registers: ptxas serialised
 * its wgmmas, C7512.) */
template <typename T, int DQK, int DV, int MODE, int BN, bool PIPE, int MINB = 1, int NB = 2, bool TMA = false>
__global__ void __launch_bounds__(TC_THREADS, MINB)
    attn_wg_kernel(const Geom g, const Tiles tl, const T *__restrict__ q, int64_t qst, int64_t qsh,
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
    constexpr int NS = PIPE ? 3 : NB; /* K/V buffers */
    static_assert(NB == 1 || NB == 2, "one or two K/V buffers");
    unsigned char *const sK = sQ + QB;
    unsigned char *const sV = sK + NS * KB;

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
        const uint64_t kd = sw128_desc(smem_u32(sK + buf * KB), 16);
#pragma unroll
        for (int j = 0; j < BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < DQK / 16; kk++) {
            const uint32_t off = (kk & 3) * 32; /* 16 dims into the 128-byte row */
            wg_ss<T, BN>(s, desc_at(qd, (kk >> 2) * BM * 128 + off), desc_at(kd, (kk >> 2) * BN * 128 + off), kk > 0);
        }
        wg_commit();
    };
    /* online softmax of tile kt in s (masked, row maxima mx), then
     * O += P V queued */
    auto issue_pv = [&](float(&s)[BN / 8][4], int buf) {
        const uint64_t vd = sw128_desc(smem_u32(sV + buf * VB), BN * 128);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[4];
            a[0] = Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]);
            a[1] = Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]);
            a[2] = Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            a[3] = Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            wg_rs<T, DV>(oacc, a, desc_at(vd, kk * 16 * 128));
        }
        wg_commit();
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
    if constexpr (TMA && !PIPE) {
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
    } else if constexpr (!PIPE) {
        for (int64_t kt = 0; kt < nkt; kt++) {
            if (NB == 2) {
                if (kt + 1 < nkt) load_kv(kt + 1, (int)((kt + 1) & 1));
                cp_async_commit();
                cp_async_wait<1>();
            } else { /* ONE: every warp is done with tile kt - 1; refill the buffer and wait for it (the other CTA on
                      * the SM computes meanwhile) */
                if (kt > 0) {
                    load_kv(kt, 0);
                    cp_async_commit();
                }
                cp_async_wait<0>();
            }
            fence_async_smem();
            __syncthreads();
            const int buf = NB == 2 ? (int)(kt & 1) : 0;
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
    } else {
        /* prologue: tile 1 on its way too; tile 0 (and Q) resident */
        if (nkt > 1) load_kv(1, 1);
        cp_async_commit();
        cp_async_wait<1>();
        fence_async_smem();
        __syncthreads();
        /* no wgmma sits under a condition that differs between warps (the
         * compiler then serialises them): both warpgroups take every tile
         * (a tile past a warpgroup's rows is masked to nothing), and the
         * last step's look-ahead product re-reads tile kt (discarded) */
        float sc[BN / 8][4], sn[BN / 8][4];
        if (nkt > 0) {
            issue_qk(sc, 0);
            wg_wait<0>();
            wg_hold(sc);
        }
        for (int64_t kt = 0; kt < nkt; kt++) {
            /* tile kt+1 has landed, and every warp finished tile kt-1, whose
             * buffer ((kt+2) % 3) takes tile kt+2 */
            cp_async_wait<0>();
            fence_async_smem();
            __syncthreads();
            if (kt + 2 < nkt) load_kv(kt + 2, (int)((kt + 2) % 3));
            cp_async_commit();
            /* S of tile kt is complete (waited for at the end of the last
             * step). Its masks branch per warp, so they run before the next
             * product is queued: divergent code while a wgmma is in flight
             * makes the compiler serialise the wgmmas. */
            float mx[2];
            wr.tile_max(sc, klo + kt * BN, lane, mx);
            issue_qk(sn, (int)((kt + 1 < nkt ? kt + 1 : kt) % 3));
            softmax_pv(sc, mx, (int)(kt % 3)); /* overlaps tile kt+1's S */
            wg_wait<0>();
            wg_hold(oacc);
            wg_hold(sn);
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) sc[j][e] = sn[j][e];
        }
    }
    attn_epilogue<T, MODE>(g, c, warp, lane, oacc, m, ls, o, ost, osh, lse, lst, lsh, fz);
#endif
}

__global__ void attn_wg_probe(int *out)
{
#ifdef NSA_WGMMA
    *out = 1;
#else
    *out = 0;
#endif
}

bool attn_wg_available()
{
    int *d = nullptr, h = 0;
    if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    attn_wg_probe<<<1, 1>>>(d);
    const bool ok = cudaGetLastError() == cudaSuccess && cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) ==
                                                             cudaSuccess;
    cudaFree(d);
    cudaGetLastError();
    return ok && h == 1;
}

/* TWO (NSA_CUDA_WG_BN=x2, g.wg_bn == 2): two CTAs per SM instead of one, so
 * that one CTA's softmax runs while the other's products hold the tensor
 * cores. Registers are capped at 128 and the K/V tiles are small enough for
 * two CTAs' shared memory: 64 keys (97 KB at D 128), 32 for Dqk 192 (89 KB). */
template <int DQK> struct WgTwoBn {
    static constexpr int value = DQK > 128 ? 32 : 64;
};

/* ONE (NSA_CUDA_WG_BN=x1, g.wg_bn == 1): two CTAs per SM as in TWO, but
 * 64-key tiles in a single K/V buffer, so that Dqk 192 gets 64-key tiles
 * into two CTAs' shared memory (91 KB each). A CTA waits for its own fetch;
 * the other CTA on the SM computes meanwhile. */
constexpr int WG_ONE_BN = 64;

/* wg_bn: 128, 64, 0 for the pipelined loop (BN = 64), 2 for TWO, 1 for ONE */
template <int DQK, int DV> static size_t wg_smem(int wg_bn)
{
    return wg_bn == 128 ? attn_wg_smem_t<DQK, DV, 128, false>()
           : wg_bn == 64 ? attn_wg_smem_t<DQK, DV, 64, false>()
           : wg_bn == 2  ? attn_wg_smem_t<DQK, DV, WgTwoBn<DQK>::value, false>()
           : wg_bn == 1  ? attn_wg_smem_t<DQK, DV, WG_ONE_BN, false, 1>()
                         : attn_wg_smem_t<DQK, DV, 64, true>();
}
size_t attn_wg_smem(int dqkp, int dvp, int wg_bn)
{
    switch (dqkp * 1000 + dvp) {
    case 64064: return wg_smem<64, 64>(wg_bn);
    case 128128: return wg_smem<128, 128>(wg_bn);
    case 192128: return wg_smem<192, 128>(wg_bn);
    default: return 0;
    }
}

/* The K / V tensor maps of a launch (tma.cuh): the packed compressed rows
 * [total_cmp][Hkv][DP] (MODE 0) or the caller's K / V [T][Hkv][D] with their
 * strides (the window), where D is the padded dim and the TMA can address
 * them; tm.ok = 0 otherwise (the cp.async loop runs). */
template <int DQK, int DV, int MODE>
static TmaKV wg_maps(const Geom &g, int BN, View k, View v)
{
    TmaKV tm = {};
    const int64_t rows = MODE == 0 ? g.total_cmp : g.T;
    tm.ok = g.tma && (MODE == 0 || (g.Dqk == DQK && g.Dv == DV)) &&
            tma_map_rows(&tm.k, k.p, rows, g.Hkv, DQK, k.st, k.sh, BN) &&
            tma_map_rows(&tm.v, v.p, rows, g.Hkv, DV, v.st, v.sh, BN);
    return tm;
}

template <typename T, int DQK, int DV, int MODE, int BN, bool PIPE, int MINB = 1, int NB = 2>
static cudaError_t launch_wg(const Geom &g, const Tiles &tl, View q, View k, View v, MView o, MView lse,
                             cudaStream_t s, const FuseCombine &fz)
{
    const TmaKV tm = PIPE ? TmaKV{} : wg_maps<DQK, DV, MODE>(g, BN, k, v);
    auto kern = tm.ok ? attn_wg_kernel<T, DQK, DV, MODE, BN, PIPE, MINB, NB, !PIPE>
                      : attn_wg_kernel<T, DQK, DV, MODE, BN, PIPE, MINB, NB, false>;
    return launch_attn_tiles<T, DQK, DV, MODE>(kern, BN, attn_wg_smem_t<DQK, DV, BN, PIPE, NB>(), g, tl, q, k, v, o,
                                               lse, s, fz, tm);
}

template <typename T, int MODE>
static cudaError_t attn_wg_t(const Geom &g, int bn, const Tiles &tl, int dqkp, int dvp, View q, View k, View v,
                             MView o, MView lse, cudaStream_t s, const FuseCombine &fz)
{
#define NSA_WG_LAUNCH(DQK, DV)                                                                                   \
    return bn == 128  ? launch_wg<T, DQK, DV, MODE, 128, false>(g, tl, q, k, v, o, lse, s, fz)                      \
           : bn == 64 ? launch_wg<T, DQK, DV, MODE, 64, false>(g, tl, q, k, v, o, lse, s, fz)                       \
           : bn == 2  ? launch_wg<T, DQK, DV, MODE, WgTwoBn<DQK>::value, false, 2>(g, tl, q, k, v, o, lse, s, fz)    \
           : bn == 1  ? launch_wg<T, DQK, DV, MODE, WG_ONE_BN, false, 2, 1>(g, tl, q, k, v, o, lse, s, fz)           \
                      : launch_wg<T, DQK, DV, MODE, 64, true>(g, tl, q, k, v, o, lse, s, fz)
    switch (dqkp * 1000 + dvp) {
    case 64064: NSA_WG_LAUNCH(64, 64);
    case 128128: NSA_WG_LAUNCH(128, 128);
    case 192128: NSA_WG_LAUNCH(192, 128);
    default: return cudaErrorInvalidValue;
    }
#undef NSA_WG_LAUNCH
}

int attn_wg_loop(const Geom &g, int mode)
{
    if (g.wg_bn >= 0) return g.wg_bn;
    if (mode == 0 && g.wg_cmp >= 0) return g.wg_cmp;
    /* measured (H200, 64k): TWO for the window branch (v7; ONE: 4.65 / 6.2 ms against
     * 4.6 / 5.6 at D 128 / 192; v8 with the TMA: TWO 3.9 / 4.8, ONE 4.4 / 5.2). The
     * compressed branch: with the TMA (v8) one CTA of 128-key tiles, two buffers (9.7 / 10.9 ms
     * against TWO's 10.0 / 14.3 and ONE's 10.2 / 12.4); with cp.async ONE (v7: 11.0 / 13.7 against
     * TWO's 11.25 / 17.7 and 128's 13.0 / 14.9) */
    if (mode == 2) return 2;
    return g.tma ? 128 : 1;
}

cudaError_t attn_wg(const Geom &g, int mode, const Tiles &tl, int dqkp, int dvp, View q, View k, View v, MView o,
                    MView lse, cudaStream_t s, const FuseCombine &fz)
{
    const int bn = attn_wg_loop(g, mode);
    NSA_ATTN_DISPATCH(attn_wg_t, g, mode, g, bn, tl, dqkp, dvp, q, k, v, o, lse, s, fz);
}

} // namespace nsa_cuda
