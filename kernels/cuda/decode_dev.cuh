/*
 * decode_dev.cuh -- device helpers of the decode kernels (decode.cu,
 * decode_attn_sm80.cu): the step's record, the rows of a step, the page
 * tables, and the key list of a row in each branch (semantics section 10).
 */
#ifndef NSA_KERNELS_CUDA_DECODE_DEV_CUH
#define NSA_KERNELS_CUDA_DECODE_DEV_CUH

#include "decode.h"
#include "nsa_cuda.cuh"

namespace nsa_cuda {

/* Programmatic dependent launch (dec_launch with g.pdl, sm_90+): a kernel of the
 * step may be launched while its predecessor still runs. dec_pdl_wait waits
 * until the predecessor has completed and its writes are visible
 * (griddepcontrol.wait); dec_pdl_launch lets this kernel's successor launch
 * (its CTAs start and wait in turn). Most decode kernels call dec_pdl_enter
 * first: the wait, then the launch, so nothing is read or written before the
 * predecessor is done. The attention kernels (decode_attn_sm80.cu) split them:
 * the launch first, then what reads only the caller's inputs, which no kernel
 * of the step writes (q, the lengths, the page tables: the row's query tile
 * and its first chunks' pool rows), then the wait, before anything the step
 * writes (the record, the caches, the selected indices, plan memory) is read
 * and before anything is written. A successor launched that early waits in
 * turn for this kernel's completion, which follows this kernel's own wait.
 * What overlaps is the launch and reads of inputs, not the work: results are
 * those of plain stream order. Without the attribute, or below sm_90, these are
 * no-ops. */
NSA_DEV void dec_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
NSA_DEV void dec_pdl_launch()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
NSA_DEV void dec_pdl_enter()
{
    dec_pdl_wait();
    dec_pdl_launch();
}

/* Launches kern<<<grid, block, smem, s>>>(args...), with programmatic dependent
 * launch where pdl is set (only kernels that call dec_pdl_wait before reading
 * anything the step writes). */
template <typename... P, typename... A>
cudaError_t dec_launch(bool pdl, void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A &&...args)
{
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<A &&>(args)...);
}

NSA_DEV int64_t dnum_cmp(const DecGeom &g, int64_t x) { return x >= g.l ? (x - g.l) / g.d + 1 : 0; }
NSA_DEV bool dec_failed(const DecGeom &g) { return *(volatile const int *)g.rec != 0; }
NSA_DEV int64_t dec_rows(const DecGeom &g) { return g.cu[g.B]; }

/* the sequence of packed row r (r < cu[B]): the largest b with cu[b] <= r */
NSA_DEV int64_t dec_row_seq(const DecGeom &g, int64_t r)
{
    int64_t lo = 0, hi = g.B - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (g.cu[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}
/* pool row of position x of sequence b (raw caches), and of compressed row i */
NSA_DEV int64_t dec_prow(const DecGeom &g, int64_t b, int64_t x)
{
    return (int64_t)g.bt[b * g.bt_st + x / g.ps] * g.ps + x % g.ps;
}
NSA_DEV int64_t dec_crow(const DecGeom &g, int64_t b, int64_t i)
{
    return (int64_t)g.cbt[b * g.cbt_st + i / g.cps] * g.cps + i % g.cps;
}

/* The row's keys: how many, and the pool row of key k (-1: not visible). */
template <int MODE> struct Keys {
    int64_t b, t, r, gi, lo;
    const int *idx; /* mode 1: the row's selected blocks (n slots) */
    NSA_DEV int64_t count(const DecGeom &g) const
    {
        return MODE == 0 ? nsa_cmp_visible(t, g.l, g.d) : MODE == 1 ? g.n * g.ls : t - lo + 1;
    }
    NSA_DEV int64_t row(const DecGeom &g, int64_t k) const
    {
        if (MODE == 0) return dec_crow(g, b, k);
        if (MODE == 2) return dec_prow(g, b, lo + k);
        const int64_t j = idx[k / g.ls], pos = j * g.ls + k % g.ls;
        return j >= 0 && pos <= t ? dec_prow(g, b, pos) : -1;
    }
    /* row() before the step's checks have run (compressed and window keys only:
     * the selected ones need the ranking): the lengths may be wrong, so a
     * column past the table reads nothing (-1). Where the checks pass, every
     * visible key's column lies in the table and this is row(). */
    NSA_DEV int64_t row_unchecked(const DecGeom &g, int64_t k) const
    {
        static_assert(MODE != 1, "the selected keys need the step's ranking");
        if (MODE == 0) return k / g.cps < g.max_cmp_pages ? dec_crow(g, b, k) : -1; /* (k, lo >= 0) */
        return (lo + k) / g.ps < g.max_pages ? dec_prow(g, b, lo + k) : -1;
    }
};

/* the key list of new row r for KV head gi */
template <int MODE> NSA_DEV Keys<MODE> dec_keys(const DecGeom &g, const DecAttnIn &a, int64_t r, int64_t gi)
{
    Keys<MODE> ks;
    ks.b = dec_row_seq(g, r);
    ks.t = g.tk0[ks.b] + r - g.cu[ks.b];
    ks.r = r;
    ks.gi = gi;
    ks.lo = MODE == 2 ? nsa_win_start(ks.t, g.w) : 0;
    ks.idx = MODE == 1 ? (const int *)a.idx.p + r * a.idx.st + gi * a.idx.sh : nullptr;
    return ks;
}

} // namespace nsa_cuda

#endif
