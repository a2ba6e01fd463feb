/*
 * test_cuda_choose.cc -- the CUDA backend's kernel chooser (backends/cuda/
 * choose.h) on every device class, without a GPU: the chooser is plain C++
 * and decides from the class's published limits and the plan's shape.
 *
 * Checks:
 *   1. Every class runs a tensor-core kernel in every stage (forward and
 *      backward) for f16 and bf16
 *      at the shapes the parity corpus and the benchmarks use (padded Dqk
 *      32 / 64 / 128 / 192, Dv 32 / 64 / 128, G = 1 .. 16, T up to 64k), and
 *      the tile each picks fits the class's shared memory (tiles.h formulas,
 *      the same the launchers use).
 *   2. f32 runs the reference kernels, on every class.
 *   3. The kernels each class runs at the paper's shape (the choices the
 *      measurements in docs/cuda-results.md are for).
 *   4. Only sm90 runs the sm90 kernels; G = 16 kernels only at G = 16.
 *   5. NSA_CUDA_TARGET and NSA_CUDA_FORCE parsing, good and bad values, and a
 *      forced kernel that cannot take a shape fails the plan with a message.
 *   6. The backward's chunk bounds (bwd_slc_chunks): the planned grid and
 *      scratch hold every chunk for adversarial selection counts.
 * Exit status 0 pass, 1 fail.
 */
#include <stdio.h>

#include <algorithm>
#include <vector>
#include <string.h>

#include <initializer_list>

#include "choose.h"

using namespace nsa_cuda;

static int failures = 0;

#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            failures++;                                                                                        \
            if (failures <= 40) {                                                                              \
                printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                    \
                printf(__VA_ARGS__);                                                                           \
                printf("\n");                                                                                  \
            }                                                                                                  \
        }                                                                                                      \
    } while (0)

static nsa_config config(int64_t hq, int64_t hkv, int64_t dqk, int64_t dv, nsa_dtype dt)
{
    nsa_config c;
    memset(&c, 0, sizeof c);
    c.num_q_heads = hq;
    c.num_kv_heads = hkv;
    c.head_dim_qk = dqk;
    c.head_dim_v = dv;
    c.cmp_block = 32;
    c.cmp_stride = 16;
    c.slc_block = 64;
    c.num_selected = 16;
    c.num_init = 1;
    c.num_local = 2;
    c.window = 512;
    c.scale = 0.f;
    c.compress = NSA_COMPRESS_MEAN;
    c.dtype = dt;
    return c;
}

static const Cls classes[] = {CLS_SM80, CLS_SM86, CLS_SM90};
static const nsa_stage attn_stages[] = {NSA_STAGE_CMP_ATTN,     NSA_STAGE_SCORES_TOPN,  NSA_STAGE_SLC_ATTN,
                                        NSA_STAGE_WIN_ATTN,     NSA_STAGE_BWD_CMP_ATTN, NSA_STAGE_BWD_SLC_ATTN,
                                        NSA_STAGE_BWD_WIN_ATTN};

static bool is_ref(Kern k) { return k == K_ATTN_REF || k == K_SCORES_REF || k == K_BWD_ATTN_REF; }

/* the bytes of dynamic shared memory the stage's kernel asks for (rows: max_ns) */
static size_t smem_of(const StageChoice &c, const Choice &ch, const nsa_config &cfg, int64_t max_ns)
{
    const int64_t G = cfg.num_q_heads / cfg.num_kv_heads;
    const int qt = c.k == K_SCORES_SM80_KQ || c.k == K_SCORES_SM80_G16 ? scores_kq_tokens(G) : tile_tokens(G);
    const size_t rows = c.scores.ring ? scores_kq_ring_smem(qt, scores_kq_ring(c.scores.bn, cfg.cmp_block, cfg.cmp_stride,
                                                                               cfg.slc_block),
                                                            cfg.num_selected)
                        : c.rows_smem ? scores_rows_smem(qt, max_ns)
                                      : 0;
    switch (c.k) {
    case K_ATTN_SM80: return attn_sm80_smem(ch.dqkp, ch.dvp, c.attn.bn);
    case K_ATTN_SM90: return attn_sm90_smem(ch.dqkp, ch.dvp, c.attn.bn);
    case K_SCORES_SM80: return scores_sm80_smem(ch.dqkp, c.scores.bn) + rows;
    case K_SCORES_SM80_G16: return scores_sm80_g16_smem(ch.dqkp, c.scores.bn, c.scores.nb, rows);
    case K_SCORES_SM80_KQ: return scores_sm80_kq_smem(ch.dqkp, c.scores.bn, c.scores.nb, scores_kq_gp(G), rows);
    case K_SCORES_SM90_G16: return scores_sm90_g16_smem(ch.dqkp, c.scores.nb) + rows;
    case K_SLC_SM80: return slc_sm80_smem(ch.dqkp, ch.dvp, cfg.num_selected, cfg.slc_block);
    case K_SLC_SM80_G16: return slc_sm80_g16_smem(ch.dqkp, ch.dvp, c.slc.panel, c.slc.ns);
    case K_SLC_SM80_BLK: return slc_sm80_blk_smem(ch.dqkp, ch.dvp);
    case K_SLC_SM90_BLK: return slc_sm90_blk_smem(ch.dqkp, ch.dvp);
    case K_BWD_ATTN_SM80: return bwd_sm80_smem(ch.dqkp, ch.dvp);
    case K_BWD_ATTN_SM90:
        return std::max({bwd_keys90_smem(ch.dqkp, ch.dvp), bwd_rows90_smem(ch.dqkp, ch.dvp), bwd_sm80_smem(ch.dqkp, ch.dvp)});
    default: return 0;
    }
}

