/*
 * bwd_common.cuh -- device helpers of the backward's tensor-core kernels
 * (bwd_sm80.cu on mma.sync, bwd_keys_sm90.cu and bwd_rows_sm90.cu on wgmma):
 * the row values in the log2 domain, the C-fragment stores, the rows
 * kernels' sweep step and dg, delta writes, and the keys kernels' shared
 * steps: their compressed / window items, which queries read a key, a step's
 * loads (rows split into reader and head), its probabilities and the final
 * store of dk, dv. Fragments follow the mma.sync m16n8 C layout
 * (nsa_cuda.cuh), which is also each warp's part of a wgmma accumulator
 * (wgmma.cuh).
 */
#ifndef NSA_KERNELS_CUDA_BWD_COMMON_CUH
#define NSA_KERNELS_CUDA_BWD_COMMON_CUH

#include "tile_qk.cuh"

namespace nsa_cuda {

/* lse in the log2 domain; +inf where the row sees nothing (lse = -inf), so that
 * every p = 2^(s sl - L) of that row is 0 */
NSA_DEV float lse2_of(float lse) { return lse == -INFINITY ? INFINITY : lse * NSA_LOG2E; }

/* A rows kernel's two fragment rows per lane (warp * 16 + lane / 4 + 8 i of the tile c): valid,
 * token, head, the row's lse in the log2 domain (+inf for a padding row) and its gate. */
NSA_DEV void frag_rows(const BwdIn &in, const TileCtx &c, int warp, int lane, float (&L)[2], float (&gt)[2],
                       int64_t (&rt)[2], int64_t (&rh)[2], bool (&rv)[2])
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = warp * 16 + (lane >> 2) + 8 * i;
        rv[i] = r < c.nrows;
        rt[i] = c.t0 + r / c.hca;
        rh[i] = c.h0 + r % c.hca;
        L[i] = rv[i] ? lse2_of(((const float *)in.lse.p)[rt[i] * in.lse.st + rh[i] * in.lse.sh]) : INFINITY;
        gt[i] = rv[i] ? ((const float *)in.gate.p)[rt[i] * in.gate.st + rh[i] * in.gate.sh] : 0.f;
    }
}

/* dg of a quad's row (the 4 lanes that hold it), the same in every lane */
NSA_DEV float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* adds a warp's 16 x (NO*8) fp32 accumulator to rows of a strided f32 tensor:
 * row i of this thread (lane/4 + 8i) at rowp(i) (NULL: skipped), columns < D */
template <int NO, bool ADD = true, typename RowFn>
NSA_DEV void warp_add_rows(const float (&acc)[NO][4], int64_t D, int lane, RowFn rowp)
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float *row = rowp(i);
        if (!row) continue;
#pragma unroll
        for (int j = 0; j < NO; j++) {
            const int col = j * 8 + 2 * (lane & 3);
            if (col < D) row[col] = ADD ? row[col] + acc[j][2 * i] : acc[j][2 * i];
            if (col + 1 < D) row[col + 1] = ADD ? row[col + 1] + acc[j][2 * i + 1] : acc[j][2 * i + 1];
        }
    }
}

template <int NJ> NSA_DEV void zero_frag(float (&s)[NJ][4])
{
#pragma unroll
    for (int j = 0; j < NJ; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
}

/* One key tile of a rows kernel's sweep, for the warp's 16 rows (this thread's
 * rows i = 0, 1: L = lse in log2 (+inf: none), gt = gate): s holds the masked
 * logits and e = dO . v. Sweep 0 adds p e to dgp; sweep 1 turns s into
 * dS scale = g p (e - dg) scale, ready for dq += dS K. */
template <int NJ>
NSA_DEV void rows_sweep_step(int pass, float (&s)[NJ][4], const float (&e)[NJ][4], const float (&L)[2],
                             const float (&gt)[2], const float (&dg)[2], float (&dgp)[2], float sl, float scale)
{
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int i = x >> 1;
            const float p = fast_ex2(fmaf(s[j][x], sl, -L[i]));
            if (pass == 0) dgp[i] += p * e[j][x];
            else s[j][x] = gt[i] * p * (e[j][x] - dg[i]) * scale;
        }
}

