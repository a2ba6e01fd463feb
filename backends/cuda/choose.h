/*
 * choose.h -- the CUDA backend's kernel chooser: which kernel runs each
 * stage of a plan, picked once when the plan is prepared, from the device's
 * class and the plan's shape.
 *
 * Device classes (what the kernels can use):
 *   sm90  wgmma and the TMA (sm_90a code), 227 KB of shared memory per CTA:
 *         H100, H200, GH200.
 *   sm80  mma.sync and cp.async with 163 KB per CTA (164 per SM): A100, A30,
 *         Orin; also sm_90 when the module lacks sm_90a code, and sm_100.
 *   sm86  the same instructions with 99 KB per CTA (100 per SM): sm_86 and
 *         sm_89 (RTX 30xx / 40xx, A10, A40, L4, L40S), sm_120.
 * Every class has a tensor-core kernel for every stage at the shapes the
 * parity corpus and the benchmarks use (f16 / bf16, padded Dqk 32..192,
 * Dv <= 128, any G up to 128); the fp32 reference kernels run for f32
 * inputs, for heads wider than the tensor-core kernels take, and where no
 * tile fits the class's shared memory. docs/cuda.md describes the kernels.
 *
 * Plain C++ with no CUDA header, so that tests/test_cuda_choose.cc checks
 * the choices of every class on machines without a GPU.
 */
#ifndef NSA_BACKENDS_CUDA_CHOOSE_H
#define NSA_BACKENDS_CUDA_CHOOSE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "tiles.h"

