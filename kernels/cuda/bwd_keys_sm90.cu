/*
 * bwd_keys_sm90.cu -- the keys kernel (dk, dv) of the compressed and window
 * backward on Hopper's warpgroup MMA (wgmma.mma_async, sm_90a code): the same
 * items, formulas and fixed summation order per element as
 * bwd_sm80.cu's bwd_keys_sm80_kernel (its header has the formulas), with the
 * four products on the tensor cores of a warpgroup:
 *
 *   S^T = K Q^T     m64 x KM, A = the CTA's 64 keys, B = KM query rows, both
 *   E^T = V dO^T    read from 128-byte-swizzled shared memory (K-major);
 *   dv += (g P)^T dO   A = g P from the registers that hold S^T (split into
 *   dk += dS^T Q       hi + lo in bf16, as warp_pv_exact; a bf16 call runs
 *                      the f16 form on scaled copies, bwd_f16.cu), B = dO / Q
 *                      of the same step, MN-major (transposed by the MMA).
 *
 * A CTA is one warpgroup (128 threads) and one item of the plan's key-tile
 * list (64 keys of one KV head, or a chunk of a long reader list); each
 * thread owns the dk, dv of two key rows, summed over the steps in order, so
 * the result is bitwise reproducible. Q / dO steps of KM rows (tokens x the
 * group's heads) are double-buffered through cp.async; per-row lse, gate and
 * delta ride beside them. KM is 64 (32 at Dqk 192, where dk holds 96
 * registers); two CTAs per SM.
 *
 * Not measured: 32-row steps at every Dqk (the S^T / E^T products would read
 * their A operand, the keys, from shared memory once per 32 rows instead of
 * 64: twice that traffic per MMA).
 */
#include "bwd_sm90.cuh"