static void check_every_class_has_tc()
{
    const Force none = {};
    const int64_t dims[][2] = {{16, 16}, {32, 32}, {64, 64}, {128, 128}, {96, 64}, {160, 128}, {192, 128}, {128, 64}};
    const int64_t groups[] = {1, 2, 3, 4, 7, 8, 12, 16};
    const int64_t max_ns[] = {1, 128, 1024};
    int cases = 0;
    for (Cls cls : classes) {
        const Limits lim = class_limits(cls);
        for (auto &d : dims)
            for (int64_t G : groups)
                for (nsa_dtype dt : {NSA_DTYPE_F16, NSA_DTYPE_BF16})
                    for (int64_t ns : max_ns) {
                        const nsa_config cfg = config(4 * G, 4, d[0], d[1], dt);
                        Choice ch;
                        char msg[256] = "";
                        const nsa_status s = choose(lim, cfg, ns, none, &ch, msg, sizeof msg);
                        CHECK(s == NSA_SUCCESS, "choose failed: %s", msg);
                        cases++;
                        for (nsa_stage st : attn_stages) {
                            const StageChoice &c = ch.st[st];
                            CHECK(!is_ref(c.k) && c.k != K_NONE,
                                  "class %s, Dqk %lld Dv %lld G %lld %s max_ns %lld: stage %s runs %s",
                                  class_name(cls), (long long)d[0], (long long)d[1], (long long)G,
                                  dt == NSA_DTYPE_F16 ? "f16" : "bf16", (long long)ns, nsa_stage_name(st),
                                  kern_name(c.k));
                            const size_t need = smem_of(c, ch, cfg, ns);
                            CHECK((int64_t)need <= lim.smem_block - SMEM_STATIC_MARGIN,
                                  "class %s: %s asks for %zu bytes, more than %lld", class_name(cls), kern_name(c.k),
                                  need, (long long)(lim.smem_block - SMEM_STATIC_MARGIN));
                            CHECK((c.k != K_ATTN_SM90 && c.k != K_SCORES_SM90_G16) || cls == CLS_SM90,
                                  "class %s runs %s", class_name(cls), kern_name(c.k));
                            CHECK((c.k != K_SCORES_SM80_G16 && c.k != K_SCORES_SM90_G16 && c.k != K_SLC_SM80_G16) ||
                                      G == 16,
                                  "G = %lld runs %s", (long long)G, kern_name(c.k));
                        }
                        CHECK(ch.st[NSA_STAGE_COMBINE].k == K_COMBINE_IN_WIN, "class %s: combine runs %s",
                              class_name(cls), kern_name(ch.st[NSA_STAGE_COMBINE].k));
                        CHECK(offers_win_combine(lim, cfg, none) &&
                                  ch.st[NSA_STAGE_WIN_COMBINE].k == ch.st[NSA_STAGE_WIN_ATTN].k,
                              "class %s: the fused win_combine stage is not offered or runs %s", class_name(cls),
                              kern_name(ch.st[NSA_STAGE_WIN_COMBINE].k));
                        CHECK(ch.st[NSA_STAGE_BLOCK_SCORES].k == ch.st[NSA_STAGE_SCORES_TOPN].k,
                              "the two scores stages disagree");
                        /* SLC_COMBINE: the selected kernel runs it; auto declines slc_sm80_g16 only */
                        const bool g16 = ch.st[NSA_STAGE_SLC_ATTN].k == K_SLC_SM80_G16;
                        CHECK(ch.st[NSA_STAGE_SLC_COMBINE].k == ch.st[NSA_STAGE_SLC_ATTN].k,
                              "class %s: slc_combine runs %s", class_name(cls),
                              kern_name(ch.st[NSA_STAGE_SLC_COMBINE].k));
                        CHECK(offers_slc_combine(lim, cfg, none, -1) == !g16 && offers_slc_combine(lim, cfg, none, 1) &&
                                  !offers_slc_combine(lim, cfg, none, 0),
                              "class %s, G %lld (%s): slc_combine offered wrongly", class_name(cls), (long long)G,
                              kern_name(ch.st[NSA_STAGE_SLC_ATTN].k));
                        CHECK(offers_scores_topn(lim, cfg, none), "class %s: no fused scores + top-n",
                              class_name(cls));
                        CHECK(ch.tiles && ch.kc16, "class %s: no tile list or packed rows for tensor-core kernels",
                              class_name(cls));
                    }
    }
    printf("every class, tensor cores in every stage: %d shapes x classes\n", cases);
}