/* One key tile of a rows kernel's single sweep (the selected rows kernel and
 * bwd_rows_sm90): s (the masked logits) becomes p and e (dO . v) becomes p e,
 * and dgp adds p e in the order rows_sweep_step's sweep 0 does, so dg is the
 * same sum. The caller then adds B += p K and A += (p e) K; after the last tile
 * dq = scale g (A - dg B) (rows_dq_finish), the same sum as
 * scale sum_r g p_r (e_r - dg) k_r, formed without a second sweep. */
template <int NJ>
NSA_DEV void rows_single_step(float (&s)[NJ][4], float (&e)[NJ][4], const float (&L)[2], float (&dgp)[2], float sl)
{
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int i = x >> 1;
            const float p = fast_ex2(fmaf(s[j][x], sl, -L[i]));
            const float pe = p * e[j][x];
            dgp[i] += pe;
            s[j][x] = p;
            e[j][x] = pe;
        }
}

/* dq = scale g (A - dg B) in place of A, for this thread's two fragment rows */
template <int NO>
NSA_DEV void rows_dq_finish(float (&a)[NO][4], const float (&b)[NO][4], const float (&dg)[2], const float (&gt)[2],
                            float scale)
{
#pragma unroll
    for (int j = 0; j < NO; j++)
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int i = x >> 1;
            a[j][x] = scale * gt[i] * fmaf(-dg[i], b[j][x], a[j][x]);
        }
}

/* After sweep 0: dg of this thread's rows (the quad's sum), and for the rows
 * that exist (head(i) >= 0; token t(i)) dgate = dg and delta = g dg. */
template <typename TokFn, typename HeadFn>
NSA_DEV void rows_write_dg(const BwdIn &in, const float (&dgp)[2], const float (&gt)[2], const bool (&rv)[2],
                           float (&dg)[2], int lane, TokFn tok, HeadFn head)
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        dg[i] = quad_sum(dgp[i]);
        if (!rv[i] || (lane & 3) != 0) continue;
        const int64_t t = tok(i), h = head(i);
        if (in.dgate.p) ((float *)in.dgate.p)[t * in.dgate.st + h * in.dgate.sh] = dg[i];
        ((float *)in.delta.p)[t * in.delta.st + h * in.delta.sh] = gt[i] * dg[i];
    }
}

/* The local query positions that may read local key kk (a compressed row, a
 * token, a token): lo <= tq <= hi; none where the key does not exist. */
template <int MODE> NSA_DEV void key_readers(const Geom &g, int64_t kk, bool exists, int64_t &lo, int64_t &hi)
{
    lo = !exists ? INT64_MAX : MODE == 0 ? kk * g.d + g.l - 1 : kk;
    hi = MODE == 2 ? kk + g.w - 1 : INT64_MAX;
}

/* This thread's two key rows of a keys kernel's 64 (warp w holds rows 16 w +
 * lane / 4 + 8 i of the C fragments): their local keys k0 + row, whether they
 * exist (row < nk), and the query positions that may read them. */
template <int MODE> struct KeyRows {
    int64_t kk[2], lo[2], hi[2];
    bool kv[2];
    NSA_DEV KeyRows(const Geom &g, int64_t k0, int64_t nk, int warp, int lane)
    {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = warp * 16 + (lane >> 2) + 8 * i;
            kv[i] = r < nk;
            kk[i] = k0 + r;
            key_readers<MODE>(g, kk[i], kv[i], lo[i], hi[i]);
        }
    }
};

/* x / d by one multiply-high where x d < 2^32: m = ceil(2^32 / d) =
 * (2^32 + e) / d with e < d, so x m / 2^32 = x / d + x e / (d 2^32) and the
 * excess stays below 1 / d. The keys kernels split a step's row x < G + 64
 * into (reader, head) with it, where a 64-bit division per 16-byte chunk cost
 * more than the MMAs; from d = 2^15 (G that large: x d may pass 2^32) they
 * divide. */
struct SmallDiv {
    uint32_t d, m;
    NSA_DEV explicit SmallDiv(int64_t dd) : d((uint32_t)dd), m(dd > 1 ? (uint32_t)((0x100000000ull + dd - 1) / dd) : 0u) {}
    NSA_DEV uint32_t div(uint32_t x) const { return d == 1 ? x : d < 32768u ? __umulhi(x, m) : x / d; }
};

/* 4-byte global -> shared copy, zero-filled (and nothing read) where pred is false */
NSA_DEV void cp_async4(void *dst, const void *src, bool pred)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(pred ? 4 : 0));
}