namespace nsa_cuda {

namespace {

constexpr int KEYS90_KN = BWD_KEYS_BN; /* keys per CTA: one warpgroup's m64 */

template <int DQK> constexpr int keys90_km() { return DQK > 128 ? 32 : 64; } /* tiles.h: bwd_keys90_smem */

template <typename T, int DQK, int DV, int MODE, int KM>
__global__ void __launch_bounds__(BWD_THREADS, 2)
    bwd_keys_sm90_kernel(const Geom g, const int64_t *ktiles, const BwdIn in, const T *__restrict__ k, int64_t kst,
                         int64_t ksh, const T *__restrict__ v, int64_t vst, int64_t vsh, int64_t kd, int64_t vd,
                         bool qvec, bool ovec, bool kvvec, float *dk, int64_t dkst, int64_t dksh, float *dv,
                         int64_t dvst, int64_t dvsh, int64_t cs, float *scratch, const float *ks, int role)
{
#ifdef NSA_WGMMA
    KeysFactors kf;
    if (!kf.load(ks, role)) return;
    constexpr int KN = KEYS90_KN, NT = BWD_THREADS;
    constexpr uint32_t KB = KN * DQK * 2, VB = KN * DV * 2, QB = KM * DQK * 2, OB = KM * DV * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *const sK = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    unsigned char *const sV = sK + KB;
    unsigned char *const sQ = sV + VB;     /* two steps */
    unsigned char *const sO = sQ + 2 * QB; /* dO, two steps */
    int64_t *sT = (int64_t *)(sO + 2 * OB); /* [2][KM] per row: local token (-1: none), lse, gate, delta */
    float *sL = (float *)(sT + 2 * KM);
    float *sG = sL + 2 * KM, *sD = sG + 2 * KM;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const KeysItem it = keys_item<MODE>(g, ktiles);
    const int64_t gi = it.gi, k0 = it.k0, nk = it.nk, r0 = it.r0;
    const int64_t s0 = g.cu_seqlens[it.b];
    /* this chunk's rows: steps of BWD_KEYS_BM rows as the plan counted them, walked KM at a time */
    const int64_t nrows = it.r1 > r0 ? (it.r1 - r0) * g.G : 0, nsteps = (nrows + BWD_KEYS_BM - 1) / BWD_KEYS_BM;
    const int64_t st0 = it.nch > 1 ? nsa_min64(it.c * cs, nsteps) : 0,
                  st1 = it.nch > 1 ? nsa_min64(st0 + cs, nsteps) : nsteps;
    if (it.slot < 0 && (nk <= 0 || st1 <= st0)) return; /* nothing reads these keys */
    const int64_t rbeg = st0 * BWD_KEYS_BM, rend = nsa_min64(st1 * BWD_KEYS_BM, nrows);
    const int64_t nst = rend > rbeg ? (rend - rbeg + KM - 1) / KM : 0;
    load_tile_to<T, KN, DQK, NT>([&](int r, int cc) { return (T *)(sK + sw128_off(r, cc, KN)); },
                                 k + (it.kbase + k0) * kst + gi * ksh, kd, kvvec,
                                 [&](int r) -> int64_t { return r < nk ? r * kst : -1; });
    load_tile_to<T, KN, DV, NT>([&](int r, int cc) { return (T *)(sV + sw128_off(r, cc, KN)); },
                                v + (it.kbase + k0) * vst + gi * vsh, vd, kvvec,
                                [&](int r) -> int64_t { return r < nk ? r * vst : -1; });
    const SmallDiv gd(g.G);
    auto load_step = [&](int64_t st, int buf) {
        keys_load_step<T, KM, DQK, DV, NT>(
            g, in, rbeg + st * KM, rend, gi, s0, gd, qvec, ovec,
            [&](int r, int cc) { return (T *)(sQ + buf * QB + sw128_off(r, cc, KM)); },
            [&](int r, int cc) { return (T *)(sO + buf * OB + sw128_off(r, cc, KM)); },
            [&](int64_t i) { return r0 + i; }, sT + buf * KM, sL + buf * KM, sG + buf * KM, sD + buf * KM);
    };
    if (nst > 0) load_step(0, 0);
    cp_async_commit();

    const float sl = g.scale * NSA_LOG2E * kf.lmul;
    const KeyRows<MODE> kr(g, k0, nk, warp, lane);
    const uint64_t kdsc = sw128_desc(smem_u32(sK), 16), vdsc = sw128_desc(smem_u32(sV), 16);
    float dka[DQK / 8][4], dva[DV / 8][4];
    zero_frag(dka);
    zero_frag(dva);

    for (int64_t st = 0; st < nst; st++) {
        if (st + 1 < nst) load_step(st + 1, (int)((st + 1) & 1));
        cp_async_commit();
        cp_async_wait<1>();
        fence_async_smem();
        __syncthreads();
        const int buf = (int)(st & 1);
        const uint32_t qa = smem_u32(sQ + buf * QB), oa = smem_u32(sO + buf * OB);
        float s[KM / 8][4], e[KM / 8][4];
        zero_frag(s);
        zero_frag(e);
        {
            const uint64_t qd = sw128_desc(qa, 16), od = sw128_desc(oa, 16);
            wg_fence();
#pragma unroll
            for (int c = 0; c < DQK / 16; c++) {
                const uint32_t off = (c & 3) * 32; /* 16 dims into the 128-byte row */
                wg_ss<T, KM>(s, desc_at(kdsc, (c >> 2) * KN * 128 + off), desc_at(qd, (c >> 2) * KM * 128 + off), c > 0);
            }
#pragma unroll
            for (int c = 0; c < DV / 16; c++) {
                const uint32_t off = (c & 3) * 32;
                wg_ss<T, KM>(e, desc_at(vdsc, (c >> 2) * KN * 128 + off), desc_at(od, (c >> 2) * KM * 128 + off), c > 0);
            }
            wg_commit();
            wg_wait<0>();
            wg_hold(s);
            wg_hold(e);
        }
        const float *L = sL + buf * KM, *G = sG + buf * KM, *D = sD + buf * KM;
        const int64_t *tq = sT + buf * KM;
        keys_step_probs(s, e, kr.lo, kr.hi, tq, L, G, D, sl, g.scale, kf.emul, kf.gmul, lane);
        {
            /* B operands MN-major: 64-column panels KM * 128 bytes apart, k-step 16 rows */
            const uint64_t qt = sw128_desc(qa, KM * 128), ot = sw128_desc(oa, KM * 128);
            wg_fence();
#pragma unroll
            for (int c = 0; c < KM / 16; c++) {
                wg_rs_exact<T, DV>(dva, s, c, desc_at(ot, c * 16 * 128));
                wg_rs_wide<T, DQK>(dka, e, c, desc_at(qt, c * 16 * 128), KM * 128);
            }
            wg_commit();
            wg_wait<0>();
            wg_hold(dva);
            wg_hold(dka);
        }
        __syncthreads(); /* the step's buffers are free for the next fetch */
    }
    if (role == KEYS_ROLE_F16) {
        scale_frag(dka, kf.dkmul);
        scale_frag(dva, kf.dvmul);
    }
    keys_store(g, dka, dva, kr.kv, kr.kk, it.slot, it.kbase, gi, warp, lane, scratch, dk, dkst, dksh, dv, dvst, dvsh);
#endif
}

template <typename T, int DQK, int DV, int MODE>
cudaError_t launch_keys90(const Geom &g, const Dev &dev, const BwdTiles &bt, const BwdIn &in, View k, View v,
                          MView dk, MView dv, const float *ks, int role, cudaStream_t s)
{
    constexpr int KM = keys90_km<DQK>();
    const int64_t n = MODE == 0 ? bt.n_cmp : bt.n_win;
    if (n == 0 || (!dk.p && !dv.p)) return cudaSuccess;
    const bool qvec = vec_ok(in.q.p, in.q.st, in.q.sh, g.Dqk), ovec = vec_ok(in.dout.p, in.dout.st, in.dout.sh, g.Dv);
    /* the packed compressed rows are padded and aligned */
    const bool kvvec = MODE == 0 || (vec_ok(k.p, k.st, k.sh, g.Dqk) && vec_ok(v.p, v.st, v.sh, g.Dv));
    const int64_t kd = MODE == 0 ? DQK : g.Dqk, vd = MODE == 0 ? DV : g.Dv;
    auto kern = bwd_keys_sm90_kernel<T, DQK, DV, MODE, KM>;
    size_t smem = bwd_keys90_smem(DQK, DV);
    cudaError_t e = launch_smem(kern, dev, smem);
    if (e != cudaSuccess) return e;
    kern<<<dim3((unsigned)n, (unsigned)g.Hkv), BWD_THREADS, smem, s>>>(
        g, MODE == 0 ? bt.kt_cmp : bt.kt_win, in, (const T *)k.p, k.st, k.sh, (const T *)v.p, v.st, v.sh, kd, vd, qvec,
        ovec, kvvec, (float *)dk.p, dk.st, dk.sh, (float *)dv.p, dv.st, dv.sh, MODE == 0 ? bt.cmp_cs : 0, bt.scratch,
        ks, role);
    return cudaGetLastError();
}

template <typename T, int DQK, int DV>
cudaError_t keys90_t(const Geom &g, const Dev &dev, int mode, const BwdTiles &bt, const BwdIn &in, View k, View v,
                     MView dk, MView dv, const float *ks, int role, cudaStream_t s)
{
    if constexpr (!keys90_dims(DQK, DV)) {
        return cudaErrorInvalidValue;
    } else {
        return mode == 0 ? launch_keys90<T, DQK, DV, 0>(g, dev, bt, in, k, v, dk, dv, ks, role, s)
                         : launch_keys90<T, DQK, DV, 2>(g, dev, bt, in, k, v, dk, dv, ks, role, s);
    }
}

} // namespace

cudaError_t bwd_keys_sm90(const Geom &g, const Dev &dev, int mode, int dqkp, int dvp, const BwdTiles &bt,
                          const BwdIn &in, View k, View v, MView dk, MView dv, const float *ks, int role,
                          cudaStream_t s)
{
    if (mode != 0 && mode != 2) return cudaErrorInvalidValue;
    NSA_SLC_DISPATCH(keys90_t, g, dqkp, dvp, g, dev, mode, bt, in, k, v, dk, dv, ks, role, s);
}

} // namespace nsa_cuda
