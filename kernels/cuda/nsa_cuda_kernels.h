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

#include "tiles.h"

namespace nsa_cuda {

struct View {
    const void *p;
    int64_t st, sh;
};
struct MView {
    void *p;
    int64_t st, sh;
};

/* The shape facts every kernel needs (copied from the core's plan). Shape
 * only: which kernel runs and with which tile is the backend's choice
 * (backends/cuda/choose.h), passed to each launcher as its tile. */
struct Geom {
    int64_t T, B, Hq, Hkv, G, Dqk, Dv;
    int64_t l, d, ls, n, n_init, n_local, w;
    int64_t total_cmp, max_ns;
    float scale;
    int dtype; /* 0 f32, 1 f16, 2 bf16 (enum nsa_dtype) */
    const int64_t *cu_seqlens, *cu_cmp, *tok_seq; /* device tables */
};

/* Shared memory per SM of the device class a plan was made for and of the
 * device it runs on. They differ under NSA_CUDA_TARGET (a Hopper GPU running
 * as an A100 or an sm_86 / sm_89 part): then every tensor-core launch asks for
 * enough dynamic shared memory that no more of its CTAs fit on one SM than
 * would on that class (launch_smem in tile_qk.cuh). */
struct Dev {
    int64_t class_smem_sm, device_smem_sm;
    int64_t reserved; /* shared memory the runtime keeps per CTA (1 KB) */
    bool emulate;
};

/* A work decomposition for the tiled tensor-core kernels (made per plan):
 * tiles[3*i] = first global token, tiles[3*i+1] = tokens (<= qt), tiles[3*i+2]
 * = sequence. A tile covers qt tokens x hc query heads of one KV group (rows
 * = tokens x heads, 128 per CTA); nchunk = ceil(G / hc). row0: the global
 * token whose score row is row 0 of the scores kernels' sc (0, or the first
 * token of a chunk of score rows, cuda_plan.cu). */
struct Tiles {
    const int64_t *tiles;
    int64_t count;
    int qt, hc, nchunk;
    int64_t row0;
};

/* compress.cu: kc/vc (f32, dense [total_cmp, Hkv, D]) */
cudaError_t compress_mean(const Geom &g, View src, int64_t D, MView dst, cudaStream_t s);
cudaError_t compress_linear(const Geom &g, View src, int64_t D, const void *W, const void *pe, MView dst,
                            cudaStream_t s);
cudaError_t compress_copy(const Geom &g, View src, int64_t D, MView dst, cudaStream_t s);
/* f32 [total_cmp, Hkv, D] -> cfg dtype (16-bit) dense [total_cmp, Hkv, DP], zero padded
 * (exact: COMPRESS already rounded kc/vc to the dtype). */
cudaError_t pack_cmp16(const Geom &g, View src, int64_t D, int DP, void *dst, cudaStream_t s);

/* SLC_COMBINE (the core's stage 16): a selected-attention launcher given an
 * SlcSum with gs.p set adds its branch's term to COMBINE's first one in place.
 * Then o is o_b[CMP] and, for the element x the kernel would have stored as
 * o_slc at (t, h, c), it stores
 *   o[t, h, c] := fmaf(g_slc, x, fmaf(g_cmp, o[t, h, c], 0))
 * which is the combine kernel's sum after two of its terms (combine.cu): COMBINE
 * and the window's fused COMBINE resume from it (their cmp_sum), so the result is
 * bitwise that of the plain stages. gs.p == NULL: plain stores of x. */
struct SlcSum {
    View gc, gs; /* f32 gates [T, Hq] of the compressed and selected branches */
};
#ifdef __CUDACC__
/* the row's two gates (x: g_cmp, y: g_slc); 0 without a sum */
__device__ __forceinline__ float2 slc_sum_gates(const SlcSum &z, int64_t t, int64_t h)
{
    if (!z.gs.p) return make_float2(0.f, 0.f);
    return make_float2(((const float *)z.gc.p)[t * z.gc.st + h * z.gc.sh],
                       ((const float *)z.gs.p)[t * z.gs.st + h * z.gs.sh]);
}
/* stores the selected branch's element x at p: plainly, or added into o_cmp's term (gw from slc_sum_gates) */
__device__ __forceinline__ void slc_store(const SlcSum &z, float2 gw, float *p, float x)
{
    *p = z.gs.p ? fmaf(gw.y, x, fmaf(gw.x, *p, 0.f)) : x;
}
#endif

/* attn_ref.cu: one warp per (token, head); every dtype, any head dim.
 * mode 0 compressed (k, v = f32 kc, vc), 1 selected (idx given), 2 window. */
cudaError_t attn_ref(const Geom &g, int mode, View q, View k, View v, View idx, MView o, MView lse,
                     cudaStream_t s, const SlcSum &z = SlcSum{});

/* COMBINE folded into the window branch's epilogue (attn_sm80 / attn_sm90 mode
 * 2): with out.p set, the kernel writes out = g_cmp o_cmp + g_slc o_slc +
 * g_win o_win (the combine kernel's order and arithmetic, so bitwise its
 * result) in the cfg dtype instead of o_win; ob[b].p == NULL: branch b off. */
struct FuseCombine {
    View gate[3];
    View ob[2]; /* o_cmp, o_slc (fp32) */
    MView out;
    bool cmp_sum; /* ob[0] holds SLC_COMBINE's sum of the first two terms (resumed from; ob[1] and gate[0] unused) */
    bool pair; /* Dv even and every row of ob / out aligned for 2-element accesses (set by the launcher) */
};

/* attn_sm80.cu / attn_sm90.cu: the compressed (mode 0: k, v = packed 16-bit
 * compressed rows, st = Hkv * DP) and window (mode 2; fz optional, see
 * FuseCombine) branches on tiles of 128 query rows, f16 / bf16, with the tile
 * the chooser picked (tiles.h, pick_attn_sm80 / pick_attn_sm90). */
cudaError_t attn_sm80(const Geom &g, const Dev &dev, const AttnTile &tile, int mode, const Tiles &tl, int dqkp,
                      int dvp, View q, View k, View v, MView o, MView lse, cudaStream_t s, const FuseCombine *fz);
cudaError_t attn_sm90(const Geom &g, const Dev &dev, const AttnTile &tile, int mode, const Tiles &tl, int dqkp,
                      int dvp, View q, View k, View v, MView o, MView lse, cudaStream_t s, const FuseCombine *fz);
/* Does this device run the module's sm_90a code (wgmma, TMA)? A probe kernel;
 * synchronous, for context creation only. */
bool sm90a_available();

/* scores_ref.cu: s(t, g, j) for every eligible j; any dtype (kc f32). */
cudaError_t scores_ref(const Geom &g, View q, View kc, View lse, MView scores, cudaStream_t s);

/* scores_sm80.cu (f16 / bf16, G <= 128; gp: 0 the general kernel, 16 the
 * G = 16 kernel, 1 .. 8 the small-group kernel for G <= gp, scores_kq_gp) and
 * scores_sm90.cu (G = 16, padded Dqk 64 / 128 / 192): block scores from the
 * packed 16-bit compressed keys. rows_smem: the CTA's score rows live in
 * shared memory (required by scores_sm90_g16 and by a fused call); then idx.p
 * set ranks them in the kernel (SCORES_TOPN: indices out, sc unused), else
 * they are written to sc. !rows_smem: the rows are accumulated in sc itself. */
cudaError_t scores_sm80(const Geom &g, const Dev &dev, const ScoresTile &tile, int gp, bool rows_smem,
                        const Tiles &tl, int dqkp, View q, View kc, View lse, MView sc, MView idx, cudaStream_t s);
cudaError_t scores_sm90_g16(const Geom &g, const Dev &dev, const ScoresTile &tile, const Tiles &tl, int dqkp, View q,
                            View kc, View lse, MView sc, MView idx, cudaStream_t s);

/* topn.cu: indices [T, Hkv, n], ascending, -1 padded */
/* tokens [t0, t1) whose score rows are scores' rows 0 .. t1 - t0 - 1 */
cudaError_t select_topn(const Geom &g, View scores, int64_t t0, int64_t t1, MView idx, cudaStream_t s);

/* slc_sm80.cu: group-centric selected attention, one token x 16 heads per
 * CTA, any G, f16 / bf16, any alignment. */
cudaError_t slc_sm80(const Geom &g, const Dev &dev, int dqkp, int dvp, View q, View k, View v, View idx, MView o,
                     MView lse, const SlcSum &z, cudaStream_t s);
/* slc_sm80_g16.cu: 8 tokens x 16 heads per CTA (G = 16, see tiles.h). K and V
 * must be loadable with 16-byte copies (slc_sm80_g16_loads; else the
 * backend runs slc_sm80). */
bool slc_sm80_g16_loads(const Geom &g, View k, View v);
cudaError_t slc_sm80_g16(const Geom &g, const Dev &dev, const SlcTile &tile, int dqkp, int dvp, View q, View k, View v,
                         View idx, MView o, MView lse, const SlcSum &z, cudaStream_t s);

/* bwd_ref.cu: the backward stages (section 9), fp32, every dtype and head dim.
 * One branch's inputs: q, dO (cfg dtype), the forward's lse and the gate (f32
 * [T, Hq]), idx (selected branch), and its outputs dgate (optional) and delta
 * (f32 [T, Hq], written by the rows kernel for the keys kernel). */
struct BwdIn {
    View q, dout, lse, gate, idx;
    MView dgate, delta;
};
/* The selected branch's inverse map: for each KV head g and selection block J
 * of the batch (J = blk_off[seq] + j), the tokens whose selection holds it,
 * ascending: list[off[g * nb + J] .. off[g * nb + J + 1]). Built per backward
 * call from the indices (slc_map_build) in memory the plan owns. */
struct SlcMap {
    int64_t nb;              /* selection blocks of the batch: sum of Ns */
    const int64_t *blk_off;  /* [B + 1] device: prefix sums of Ns */
    int *cnt;                /* [Hkv * nb + 1] counts, then (scanned) offsets */
    int *off;                /* [Hkv * nb + 1] */
    int *list_in, *list_out; /* [T * Hkv * n] */
    int *seg;                /* [T * Hkv * n] segment of each entry (sort key) */
    int *seg_out;
    void *tmp;               /* CUB temporary storage */
    size_t tmp_bytes;
};
/* Temporary bytes slc_map_build needs for entries = T * Hkv * n (CUB's scan and sort). */
size_t slc_map_tmp_bytes(int64_t entries, int64_t segments);
/* The map of tokens [t0, t1): list values are the tokens (the backward's keys
 * kernels), or with entry_vals the entries' indices e = ((t - t0) Hkv + g) n +
 * slot (slc_sm80_blk). m's buffers hold (t1 - t0) Hkv n entries. */
cudaError_t slc_map_build(const Geom &g, View idx, SlcMap &m, int64_t t0, int64_t t1, bool entry_vals, cudaStream_t s);
/* slc_sm80_blk.cu: block-major selected attention (any G <= 64, tiles.h):
 * per pass of tokens [t0, t1) (slc_sm80_blk_pass_tokens), the map of the pass
 * built into map (entry values), the partial states of each (token, head,
 * slot) written to part_o (the dtype's o_s / l_s, [(t1 - t0) Hq n, dvp]) and
 * part_ml (f32 pairs m, l), then merged in slot order into o and lse. */
cudaError_t slc_sm80_blk(const Geom &g, const Dev &dev, int dqkp, int dvp, View q, View k, View v, View idx, MView o,
                         MView lse, const SlcSum &z, SlcMap &map, int64_t pass_tokens, void *part_o, float *part_ml,
                         cudaStream_t s);
/* slc_sm90_blk.cu: slc_sm80_blk on wgmma (sm90a; slc_sm90_blk_takes), the same
 * arguments, passes and partial states. */
cudaError_t slc_sm90_blk(const Geom &g, const Dev &dev, int dqkp, int dvp, View q, View k, View v, View idx, MView o,
                         MView lse, const SlcSum &z, SlcMap &map, int64_t pass_tokens, void *part_o, float *part_ml,
                         cudaStream_t s);
/* mode 0 compressed (k, v = f32 kc, vc; dk, dv = the dkc, dvc accumulators),
 * 1 selected (map: the inverse map, built), 2 window: adds to dq (may be
 * absent), dk, dv (f32 accumulators). */
cudaError_t bwd_attn_ref(const Geom &g, int mode, const BwdIn &in, View k, View v, MView dq, MView dk, MView dv,
                         const SlcMap *map, cudaStream_t s);
/* bwd_sm80.cu: the same on mma.sync, f16 / bf16, padded dims 32/32, 64/64,
 * 128/128, 192/128 (tiles.h, bwd_sm80_takes). k, v of the compressed branch:
 * the packed 16-bit rows. What the plan made for it:
 *   rows: the rows kernels' 64-row tiles (compressed, window);
 *   kt_cmp, kt_win: the keys kernel's work items (k0 local to the sequence,
 *     keys, sequence, chunk c, chunks nch, first scratch slot or -1), one CTA
 *     per item and KV head: a compressed tile whose readers exceed cmp_cs
 *     steps of 32 rows is split into chunks, each writing partial sums to
 *     scratch, added in chunk order by a reduce kernel (red_cmp: k0, keys,
 *     sequence, nch, first slot); window tiles are not split;
 *   the selected items (KV head, batch block, 64-key sub-tile) are split the
 *     same way at slc_cs steps, from the inverse map's counts on the device:
 *     slc_nch / slc_nsl (chunks, scratch slots per item) and their scans
 *     slc_choff / slc_sloff ([items + 1] ints, CUB temporary slc_tmp);
 *     slc_grid CTAs bound the chunks;
 *   scratch: the split chunks' partial dk | dv rows, f32. */
struct BwdTiles {
    Tiles rows;
    const int64_t *kt_cmp, *kt_win, *red_cmp;
    int64_t n_cmp, n_win, n_red_cmp, cmp_cs;
    int64_t slc_cs, slc_grid;
    int slc_nsub;
    int *slc_nch, *slc_nsl, *slc_choff, *slc_sloff;
    void *slc_tmp;
    size_t slc_tmp_bytes;
    float *scratch;
};
/* bwd_f16.cu: the keys kernels' f16 operands in a bf16 call (its header has
 * the scheme). One block per plan, in device memory: the largest magnitudes
 * (float bits) of q, dO, and of the running branch's keys, values and gate;
 * the exponents of q (a), dO (c), keys (b), values (d); and the factors the
 * keys kernels read (ks[KS_*]; ks[KS_USE] = 0: the bf16 kernels run). */
enum { KS_LMUL, KS_EMUL, KS_GMUL, KS_DKMUL, KS_DVMUL, KS_USE, KS_COUNT };
struct F16Scale {
    unsigned mx[5]; /* q, dO, keys, values, gate */
    int ex[4];      /* a, c, b, d */
    int qo_ok;
    float ks[KS_COUNT];
};
/* atomicMax of |x|'s bits over x (bf16, or f32 where fsrc) [rows, heads, D] into *out */
cudaError_t f16_amax(bool fsrc, View x, int64_t rows, int64_t heads, int64_t D, unsigned *out, cudaStream_t s);
/* stage 0: q's and dO's exponents from mx[0], mx[1]; stage 1: the branch's
 * (mx[2..4]) and ks, for a softmax scale and value width Dv */
cudaError_t f16_scales(F16Scale *f, int stage, float scale, int64_t Dv, cudaStream_t s);
/* dst (f16 [rows, heads, DP], DP a multiple of 8, zero past D) = x 2^(*ex) */
cudaError_t f16_convert(bool fsrc, View x, int64_t rows, int64_t heads, int64_t D, int DP, const int *ex, void *dst,
                        cudaStream_t s);
/* The f16 copies the keys kernels read in a bf16 call (ks: F16Scale.ks on the
 * device; NULL: none, the keys kernels run in the call's dtype alone) */
struct BwdF16 {
    const float *ks;
    View q, dout, k, v;
};
/* CUB temporary bytes of the scans over the selected items' chunk counts */
size_t bwd_slc_scan_bytes(int64_t items);
/* keys90: the compressed / window keys kernel on wgmma (bwd_keys_sm90, class
 * sm90, the dims keys90_dims takes); the rows kernels and the selected
 * branch stay on mma.sync. f16.ks set (bf16 calls): the keys kernels run on
 * the f16 copies in f16.q, dout, k, v, or in bf16 where ks[KS_USE] is 0. */
cudaError_t bwd_attn_sm80(const Geom &g, const Dev &dev, int mode, int dqkp, int dvp, const BwdTiles &bt,
                          const BwdIn &in, View k, View v, MView dq, MView dk, MView dv, const SlcMap *map,
                          bool keys90, const BwdF16 &f16, cudaStream_t s);
/* bwd_keys_sm90.cu: dk, dv of the compressed (mode 0) or window (2) branch;
 * split items' partial sums go to bt.scratch for bwd_attn_sm80's reduce.
 * ks, role: KEYS_ROLE_* (bwd_common.cuh); in, k, v of the kernel's type. */
cudaError_t bwd_keys_sm90(const Geom &g, const Dev &dev, int mode, int dqkp, int dvp, const BwdTiles &bt,
                          const BwdIn &in, View k, View v, MView dk, MView dv, const float *ks, int role,
                          cudaStream_t s);
/* bwd_rows_sm90.cu: dq, dgate, delta of the compressed (mode 0) or window (2) branch on bt.rows' tiles */
cudaError_t bwd_rows_sm90(const Geom &g, const Dev &dev, int mode, int dqkp, int dvp, const BwdTiles &bt,
                          const BwdIn &in, View k, View v, MView dq, cudaStream_t s);
/* dc (f32 [total_cmp, Hkv, D]) back through the compression: adds to dx (f32
 * [T, Hkv, D], optional) and, LINEAR, to dW [Hkv, l, D, D] and dpe [Hkv, l, D]
 * (f32, optional); x, W, pe of the cfg dtype (pe may be absent). */
cudaError_t bwd_compress(const Geom &g, bool linear, int64_t D, View dc, View x, View W, View pe, MView dx, MView dW,
                         MView dpe, cudaStream_t s);
/* out (cfg dtype) = acc (f32), rows x heads x dim elements */
cudaError_t bwd_store(int dtype, View acc, MView out, int64_t rows, int64_t heads, int64_t dim, cudaStream_t s);

/* combine.cu: o = sum_b gate_b * o_b over the branches whose ob[b].p != NULL, one
 * fmaf per term in branch order; cmp_sum: ob[0] is SLC_COMBINE's sum of the first
 * two terms, taken as it is (gate[0] and ob[1] unused) */
cudaError_t combine(const Geom &g, const View gate[3], const View ob[3], bool cmp_sum, MView o, cudaStream_t s);

} // namespace nsa_cuda

#endif