static void check_f32_reference()
{
    const Force none = {};
    for (Cls cls : classes) {
        Choice ch;
        char msg[256];
        const nsa_config cfg = config(64, 4, 128, 128, NSA_DTYPE_F32);
        CHECK(choose(class_limits(cls), cfg, 1024, none, &ch, msg, sizeof msg) == NSA_SUCCESS, "%s", msg);
        CHECK(ch.st[NSA_STAGE_CMP_ATTN].k == K_ATTN_REF && ch.st[NSA_STAGE_SLC_ATTN].k == K_ATTN_REF &&
                  ch.st[NSA_STAGE_WIN_ATTN].k == K_ATTN_REF && ch.st[NSA_STAGE_BLOCK_SCORES].k == K_SCORES_REF &&
                  ch.st[NSA_STAGE_COMBINE].k == K_COMBINE && ch.st[NSA_STAGE_BWD_CMP_ATTN].k == K_BWD_ATTN_REF &&
                  ch.st[NSA_STAGE_BWD_SLC_ATTN].k == K_BWD_ATTN_REF && ch.st[NSA_STAGE_BWD_WIN_ATTN].k == K_BWD_ATTN_REF,
              "class %s, f32: a tensor-core kernel was chosen", class_name(cls));
        CHECK(!offers_scores_topn(class_limits(cls), cfg, none), "f32 offers the fused stage");
        CHECK(!offers_win_combine(class_limits(cls), cfg, none), "f32 offers win_combine");
        CHECK(offers_slc_combine(class_limits(cls), cfg, none, -1), "f32 (the reference) does not offer slc_combine");
        nsa_config off = cfg;
        off.num_selected = 0;
        CHECK(!offers_slc_combine(class_limits(cls), off, none, 1), "slc_combine offered with the branch off");
        CHECK(!ch.tiles && !ch.kc16, "f32 plans a tile list or packed rows");
        /* heads wider than 256: reference too */
        const nsa_config wide = config(16, 4, 320, 128, NSA_DTYPE_BF16);
        CHECK(choose(class_limits(cls), wide, 1024, none, &ch, msg, sizeof msg) == NSA_SUCCESS, "%s", msg);
        CHECK(ch.st[NSA_STAGE_CMP_ATTN].k == K_ATTN_REF && ch.st[NSA_STAGE_SLC_ATTN].k == K_ATTN_REF &&
                  ch.st[NSA_STAGE_BWD_SLC_ATTN].k == K_BWD_ATTN_REF,
              "Dqk 320 runs a tensor-core kernel");
    }
}

static void expect(Cls cls, const nsa_config &cfg, int64_t max_ns, nsa_stage st, const char *want)
{
    const Force none = {};
    Choice ch;
    char msg[256], got[128];
    CHECK(choose(class_limits(cls), cfg, max_ns, none, &ch, msg, sizeof msg) == NSA_SUCCESS, "%s", msg);
    describe(ch.st[st], st, got, sizeof got);
    CHECK(strcmp(got, want) == 0, "class %s, Dqk %lld, stage %s: %s, expected %s", class_name(cls),
          (long long)cfg.head_dim_qk, nsa_stage_name(st), got, want);
}

