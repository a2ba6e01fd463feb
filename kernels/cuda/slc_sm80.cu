/*
 * slc_sm80.cu -- the selected branch on mma.sync for any G: group-centric
 * selected attention on the tensor cores (sm_80+, f16 / bf16), after the
 * paper's kernel design (section 3.3 of Yuan et al.). slc_sm80_g16.cu takes
 * G = 16 where it can (8 tokens per CTA sharing their common blocks); this
 * kernel runs for every other G and for K/V rows that are not 16-byte
 * aligned (it loads those element by element).
 *
 * One CTA per (token, KV group, chunk of 16 query heads). All query heads of
 * the chunk share every fetch of a selected K/V block: they are the 16 MMA
 * rows. How the 16-row tile is filled:
 *   G = 16   one CTA per (token, group), all rows used;
 *   G < 16   the G heads are padded to 16 rows (zero queries, never stored):
 *            tokens are NOT packed together because different tokens select
 *            different blocks, and a union would cost more than the padding
 *            (this branch is bound by the K/V bytes, not by the MMAs);
 *   G > 16   ceil(G/16) CTAs per (token, group), each fetching the blocks.
 *
 * The selected blocks (cut at the token, the query's own block causally
 * masked) are split into sub-tiles of 64 keys; thread 0 lists them in shared
 * memory. The 4 warps stream the sub-tiles through a cp.async double buffer,
 * warp w taking keys 16w .. 16w+15 of each: S = Q K^T (16 x 16), online
 * softmax in fp32, O += P V. At the end the 4 partial softmax states are
 * merged in shared memory in a fixed order (reproducible).
 *
 * Bytes: n * l_s * (Dqk + Dv) * 2 per (token, group): 512 KB at the paper's
 * shape with D = 128, so the branch is bound by the L2 -> SM stream of K/V
 * blocks; the grid is ordered token-fastest so that the resident CTAs work on
 * one KV group, whose K/V (T * 512 B) stays in L2.
 */
#include "tile_qk.cuh"

