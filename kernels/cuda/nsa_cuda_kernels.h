/*
 * nsa_cuda_kernels.h -- the launchers of the CUDA kernels, as the backend
 * (backends/cuda) calls them. Host-side C++; no core header is needed here:
 * the backend translates its nsa_bk_args into these plain views.
 *
 * A View is a strided [rows, heads, dim] (or [rows, heads]) tensor: p points
 * at its first element (the element offset already applied), st/sh are the
 * element strides of the token and head axes; the last axis is contiguous.
 * Every launcher only queues work on `stream` and returns the launch status.
 */
#ifndef NSA_KERNELS_CUDA_NSA_CUDA_KERNELS_H
#define NSA_KERNELS_CUDA_NSA_CUDA_KERNELS_H

#include <cuda_runtime.h>
#include <stdint.h>

namespace nsa_cuda {

struct View {
    const void *p;
    int64_t st, sh;
};
struct MView {
    void *p;
    int64_t st, sh;
};

/* The shape facts every kernel needs (copied from the core's plan). */
struct Geom {
    int64_t T, B, Hq, Hkv, G, Dqk, Dv;
    int64_t l, d, ls, n, n_init, n_local, w;
    int64_t total_cmp, max_ns;
    float scale;
    int dtype; /* 0 f32, 1 f16, 2 bf16 (enum nsa_dtype) */
    int v3;    /* 1: v3 kernels (NSA_CUDA_V3, default), 0: the v2.2 versions */
    int64_t smem_optin; /* usable dynamic shared memory per block (device opt-in less a margin) */
    int attn_var;       /* attn_tc tile variant for Dv <= 128 (NSA_CUDA_ATTN_VAR, default 1; attn_tc.cu AttnCfg) */
    int scores_lean;    /* scores_tc LEAN kernels for G = 16 (NSA_CUDA_SCORES_LEAN, default 1) */
    int topn_rounds;    /* 1: top-n by n rounds only, not by filtering (NSA_CUDA_TOPN=rounds; topn.cuh) */
    int slc_panel;      /* slc_fs keeps K/V in 128-byte-swizzled panels: 1 (NSA_CUDA_SLC=fsp), 2 with three chunk
                         * buffers per warp where they fit (fsp3; the sm_90 default since v8), 0 padded rows */
    int scores_wt;      /* scores_wt (v6, transposed S) where the WG scores kernel would run: 2 every padded Dqk
                         * (192 with one K buffer; the default since v7), 1 Dqk <= 128, 0 never
                         * (NSA_CUDA_SCORES_WT unset or 192 | 128 | 0) */
    int wgmma;          /* wgmma kernels that may run (sm_90a code on the device): bit 0 cmp_attn, 1 scores, 2 win_attn */
    int wg_bn;          /* attn_wg loop (NSA_CUDA_WG_BN): 128 or 64 keys per tile, 0 pipelined, 2 two CTAs per SM (TWO),
                        * 1 two CTAs per SM with one 64-key K/V buffer (ONE),
                        * -1 the measured best per branch (attn_wg_loop) */
    int wg_cmp;         /* the compressed branch's loop alone (NSA_CUDA_WG_CMP, the same codes); wg_bn wins over it */
    int tma;            /* 1: the wgmma kernels fetch K / V tiles through the TMA (v8, tma.cuh) where a tensor map
                         * can be made; 0: cp.async (NSA_CUDA_TMA=0) */
    const int64_t *cu_seqlens, *cu_cmp, *tok_seq; /* device tables */
};

/* A work decomposition for the tiled tensor-core kernels (made per plan):
 * tiles[3*i] = first global token, tiles[3*i+1] = tokens (<= qt), tiles[3*i+2]
 * = sequence. A tile covers qt tokens x hc query heads of one KV group (rows
 * = tokens x heads, 128 per CTA); nchunk = ceil(G / hc). */
struct Tiles {
    const int64_t *tiles;
    int64_t count;
    int qt, hc, nchunk;
};

/* Padded head dims of the tensor-core kernels for (Dqk, Dv); 0 when the dims
 * are too large (then the reference kernels run). */
void tc_dims(int64_t dqk, int64_t dv, int *dqkp, int *dvp);

/* compress.cu: kc/vc (f32, dense [total_cmp, Hkv, D]) */
cudaError_t compress_mean(const Geom &g, View src, int64_t D, MView dst, cudaStream_t s);
cudaError_t compress_linear(const Geom &g, View src, int64_t D, const void *W, const void *pe, MView dst,
                            cudaStream_t s);
cudaError_t compress_copy(const Geom &g, View src, int64_t D, MView dst, cudaStream_t s);
/* f32 [total_cmp, Hkv, D] -> cfg dtype (16-bit) dense [total_cmp, Hkv, DP], zero padded
 * (exact: COMPRESS already rounded kc/vc to the dtype). */
cudaError_t pack_cmp16(const Geom &g, View src, int64_t D, int DP, void *dst, cudaStream_t s);

/* attn_ref.cu: one warp per (token, head); every dtype, any head dim.
 * mode 0 compressed (k, v = f32 kc, vc), 1 selected (idx given), 2 window. */
cudaError_t attn_ref(const Geom &g, int mode, View q, View k, View v, View idx, MView o, MView lse,
                     cudaStream_t s);

/* COMBINE folded into the window branch's epilogue (attn_tc mode 2): with
 * out.p set, the kernel writes out = g_cmp o_cmp + g_slc o_slc + g_win o_win
 * (the combine kernel's order and arithmetic, so bitwise its result) in the
 * cfg dtype instead of o_win; ob[b].p == NULL: branch b off. */
struct FuseCombine {
    View gate[3];
    View ob[2]; /* o_cmp, o_slc (fp32) */
    MView out;
    bool pair; /* Dv even and every row of ob / out aligned for 2-element accesses (attn_tc sets it) */
};

/* attn_tc.cu: tensor-core FlashAttention-style tiles; mode 0 (k, v = packed
 * 16-bit compressed rows, st = Hkv*DP) or 2 (window; fz optional, see
 * FuseCombine). f16 / bf16 only. */
cudaError_t attn_tc(const Geom &g, int mode, const Tiles &tl, int dqkp, int dvp, View q, View k, View v, MView o,
                    MView lse, cudaStream_t s, const FuseCombine *fz = nullptr);

/* attn_wg.cu: attn_tc's tile on Hopper wgmma (sm_90a), padded dims 64/64,
 * 128/128 and 192/128 (attn_wg_smem > 0); attn_tc calls it for the
 * compressed branch when g.wgmma bit 0 is set (bit 2: the window branch).
 * attn_wg_available: does this device run the module's sm_90a code (a probe
 * kernel; synchronous, for context creation only)? */
bool attn_wg_available();
size_t attn_wg_smem(int dqkp, int dvp, int bn);
int attn_wg_loop(const Geom &g, int mode); /* the wg_bn code attn_wg runs for a branch */
cudaError_t attn_wg(const Geom &g, int mode, const Tiles &tl, int dqkp, int dvp, View q, View k, View v, MView o,
                    MView lse, cudaStream_t s, const FuseCombine &fz);

/* slc_mt.cu: selected attention with 4 tokens per CTA sharing block fetches
 * (G = 16, l_s <= 64, n <= 32, Dqk <= 192, Dv <= 128, aligned K/V: slc_mt_ok). */
bool slc_mt_ok(const Geom &g, int dqkp, int dvp, View k, View v);
cudaError_t slc_mt(const Geom &g, int dqkp, int dvp, View q, View k, View v, View idx, MView o, MView lse,
                   cudaStream_t s);

/* slc_fs.cu: selected attention with 8 tokens per CTA fetching their common
 * blocks once (G = 16, l_s <= 64, n <= 32, Dqk <= 192, Dv <= 128, aligned K/V:
 * slc_fs_ok); the default on sm_90 (v7), NSA_CUDA_SLC=fs elsewhere. */
bool slc_fs_ok(const Geom &g, int dqkp, int dvp, View k, View v);
cudaError_t slc_fs(const Geom &g, int dqkp, int dvp, View q, View k, View v, View idx, MView o, MView lse,
                   cudaStream_t s);

/* slc_tc.cu: group-centric selected attention, f16 / bf16. */
cudaError_t slc_tc(const Geom &g, int dqkp, int dvp, View q, View k, View v, View idx, MView o, MView lse,
                   cudaStream_t s);

/* scores.cu: s(t, g, j) for every eligible j. ref: any dtype (kc f32);
 * tc: f16 / bf16 (kc packed 16-bit), needs G <= 128. */
cudaError_t scores_ref(const Geom &g, View q, View kc, View lse, MView scores, cudaStream_t s);
cudaError_t scores_tc(const Geom &g, const Tiles &tl, int dqkp, View q, View kc, View lse,
                      MView scores, cudaStream_t s);

/* scores.cu, v3 fused SCORES_TOPN (f16 / bf16, G <= 128): the scores_tc
 * kernel with its score rows kept in shared memory, then ranked there (the
 * ranking of select_topn) and written as indices; no scores buffer. Only for
 * plans where scores_topn_fits(dqkp, tiles.qt, max_ns, device's opt-in shared
 * memory per block) holds. */
bool scores_topn_fits(int dqkp, int qt, int64_t max_ns, int64_t smem_optin);
cudaError_t scores_topn_tc(const Geom &g, const Tiles &tl, int dqkp, View q, View kc, View lse,
                           MView idx, cudaStream_t s);

/* scores_wt.cu, v6 (sm_90a, G = 16, padded Dqk 64 / 128, and 192 with scores_wt == 2; 8-token
 * tiles): scores (idx NULL) or fused scores + top-n (idx set) with S^T =
 * K Q^T on wgmma; scores_tc / scores_topn_tc call it where it applies. It
 * returns cudaErrorInvalidConfiguration, launching nothing, for a shape it
 * does not cover (the caller then runs the v5 kernel). */
cudaError_t scores_wt(const Geom &g, const Tiles &tl, int dqkp, View q, View kc, View lse, MView sc, MView idx,
                      cudaStream_t s);

/* Dynamic shared memory (bytes) each tensor-core kernel asks for, from the
 * same formulas its launcher uses: the backend compares them with the device's
 * opt-in limit (A100 163 KB, sm_86/89 99 KB, H100/H200 227 KB) and runs the
 * reference kernels where they do not fit. */
size_t attn_tc_smem(int dqkp, int dvp, int mode);
size_t slc_tc_smem(int dqkp, int dvp, int64_t n, int64_t ls);
size_t scores_tc_smem(int dqkp);

/* topn.cu: indices [T, Hkv, n], ascending, -1 padded */
cudaError_t select_topn(const Geom &g, View scores, MView idx, cudaStream_t s);

/* combine.cu: o = sum_b gate_b * o_b over the branches whose ob[b].p != NULL */
cudaError_t combine(const Geom &g, const View gate[3], const View ob[3], MView o, cudaStream_t s);

} // namespace nsa_cuda

#endif