static void check_paper_shape()
{
    /* T = 65536: 1024 selection blocks */
    const nsa_config d128 = config(64, 4, 128, 128, NSA_DTYPE_BF16), d192 = config(64, 4, 192, 128, NSA_DTYPE_BF16);
    expect(CLS_SM90, d128, 1024, NSA_STAGE_CMP_ATTN, "attn_sm90[bn128,1cta,tma]");
    expect(CLS_SM90, d128, 1024, NSA_STAGE_SCORES_TOPN, "scores_sm90_g16[bn64,2buf,rows:smem]+topn:fused");
    expect(CLS_SM90, d192, 1024, NSA_STAGE_SCORES_TOPN, "scores_sm90_g16[bn64,1buf,rows:smem]+topn:fused");
    expect(CLS_SM90, d128, 1024, NSA_STAGE_SLC_ATTN, "slc_sm80_g16[panels,3buf]");
    expect(CLS_SM90, d192, 1024, NSA_STAGE_SLC_ATTN, "slc_sm80_g16[panels,2buf]"); /* three: 240 KB */
    expect(CLS_SM90, d128, 1024, NSA_STAGE_WIN_ATTN, "attn_sm90[bn64,2cta,tma]");
    expect(CLS_SM90, d192, 1024, NSA_STAGE_WIN_ATTN, "attn_sm90[bn32,2cta,tma]");
    expect(CLS_SM90, d128, 1024, NSA_STAGE_COMBINE, "combine_in_win");
    expect(CLS_SM90, d128, 1024, NSA_STAGE_BWD_CMP_ATTN, "bwd_attn_sm90[rows64,bn32,keys64:wgmma]");
    expect(CLS_SM90, d192, 1024, NSA_STAGE_BWD_WIN_ATTN, "bwd_attn_sm90[rows64,bn32,keys64:wgmma]");
    expect(CLS_SM90, d128, 1024, NSA_STAGE_BWD_SLC_ATTN, "bwd_attn_sm80[rows16,bn16,keys64x32]");
    expect(CLS_SM80, d128, 1024, NSA_STAGE_BWD_CMP_ATTN, "bwd_attn_sm80[rows64,bn32,keys64x32]");
    expect(CLS_SM86, d192, 1024, NSA_STAGE_BWD_SLC_ATTN, "bwd_attn_sm80[rows16,bn16,keys64x32]");
    expect(CLS_SM80, d128, 1024, NSA_STAGE_CMP_ATTN, "attn_sm80[bn32,2cta,r32]");
    expect(CLS_SM80, d192, 1024, NSA_STAGE_CMP_ATTN, "attn_sm80[bn16,2cta,r32]"); /* bn32: 92 KB, one CTA */
    /* Q in registers, the K tiles in its place: two CTAs of 66 KB (D 128) / 57 KB (Dqk 192) */
    expect(CLS_SM80, d128, 1024, NSA_STAGE_SCORES_TOPN, "scores_sm80_g16[bn64,2buf,rows:smem]+topn:fused");
    expect(CLS_SM80, d192, 1024, NSA_STAGE_SCORES_TOPN, "scores_sm80_g16[bn32,2buf,rows:smem]+topn:fused");
    expect(CLS_SM80, d128, 1024, NSA_STAGE_SLC_ATTN, "slc_sm80_g16[panels,2buf]"); /* three: 192 KB */
    expect(CLS_SM80, d128, 1024, NSA_STAGE_WIN_ATTN, "attn_sm80[bn32,2cta]");
    expect(CLS_SM80, d192, 1024, NSA_STAGE_WIN_ATTN, "attn_sm80[bn16,2cta,r32]");
    expect(CLS_SM86, d128, 1024, NSA_STAGE_CMP_ATTN, "attn_sm80[bn32,2cta]"); /* r32: one CTA of 4 warps fits */
    expect(CLS_SM86, d192, 1024, NSA_STAGE_SLC_ATTN, "slc_sm80_g16[panels,1buf]"); /* two: 160 KB */
    expect(CLS_SM80, d192, 1024, NSA_STAGE_SLC_ATTN, "slc_sm80_g16[panels,1buf]"); /* two: 160 KB + static > 163 */
    expect(CLS_SM86, d128, 1024, NSA_STAGE_SLC_ATTN, "slc_sm80_g16[panels,1buf]");
    expect(CLS_SM86, d128, 1024, NSA_STAGE_SCORES_TOPN, "scores_sm80_g16[bn32,1buf,rows:smem]+topn:fused"); /* two CTAs */
    /* G = 4 (Llama-3-8B's 32 / 8) */
    const nsa_config g4 = config(32, 8, 128, 128, NSA_DTYPE_BF16);
    expect(CLS_SM90, g4, 1024, NSA_STAGE_SLC_ATTN, "slc_sm90_blk[rows64,bn64]");
    expect(CLS_SM80, g4, 1024, NSA_STAGE_SLC_ATTN, "slc_sm80_blk[rows64,bn64]");
    /* the selected rows kernel: 8 rows up to G = 8 (keys on the MMA's M side), 16 above */
    expect(CLS_SM90, g4, 1024, NSA_STAGE_BWD_SLC_ATTN, "bwd_attn_sm80[rows8,bn16,keys64x32]");
    expect(CLS_SM86, config(64, 8, 192, 128, NSA_DTYPE_BF16), 1024, NSA_STAGE_BWD_SLC_ATTN,
           "bwd_attn_sm80[rows8,bn16,keys64x32]");
    expect(CLS_SM80, config(36, 4, 128, 128, NSA_DTYPE_BF16), 1024, NSA_STAGE_BWD_SLC_ATTN,
           "bwd_attn_sm80[rows16,bn16,keys64x32]");
    /* the transposed kernel with 4 tokens per warp: 32 rows of 1024 blocks (128 KB) allow one CTA per SM, so the
     * rows go to the plan's buffer (two CTAs per SM, topn after), not into a ring; whole rows where two CTAs fit
     * with them (128 blocks) */
    expect(CLS_SM90, g4, 1024, NSA_STAGE_SCORES_TOPN, "scores_sm80_kq[bn64,2buf,rows:global]+topn");
    expect(CLS_SM80, g4, 1024, NSA_STAGE_SCORES_TOPN, "scores_sm80_kq[bn64,2buf,rows:global]+topn");
    expect(CLS_SM90, g4, 128, NSA_STAGE_SCORES_TOPN, "scores_sm80_kq[bn64,2buf,rows:smem]+topn:fused");
    /* G = 6 as 8, 2 tokens per warp: the ring (16 rows of 2048 blocks do not fit two CTAs) */
    expect(CLS_SM90, config(24, 4, 128, 128, NSA_DTYPE_BF16), 2048, NSA_STAGE_SCORES_TOPN,
           "scores_sm80_kq[bn64,2buf,rows:ring]+topn:fused");
    /* G = 7 as 8: 16 tokens' rows of 1024 blocks let two CTAs fit */
    expect(CLS_SM90, config(28, 4, 128, 128, NSA_DTYPE_BF16), 1024, NSA_STAGE_SCORES_TOPN,
           "scores_sm80_kq[bn64,2buf,rows:smem]+topn:fused");
    /* G = 1: 128 tokens' rows do not fit, and the ring does not pay at 16 tokens per warp */
    expect(CLS_SM90, config(4, 4, 128, 128, NSA_DTYPE_BF16), 1024, NSA_STAGE_SCORES_TOPN,
           "scores_sm80_kq[bn64,2buf,rows:global]+topn");
    /* n > 32 is past a warp's kept set: whole rows at G 6 (one CTA per SM), the plan's buffer at G 4 */
    nsa_config n48 = config(24, 4, 128, 128, NSA_DTYPE_BF16);
    n48.num_selected = 48;
    expect(CLS_SM90, n48, 2048, NSA_STAGE_SCORES_TOPN, "scores_sm80_kq[bn64,2buf,rows:smem]+topn:fused");
    n48 = g4;
    n48.num_selected = 48;
    expect(CLS_SM90, n48, 1024, NSA_STAGE_SCORES_TOPN, "scores_sm80_kq[bn64,2buf,rows:global]+topn");
    /* padded Dqk 256 is past the registers that hold Q: the general kernel */
    expect(CLS_SM90, config(32, 8, 256, 256, NSA_DTYPE_BF16), 128, NSA_STAGE_SCORES_TOPN,
           "scores_sm80[bn32,2buf,rows:smem]+topn:fused");
    /* its own tile list where G is not a power of two (G 7: 16 tokens of 8 rows, not 18 of 7) */
    for (int64_t G : {1, 2, 3, 4, 5, 7, 8, 12, 16}) {
        Choice ch;
        char msg[256];
        const nsa_config c = config(4 * G, 4, 128, 128, NSA_DTYPE_BF16);
        CHECK(choose(class_limits(CLS_SM90), c, 1024, Force{}, &ch, msg, sizeof msg) == NSA_SUCCESS, "%s", msg);
        const bool kq = ch.st[NSA_STAGE_SCORES_TOPN].k == K_SCORES_SM80_KQ;
        CHECK(kq == (G < 16), "G = %lld: scores run %s", (long long)G, kern_name(ch.st[NSA_STAGE_SCORES_TOPN].k));
        const int want = kq && (G & (G - 1)) ? TC_BM / scores_kq_gp(G) : 0;
        CHECK(ch.sc_tokens == want, "G = %lld: sc_tokens %d, expected %d", (long long)G, ch.sc_tokens, want);
    }
    /* block-major for every G but 16, on every class (wgmma on sm90), Dqk 192 too */
    for (Cls cls : classes)
        for (int64_t hq : {4, 8, 28, 32, 128}) {
            const nsa_config c = config(hq, 4, 192, 128, NSA_DTYPE_BF16);
            expect(cls, c, 1024, NSA_STAGE_SLC_ATTN,
                   cls == CLS_SM90 ? "slc_sm90_blk[rows64,bn64]" : "slc_sm80_blk[rows64,bn64]");
            Choice ch;
            char msg[256];
            CHECK(choose(class_limits(cls), c, 1024, Force{}, &ch, msg, sizeof msg) == NSA_SUCCESS && ch.slc_blk,
                  "slc_blk not set for G = %lld", (long long)(hq / 4));
        }
    /* G = 128 is past its 64 rows: slc_sm80 */
    expect(CLS_SM90, config(512, 4, 128, 128, NSA_DTYPE_BF16), 1024, NSA_STAGE_SLC_ATTN, "slc_sm80");
}