namespace nsa_cuda {

constexpr int SLC_THREADS = 128; /* SLC_KB (tiles.h): keys per sub-tile */

template <typename T, int DQK, int DV>
__global__ void __launch_bounds__(SLC_THREADS)
    slc_sm80_kernel(const Geom g, int nchunk, const T *__restrict__ q, int64_t qst, int64_t qsh,
                  const T *__restrict__ k, int64_t kst, int64_t ksh, const T *__restrict__ v, int64_t vst,
                  int64_t vsh, bool qvec, bool kvvec, const int *idx, int64_t ist, int64_t ish, float *o,
                  int64_t ost, int64_t osh, float *lse, int64_t lst, int64_t lsh, const SlcSum z)
{
    constexpr int NT = SLC_THREADS, KB = SLC_KB, SQ = DQK + 8, SV = DV + 8;
    constexpr bool QREG = DQK <= 192;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = (T *)smem_raw;
    T *sK = sQ + 16 * SQ;
    T *sV = sK + 2 * KB * SQ;
    int64_t *sub_ks = (int64_t *)(sV + 2 * KB * SV);
    int *sub_cnt = (int *)(sub_ks + g.n * ((g.ls + KB - 1) / KB));
    __shared__ int s_nsub;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t t = blockIdx.x;
    const int64_t gi = blockIdx.y / nchunk, chunk = blockIdx.y % nchunk;
    const int64_t h0 = gi * g.G + chunk * 16;
    const int hca = (int)nsa_min64(16, g.G - chunk * 16);
    const int64_t s0 = g.cu_seqlens[g.tok_seq[t]], tl = t - s0, cur = nsa_slc_last(tl, g.ls);

    if (tid == 0) {
        int ns = 0;
        for (int64_t b = 0; b < g.n; b++) {
            const int64_t j = idx[t * ist + gi * ish + b];
            if (j < 0 || j > cur) continue;
            const int64_t be = nsa_min64((j + 1) * g.ls, tl + 1);
            for (int64_t x = j * g.ls; x < be; x += KB) {
                sub_ks[ns] = x;
                sub_cnt[ns] = (int)nsa_min64(KB, be - x);
                ns++;
            }
        }
        s_nsub = ns;
    }
    load_tile<T, 16, DQK, SQ, NT>(sQ, q, g.Dqk, qvec,
                                  [&](int r) -> int64_t { return r < hca ? t * qst + (h0 + r) * qsh : -1; });
    cp_async_commit();
    __syncthreads();
    const int nsub = s_nsub;
    const T *kg = k + s0 * kst + gi * ksh;
    const T *vg = v + s0 * vst + gi * vsh;
    auto load_kv = [&](int st, int buf) {
        const int64_t ks = sub_ks[st];
        const int cnt = sub_cnt[st];
        if (kvvec) { /* aligned and rs32_ok (the launcher checked) */
            load_rows_vec<T, KB, DQK, SQ, NT>(sK + buf * KB * SQ, kg + ks * kst, (int)kst, cnt, (int)g.Dqk);
            load_rows_vec<T, KB, DV, SV, NT>(sV + buf * KB * SV, vg + ks * vst, (int)vst, cnt, (int)g.Dv);
        } else {
            load_tile<T, KB, DQK, SQ, NT>(sK + buf * KB * SQ, kg, g.Dqk, false,
                                          [&](int r) -> int64_t { return r < cnt ? (ks + r) * kst : -1; });
            load_tile<T, KB, DV, SV, NT>(sV + buf * KB * SV, vg, g.Dv, false,
                                         [&](int r) -> int64_t { return r < cnt ? (ks + r) * vst : -1; });
        }
    };
    if (nsub > 0) load_kv(0, 0);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    uint32_t qf[QREG ? DQK / 16 : 1][4];
    q_frags<SQ, QREG>(qf, sQ, lane);
    const float sl = g.scale * NSA_LOG2E;
    float oacc[DV / 8][4], m[2], ls[2];
    warp_state_init(oacc, m, ls);

    for (int st = 0; st < nsub; st++) {
        if (st + 1 < nsub) load_kv(st + 1, (st + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const int buf = st & 1, cnt = sub_cnt[st];
        if (16 * warp < cnt) {
            float s[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            warp_qk<T, DQK, 2, SQ, QREG>(s, qf, sQ, sK + buf * KB * SQ, 16 * warp, lane);
            float mx[2] = {-INFINITY, -INFINITY};
            if (16 * warp + 16 <= cnt) { /* the warp's 16 keys all present */
                warp_rows_max(s, mx);
            } else {
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = 16 * warp + j * 8 + 2 * (lane & 3) + (e & 1);
                        const float x = key < cnt ? s[j][e] : -INFINITY;
                        s[j][e] = x;
                        mx[e >> 1] = fmaxf(mx[e >> 1], x);
                    }
            }
            warp_softmax_step(s, mx, m, ls, oacc, sl);
            warp_pv<T, DV, 1, SV>(oacc, s, sV + buf * KB * SV, 16 * warp, lane);
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();

    /* merge the 4 warps' softmax states (shared memory reused) in a fixed
     * order; row terms once per row, the column loop over a constant DV */
    float *sM = (float *)sK;  /* [4][16] */
    float *sL = sM + 64;      /* [4][16] */
    float *sF = sL + 64;      /* [4][16] per-warp factor exp2(m_w - M) / L */
    float *sO = sF + 64;      /* [4][16][DV] */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 1);
        ls[i] += __shfl_xor_sync(0xffffffffu, ls[i], 2);
        if ((lane & 3) == 0) {
            sM[warp * 16 + (lane >> 2) + 8 * i] = m[i];
            sL[warp * 16 + (lane >> 2) + 8 * i] = ls[i];
        }
    }
    __syncthreads();
    if (tid < 16) {
        const int row = tid;
        float M = sM[row];
        for (int w = 1; w < 4; w++) M = fmaxf(M, sM[w * 16 + row]);
        const float Mu = M == -INFINITY ? 0.f : M;
        float L = 0.f;
        for (int w = 0; w < 4; w++) L += sL[w * 16 + row] * exp2f(sM[w * 16 + row] - Mu);
        const float inv = L != 0.f ? 1.0f / L : 0.f;
        for (int w = 0; w < 4; w++) sF[w * 16 + row] = exp2f(sM[w * 16 + row] - Mu) * inv;
        if (lse && row < hca) lse[t * lst + (h0 + row) * lsh] = L != 0.f ? (M + log2f(L)) * NSA_LN2 : -INFINITY;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = (lane >> 2) + 8 * i;
        const float f = sF[warp * 16 + row];
        float *dst = sO + (warp * 16 + row) * DV;
#pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            const int col = j * 8 + 2 * (lane & 3);
            *reinterpret_cast<float2 *>(dst + col) = make_float2(oacc[j][2 * i] * f, oacc[j][2 * i + 1] * f);
        }
    }
    __syncthreads();
    float *orow0 = o + t * ost + h0 * osh;
    for (int e = tid; e < 16 * DV; e += NT) {
        const int row = e / DV, col = e % DV;
        if (row >= hca || col >= g.Dv) continue;
        const float acc = sO[row * DV + col] + sO[(16 + row) * DV + col] + sO[(32 + row) * DV + col] +
                          sO[(48 + row) * DV + col];
        slc_store(z, slc_sum_gates(z, t, h0 + row), orow0 + row * osh + col, acc);
    }
}

template <typename T, int DQK, int DV>
static cudaError_t launch_slc(const Dev &dev, const Geom &g, View q, View k, View v, View idx, MView o, MView lse,
                              const SlcSum &z, cudaStream_t s)
{
    static_assert(sizeof(T) == 2, "tensor-core path: 16-bit storage");
    size_t smem = slc_sm80_smem(DQK, DV, g.n, g.ls);
    cudaError_t e = launch_smem(slc_sm80_kernel<T, DQK, DV>, dev, smem);
    if (e != cudaSuccess) return e;
    const int nchunk = (int)((g.G + 15) / 16);
    const bool qvec = vec_ok(q.p, q.st, q.sh, g.Dqk);
    const bool kvvec = vec_ok(k.p, k.st, k.sh, g.Dqk) && vec_ok(v.p, v.st, v.sh, g.Dv) && rs32_ok(k.st, SLC_KB) &&
                       rs32_ok(v.st, SLC_KB);
    const dim3 grid((unsigned)g.T, (unsigned)(g.Hkv * nchunk));
    slc_sm80_kernel<T, DQK, DV><<<grid, SLC_THREADS, smem, s>>>(
        g, nchunk, (const T *)q.p, q.st, q.sh, (const T *)k.p, k.st, k.sh, (const T *)v.p, v.st, v.sh, qvec, kvvec,
        (const int *)idx.p, idx.st, idx.sh, (float *)o.p, o.st, o.sh, (float *)lse.p, lse.st, lse.sh, z);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t slc_sm80_t(const Dev &dev, const Geom &g, int dqkp, int dvp, View q, View k, View v, View idx,
                              MView o, MView lse, const SlcSum &z, cudaStream_t s)
{
    switch (dqkp * 1000 + dvp) {
    case 32032: return launch_slc<T, 32, 32>(dev, g, q, k, v, idx, o, lse, z, s);
    case 64064: return launch_slc<T, 64, 64>(dev, g, q, k, v, idx, o, lse, z, s);
    case 128128: return launch_slc<T, 128, 128>(dev, g, q, k, v, idx, o, lse, z, s);
    case 192128: return launch_slc<T, 192, 128>(dev, g, q, k, v, idx, o, lse, z, s);
    case 256256: return launch_slc<T, 256, 256>(dev, g, q, k, v, idx, o, lse, z, s);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t slc_sm80(const Geom &g, const Dev &dev, int dqkp, int dvp, View q, View k, View v, View idx, MView o,
                     MView lse, const SlcSum &z, cudaStream_t s)
{
    if (g.T == 0) return cudaSuccess;
    if (g.dtype == 1) return slc_sm80_t<__half>(dev, g, dqkp, dvp, q, k, v, idx, o, lse, z, s);
    if (g.dtype == 2) return slc_sm80_t<__nv_bfloat16>(dev, g, dqkp, dvp, q, k, v, idx, o, lse, z, s);
    return cudaErrorInvalidValue;
}

} // namespace nsa_cuda