namespace nsa_cuda {

enum Cls { CLS_SM80 = 0, CLS_SM86 = 1, CLS_SM90 = 2 };

/* What a class offers the kernels; the published limits of its devices. */
struct Limits {
    Cls cls;
    int64_t smem_block; /* opt-in shared memory one CTA may use (bytes) */
    int64_t smem_sm;    /* shared memory of one SM */
};
Limits class_limits(Cls cls);
const char *class_name(Cls cls); /* "sm90" */

/* The class of a device from its compute capability, its opt-in shared memory
 * per CTA and whether it runs the module's sm_90a code. */
Cls device_class(int major, int minor, int64_t smem_block, bool sm90a);

/* NSA_CUDA_TARGET: "sm80", "sm86" or "sm89" (the sm86 class) run a Hopper
 * GPU as that class (its kernels and its shared-memory limits), "sm90" is the
 * identity on sm_90 devices. Returns false with a message for an unknown
 * value or a class the device cannot stand in for. */
bool parse_target(const char *s, Cls device, Cls *out, char *msg, size_t msg_size);

/* The kernels, one name each (kern_name). */
enum Kern {
    K_NONE = 0,
    K_COMPRESS_MEAN,
    K_COMPRESS_LINEAR,
    K_COMPRESS_COPY,
    K_ATTN_REF,        /* one warp per (token, head), fp32, any dtype and head dim (all three branches) */
    K_ATTN_SM80,       /* compressed / window: mma.sync tiles of 128 rows */
    K_ATTN_SM90,       /* compressed / window: wgmma, K/V through the TMA */
    K_SCORES_REF,      /* one warp per (token, KV head), fp32 */
    K_SCORES_SM80,     /* any G <= 128 */
    K_SCORES_SM80_G16, /* G = 16 */
    K_SCORES_SM80_KQ,  /* G < 16: the G16 kernel with 16 / G tokens per warp (G padded to a power of two) */
    K_SCORES_SM90_G16, /* G = 16, S^T = K Q^T on wgmma */
    K_TOPN,
    K_SLC_SM80,     /* one token x 16 heads per CTA */
    K_SLC_SM80_G16, /* 8 tokens x 16 heads per CTA sharing block fetches */
    K_SLC_SM80_BLK, /* block-major: the rows that selected a block share its fetch, partial states merged */
    K_SLC_SM90_BLK, /* the same on wgmma (sm90) */
    K_COMBINE,
    K_COMBINE_IN_WIN, /* COMBINE done by the window kernel's epilogue */
    K_BWD_ATTN_REF,   /* backward of a branch: rows (dq) and keys (dk, dv) kernels, fp32 */
    K_BWD_ATTN_SM80,  /* the same two kernels on mma.sync (every class) */
    K_BWD_ATTN_SM90,  /* compressed / window: the rows and keys kernels on wgmma (sm90) */
    K_BWD_COMPRESS_MEAN,
    K_BWD_COMPRESS_LINEAR,
    K_BWD_STORE,
    K_DECODE_APPEND, /* decode: device checks (two kernels after a memset), append, compressed rows (decode.cu) */
    K_DECODE_APPEND_ONE, /* the same with the checks in one CTA that zeroes its memory (small batches and pools) */
    K_DECODE_SPLIT,  /* decode: the three branches split across CTAs, merged in split order (decode.cu, fp32) */
    K_DECODE_SM80,   /* decode: the same splits on mma.sync, merged by each (row, KV head)'s last CTA, which also
                        ranks (from the kept q.k) and combines (decode_attn_sm80.cu) */
    K_DECODE_SM80_WIDE,  /* decode_sm80 whose last CTAs merge only; dec_rank_wide's CTAs (parts of each row's
                            selection blocks) form the block scores and rank (batches that leave SMs idle) */
    K_DECODE_SM80_PROBS, /* decode_sm80 with the block scores from a second pass over the compressed keys */
    K_COUNT
};
const char *kern_name(Kern k);

/* NSA_CUDA_FORCE: a comma list of "ref" (every stage on its reference kernel)
 * and "stage:kernel" items (stage: cmp_attn, block_scores (also the fused
 * scores_topn), select_topn, slc_attn, win_attn, combine, the backward's
 * bwd_*_attn, decode_append, decode_attn; kernel: a name of kern_name or "ref"). For bisecting and comparing; a forced kernel that does
 * not take a plan's shape makes the plan fail with a message. */
struct Force {
    Kern k[NSA_STAGE_COUNT]; /* K_NONE: not forced */
};
bool parse_force(const char *s, Force *f, char *msg, size_t msg_size);

/* The choice of one stage: its kernel, tile and where its rows live. */
struct StageChoice {
    Kern k;
    AttnTile attn;     /* K_ATTN_SM80 / K_ATTN_SM90 */
    ScoresTile scores; /* K_SCORES_SM80* / K_SCORES_SM90_G16 */
    SlcTile slc;       /* K_SLC_SM80_G16 */
    bool rows_smem;    /* scores: the CTA's score rows in shared memory (then the ranking can follow in-kernel) */
    int bwd_rows;      /* K_BWD_ATTN_SM80 on BWD_SLC_ATTN: the selected rows kernel's rows per warp (bwd_slc_rows) */
};

/* Everything chosen for a plan. */
struct Choice {
    StageChoice st[NSA_STAGE_COUNT]; /* by nsa_stage; SCORES_TOPN and BLOCK_SCORES hold the same scores kernel */
    int dqkp, dvp;   /* padded head dims of the tensor-core kernels (0: none) */
    Kern slc_unaligned; /* selected branch where slc_sm80_g16 cannot load K/V (rows not 16-byte aligned) */
    bool slc_blk;       /* SLC_ATTN runs slc_sm80_blk or slc_sm90_blk (inverse map, partial states in plan memory) */
    bool fused_topn; /* SCORES_TOPN ranks inside the scores kernel; else the backend's own scores rows + topn */
    bool tiles;      /* some kernel walks the plan's tile list */
    bool kc16;       /* some kernel reads the packed 16-bit compressed rows */
    bool bwd_tiles;  /* a backward stage runs bwd_attn_sm80 or bwd_attn_sm90 (their work lists) */
    int sc_tokens;   /* the scores kernel's tokens per tile where they differ from tile_tokens(G)
                        (scores_sm80_kq at a G that is not a power of two: its own tile list); else 0 */
};

/* Chooses every stage for a config and the plan's longest sequence's number
 * of selection blocks (max_ns). Returns NSA_SUCCESS, or NSA_ERR_UNSUPPORTED
 * with a message in msg (a forced kernel that does not take the shape, a
 * LINEAR compression wider than its kernel). */
nsa_status choose(const Limits &lim, const nsa_config &cfg, int64_t max_ns, const Force &force, Choice *out,
                  char *msg, size_t msg_size);

/* Will SCORES_TOPN be offered for this config (a tensor-core scores kernel is chosen)? */
bool offers_scores_topn(const Limits &lim, const nsa_config &cfg, const Force &force);
/* Would a plan for cfg fold COMBINE into the window kernel (combine_in_win)? Then the
 * core's fused WIN_COMBINE stage runs that kernel, and the workspace has no o_b[WIN]. */
bool offers_win_combine(const Limits &lim, const nsa_config &cfg, const Force &force);

/* Does the backend offer the core's SLC_COMBINE for cfg (the selected kernel adds its
 * term into o_cmp; no o_b[SLC] in the workspace)? Never with the selected branch off,
 * or where NSA_CUDA_FORCE puts COMBINE on the combine kernel (combine:combine, ref:
 * every branch's output stays in the workspace, the plain stages). mode is
 * NSA_CUDA_SLC_COMBINE: 0 never, 1 always, -1 (auto, the default) where the plan's
 * selected kernel is not slc_sm80_g16 (there the fused epilogue costs 12 % of the
 * forward at 64k; 1 trades that for T x Hq x Dv floats of workspace). */
bool offers_slc_combine(const Limits &lim, const nsa_config &cfg, const Force &force, int mode);

/* "attn_sm90 (128-key tiles, 1 CTA/SM)": the kernel and its tile, for plan info and the profile. */
void describe(const StageChoice &c, nsa_stage stage, char *buf, size_t size);

} // namespace nsa_cuda

#endif
