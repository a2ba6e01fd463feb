/*
 * decode.h -- the launchers of the decode kernels (kernels/cuda/decode.cu,
 * semantics section 10), as backends/cuda/cuda_decode.cu calls them.
 * Host-side C++, no core header: the backend translates nsa_bk_args into
 * the plain pointers and strides below.
 *
 * Every kernel reads the step's lengths (cu_seqlens_q, cache_seqlens) and
 * page tables in device memory; nothing is read back on the host, nothing is
 * allocated or synchronized, so a step can be captured in a CUDA graph and
 * replayed with new lengths and tables. The check kernels write the step's
 * record (DecRec); every later kernel reads its status first and does
 * nothing when the step failed (a failed step writes nothing but the status).
 */
#ifndef NSA_KERNELS_CUDA_DECODE_H
#define NSA_KERNELS_CUDA_DECODE_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "nsa_decode_record.h"

namespace nsa_cuda {

/* The record of a step's checks (NSA_DR_* fields, NSA_DRS_* reasons) is
 * kernels/common/nsa_decode_record.h's, shared with the HIP backend;
 * cuda_decode.cu words the message from it. */

/* A paged cache: base (cfg dtype), row stride st and head stride sh (elements) */
struct DecCache {
    void *p;
    int64_t st, sh;
};
struct DecIn { /* a packed [rows, heads, dim] input */
    const void *p;
    int64_t st, sh;
};

/* Everything a decode kernel reads: shape, capacities and the step's tensors. */
struct DecGeom {
    int64_t B, MT, Hq, Hkv, G, Dqk, Dv;
    int64_t l, d, ls, n, n_init, n_local, w;
    int64_t max_step, max_context, ps, num_pages, max_pages, cps, num_cmp_pages, max_cmp_pages;
    int64_t max_ns; /* score row length */
    float scale;
    int dtype;      /* 0 f32, 1 f16, 2 bf16 */
    int compress;   /* nsa_compress_mode */
    const int *cu;  /* cu_seqlens_q [B + 1] */
    const int *tk0; /* cache_seqlens [B] */
    const int *bt;  /* block_table, row stride bt_st */
    int64_t bt_st;
    const int *cbt; /* cmp_block_table (NULL when no compressed rows exist) */
    int64_t cbt_st;
    int *rec;       /* the step's record [NSA_DR_FIELDS] (plan memory) */
    int *status;    /* the caller's status tensor [2], or NULL */
    int pdl;        /* launch the step's kernels after the first with programmatic dependent launch
                     * (dec_pdl_available; decode_dev.cuh, dec_launch) */
};

/* Whether a device of compute capability major.x runs this module's decode kernels
 * with programmatic dependent launch: sm_90 or newer, and the kernels' code built
 * from sm_90+ PTX (so that it holds the griddepcontrol instructions, not an older
 * target's code JIT-compiled for the device). */
bool dec_pdl_available(int major);

/* Plan memory of the checks: two 64-bit flags, the arrival counter of the
 * second kernel's CTAs (8 bytes with padding), then the page counts; zeroed
 * at the start of every step (cudaMemsetAsync, capturable, or the first
 * thing check_one_kernel does). */
constexpr size_t DEC_CHECK_HEAD = 24;
struct DecCheckMem {
    unsigned long long *flags; /* [2]: phase-1 and shared-page failures, as UINT64_MAX - b (0: none) */
    unsigned *arrive;          /* CTAs of check_shared done (the last one writes the verdict) */
    int *pcount, *ccount;      /* [num_pages], [num_cmp_pages] */
};

/* Where the plan's B x (table columns) items and its check memory (bytes, from
 * m.flags on) are small (dec_check_one_fits) and one is set, one CTA runs both
 * phases and the verdict and zeroes the memory itself first: the caller skips
 * the memset. */
constexpr int DEC_CHECK_ONE_THREADS = 1024;
constexpr int64_t DEC_CHECK_ONE_ITEMS = 4 * DEC_CHECK_ONE_THREADS;
constexpr size_t DEC_CHECK_ONE_BYTES = 64 * 1024;
bool dec_check_one_fits(int64_t batch, int64_t cols, size_t bytes);
cudaError_t dec_check(const DecGeom &g, const DecCheckMem &m, size_t bytes, bool one, cudaStream_t s);

/* Appends the new tokens' rows to the distinct caches, in one launch: src[c]
 * (k or v of a branch, D[c] wide) into dst[c], for c < n (at most 6: the k and
 * v caches of three branches). */
struct DecAppend {
    int n;
    DecIn src[6];
    DecCache dst[6];
    int64_t D[6];
};
/* MEAN / LINEAR (kc.p != NULL): the compressed rows the step completes, into kc /
 * vc. A block's positions cached before the step are read from the compressed
 * branch's caches (kraw, vraw), the step's own from its inputs (kin, vin: the
 * values the append writes), so the rows form in the append's launch. */
struct DecCompress {
    DecCache kraw, vraw, kc, vc;
    DecIn kin, vin;
    const void *wk, *wv, *pek, *pev;
};
cudaError_t dec_append(const DecGeom &g, const DecAppend &ap, const DecCompress &cp, cudaStream_t s);

/* The split attention of one branch (mode 0 compressed, 1 selected, 2 window):
 * grid (rows, Hkv x head chunks, ns splits of chunk keys each), partial
 * softmax states into part (f32: [MT, Hq, ns] x (Dv + 2)). */
struct DecSplit {
    int ns;        /* splits */
    int64_t chunk; /* keys per split */
    int hc;        /* heads per CTA */
};
struct DecAttnIn {
    DecIn q;
    DecCache k, v;        /* mode 0: the compressed caches */
    DecIn idx;            /* mode 1: the selected blocks (int32 [MT, Hkv, n]) */
    float *part;          /* partial states */
    float *o;             /* o_b (f32 [MT, Hq, Dv]) */
    int64_t ost, osh;
    float *lse;           /* lse of the branch, or NULL */
    int64_t lst, lsh;
};
cudaError_t dec_attn(const DecGeom &g, int mode, const DecSplit &sp, const DecAttnIn &a, cudaStream_t s);
/* dynamic shared memory of dec_attn's kernel (the plan refuses head dims past 48 KB) */
size_t dec_attn_smem(int64_t Dqk, int64_t Dv);

/* Block scores and top-n: p_cmp group sums of every visible compressed row
 * (split like the compressed branch: pbuf f32 [MT, Hkv, max_nc]), then one
 * warp per (row, KV head) maps them onto the selection blocks (rows: f32
 * [MT, Hkv, max_ns]) and ranks them (topn.cuh) into idx. */
cudaError_t dec_select(const DecGeom &g, const DecSplit &sp, DecIn q, DecCache kc, DecIn lse_cmp, float *pbuf,
                       int64_t max_nc, float *rows, int *idx, int64_t ist, int64_t ish, cudaStream_t s);

/* decode_attn_sm80.cu: the split attention (mode 0, 1, 2) and the compressed
 * rows' block scores (probs: mode 0, into pbuf as dec_select's first kernel
 * writes them) on mma.sync, one CTA per (row, KV head, split) with the
 * group's G <= 16 heads as the 16 MMA rows (sp.hc = 16), f16 / bf16, padded
 * dims dqkp / dvp of tc_dims (32/32, 64/64, 128/128, 192/128). K/V caches
 * must be loadable with 16-byte copies (dec_rows16). A launch runs one
 * branch (DecBranch), or the compressed branch with the window beside it
 * (their splits in one grid, each with its own counters and partial
 * states). The attention's partial states go to a.part; the last CTA of a
 * (row, KV head) to arrive (counted in t.cnt) merges them in split order
 * into a.o / a.lse, so no merge kernel runs, and then, as DecTail asks:
 *   rank (compressed branch, t.scores set): every split also stored its
 *     q.k products, so the last CTA forms p_cmp's group sums (pbuf), the
 *     block scores (rows) and the top-n (idx) of the row: no second pass
 *     over the compressed keys, no select kernel;
 *   combine (the step's last branch, or both branches of a launch):
 *     o = sum_b gate_b o_b of its heads, as dec_combine computes it (the
 *     earlier launches' o_b are complete; of a launch's two branches, the
 *     second last CTA to arrive, counted in t.bdone, combines).
 * probs (the block scores alone, when the plan has no room for t.scores)
 * reads t.lse_cmp and writes t.pbuf; dec_rank ranks them. */
struct DecTail {
    int *cnt;            /* [MT x Hkv] arrival counters, zero between steps (each last CTA resets its own) */
    float *scores;       /* rank: f32 [MT x Hkv][max_nc][G] q.k of the compressed keys, or NULL: no ranking */
    float *pbuf, *rows;  /* f32 [MT x Hkv][max_nc] group sums, [MT x Hkv][max_ns] block scores */
    int64_t max_nc;
    int *idx;            /* rank: the selected blocks, strides ist / ish */
    int64_t ist, ish;
    const float *lse_cmp; /* probs: the compressed branch's LSE (natural log) */
    int64_t lst, lsh;
    bool rank_wide;       /* rank: the last CTA merges only; dec_rank_wide ranks after the launch */
    bool combine;
    int nbranch;          /* combine: branches of the launch that must complete first (1 or 2) */
    int *bdone;           /* combine with nbranch 2: [MT x Hkv] counters, zero between steps */
    DecIn gate[3], ob[3]; /* combine: f32 gates and branch outputs (ob[b].p NULL: branch b absent) */
    void *o;              /* combine: the step's output (cfg dtype) */
    int64_t ost, osh;
};
/* one branch of an attention launch */
struct DecBranch {
    int mode; /* 0 compressed, 1 selected, 2 window */
    DecSplit sp;
    DecAttnIn a;
    DecTail t;
};
bool dec_attn_sm80_takes(int dtype, int64_t G, int dqkp, int dvp);
/* sets the kernels' shared-memory opt-in for a plan's dtype and dims (plan time: a step may be captured) */
cudaError_t dec_attn_sm80_prepare(int dtype, int dqkp, int dvp);
size_t dec_attn_sm80_smem(int dqkp, int dvp, bool probs);
/* CTAs of the attention kernel resident per SM (after dec_attn_sm80_prepare) */
cudaError_t dec_attn_sm80_ctas_per_sm(int dtype, int dqkp, int dvp, int *ctas);
/* the largest split count the attention's merge takes (its split factors live in shared memory) */
constexpr int DEC_SM80_MAX_SPLITS = 256;
/* b0 alone (probs: b0 mode 0, its block scores), or b0 (mode 0) with b1 (mode 2, its own t.cnt and
 * a.part) beside it */
cudaError_t dec_attn_sm80(const DecGeom &g, bool probs, int dqkp, int dvp, const DecBranch &b0, const DecBranch *b1,
                          cudaStream_t s);
/* may a cache's rows be copied 16 bytes at a time (16-bit dtype)? */
bool dec_rows16(const DecCache &c, int64_t D);
/* The ranking of decode_sm80_wide, after a compressed launch whose last CTAs merged only
 * (t.rank_wide): grid (rows, Hkv, parts), each CTA forms p_cmp's group sums from the kept
 * q.k products and the merged LSE for one part of the row's selection blocks and their block
 * scores (rows), exactly as dec_tail does; the last of a (row, KV head)'s parts to arrive
 * (counted in cnt, reset by it) ranks the row (warp_select_row). Spread so that batch 1 does
 * not wait on one CTA per KV head forming 16 x nc exponentials and ranking alone. */
struct DecRankWide {
    const float *scores; /* f32 [MT x Hkv][max_nc][G] */
    int64_t max_nc;
    const float *lse_cmp; /* the compressed branch's LSE (natural log), strides lst / lsh */
    int64_t lst, lsh;
    float *rows;          /* f32 [MT x Hkv][max_ns] block scores */
    int *cnt;             /* [MT x Hkv] arrival counters, zero between steps */
    int *idx;             /* the selected blocks, strides ist / ish */
    int64_t ist, ish;
    int parts;
};
cudaError_t dec_rank_wide(const DecGeom &g, const DecRankWide &w, cudaStream_t s);
/* The parts of dec_rank_wide for a plan: about one wave of CTAs over rows x Hkv (MT the plan's
 * rows), at least enough that a part's compressed rows fit its shared memory; 0 where a wave is
 * already full (the last CTAs rank: decode_sm80), unless force (then at least 2) */
int dec_rank_wide_parts(int64_t MT, int64_t Hkv, int64_t max_ns, int64_t l, int64_t d, int64_t ls, int sms, bool force);

/* the ranking half of dec_select (pbuf already written) */
cudaError_t dec_rank(const DecGeom &g, const float *pbuf, int64_t max_nc, float *rows, int *idx, int64_t ist,
                     int64_t ish, cudaStream_t s);

#ifdef NSA_DEC_TRACE
/* dev aid: prints and clears the attention kernels' phase records (decode_attn_sm80.cu) */
void dec_attn_sm80_trace_dump();
#endif

/* o = sum_b gate_b o_b over the step's rows (fixed order, f32, rounded once). */
cudaError_t dec_combine(const DecGeom &g, const DecIn gate[3], const DecIn ob[3], void *o, int64_t ost, int64_t osh,
                        cudaStream_t s);

} // namespace nsa_cuda

#endif