/* One step of a keys kernel: rows [rb, rb + KM) of its reader list (reader-
 * major, the group's G heads fastest; rows >= rend absent). Queues (cp.async)
 * each row's Q and dO to qdst(r, c) / odst(r, c) and its lse (natural log, as
 * stored), gate and delta to sL, sG, sD (zero where absent), and writes its
 * local token to sT (-1: absent). tok(i): the global token of reader i. The
 * row split divides by G once per step, not once per chunk. */
template <typename T, int KM, int DQK, int DV, int NT, typename QDst, typename ODst, typename TokFn>
NSA_DEV void keys_load_step(const Geom &g, const BwdIn &in, int64_t rb, int64_t rend, int64_t gi, int64_t s0,
                            const SmallDiv &gd, bool qvec, bool ovec, QDst qdst, ODst odst, TokFn tok, int64_t *sT,
                            float *sL, float *sG, float *sD)
{
    const int64_t tb = rb / g.G;
    const uint32_t hb = (uint32_t)(rb - tb * g.G);
    auto row = [&](int r, int64_t &t, int64_t &h) {
        const uint32_t x = hb + (uint32_t)r, qd = gd.div(x);
        t = rb + r < rend ? tok(tb + qd) : -1;
        h = gi * g.G + (x - qd * gd.d);
    };
    load_tile_to<T, KM, DQK, NT>(qdst, (const T *)in.q.p, g.Dqk, qvec, [&](int r) -> int64_t {
        int64_t t, h;
        row(r, t, h);
        return t < 0 ? -1 : t * in.q.st + h * in.q.sh;
    });
    load_tile_to<T, KM, DV, NT>(odst, (const T *)in.dout.p, g.Dv, ovec, [&](int r) -> int64_t {
        int64_t t, h;
        row(r, t, h);
        return t < 0 ? -1 : t * in.dout.st + h * in.dout.sh;
    });
    if (threadIdx.x < KM) {
        const int r = threadIdx.x;
        int64_t t, h;
        row(r, t, h);
        const bool ok = t >= 0;
        const float *lse = (const float *)in.lse.p, *gate = (const float *)in.gate.p, *delta = (const float *)in.delta.p;
        cp_async4(sL + r, ok ? lse + t * in.lse.st + h * in.lse.sh : lse, ok);
        cp_async4(sG + r, ok ? gate + t * in.gate.st + h * in.gate.sh : gate, ok);
        cp_async4(sD + r, ok ? delta + t * in.delta.st + h * in.delta.sh : delta, ok);
        sT[r] = ok ? t - s0 : -1;
    }
}

/* A keys kernel's step in the accumulators: s = S^T (scores of this thread's
 * two keys against the step's columns), e = E^T (dO . v). Turns s into g p
 * (for dv) and e into scale dS (for dk); p is 0 where the column's token may
 * not read the key (klo / khi: key_readers) or the column is absent. */
template <int NJ>
NSA_DEV void keys_step_probs(float (&s)[NJ][4], float (&e)[NJ][4], const int64_t (&klo)[2], const int64_t (&khi)[2],
                             const int64_t *tq, const float *L, const float *G, const float *D, float sl, float scale,
                             float emul, float gmul, int lane)
{
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int col = j * 8 + 2 * (lane & 3) + (x & 1), i = x >> 1;
            const int64_t t = tq[col];
            const bool vis = t >= klo[i] && t <= khi[i];
            const float p = vis ? fast_ex2(fmaf(s[j][x], sl, -lse2_of(L[col]))) : 0.f;
            const float dl = D[col] * emul;                   /* delta in e's units */
            s[j][x] = p * G[col] * gmul;                       /* g p: dv */
            e[j][x] = p * (G[col] * e[j][x] - dl) * scale;     /* scale ds: dk */
        }
}

/* Which keys kernel of a call runs, and its factors (bwd_f16.cu): ONLY, the
 * call has no f16 copies (factors 1); F16, the f16 kernel on the copies, where
 * ks[KS_USE] is set; BF16, the bf16 kernel on the inputs, where it is not.
 * A bf16 call queues both; every CTA of the other returns at once. */