/* slc_sm80_blk's passes: partial states within the bound, at least one token,
 * never more than T, and a pass's map entries within its int32 lists. */
static void check_slc_passes()
{
    const int64_t Ts[] = {1, 17, 4096, 65536, 1048576, (int64_t)1 << 30};
    const int64_t hqs[] = {1, 4, 32, 64, 512};
    const int64_t ns[] = {1, 16, 64};
    const int dvps[] = {32, 128};
    const int64_t maxes[] = {1, 4096, SBK_PASS_BYTES, (int64_t)1 << 50}; /* the last: NSA_CUDA_SLC_PASS_MAX huge */
    int cases = 0;
    for (int64_t T : Ts)
        for (int64_t hq : hqs)
            for (int64_t n : ns)
                for (int dvp : dvps)
                    for (int64_t mx : maxes) {
                        const int64_t tc = slc_sm80_blk_pass_tokens(T, hq, n, dvp, mx);
                        const int64_t per = hq * n * (2 * (int64_t)dvp + 8); /* o_s / l_s 16-bit, m and l fp32 */
                        CHECK(tc >= 1 && tc <= T, "T %lld: pass of %lld tokens", (long long)T, (long long)tc);
                        CHECK(tc == 1 || tc * per <= mx, "pass of %lld tokens x %lld bytes > %lld", (long long)tc,
                              (long long)per, (long long)mx);
                        const bool ent_full = (tc + 1) * hq * n > ((int64_t)1 << 31) - 1;
                        CHECK(tc == T || (tc + 1) * per > mx || ent_full, "pass of %lld tokens could hold more",
                              (long long)tc);
                        CHECK(tc == 1 || tc * hq * n <= ((int64_t)1 << 31) - 1,
                              "pass of %lld tokens: %lld map entries", (long long)tc, (long long)(tc * hq * n));
                        cases++;
                    }
    printf("slc_sm80_blk passes: %d cases\n", cases);
}

static void check_parsing()
{
    Force f;
    char msg[512];
    CHECK(parse_force(nullptr, &f, msg, sizeof msg), "NULL");
    CHECK(parse_force("", &f, msg, sizeof msg), "empty");
    CHECK(parse_force("ref", &f, msg, sizeof msg) && f.k[NSA_STAGE_CMP_ATTN] == K_ATTN_REF &&
              f.k[NSA_STAGE_SCORES_TOPN] == K_SCORES_REF && f.k[NSA_STAGE_COMBINE] == K_COMBINE,
          "ref");
    CHECK(parse_force("slc_attn:slc_sm80,block_scores:ref", &f, msg, sizeof msg) &&
              f.k[NSA_STAGE_SLC_ATTN] == K_SLC_SM80 && f.k[NSA_STAGE_BLOCK_SCORES] == K_SCORES_REF &&
              f.k[NSA_STAGE_SCORES_TOPN] == K_SCORES_REF && f.k[NSA_STAGE_CMP_ATTN] == K_NONE,
          "stage:kernel list: %s", msg);
    CHECK(!parse_force("slc_attn:attn_sm90", &f, msg, sizeof msg) && strstr(msg, "not a kernel of stage slc_attn"),
          "a kernel of another stage: %s", msg);
    CHECK(parse_force("decode_attn:decode_sm80_probs", &f, msg, sizeof msg) &&
              f.k[NSA_STAGE_DECODE_ATTN] == K_DECODE_SM80_PROBS && f.k[NSA_STAGE_SLC_ATTN] == K_NONE,
          "decode_attn: %s", msg);
    CHECK(parse_force("decode_attn:decode_sm80_wide", &f, msg, sizeof msg) &&
              f.k[NSA_STAGE_DECODE_ATTN] == K_DECODE_SM80_WIDE,
          "decode_attn wide: %s", msg);
    CHECK(parse_force("ref", &f, msg, sizeof msg) && f.k[NSA_STAGE_DECODE_ATTN] == K_DECODE_SPLIT, "ref decodes: %s",
          msg);
    CHECK(parse_force("ref", &f, msg, sizeof msg) && f.k[NSA_STAGE_DECODE_APPEND] == K_DECODE_APPEND,
          "ref keeps the two check kernels: %s", msg);
    CHECK(parse_force("decode_append:decode_append_one", &f, msg, sizeof msg) &&
              f.k[NSA_STAGE_DECODE_APPEND] == K_DECODE_APPEND_ONE && f.k[NSA_STAGE_DECODE_ATTN] == K_NONE,
          "decode_append: %s", msg);
    CHECK(!parse_force("decode_append:decode_sm80", &f, msg, sizeof msg) &&
              strstr(msg, "decode_append, decode_append_one"),
          "decode_append's kernels named: %s", msg);
    CHECK(!parse_force("decode_attn:attn_sm80", &f, msg, sizeof msg) &&
              strstr(msg, "decode_split, decode_sm80, decode_sm80_wide, decode_sm80_probs"),
          "decode_attn's kernels named: %s", msg);
    CHECK(!parse_force("bogus:ref", &f, msg, sizeof msg) && strstr(msg, "not a stage"), "unknown stage: %s", msg);
    CHECK(!parse_force("attn_sm90", &f, msg, sizeof msg) && strstr(msg, "stage:kernel"), "no colon: %s", msg);

    Cls c;
    CHECK(parse_target("sm80", CLS_SM90, &c, msg, sizeof msg) && c == CLS_SM80, "sm80 on sm90");
    CHECK(parse_target("sm89", CLS_SM90, &c, msg, sizeof msg) && c == CLS_SM86, "sm89 on sm90");
    CHECK(parse_target("sm90", CLS_SM90, &c, msg, sizeof msg) && c == CLS_SM90, "sm90 on sm90");
    CHECK(!parse_target("sm90", CLS_SM80, &c, msg, sizeof msg) && strstr(msg, "cannot run as sm90"),
          "sm90 on sm80: %s", msg);
    CHECK(!parse_target("sm80", CLS_SM86, &c, msg, sizeof msg), "sm80 on sm86");
    CHECK(!parse_target("a100", CLS_SM90, &c, msg, sizeof msg) && strstr(msg, "not a device class"), "a100: %s", msg);

    CHECK(device_class(9, 0, 232448, true) == CLS_SM90, "H100");
    CHECK(device_class(9, 0, 232448, false) == CLS_SM80, "sm_90 without sm_90a code");
    CHECK(device_class(8, 0, 166912, false) == CLS_SM80, "A100");
    CHECK(device_class(8, 6, 101376, false) == CLS_SM86, "sm_86");
    CHECK(device_class(8, 9, 101376, false) == CLS_SM86, "sm_89");

    /* a forced kernel that does not take the shape fails the plan */
    const nsa_config g4 = config(16, 4, 128, 128, NSA_DTYPE_BF16);
    Choice ch;
    CHECK(parse_force("slc_attn:slc_sm80_g16", &f, msg, sizeof msg), "parse");
    CHECK(choose(class_limits(CLS_SM90), g4, 64, f, &ch, msg, sizeof msg) == NSA_ERR_UNSUPPORTED &&
              strstr(msg, "slc_sm80_g16") && strstr(msg, "G = 16"),
          "forced slc_sm80_g16 at G = 4: %s", msg);
    CHECK(parse_force("cmp_attn:attn_sm90", &f, msg, sizeof msg), "parse");
    CHECK(choose(class_limits(CLS_SM80), g4, 64, f, &ch, msg, sizeof msg) == NSA_ERR_UNSUPPORTED &&
              strstr(msg, "sm90"),
          "forced attn_sm90 on sm80: %s", msg);
    CHECK(parse_force("bwd_slc_attn:bwd_attn_sm90", &f, msg, sizeof msg), "parse");
    CHECK(choose(class_limits(CLS_SM90), g4, 64, f, &ch, msg, sizeof msg) == NSA_ERR_UNSUPPORTED &&
              strstr(msg, "bwd_attn_sm90") && strstr(msg, "compressed and window"),
          "forced bwd_attn_sm90 on the selected branch: %s", msg);
    CHECK(parse_force("bwd_cmp_attn:bwd_attn_sm90", &f, msg, sizeof msg), "parse");
    CHECK(choose(class_limits(CLS_SM80), g4, 64, f, &ch, msg, sizeof msg) == NSA_ERR_UNSUPPORTED &&
              strstr(msg, "sm90"),
          "forced bwd_attn_sm90 on sm80: %s", msg);
    CHECK(choose(class_limits(CLS_SM90), config(16, 4, 32, 32, NSA_DTYPE_BF16), 64, f, &ch, msg, sizeof msg) ==
                  NSA_ERR_UNSUPPORTED,
          "forced bwd_attn_sm90 at D 32: %s", msg);
    CHECK(parse_force("bwd_cmp_attn:bwd_attn_sm80", &f, msg, sizeof msg), "parse");
    CHECK(choose(class_limits(CLS_SM90), g4, 64, f, &ch, msg, sizeof msg) == NSA_SUCCESS &&
              ch.st[NSA_STAGE_BWD_CMP_ATTN].k == K_BWD_ATTN_SM80 && ch.st[NSA_STAGE_BWD_WIN_ATTN].k == K_BWD_ATTN_SM90,
          "forced bwd_attn_sm80 on sm90: %s", msg);
    /* forcing the reference scores turns the fused stage off; forcing combine unfuses it */
    CHECK(parse_force("block_scores:ref,combine:combine", &f, msg, sizeof msg), "parse");
    CHECK(!offers_scores_topn(class_limits(CLS_SM90), g4, f), "fused stage with forced reference scores");
    CHECK(choose(class_limits(CLS_SM90), g4, 64, f, &ch, msg, sizeof msg) == NSA_SUCCESS &&
              ch.st[NSA_STAGE_COMBINE].k == K_COMBINE,
          "combine:combine: %s", msg);
    CHECK(!offers_win_combine(class_limits(CLS_SM90), g4, f) && offers_win_combine(class_limits(CLS_SM90), g4, {}),
          "combine:combine must turn win_combine off, and only it");
    CHECK(!offers_slc_combine(class_limits(CLS_SM90), g4, f, 1) && offers_slc_combine(class_limits(CLS_SM90), g4, {}, -1),
          "combine:combine must turn slc_combine off, even under NSA_CUDA_SLC_COMBINE=1");
    /* LINEAR compression wider than its kernel */
    nsa_config lin = config(16, 4, 2048, 128, NSA_DTYPE_F32);
    lin.compress = NSA_COMPRESS_LINEAR;
    const Force none = {};
    CHECK(choose(class_limits(CLS_SM90), lin, 64, none, &ch, msg, sizeof msg) == NSA_ERR_UNSUPPORTED &&
              strstr(msg, "1024"),
          "LINEAR at Dqk 2048: %s", msg);
}