enum { KEYS_ROLE_ONLY, KEYS_ROLE_F16, KEYS_ROLE_BF16 };
struct KeysFactors {
    float lmul = 1.f, emul = 1.f, gmul = 1.f, dkmul = 1.f, dvmul = 1.f;
    /* false: the other kernel of the pair runs */
    NSA_DEV bool load(const float *ks, int role)
    {
        if (role == KEYS_ROLE_ONLY) return true;
        const bool use = ks[KS_USE] != 0.f;
        if (use != (role == KEYS_ROLE_F16)) return false;
        if (use) {
            lmul = ks[KS_LMUL];
            emul = ks[KS_EMUL];
            gmul = ks[KS_GMUL];
            dkmul = ks[KS_DKMUL];
            dvmul = ks[KS_DVMUL];
        }
        return true;
    }
};

/* acc *= m (a power of two: exact) */
template <int N> NSA_DEV void scale_frag(float (&acc)[N][4], float m)
{
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int x = 0; x < 4; x++) acc[j][x] *= m;
}

/* A compressed (MODE 0) or window (MODE 2) keys item: CTA blockIdx.x of the
 * plan's list (k0, keys, sequence, chunk, chunks, first slot) and KV head
 * blockIdx.y. Its keys are [k0, k0 + nk) of sequence b (row kbase + key of
 * the K/V tensor); the queries that may read them are the tokens [r0, r1)
 * (x the group's G heads); a split item's chunk c of nch writes its partial
 * sums to scratch slot `slot` (-1: not split). */
struct KeysItem {
    int64_t gi, b, k0, nk, kbase, r0, r1, c, nch, slot;
};
template <int MODE> NSA_DEV KeysItem keys_item(const Geom &g, const int64_t *ktiles)
{
    const int64_t *it = ktiles + 6 * (int64_t)blockIdx.x;
    KeysItem u;
    u.k0 = it[0];
    u.nk = it[1];
    u.b = it[2];
    u.c = it[3];
    u.nch = it[4];
    u.gi = blockIdx.y;
    u.slot = it[5] < 0 ? -1 : it[5] * g.Hkv + u.gi;
    const int64_t s0 = g.cu_seqlens[u.b], len = g.cu_seqlens[u.b + 1] - s0;
    u.kbase = MODE == 0 ? g.cu_cmp[u.b] : s0;
    u.r0 = s0 + (MODE == 0 ? u.k0 * g.d + g.l - 1 : u.k0);
    u.r1 = s0 + (MODE == 0 ? len : nsa_min64(u.k0 + u.nk - 1 + g.w, len));
    return u;
}

/* The end of a keys kernel: a warp's 16 keys' dk, dv (kv: this thread's two
 * key rows exist; kk: their local index) added to dk / dv (f32, NULL:
 * skipped), or, for a split item's chunk (slot >= 0), written to
 * scratch[slot][key][Dqk + Dv] for bwd_keys_reduce_kernel. */
template <int NK, int NV>
NSA_DEV void keys_store(const Geom &g, const float (&dka)[NK][4], const float (&dva)[NV][4], const bool (&kv)[2],
                        const int64_t (&kk)[2], int64_t slot, int64_t kbase, int64_t gi, int warp, int lane,
                        float *scratch, float *dk, int64_t dkst, int64_t dksh, float *dv, int64_t dvst, int64_t dvsh)
{
    constexpr int KN = BWD_KEYS_BN;
    if (slot >= 0) {
        const int64_t W = g.Dqk + g.Dv;
        auto sp = [&](int i, int64_t off) {
            return kv[i] ? scratch + (slot * KN + warp * 16 + (lane >> 2) + 8 * i) * W + off : (float *)nullptr;
        };
        warp_add_rows<NK, false>(dka, g.Dqk, lane, [&](int i) { return sp(i, 0); });
        warp_add_rows<NV, false>(dva, g.Dv, lane, [&](int i) { return sp(i, g.Dqk); });
        return;
    }
    auto rowp = [&](float *base, int64_t rs, int64_t hs, int i) {
        return base && kv[i] ? base + (kbase + kk[i]) * rs + gi * hs : (float *)nullptr;
    };
    warp_add_rows(dka, g.Dqk, lane, [&](int i) { return rowp(dk, dkst, dksh, i); });
    warp_add_rows(dva, g.Dv, lane, [&](int i) { return rowp(dv, dvst, dvsh, i); });
}

} // namespace nsa_cuda

#endif