/* The backward's selected chunks (tiles.h, bwd_slc_chunks): the grid and the
 * scratch slots the plan sizes from the entry count must hold every chunk the
 * device counts, whatever the inverse map's counts (the kernel counts
 * ceil(bwd_steps(cnt, G) / cs) per item, its whole block's readers for each of
 * the nsub sub-tiles): all readers in one block (the forced first block),
 * uniform, every block just past one chunk (the most scratch), random. */
static void check_bwd_chunk_bounds()
{
    struct Shape {
        int64_t entries, G, segments, nsub;
    };
    const Shape shapes[] = {{65536 * 4 * 16, 16, 4 * 1024, 1}, {65536 * 8 * 16, 4, 8 * 1024, 1},
                            {333 * 16, 16, 6, 1},          {1000 * 2 * 3, 1, 2 * 63, 2},
                            {524288 * 4 * 16, 16, 4 * 8192, 1}, {7, 3, 5, 3}};
    uint64_t rng = 12345;
    auto next = [&]() { return (rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
    int cases = 0;
    for (const Shape &sh : shapes) {
        const int64_t items = sh.segments * sh.nsub;
        const BwdSlcChunks ch = bwd_slc_chunks(sh.entries, sh.G, items, sh.nsub);
        CHECK(ch.cs >= BWD_CHUNK_MIN, "cs %lld below the minimum", (long long)ch.cs);
        for (int dist = 0; dist < 4; dist++) {
            std::vector<int64_t> cnt(sh.segments, 0);
            int64_t left = sh.entries;
            if (dist == 0) cnt[0] = left;
            if (dist == 1)
                for (int64_t i = 0; i < sh.segments; i++) cnt[i] = sh.entries / sh.segments;
            if (dist == 2) { /* each block one row past cs steps: two chunks each */
                const int64_t per = (ch.cs * BWD_KEYS_BM) / sh.G + 1;
                for (int64_t i = 0; i < sh.segments && left >= per; i++, left -= per) cnt[i] = per;
            }
            if (dist == 3)
                for (int64_t e = 0; e < std::min<int64_t>(sh.entries, 2000000); e++) cnt[next() % sh.segments]++;
            int64_t chunks = 0, slots = 0;
            for (int64_t i = 0; i < items; i++) {
                const int64_t n = (bwd_steps(cnt[i / sh.nsub], sh.G) + ch.cs - 1) / ch.cs;
                chunks += n;
                slots += n > 1 ? n : 0;
            }
            CHECK(chunks <= ch.grid, "entries %lld, distribution %d: %lld chunks but a grid of %lld",
                  (long long)sh.entries, dist, (long long)chunks, (long long)ch.grid);
            CHECK(slots <= ch.slots, "entries %lld, distribution %d: %lld scratch slots but %lld planned",
                  (long long)sh.entries, dist, (long long)slots, (long long)ch.slots);
            cases++;
        }
    }
    /* 64k, paper shape: the forced first block is split, the scratch stays near 134 MB at D 128 */
    const BwdSlcChunks p = bwd_slc_chunks(65536LL * 4 * 16, 16, 4 * 1024, 1);
    CHECK(bwd_steps(65536, 16) > p.cs && p.slots * BWD_KEYS_BN * 256 * 4 < ((int64_t)160 << 20),
          "64k: cs %lld, %lld slots", (long long)p.cs, (long long)p.slots);
    printf("backward chunk bounds: %d shapes x distributions\n", cases);
}

int main()
{
    check_every_class_has_tc();
    check_bwd_chunk_bounds();
    check_f32_reference();
    check_paper_shape();
    check_slc_passes();
    check_parsing();
    printf("%s: %d failure%s\n", failures ? "FAIL" : "PASS", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
