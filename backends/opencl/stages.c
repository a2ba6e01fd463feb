/*
 * stages.c: what each stage queues (kernels/opencl/<idea>.cl), work-group sizes chosen from
 * the device's limits, and the per-plan state.
 *
 * Work decomposition:
 *   COMPRESS      MEAN / EXTERNAL: element-wise kernels; LINEAR: compress_linear.c (CLBlast GEMMs)
 *                 where the module has CLBlast, else the compress_linear kernel
 *   CMP_ATTN      v1: one work-group per (t, h) (T * Hq groups, softmax.cl);
 *                 v2: one per (t, g), G heads sharing K/V tiles (T * Hkv, group_attn.cl);
 *                 v3: one per (64 / G consecutive tokens, g), 64 rows sharing 32-key
 *                 tiles, register-blocked (tile_attn.cl)
 *   BLOCK_SCORES  one work-group per (t, g) (T * Hkv groups); v1: lane per block j;
 *                 v2: rows scored once by all lanes, tiles in local memory
 *   SELECT_TOPN   one work-group per (t, g)
 *   SCORES_TOPN   (fused; the default where the v2 tile fits) one work-group per (t, g):
 *                 BLOCK_SCORES v2's chunks ranked as they are made, no scores row in the
 *                 workspace; NSA_OPENCL_NO_FUSED=1 refuses it (the plain stages run)
 *   SLC_ATTN      v1 or v2 as CMP_ATTN; v3: one 256-lane work-group per (t, g, 16 heads of
 *                 the group), the 16 rows sharing 64-key tiles, register-blocked (slc_tile.cl)
 *   WIN_ATTN      as CMP_ATTN (v1, v2 or v3)
 *   COMBINE       element-wise over T * Hq * Dv
 *   WIN_COMBINE   (fused; the default with the window branch on) WIN_ATTN and COMBINE over runs
 *                 of win_chunk tokens through a plan scratch, no o_win in the workspace
 *                 (win_combine_prepare); NSA_OPENCL_NO_FUSED=1 refuses it
 *   SLC_COMBINE   (fused; the default with the selected branch on) SLC_ATTN over the same runs
 *                 through the same scratch, each run's rows added into o_cmp by combine_partial
 *                 (COMBINE's first two terms), no o_slc in the workspace; NSA_OPENCL_NO_FUSED=1
 *                 refuses it
 *   DECODE_APPEND, DECODE_ATTN   the decode step: decode.c (decode.cl)
 * Version 3 is used where it fits (choose_v3; for SLC_ATTN choose_slc_v3, which also
 * wants G >= 8); else version 2 when its outputs fit the
 * registers (G * Dv <= 16 * its work-group size, 256 lanes) and a key tile fits the local
 * memory; NSA_OPENCL_KERNELS=v1 or v2 forces that version (v1 is the readable reference).
 * Launches are split into pieces of at most OCL_MAX_GROUPS_PER_LAUNCH groups; each
 * kernel's `first` argument says where its piece starts. Tensors are passed as
 * (cl_mem, element offset, stride_token, stride_head); no sub-buffers.
 *
 * Work-group sizes: powers of two, at most min(CL_DEVICE_MAX_WORK_GROUP_SIZE,
 * CL_KERNEL_WORK_GROUP_SIZE), shrunk until the kernel's local memory fits in
 * CL_DEVICE_LOCAL_MEM_SIZE. Defaults: 128 lanes for attention on GPUs, 64 on CPUs;
 * NSA_OPENCL_WG=<n> overrides the attention size (for tuning).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "opencl_internal.h"

/* ------------------------------------------------------------------ arguments */

void ocl_args_begin(ocl_args *a, cl_kernel k, const char *kname)
{
    a->kernel = k;
    a->next = 0;
    a->err = CL_SUCCESS;
    a->status = NSA_SUCCESS;
    a->kname = kname;
}

static void set_arg(ocl_args *a, size_t size, const void *value)
{
    cl_int err = clSetKernelArg(a->kernel, a->next++, size, value);
    if (err != CL_SUCCESS && a->err == CL_SUCCESS) a->err = err;
}

void ocl_arg_mem(ocl_args *a, cl_mem m) { set_arg(a, sizeof(cl_mem), m ? (const void *)&m : NULL); }
void ocl_arg_long(ocl_args *a, int64_t v) { cl_long x = v; set_arg(a, sizeof x, &x); }
void ocl_arg_int(ocl_args *a, int v) { cl_int x = v; set_arg(a, sizeof x, &x); }
void ocl_arg_float(ocl_args *a, float v) { cl_float x = v; set_arg(a, sizeof x, &x); }
void ocl_arg_local(ocl_args *a, size_t bytes) { set_arg(a, bytes ? bytes : 4, NULL); }

int64_t ocl_tensor_elem_offset(const nsa_bk_tensor *t, size_t elem_size)
{
    const ocl_buffer *b = t->buf;
    if (b->offset % elem_size != 0) return -1;
    return (int64_t)(b->offset / elem_size) + t->offset;
}

void ocl_arg_tensor(ocl_args *a, const nsa_bk_tensor *t, size_t elem_size, int strides)
{
    int64_t off = 0;
    cl_mem m = NULL;
    if (t->buf) {
        m = ((const ocl_buffer *)t->buf)->mem;
        off = ocl_tensor_elem_offset(t, elem_size);
        if (off < 0 && a->status == NSA_SUCCESS) {
            a->status = OCL_ERR(NSA_ERR_UNSUPPORTED,
                                "opencl: %s: a buffer's byte offset %zu is not a multiple of its element size %zu",
                                a->kname, ((const ocl_buffer *)t->buf)->offset, elem_size);
            off = 0;
        }
    }
    ocl_arg_mem(a, m);
    ocl_arg_long(a, off);
    if (strides) {
        ocl_arg_long(a, t->buf ? t->stride_token : 0);
        ocl_arg_long(a, t->buf ? t->stride_head : 0);
    }
}

nsa_status ocl_args_end(ocl_args *a)
{
    if (a->status != NSA_SUCCESS) return a->status;
    if (a->err != CL_SUCCESS)
        return OCL_ERR(NSA_ERR_INTERNAL, "opencl: clSetKernelArg(%s): %d (%s)", a->kname, (int)a->err,
                       ocl_error_name(a->err));
    return NSA_SUCCESS;
}

nsa_status ocl_launch(ocl_context *c, cl_kernel k, const char *kname, cl_uint first_arg, int64_t groups, size_t wg,
                      int64_t first_scale)
{
    return ocl_launch_at(c, k, kname, first_arg, 0, groups, wg, first_scale);
}

nsa_status ocl_launch_at(ocl_context *c, cl_kernel k, const char *kname, cl_uint first_arg, int64_t base,
                         int64_t groups, size_t wg, int64_t first_scale)
{
    for (int64_t g0 = 0; g0 < groups; g0 += OCL_MAX_GROUPS_PER_LAUNCH) {
        const int64_t n = groups - g0 < OCL_MAX_GROUPS_PER_LAUNCH ? groups - g0 : OCL_MAX_GROUPS_PER_LAUNCH;
        const cl_long first = base + g0 * first_scale;
        cl_int err = clSetKernelArg(k, first_arg, sizeof first, &first);
        if (err != CL_SUCCESS) return ocl_fail(err, "clSetKernelArg(first)");
        const size_t global = (size_t)n * wg, local = wg;
        err = clEnqueueNDRangeKernel(c->queue, k, 1, NULL, &global, &local, 0, NULL, NULL);
        if (err != CL_SUCCESS)
            return OCL_ERR(err == CL_MEM_OBJECT_ALLOCATION_FAILURE ? NSA_ERR_OUT_OF_MEMORY : NSA_ERR_DEVICE,
                           "opencl: queueing %s (%lld work-groups of %zu) on %s: %d (%s)", kname, (long long)n, wg,
                           c->device_name, (int)err, ocl_error_name(err));
        nsa_status s = ocl_order(c);
        if (s != NSA_SUCCESS) return s;
    }
    return NSA_SUCCESS;
}

/* ------------------------------------------------------------------ sizes */

static size_t floor_pow2(size_t x)
{
    size_t p = 1;
    while (p <= x / 2) p *= 2;
    return p;
}

static size_t attn_local_bytes(const nsa_config *cfg, size_t wg)
{
    /* qs[Dqk] + acc[Dv] + p[wg] + red[wg] (f32) + row[wg] (long) + slc's blk[n + 1] */
    return (size_t)(cfg->head_dim_qk + cfg->head_dim_v + cfg->num_selected + 1) * 4 + wg * 16;
}

static size_t kernel_limit(const ocl_context *c, const ocl_program *p, int kid)
{
    size_t lim = c->max_wg ? c->max_wg : 1;
    if (p && p->kernel_wg[kid] && p->kernel_wg[kid] < lim) lim = p->kernel_wg[kid];
    return lim;
}

static size_t attn_wg(const ocl_context *c, const ocl_program *p, const nsa_config *cfg)
{
    size_t want = (c->type & CL_DEVICE_TYPE_CPU) ? 64 : 128;
    const char *env = getenv("NSA_OPENCL_WG");
    if (env && atoi(env) > 0) want = (size_t)atoi(env);
    size_t lim = kernel_limit(c, p, OCL_K_CMP_ATTN);
    if (p) {
        if (p->kernel_wg[OCL_K_SLC_ATTN] < lim) lim = p->kernel_wg[OCL_K_SLC_ATTN];
        if (p->kernel_wg[OCL_K_WIN_ATTN] < lim) lim = p->kernel_wg[OCL_K_WIN_ATTN];
    }
    size_t wg = floor_pow2(want < lim ? want : lim);
    while (wg > 1 && attn_local_bytes(cfg, wg) > c->local_mem) wg /= 2;
    return attn_local_bytes(cfg, wg) <= c->local_mem ? wg : 0;
}

static size_t scores_local_bytes(const nsa_config *cfg, int q_local)
{
    const size_t G = (size_t)(cfg->num_q_heads / cfg->num_kv_heads);
    return G * 4 + (q_local ? G * (size_t)cfg->head_dim_qk * 4 : 4);
}

/* Version 2 (group_attn.cl): local bytes for key tile kt, and the choice of wg / kt. */
#define GA_MAX_ACC 16 /* as in group_attn.cl */

static size_t v2_local_bytes(const nsa_config *cfg, size_t kt)
{
    const size_t G = (size_t)(cfg->num_q_heads / cfg->num_kv_heads);
    const size_t Dqk = (size_t)cfg->head_dim_qk, Dv = (size_t)cfg->head_dim_v;
    return 4 * (G * Dqk + kt * (Dqk + 1) + kt * Dv + G * kt + 3 * G) + 16 * kt /* krow, vrow */
           + 4 * (size_t)(cfg->num_selected + 1) /* slc's blk */;
}

static void choose_v2(const ocl_context *c, ocl_plan *op, const nsa_config *cfg)
{
    op->attn_v2 = 0;
    const char *env = getenv("NSA_OPENCL_KERNELS");
    if (env && strcmp(env, "v1") == 0) return;
    size_t lim = kernel_limit(c, op->prog, OCL_K_CMP_ATTN_V2);
    if (op->prog->kernel_wg[OCL_K_SLC_ATTN_V2] < lim) lim = op->prog->kernel_wg[OCL_K_SLC_ATTN_V2];
    if (op->prog->kernel_wg[OCL_K_WIN_ATTN_V2] < lim) lim = op->prog->kernel_wg[OCL_K_WIN_ATTN_V2];
    const size_t wg = floor_pow2(lim < 256 ? lim : 256);
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    if (G * cfg->head_dim_v > GA_MAX_ACC * (int64_t)wg) return; /* outputs do not fit the registers */
    size_t kt = 32;
    while (kt > 1 && v2_local_bytes(cfg, kt) > c->local_mem) kt /= 2;
    if (v2_local_bytes(cfg, kt) > c->local_mem) return;
    op->attn_v2 = 1;
    op->wg_v2 = wg;
    op->kt_v2 = (int64_t)kt;
}

/* Version 3 (tile_attn.cl, CMP_ATTN and WIN_ATTN): constants as there. */
#define TA_WG 256
#define TA_R 64
#define TA_BK 32
#define TA_DC 32
#define TA_NC 8

/* Tokens per version 3 tile: 64 / G rows' worth (BQ in tile_attn.cl). */
static int64_t v3_tile_tokens(const nsa_config *cfg) { return TA_R / (cfg->num_q_heads / cfg->num_kv_heads); }

static size_t v3_local_floats(const nsa_config *cfg)
{
    return TA_R * (TA_DC + 1) + TA_BK * (TA_DC + 1) + TA_R * (TA_BK + 1) + TA_BK * (size_t)cfg->head_dim_v +
           11 * TA_R;
}

/* Version 3 needs its 256 lanes, Dv <= 128, G <= 64 (one row per head of a token at
 * least) and its tiles in local memory; NSA_OPENCL_KERNELS=v1 or v2 keeps the older
 * versions (comparisons). */
static void choose_v3(const ocl_context *c, ocl_plan *op, const nsa_config *cfg)
{
    op->attn_v3 = 0;
    const char *env = getenv("NSA_OPENCL_KERNELS");
    if (env && (strcmp(env, "v1") == 0 || strcmp(env, "v2") == 0)) return;
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    if (G > TA_R || cfg->head_dim_v > 16 * TA_NC) return;
    if (kernel_limit(c, op->prog, OCL_K_CMP_ATTN_V3) < TA_WG || kernel_limit(c, op->prog, OCL_K_WIN_ATTN_V3) < TA_WG)
        return;
    if (4 * v3_local_floats(cfg) + 16 * TA_R > c->local_mem) return;
    op->attn_v3 = 1;
}

/* Version 3 of SLC_ATTN (slc_tile.cl): constants as there. */
#define ST_WG 256
#define ST_R 16
#define ST_BK 64
#define ST_DC 32
#define ST_QS (ST_DC + 4)
#define ST_PS (ST_R + 4)
#define ST_NV 2

static size_t slc_v3_local_floats(const nsa_config *cfg)
{
    const size_t vs = ((size_t)cfg->head_dim_v + 1) & ~(size_t)1;
    size_t a = (ST_R + ST_BK) * ST_QS;
    if (a < 4 * ST_R * ST_BK) a = 4 * ST_R * ST_BK;
    if (a < ST_BK * vs) a = ST_BK * vs;
    return a + ST_BK * ST_PS + 3 * ST_R + 2 * ST_R * 16;
}

static size_t slc_v3_local_bytes(const nsa_config *cfg)
{
    return 4 * slc_v3_local_floats(cfg) + 16 * ST_BK /* krow, vrow */ + 4 * (size_t)(cfg->num_selected + 1) /* blk */;
}

/* Version 3 of the selected attention needs its 256 lanes, Dv <= 128 and its tiles in
 * local memory, and runs where G >= ST_MIN_G: its work-group computes 16 rows whatever
 * G is (one token's rows share the keys), so below that version 2 does less work
 * (PoCL, 2 cores, T = 1024, Hkv 4, Dqk 192, Dv 128, 2026-12-05: v2 / v3 2360 / 4463 ms at
 * G = 1, 3281 / 4345 at G = 4, 4658 / 4340 at G = 8, 7302 / 4507 at G = 16; not measured
 * on a GPU). NSA_OPENCL_KERNELS=v1 or v2 keeps the older versions (comparisons). */
#define ST_MIN_G 8
static void choose_slc_v3(const ocl_context *c, ocl_plan *op, const nsa_config *cfg)
{
    op->slc_v3 = 0;
    const char *env = getenv("NSA_OPENCL_KERNELS");
    if (env && (strcmp(env, "v1") == 0 || strcmp(env, "v2") == 0)) return;
    if (cfg->num_selected == 0 || cfg->head_dim_v > 64 * ST_NV) return;
    if (cfg->num_q_heads / cfg->num_kv_heads < ST_MIN_G) return;
    if (kernel_limit(c, op->prog, OCL_K_SLC_ATTN_V3) < ST_WG) return;
    if (slc_v3_local_bytes(cfg) > c->local_mem) return;
    op->slc_v3 = 1;
}

static size_t scores_v2_local_bytes(const nsa_config *cfg, size_t kt, size_t jc)
{
    const size_t G = (size_t)(cfg->num_q_heads / cfg->num_kv_heads), Dqk = (size_t)cfg->head_dim_qk;
    const size_t pc = (jc * (size_t)cfg->slc_block + (size_t)cfg->cmp_block) / (size_t)cfg->cmp_stride + 2;
    return 4 * (G * Dqk + G + kt * (Dqk + 1) + G * kt + pc);
}

/* The row tile kt and chunk jc of block_scores_v2 (fused: scores_topn, which
 * also keeps a chunk's jc scores and n candidates) that fit the device's local
 * memory; 0 when none does. */
static size_t scores_tile_bytes(const nsa_config *cfg, size_t kt, size_t jc, int fused)
{
    return scores_v2_local_bytes(cfg, kt, jc) + (fused ? 4 * jc + 8 * (size_t)cfg->num_selected : 0);
}
static int scores_tile_fit(const ocl_context *c, const nsa_config *cfg, int fused, size_t *kt_out, size_t *jc_out)
{
    size_t kt = 32, jc = 64;
    while (scores_tile_bytes(cfg, kt, jc, fused) > c->local_mem && (kt > 1 || jc > 1)) {
        if (kt > 4 || jc == 1) kt = kt > 1 ? kt / 2 : 1;
        else jc /= 2;
    }
    if (scores_tile_bytes(cfg, kt, jc, fused) > c->local_mem) return 0;
    *kt_out = kt;
    *jc_out = jc;
    return 1;
}
static int scores_tile(const ocl_context *c, const nsa_config *cfg, int fused, size_t *kt_out, size_t *jc_out)
{
    const char *env = getenv("NSA_OPENCL_KERNELS");
    if (env && strcmp(env, "v1") == 0) return 0;
    return scores_tile_fit(c, cfg, fused, kt_out, jc_out);
}

/* the decode step's decode_scores_topn (decode.c) has the fused kernel's tile */
int ocl_scores_topn_tile(const ocl_context *c, const nsa_config *cfg, size_t *kt, size_t *jc)
{
    return scores_tile_fit(c, cfg, 1, kt, jc);
}
size_t ocl_scores_topn_bytes(const nsa_config *cfg, size_t kt, size_t jc)
{
    return scores_tile_bytes(cfg, kt, jc, 1);
}

/* NSA_OPENCL_NO_FUSED=1: refuse SCORES_TOPN, WIN_COMBINE and SLC_COMBINE, so plans take BLOCK_SCORES +
 * SELECT_TOPN, WIN_ATTN + COMBINE and SLC_ATTN (testing both) */
static int fused_off(void)
{
    const char *e = getenv("NSA_OPENCL_NO_FUSED");
    return e && strcmp(e, "1") == 0;
}

static void choose_scores_v2(const ocl_context *c, ocl_plan *op, const nsa_config *cfg)
{
    size_t kt, jc;
    op->scores_v2 = scores_tile(c, cfg, 0, &kt, &jc);
    if (op->scores_v2) {
        const size_t lim = kernel_limit(c, op->prog, OCL_K_BLOCK_SCORES_V2);
        op->wg_scores_v2 = floor_pow2(lim < 256 ? lim : 256);
        op->kt_scores = (int64_t)kt;
        op->jc_scores = (int64_t)jc;
    }
    if (cfg->num_selected > 0 && !fused_off() && scores_tile(c, cfg, 1, &kt, &jc)) {
        const size_t lim = kernel_limit(c, op->prog, OCL_K_SCORES_TOPN);
        op->wg_fused = floor_pow2(lim < 256 ? lim : 256);
        op->kt_fused = (int64_t)kt;
        op->jc_fused = (int64_t)jc;
    }
}

int ocl_supports(void *bctx, nsa_stage stage, const nsa_config *cfg)
{
    ocl_context *c = bctx;
    if (cfg->dtype != NSA_DTYPE_F32 && cfg->dtype != NSA_DTYPE_F16 && cfg->dtype != NSA_DTYPE_BF16) return 0;
    switch (stage) {
    case NSA_STAGE_COMPRESS:
    case NSA_STAGE_SELECT_TOPN:
    case NSA_STAGE_COMBINE:
        return 1;
    case NSA_STAGE_CMP_ATTN:
    case NSA_STAGE_SLC_ATTN:
    case NSA_STAGE_WIN_ATTN:
        return attn_wg(c, NULL, cfg) > 0;
    case NSA_STAGE_BLOCK_SCORES:
        return scores_local_bytes(cfg, 0) <= c->local_mem;
    case NSA_STAGE_SCORES_TOPN: {
        size_t kt, jc;
        return !fused_off() && scores_tile(c, cfg, 1, &kt, &jc);
    }
    case NSA_STAGE_WIN_COMBINE:
        return !fused_off() && cfg->window > 0 && attn_wg(c, NULL, cfg) > 0;
    case NSA_STAGE_SLC_COMBINE:
        return !fused_off() && cfg->num_selected > 0 && attn_wg(c, NULL, cfg) > 0;
    case NSA_STAGE_BWD_CMP_ATTN:
    case NSA_STAGE_BWD_COMPRESS:
    case NSA_STAGE_BWD_SLC_ATTN:
    case NSA_STAGE_BWD_WIN_ATTN:
    case NSA_STAGE_BWD_STORE:
        return 1; /* backward.cl: any head dim (rows are read from global memory) */
    case NSA_STAGE_DECODE_APPEND:
    case NSA_STAGE_DECODE_ATTN:
        return attn_wg(c, NULL, cfg) > 0 && ocl_decode_supports(c, cfg);
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------ plans */

/* WIN_COMBINE, the fused WIN_ATTN + COMBINE the planner takes where supports()
 * says yes: the window branch's rows go to a plan scratch of win_chunk tokens
 * (about OCL_WIN_CHUNK_BYTES, a multiple of v3's tile tokens so that the
 * window kernels' work-groups split at its edges), a run of tokens at a time,
 * and the combine kernel reads them there: the same kernels in the same order
 * as the two stages, so o is bitwise the same, and the workspace holds no o_win
 * (T * Hq * Dv floats). SLC_COMBINE uses the same scratch (it runs before
 * WIN_COMBINE): the selected branch's rows of a run, then combine_partial adds
 * them into o_cmp as COMBINE's first two terms (one fma each, combine.cl), and
 * COMBINE resumes from that sum, so o is bitwise the same again and the
 * workspace holds no o_slc. */
#define OCL_WIN_CHUNK_BYTES ((int64_t)64 << 20)

static int64_t win_tile_tokens(const ocl_plan *op, const nsa_config *cfg)
{
    return op->attn_v3 ? v3_tile_tokens(cfg) : 1;
}

static nsa_status win_combine_prepare(ocl_context *c, const nsa_bk_plan *plan, ocl_plan *op)
{
    const nsa_config *cfg = &plan->cfg;
    const int64_t T = plan->total_tokens, row = cfg->num_q_heads * cfg->head_dim_v, bq = win_tile_tokens(op, cfg);
    if (T == 0) return NSA_SUCCESS;
    int64_t chunk = OCL_WIN_CHUNK_BYTES / (row * 4) / bq * bq; /* row < 2^30: config.c's bounds */
    if (chunk < bq) chunk = bq;
    if (chunk > T) chunk = T;
    const size_t bytes = (size_t)chunk * (size_t)row * 4;
    cl_int err;
    op->win_scratch = clCreateBuffer(c->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS)
        return OCL_ERR(NSA_ERR_OUT_OF_MEMORY, "opencl: the window rows of %lld tokens (%zu bytes) for win_combine: %d (%s)",
                       (long long)chunk, bytes, (int)err, ocl_error_name(err));
    op->win_chunk = chunk;
    op->bytes += bytes;
    return NSA_SUCCESS;
}

nsa_status ocl_plan_prepare(void *bctx, nsa_bk_plan *plan)
{
    ocl_context *c = bctx;
    const nsa_config *cfg = &plan->cfg;
    ocl_plan *op = calloc(1, sizeof *op);
    if (!op) return OCL_ERR(NSA_ERR_OUT_OF_MEMORY, "opencl: out of host memory for a plan");
    nsa_status s = ocl_program_get(c, cfg->dtype, &op->prog);
    if (s != NSA_SUCCESS) {
        free(op);
        return s;
    }
    op->wg_attn = attn_wg(c, op->prog, cfg);
    if (op->wg_attn == 0) {
        free(op);
        return OCL_ERR(NSA_ERR_UNSUPPORTED,
                       "opencl: head dims Dqk=%lld + Dv=%lld need more local memory than %s has (%llu bytes)",
                       (long long)cfg->head_dim_qk, (long long)cfg->head_dim_v, c->device_name,
                       (unsigned long long)c->local_mem);
    }
    const int cpu = (c->type & CL_DEVICE_TYPE_CPU) != 0;
    op->wg_scores = floor_pow2(kernel_limit(c, op->prog, OCL_K_BLOCK_SCORES) < 64 ? kernel_limit(c, op->prog, OCL_K_BLOCK_SCORES) : 64);
    op->scores_q_local = scores_local_bytes(cfg, 1) <= c->local_mem;
    op->wg_topn = floor_pow2(kernel_limit(c, op->prog, OCL_K_SELECT_TOPN) < 64 ? kernel_limit(c, op->prog, OCL_K_SELECT_TOPN) : 64);
    op->wg_elem = floor_pow2(kernel_limit(c, op->prog, OCL_K_COMBINE) < 256 ? kernel_limit(c, op->prog, OCL_K_COMBINE) : 256);
    if (cpu && op->wg_elem > 64) op->wg_elem = 64;
    for (int k = OCL_K_COMPRESS_MEAN; k <= OCL_K_COMPRESS_LINEAR; ++k)
        while (op->wg_elem > kernel_limit(c, op->prog, k)) op->wg_elem /= 2;
    op->wg_bwd = cpu ? 16 : 64;
    for (int k = OCL_K_BWD_ROWS_CMP; k <= OCL_K_BWD_KEYS_WIN; ++k)
        while (op->wg_bwd > 1 && op->wg_bwd > kernel_limit(c, op->prog, k)) op->wg_bwd /= 2;
    choose_v2(c, op, cfg);
    choose_v3(c, op, cfg);
    choose_slc_v3(c, op, cfg);
    choose_scores_v2(c, op, cfg);
    /* a decode plan has its own scratch (decode.c); LINEAR compression there is a kernel */
    if (plan->decode) s = ocl_decode_prepare(c, plan, op);
    else if (cfg->compress == NSA_COMPRESS_LINEAR) s = ocl_linear_prepare(c, plan, op);
    if (s == NSA_SUCCESS && !plan->decode && (cfg->window > 0 || plan->slc_combined) && !fused_off())
        s = win_combine_prepare(c, plan, op);
    if (s != NSA_SUCCESS) {
        plan->backend_plan = op;
        ocl_plan_release(c, plan);
        return s;
    }
    plan->backend_plan = op;
    plan->backend_bytes = op->bytes;
    return NSA_SUCCESS;
}

void ocl_plan_release(void *bctx, nsa_bk_plan *plan)
{
    (void)bctx;
    ocl_plan *op = plan->backend_plan;
    if (!op) return;
    cl_mem mems[] = {op->stage_x, op->stage_w, op->stage_pe, op->bias, op->gemm_tmp, op->win_scratch};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; ++i)
        if (mems[i]) clReleaseMemObject(mems[i]);
    ocl_decode_release(op);
    free(op);
    plan->backend_plan = NULL;
}

/* ------------------------------------------------------------------ stages */

static size_t dtype_size(nsa_dtype d) { return d == NSA_DTYPE_F32 || d == NSA_DTYPE_I32 ? 4 : 2; }

/* The plan's device tables: (cl_mem, element offsets of cu_seqlens (queries),
 * cu_seqlens_k (keys: the same offset but for shard plans), cu_cmp, tok_seq). */
typedef struct tables {
    cl_mem mem;
    int64_t cu_seq, cu_k, cu_cmp, tok_seq;
} tables;

static nsa_status get_tables(const nsa_bk_plan *plan, tables *t)
{
    const ocl_buffer *b = plan->dev_tables;
    if (!b || b->offset % 8 != 0)
        return OCL_ERR(NSA_ERR_INTERNAL, "opencl: the plan has no (aligned) device tables");
    const int64_t base = (int64_t)(b->offset / 8);
    t->mem = b->mem;
    t->cu_seq = base + plan->dev_cu_seqlens;
    t->cu_k = base + plan->dev_cu_seqlens_k;
    t->cu_cmp = base + plan->dev_cu_cmp;
    t->tok_seq = base + plan->dev_tok_seq;
    return NSA_SUCCESS;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The arguments compress_mean and compress_linear share after their inputs: the
 * output rows, the tables and the block geometry. */
static void block_args(ocl_args *a, const nsa_bk_tensor *out, const tables *tb, const nsa_bk_plan *plan, int64_t D)
{
    const nsa_config *cfg = &plan->cfg;
    ocl_arg_tensor(a, out, 4, 1);
    ocl_arg_mem(a, tb->mem);
    ocl_arg_long(a, tb->cu_k); /* the kernels' cu_seq_at: the blocks are of key rows */
    ocl_arg_long(a, tb->cu_cmp);
    ocl_arg_long(a, plan->batch);
    ocl_arg_long(a, cfg->num_kv_heads);
    ocl_arg_long(a, D);
    ocl_arg_long(a, cfg->cmp_block);
    ocl_arg_long(a, cfg->cmp_stride);
}

/* The kernel (and version, with its tile) that a prepared plan runs for a stage,
 * for nsa_plan_stage_kernel (nsa info --kernels, nsa run, the profile). */
nsa_status ocl_stage_kernel(void *bctx, const nsa_bk_plan *plan, nsa_stage stage, char *name, size_t size)
{
    (void)bctx;
    const ocl_plan *op = plan ? (const ocl_plan *)plan->backend_plan : NULL;
    if (!op || !name || size == 0)
        return OCL_ERR(NSA_ERR_INTERNAL, "opencl: stage_kernel without a prepared plan or a name buffer");
    const nsa_config *cfg = &plan->cfg;
    switch (stage) {
    case NSA_STAGE_COMPRESS:
        snprintf(name, size, "%s", cfg->compress == NSA_COMPRESS_MEAN ? "compress_mean"
                                   : cfg->compress == NSA_COMPRESS_EXTERNAL ? "compress_copy[convert_rows]"
#ifdef NSA_OPENCL_CLBLAST
                                                                              : "compress_linear[clblast]");
#else
                                                                              : "compress_linear");
#endif
        break;
    case NSA_STAGE_CMP_ATTN:
    case NSA_STAGE_WIN_ATTN:
    case NSA_STAGE_WIN_COMBINE: {
        const char *base = stage == NSA_STAGE_CMP_ATTN ? "cmp_attn" : "win_attn";
        /* WIN_COMBINE: the window kernel, then combine, per run of win_chunk tokens */
        char tail[48] = "";
        if (stage == NSA_STAGE_WIN_COMBINE) snprintf(tail, sizeof tail, "+combine[chunk%lld]", (long long)op->win_chunk);
        if (op->attn_v3) snprintf(name, size, "%s_v3[r%d,bk%d,dc%d]%s", base, TA_R, TA_BK, TA_DC, tail);
        else if (op->attn_v2)
            snprintf(name, size, "%s_v2[kt%lld,wg%zu]%s", base, (long long)op->kt_v2, op->wg_v2, tail);
        else snprintf(name, size, "%s[wg%zu]%s", base, op->wg_attn, tail);
        break;
    }
    case NSA_STAGE_SLC_ATTN:
    case NSA_STAGE_SLC_COMBINE: {
        /* SLC_COMBINE: the selected kernel, then combine_partial, per run of win_chunk tokens */
        char tail[48] = "";
        if (stage == NSA_STAGE_SLC_COMBINE)
            snprintf(tail, sizeof tail, "+combine_partial[chunk%lld]", (long long)op->win_chunk);
        if (op->slc_v3) snprintf(name, size, "slc_attn_v3[r%d,bk%d,dc%d]%s", ST_R, ST_BK, ST_DC, tail);
        else if (op->attn_v2)
            snprintf(name, size, "slc_attn_v2[kt%lld,wg%zu]%s", (long long)op->kt_v2, op->wg_v2, tail);
        else snprintf(name, size, "slc_attn[wg%zu]%s", op->wg_attn, tail);
        break;
    }
    case NSA_STAGE_BLOCK_SCORES:
        if (op->scores_v2) snprintf(name, size, "block_scores_v2[kt%lld,jc%lld]", (long long)op->kt_scores, (long long)op->jc_scores);
        else snprintf(name, size, "block_scores[wg%zu]", op->wg_scores);
        break;
    case NSA_STAGE_SCORES_TOPN:
        snprintf(name, size, "scores_topn[kt%lld,jc%lld]", (long long)op->kt_fused, (long long)op->jc_fused);
        break;
    default: snprintf(name, size, "%s", nsa_stage_name(stage)); break;
    }
    return NSA_SUCCESS;
}

static nsa_status run_compress(ocl_context *c, ocl_plan *op, const nsa_bk_args *args, const tables *tb)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    const size_t es = dtype_size(cfg->dtype);
#ifdef NSA_OPENCL_CLBLAST
    if (cfg->compress == NSA_COMPRESS_LINEAR) return ocl_linear_run(c, args, op);
#endif
    if (plan->total_cmp == 0) return NSA_SUCCESS;
    for (int kv = 0; kv < 2; ++kv) {
        const int64_t D = kv ? cfg->head_dim_v : cfg->head_dim_qk;
        const nsa_bk_tensor *out = kv ? &args->vc : &args->kc;
        const int64_t total = plan->total_cmp * cfg->num_kv_heads * D;
        ocl_args a;
        cl_uint first;
        if (cfg->compress == NSA_COMPRESS_MEAN) {
            ocl_args_begin(&a, op->prog->kernel[OCL_K_COMPRESS_MEAN], "compress_mean");
            ocl_arg_tensor(&a, kv ? &args->v[NSA_BRANCH_CMP] : &args->k[NSA_BRANCH_CMP], es, 1);
            block_args(&a, out, tb, plan, D);
        } else if (cfg->compress == NSA_COMPRESS_LINEAR) { /* without CLBlast */
            const nsa_bk_tensor *w = kv ? &args->w_v : &args->w_k, *pe = kv ? &args->pe_v : &args->pe_k;
            ocl_args_begin(&a, op->prog->kernel[OCL_K_COMPRESS_LINEAR], "compress_linear");
            ocl_arg_tensor(&a, kv ? &args->v[NSA_BRANCH_CMP] : &args->k[NSA_BRANCH_CMP], es, 1);
            ocl_arg_tensor(&a, w, es, 0);
            ocl_arg_tensor(&a, pe->buf ? pe : w, es, 0); /* absent: any buffer, never read */
            ocl_arg_int(&a, pe->buf != NULL);
            block_args(&a, out, tb, plan, D);
        } else { /* EXTERNAL */
            ocl_args_begin(&a, op->prog->kernel[OCL_K_CONVERT_ROWS], "convert_rows");
            ocl_arg_tensor(&a, kv ? &args->vc_in : &args->kc_in, es, 1);
            ocl_arg_tensor(&a, out, 4, 1);
            ocl_arg_long(&a, cfg->num_kv_heads);
            ocl_arg_long(&a, D);
        }
        ocl_arg_long(&a, total);
        first = a.next;
        ocl_arg_long(&a, 0);
        nsa_status s = ocl_args_end(&a);
        if (s == NSA_SUCCESS)
            s = ocl_launch(c, a.kernel, a.kname, first, ceil_div(total, (int64_t)op->wg_elem), op->wg_elem,
                           (int64_t)op->wg_elem);
        if (s != NSA_SUCCESS) return s;
    }
    return NSA_SUCCESS;
}

/* The local arrays of the attention kernels (see softmax.cl). */
static void attn_locals(ocl_args *a, const nsa_config *cfg, size_t wg)
{
    ocl_arg_local(a, (size_t)cfg->head_dim_qk * 4); /* qs */
    ocl_arg_local(a, (size_t)cfg->head_dim_v * 4);  /* acc */
    ocl_arg_local(a, wg * 4);                       /* p */
    ocl_arg_local(a, wg * 4);                       /* red */
    ocl_arg_local(a, wg * 8);                       /* row */
}

/* Version 2: the key tile, then the local float array and the key rows. */
static void v2_locals(ocl_args *a, const nsa_config *cfg, const ocl_plan *op)
{
    ocl_arg_long(a, op->kt_v2);
    ocl_arg_local(a, v2_local_bytes(cfg, (size_t)op->kt_v2) - 16 * (size_t)op->kt_v2 -
                         4 * (size_t)(cfg->num_selected + 1));
    ocl_arg_local(a, 16 * (size_t)op->kt_v2);
}

/* Version 3: the local float array and the rows' key ranges; its work-groups. */
static void v3_locals(ocl_args *a, const nsa_config *cfg)
{
    ocl_arg_local(a, 4 * v3_local_floats(cfg));
    ocl_arg_local(a, 16 * TA_R);
}

static int64_t v3_groups(const nsa_bk_plan *plan)
{
    const int64_t bq = v3_tile_tokens(&plan->cfg);
    return (plan->total_tokens + bq - 1) / bq * plan->cfg.num_kv_heads;
}

static nsa_status run_cmp_attn(ocl_context *c, ocl_plan *op, const nsa_bk_args *args, const tables *tb)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    const int v3 = op->attn_v3, v2 = !v3 && op->attn_v2;
    ocl_args a;
    ocl_args_begin(&a, op->prog->kernel[v3 ? OCL_K_CMP_ATTN_V3 : v2 ? OCL_K_CMP_ATTN_V2 : OCL_K_CMP_ATTN],
                   v3 ? "cmp_attn_v3" : v2 ? "cmp_attn_v2" : "cmp_attn");
    ocl_arg_tensor(&a, &args->q, dtype_size(cfg->dtype), 1);
    ocl_arg_tensor(&a, &args->kc, 4, 1);
    ocl_arg_tensor(&a, &args->vc, 4, 1);
    ocl_arg_tensor(&a, &args->o_b[NSA_BRANCH_CMP], 4, 1);
    ocl_arg_tensor(&a, &args->lse[NSA_BRANCH_CMP], 4, 1);
    ocl_arg_mem(&a, tb->mem);
    ocl_arg_long(&a, tb->cu_seq);
    ocl_arg_long(&a, tb->cu_k);
    ocl_arg_long(&a, tb->cu_cmp);
    ocl_arg_long(&a, tb->tok_seq);
    if (v3) ocl_arg_long(&a, plan->total_tokens);
    ocl_arg_long(&a, cfg->num_q_heads);
    ocl_arg_long(&a, cfg->num_kv_heads);
    ocl_arg_long(&a, cfg->head_dim_qk);
    ocl_arg_long(&a, cfg->head_dim_v);
    ocl_arg_long(&a, cfg->cmp_block);
    ocl_arg_long(&a, cfg->cmp_stride);
    ocl_arg_float(&a, cfg->scale);
    const cl_uint first = a.next;
    ocl_arg_long(&a, 0);
    if (v3) v3_locals(&a, cfg);
    else if (v2) v2_locals(&a, cfg, op);
    else attn_locals(&a, cfg, op->wg_attn);
    nsa_status s = ocl_args_end(&a);
    if (s != NSA_SUCCESS) return s;
    if (v3) return ocl_launch(c, a.kernel, a.kname, first, v3_groups(plan), TA_WG, 1);
    if (v2) return ocl_launch(c, a.kernel, a.kname, first, plan->total_tokens * cfg->num_kv_heads, op->wg_v2, 1);
    return ocl_launch(c, a.kernel, a.kname, first, plan->total_tokens * cfg->num_q_heads, op->wg_attn, 1);
}

/* The arguments block_scores, block_scores_v2 and scores_topn share: q, kc, lse_cmp,
 * their output (scores or indices), the tables and the shape. */
static void scores_args(ocl_args *a, const nsa_bk_args *args, const nsa_bk_tensor *out, const tables *tb)
{
    const nsa_config *cfg = &args->plan->cfg;
    ocl_arg_tensor(a, &args->q, dtype_size(cfg->dtype), 1);
    ocl_arg_tensor(a, &args->kc, 4, 1);
    ocl_arg_tensor(a, &args->lse[NSA_BRANCH_CMP], 4, 1);
    ocl_arg_tensor(a, out, 4, 1);
    ocl_arg_mem(a, tb->mem);
    ocl_arg_long(a, tb->cu_seq);
    ocl_arg_long(a, tb->cu_k);
    ocl_arg_long(a, tb->cu_cmp);
    ocl_arg_long(a, tb->tok_seq);
    ocl_arg_long(a, cfg->num_q_heads);
    ocl_arg_long(a, cfg->num_kv_heads);
    ocl_arg_long(a, cfg->head_dim_qk);
    ocl_arg_long(a, cfg->cmp_block);
    ocl_arg_long(a, cfg->cmp_stride);
    ocl_arg_long(a, cfg->slc_block);
    ocl_arg_float(a, cfg->scale);
}

static nsa_status run_block_scores(ocl_context *c, ocl_plan *op, const nsa_bk_args *args, const tables *tb)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    const int v2 = op->scores_v2;
    ocl_args a;
    ocl_args_begin(&a, op->prog->kernel[v2 ? OCL_K_BLOCK_SCORES_V2 : OCL_K_BLOCK_SCORES],
                   v2 ? "block_scores_v2" : "block_scores");
    scores_args(&a, args, &args->scores, tb);
    const cl_uint first = a.next;
    ocl_arg_long(&a, 0);
    if (v2) {
        ocl_arg_long(&a, op->kt_scores);
        ocl_arg_long(&a, op->jc_scores);
        ocl_arg_local(&a, scores_v2_local_bytes(cfg, (size_t)op->kt_scores, (size_t)op->jc_scores));
        nsa_status s = ocl_args_end(&a);
        if (s != NSA_SUCCESS) return s;
        return ocl_launch(c, a.kernel, a.kname, first, plan->total_tokens * cfg->num_kv_heads, op->wg_scores_v2, 1);
    }
    ocl_arg_int(&a, op->scores_q_local);
    ocl_arg_local(&a, op->scores_q_local ? (size_t)(G * cfg->head_dim_qk) * 4 : 4);
    ocl_arg_local(&a, (size_t)G * 4);
    nsa_status s = ocl_args_end(&a);
    if (s != NSA_SUCCESS) return s;
    return ocl_launch(c, a.kernel, a.kname, first, plan->total_tokens * cfg->num_kv_heads, op->wg_scores, 1);
}

/* SCORES_TOPN: block_scores_v2's chunks merged into a ranked list per (t, g), no scores row */
static nsa_status run_scores_topn(ocl_context *c, ocl_plan *op, const nsa_bk_args *args, const tables *tb)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    if (op->wg_fused == 0)
        return OCL_ERR(NSA_ERR_INTERNAL, "opencl: scores_topn planned for a config whose tile does not fit");
    const size_t kt = (size_t)op->kt_fused, jc = (size_t)op->jc_fused;
    const int64_t pc = (int64_t)((jc * (size_t)cfg->slc_block + (size_t)cfg->cmp_block) / (size_t)cfg->cmp_stride + 2);
    ocl_args a;
    ocl_args_begin(&a, op->prog->kernel[OCL_K_SCORES_TOPN], "scores_topn");
    scores_args(&a, args, &args->indices, tb);
    ocl_arg_long(&a, cfg->num_selected);
    ocl_arg_long(&a, cfg->num_init);
    ocl_arg_long(&a, cfg->num_local);
    const cl_uint first = a.next;
    ocl_arg_long(&a, 0);
    ocl_arg_long(&a, (int64_t)kt);
    ocl_arg_long(&a, (int64_t)jc);
    ocl_arg_long(&a, pc);
    ocl_arg_local(&a, scores_tile_bytes(cfg, kt, jc, 1));
    nsa_status s = ocl_args_end(&a);
    if (s != NSA_SUCCESS) return s;
    return ocl_launch(c, a.kernel, a.kname, first, plan->total_tokens * cfg->num_kv_heads, op->wg_fused, 1);
}

static nsa_status run_select_topn(ocl_context *c, ocl_plan *op, const nsa_bk_args *args, const tables *tb)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    ocl_args a;
    ocl_args_begin(&a, op->prog->kernel[OCL_K_SELECT_TOPN], "select_topn");
    ocl_arg_tensor(&a, &args->scores, 4, 1);
    ocl_arg_tensor(&a, &args->indices, 4, 1);
    ocl_arg_mem(&a, tb->mem);
    ocl_arg_long(&a, tb->cu_seq);
    ocl_arg_long(&a, tb->cu_k);
    ocl_arg_long(&a, tb->tok_seq);
    ocl_arg_long(&a, cfg->num_kv_heads);
    ocl_arg_long(&a, cfg->slc_block);
    ocl_arg_long(&a, cfg->num_selected);
    ocl_arg_long(&a, cfg->num_init);
    ocl_arg_long(&a, cfg->num_local);
    const cl_uint first = a.next;
    ocl_arg_long(&a, 0);
    ocl_arg_local(&a, op->wg_topn * 4);
    ocl_arg_local(&a, op->wg_topn * 4);
    nsa_status s = ocl_args_end(&a);
    if (s != NSA_SUCCESS) return s;
    return ocl_launch(c, a.kernel, a.kname, first, plan->total_tokens * cfg->num_kv_heads, op->wg_topn, 1);
}

/* An f32 [T, Hq, Dv] output as kernel arguments: the buffer, the element offset of
 * row 0 (may be negative when only later rows are written) and the strides. */
typedef struct ocl_rows {
    cl_mem mem;
    int64_t off, st, sh;
} ocl_rows;

static void arg_rows(ocl_args *a, const nsa_bk_tensor *t, const ocl_rows *r)
{
    if (!r) {
        ocl_arg_tensor(a, t, 4, 1);
        return;
    }
    ocl_arg_mem(a, r->mem);
    ocl_arg_long(a, r->off);
    ocl_arg_long(a, r->st);
    ocl_arg_long(a, r->sh);
}

/* SLC_ATTN and WIN_ATTN share everything but the key set. Tokens [t0, t1), o_b
 * in `rows` (NULL: args->o_b[branch]); t0 is a multiple of win_tile_tokens. */
static nsa_status run_sparse_attn(ocl_context *c, ocl_plan *op, const nsa_bk_args *args, const tables *tb, int branch,
                                  const ocl_rows *rows, int64_t t0, int64_t t1)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    const size_t es = dtype_size(cfg->dtype);
    const int slc = branch == NSA_BRANCH_SLC, v3 = slc ? op->slc_v3 : op->attn_v3, v2 = !v3 && op->attn_v2;
    static const int kid[2][2] = {{OCL_K_WIN_ATTN, OCL_K_SLC_ATTN}, {OCL_K_WIN_ATTN_V2, OCL_K_SLC_ATTN_V2}};
    static const char *const kname[2][2] = {{"win_attn", "slc_attn"}, {"win_attn_v2", "slc_attn_v2"}};
    ocl_args a;
    if (v3) ocl_args_begin(&a, op->prog->kernel[slc ? OCL_K_SLC_ATTN_V3 : OCL_K_WIN_ATTN_V3],
                           slc ? "slc_attn_v3" : "win_attn_v3");
    else ocl_args_begin(&a, op->prog->kernel[kid[v2][slc]], kname[v2][slc]);
    ocl_arg_tensor(&a, &args->q, es, 1);
    ocl_arg_tensor(&a, &args->k[branch], es, 1);
    ocl_arg_tensor(&a, &args->v[branch], es, 1);
    if (slc) ocl_arg_tensor(&a, &args->indices, 4, 1);
    arg_rows(&a, &args->o_b[branch], rows);
    ocl_arg_tensor(&a, &args->lse[branch], 4, 1);
    ocl_arg_int(&a, args->lse[branch].buf != NULL);
    ocl_arg_mem(&a, tb->mem);
    ocl_arg_long(&a, tb->cu_seq);
    ocl_arg_long(&a, tb->cu_k);
    ocl_arg_long(&a, tb->tok_seq);
    if (v3 && !slc) ocl_arg_long(&a, plan->total_tokens);
    ocl_arg_long(&a, cfg->num_q_heads);
    ocl_arg_long(&a, cfg->num_kv_heads);
    ocl_arg_long(&a, cfg->head_dim_qk);
    ocl_arg_long(&a, cfg->head_dim_v);
    if (slc) {
        ocl_arg_long(&a, cfg->slc_block);
        ocl_arg_long(&a, cfg->num_selected);
    } else {
        ocl_arg_long(&a, cfg->window);
    }
    ocl_arg_float(&a, cfg->scale);
    const cl_uint first = a.next;
    ocl_arg_long(&a, 0);
    if (v3 && slc) {
        ocl_arg_local(&a, 4 * slc_v3_local_floats(cfg));
        ocl_arg_local(&a, 16 * ST_BK);
    } else if (v3) {
        v3_locals(&a, cfg);
    } else if (v2) {
        v2_locals(&a, cfg, op);
    } else {
        attn_locals(&a, cfg, op->wg_attn);
    }
    if (slc) ocl_arg_local(&a, (size_t)(cfg->num_selected + 1) * 4); /* blk: count + usable blocks */
    nsa_status s = ocl_args_end(&a);
    if (s != NSA_SUCCESS) return s;
    /* work-groups per token (or per tile of bq tokens), and the lanes of one */
    const int64_t G = cfg->num_q_heads / cfg->num_kv_heads;
    int64_t per = cfg->num_q_heads, bq = 1;
    size_t wg = op->wg_attn;
    if (v3 && slc) {
        per = cfg->num_kv_heads * ((G + ST_R - 1) / ST_R);
        wg = ST_WG;
    } else if (v3) {
        per = cfg->num_kv_heads;
        bq = win_tile_tokens(op, cfg);
        wg = TA_WG;
    } else if (v2) {
        per = cfg->num_kv_heads;
        wg = op->wg_v2;
    }
    const int64_t g0 = t0 / bq * per, g1 = (t1 + bq - 1) / bq * per;
    return ocl_launch_at(c, a.kernel, a.kname, first, g0, g1 - g0, wg, 1);
}

/* The end of an element-wise launch over elements [e0, e1) of [T, Hq, Dv] rows (combine,
 * combine_partial): Hq, Dv, the total and `first`, then the launch. */
static nsa_status launch_rows_elem(ocl_context *c, ocl_plan *op, ocl_args *a, const nsa_config *cfg, int64_t e0,
                                   int64_t e1)
{
    ocl_arg_long(a, cfg->num_q_heads);
    ocl_arg_long(a, cfg->head_dim_v);
    ocl_arg_long(a, e1);
    const cl_uint first = a->next;
    ocl_arg_long(a, 0);
    nsa_status s = ocl_args_end(a);
    if (s != NSA_SUCCESS) return s;
    return ocl_launch_at(c, a->kernel, a->kname, first, e0, ceil_div(e1 - e0, (int64_t)op->wg_elem), op->wg_elem,
                         (int64_t)op->wg_elem);
}

/* COMBINE over tokens [t0, t1), o_win in `win` (NULL: args->o_b[WIN]). */
static nsa_status run_combine(ocl_context *c, ocl_plan *op, const nsa_bk_args *args, const ocl_rows *win, int64_t t0,
                              int64_t t1)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    const int64_t row = cfg->num_q_heads * cfg->head_dim_v, e0 = t0 * row, e1 = t1 * row;
    const int has[3] = {args->o_b[NSA_BRANCH_CMP].buf != NULL, args->o_b[NSA_BRANCH_SLC].buf != NULL,
                        win || args->o_b[NSA_BRANCH_WIN].buf};
    /* after SLC_COMBINE, o_cmp holds the first two terms' sum: resumed from, its gate not read */
    const int c_done = plan->slc_combined;
    ocl_args a;
    ocl_args_begin(&a, op->prog->kernel[OCL_K_COMBINE], "combine");
    for (int b = 0; b < 3; ++b) arg_rows(&a, &args->o_b[b], b == NSA_BRANCH_WIN ? win : NULL);
    for (int b = 0; b < 3; ++b) {
        /* a disabled branch's gate is not read (it may be absent) */
        nsa_bk_tensor none = {0};
        ocl_arg_tensor(&a, has[b] && !(b == NSA_BRANCH_CMP && c_done) ? &args->gate[b] : &none, 4, 1);
    }
    for (int b = 0; b < 3; ++b) ocl_arg_int(&a, has[b]);
    ocl_arg_int(&a, c_done);
    ocl_arg_tensor(&a, &args->o, dtype_size(cfg->dtype), 1);
    return launch_rows_elem(c, op, &a, cfg, e0, e1);
}

/* SLC_COMBINE's end for tokens [t0, t1): o_cmp := g_cmp o_cmp + g_slc o_slc, o_slc in `slc` */
static nsa_status run_combine_partial(ocl_context *c, ocl_plan *op, const nsa_bk_args *args, const ocl_rows *slc,
                                      int64_t t0, int64_t t1)
{
    const nsa_config *cfg = &args->plan->cfg;
    const int64_t row = cfg->num_q_heads * cfg->head_dim_v, e0 = t0 * row, e1 = t1 * row;
    ocl_args a;
    ocl_args_begin(&a, op->prog->kernel[OCL_K_COMBINE_PARTIAL], "combine_partial");
    arg_rows(&a, &args->o_b[NSA_BRANCH_CMP], NULL);
    arg_rows(&a, NULL, slc);
    ocl_arg_tensor(&a, &args->gate[NSA_BRANCH_CMP], 4, 1);
    ocl_arg_tensor(&a, &args->gate[NSA_BRANCH_SLC], 4, 1);
    return launch_rows_elem(c, op, &a, cfg, e0, e1);
}

/* WIN_COMBINE and SLC_COMBINE (see win_combine_prepare): the branch's rows of
 * win_chunk tokens into the scratch, then their combine (window) or their sum into
 * o_cmp (selected), a run of tokens at a time. */
static nsa_status run_fused_runs(ocl_context *c, ocl_plan *op, const nsa_bk_args *args, const tables *tb, int branch)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    if (!op->win_scratch || args->o_b[branch].buf ||
        (branch == NSA_BRANCH_SLC && (!args->o_b[NSA_BRANCH_CMP].buf || !plan->slc_combined)))
        return OCL_ERR(NSA_ERR_INTERNAL, "opencl: %s without its scratch (or o_cmp), or given its branch's output",
                       branch == NSA_BRANCH_SLC ? "slc_combine" : "win_combine");
    const int64_t T = plan->total_tokens, row = cfg->num_q_heads * cfg->head_dim_v;
    nsa_status s = NSA_SUCCESS;
    for (int64_t t0 = 0; t0 < T && s == NSA_SUCCESS; t0 += op->win_chunk) {
        const int64_t t1 = T - t0 < op->win_chunk ? T : t0 + op->win_chunk;
        const ocl_rows rows = {op->win_scratch, -t0 * row, row, cfg->head_dim_v}; /* token t at scratch row t - t0 */
        s = run_sparse_attn(c, op, args, tb, branch, &rows, t0, t1);
        if (s == NSA_SUCCESS)
            s = branch == NSA_BRANCH_SLC ? run_combine_partial(c, op, args, &rows, t0, t1)
                                         : run_combine(c, op, args, &rows, t0, t1);
    }
    return s;
}

/* ---- backward (backward.cl) */

/* The arguments the rows and keys kernels share, up to their outputs. */
static void bwd_inputs(ocl_args *a, const nsa_bk_args *args, int b, size_t es)
{
    const nsa_bk_tensor *k = b == NSA_BRANCH_CMP ? &args->kc : &args->k[b];
    const nsa_bk_tensor *v = b == NSA_BRANCH_CMP ? &args->vc : &args->v[b];
    const size_t kes = b == NSA_BRANCH_CMP ? 4 : es;
    nsa_bk_tensor none = {0};
    ocl_arg_tensor(a, &args->q, es, 1);
    ocl_arg_tensor(a, &args->dout, es, 1);
    ocl_arg_tensor(a, &args->lse[b], 4, 1);
    ocl_arg_tensor(a, &args->gate[b], 4, 1);
    ocl_arg_tensor(a, b == NSA_BRANCH_SLC ? &args->indices : &none, 4, 1);
    ocl_arg_tensor(a, k, kes, 1);
    ocl_arg_tensor(a, v, kes, 1);
}

/* ... and after their outputs: the tables and the shape. */
static void bwd_shape(ocl_args *a, const tables *tb, const nsa_bk_plan *plan)
{
    const nsa_config *cfg = &plan->cfg;
    ocl_arg_mem(a, tb->mem);
    ocl_arg_long(a, tb->cu_seq);
    ocl_arg_long(a, tb->cu_k);
    ocl_arg_long(a, tb->cu_cmp);
    ocl_arg_long(a, tb->tok_seq);
    ocl_arg_long(a, plan->batch);
    ocl_arg_long(a, cfg->num_q_heads);
    ocl_arg_long(a, cfg->num_kv_heads);
    ocl_arg_long(a, cfg->head_dim_qk);
    ocl_arg_long(a, cfg->head_dim_v);
    ocl_arg_long(a, cfg->cmp_block);
    ocl_arg_long(a, cfg->cmp_stride);
    ocl_arg_long(a, cfg->slc_block);
    ocl_arg_long(a, cfg->num_selected);
    ocl_arg_long(a, cfg->window);
    ocl_arg_float(a, cfg->scale);
}

static nsa_status run_bwd_attn(ocl_context *c, ocl_plan *op, const nsa_bk_args *args, const tables *tb, int b)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    const size_t es = dtype_size(cfg->dtype), wg = op->wg_bwd;
    static const int rows_k[3] = {OCL_K_BWD_ROWS_CMP, OCL_K_BWD_ROWS_SLC, OCL_K_BWD_ROWS_WIN};
    static const int keys_k[3] = {OCL_K_BWD_KEYS_CMP, OCL_K_BWD_KEYS_SLC, OCL_K_BWD_KEYS_WIN};
    static const char *const rows_n[3] = {"bwd_rows_cmp", "bwd_rows_slc", "bwd_rows_win"};
    static const char *const keys_n[3] = {"bwd_keys_cmp", "bwd_keys_slc", "bwd_keys_win"};
    if (!args->q.buf || !args->dout.buf || !args->lse[b].buf || !args->gate[b].buf || !args->delta.buf ||
        (b == NSA_BRANCH_SLC && !args->indices.buf))
        return OCL_ERR(NSA_ERR_MISSING_TENSOR, "opencl: %s: a tensor it needs is absent", rows_n[b]);
    ocl_args a;
    ocl_args_begin(&a, op->prog->kernel[rows_k[b]], rows_n[b]);
    bwd_inputs(&a, args, b, es);
    ocl_arg_tensor(&a, &args->dq_acc, 4, 1);
    ocl_arg_int(&a, args->dq_acc.buf != NULL);
    ocl_arg_tensor(&a, &args->dgate[b], 4, 1);
    ocl_arg_int(&a, args->dgate[b].buf != NULL);
    ocl_arg_tensor(&a, &args->delta, 4, 1);
    bwd_shape(&a, tb, plan);
    cl_uint first = a.next;
    ocl_arg_long(&a, 0);
    ocl_arg_local(&a, wg * 4);
    ocl_arg_local(&a, wg * 4);
    ocl_arg_local(&a, wg * 8);
    nsa_status s = ocl_args_end(&a);
    if (s == NSA_SUCCESS)
        s = ocl_launch(c, a.kernel, a.kname, first, plan->total_tokens * cfg->num_q_heads, wg, 1);
    const nsa_bk_tensor *dk = b == NSA_BRANCH_CMP ? &args->dkc_acc : &args->dk_acc[b];
    const nsa_bk_tensor *dv = b == NSA_BRANCH_CMP ? &args->dvc_acc : &args->dv_acc[b];
    const int64_t nrows = b == NSA_BRANCH_CMP ? plan->total_cmp : plan->total_keys;
    if (s != NSA_SUCCESS || (!dk->buf && !dv->buf) || nrows == 0) return s;
    ocl_args_begin(&a, op->prog->kernel[keys_k[b]], keys_n[b]);
    bwd_inputs(&a, args, b, es);
    ocl_arg_tensor(&a, dk, 4, 1);
    ocl_arg_int(&a, dk->buf != NULL);
    ocl_arg_tensor(&a, dv, 4, 1);
    ocl_arg_int(&a, dv->buf != NULL);
    ocl_arg_tensor(&a, &args->delta, 4, 1);
    bwd_shape(&a, tb, plan);
    first = a.next;
    ocl_arg_long(&a, 0);
    ocl_arg_local(&a, wg * 4);
    ocl_arg_local(&a, wg * 4);
    if ((s = ocl_args_end(&a)) != NSA_SUCCESS) return s;
    return ocl_launch(c, a.kernel, a.kname, first, nrows * cfg->num_kv_heads, wg, 1);
}

/* An element-wise kernel's last arguments (total, first) and its launch, one work-item per element. */
static nsa_status launch_elem(ocl_context *c, ocl_plan *op, ocl_args *a, int64_t total)
{
    ocl_arg_long(a, total);
    const cl_uint first = a->next;
    ocl_arg_long(a, 0);
    nsa_status s = ocl_args_end(a);
    if (s != NSA_SUCCESS) return s;
    return ocl_launch(c, a->kernel, a->kname, first, ceil_div(total, (int64_t)op->wg_elem), op->wg_elem,
                      (int64_t)op->wg_elem);
}

static nsa_status run_bwd_compress(ocl_context *c, ocl_plan *op, const nsa_bk_args *args, const tables *tb)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    const size_t es = dtype_size(cfg->dtype);
    const int linear = cfg->compress == NSA_COMPRESS_LINEAR;
    if (plan->total_cmp == 0 || cfg->compress == NSA_COMPRESS_EXTERNAL) return NSA_SUCCESS;
    nsa_status s = NSA_SUCCESS;
    for (int side = 0; side < 2 && s == NSA_SUCCESS; side++) {
        const int64_t D = side ? cfg->head_dim_v : cfg->head_dim_qk;
        const nsa_bk_tensor *dc = side ? &args->dvc_acc : &args->dkc_acc, *dx = side ? &args->dv_acc[0] : &args->dk_acc[0];
        const nsa_bk_tensor *w = side ? &args->w_v : &args->w_k, *x = side ? &args->v[0] : &args->k[0];
        const nsa_bk_tensor *pe = side ? &args->pe_v : &args->pe_k;
        const nsa_bk_tensor *dw = side ? &args->dw_v_acc : &args->dw_k_acc, *dpe = side ? &args->dpe_v_acc : &args->dpe_k_acc;
        ocl_args a;
        if (dx->buf) {
            const int64_t total = plan->total_keys * cfg->num_kv_heads * D;
            ocl_args_begin(&a, op->prog->kernel[OCL_K_BWD_COMPRESS_ROWS], "bwd_compress_rows");
            ocl_arg_tensor(&a, dc, 4, 1);
            ocl_arg_tensor(&a, linear ? w : dc, linear ? es : 4, 0); /* MEAN: W is not read */
            ocl_arg_tensor(&a, dx, 4, 1);
            ocl_arg_int(&a, linear);
            ocl_arg_mem(&a, tb->mem);
            ocl_arg_long(&a, tb->cu_seq);
            ocl_arg_long(&a, tb->cu_k);
            ocl_arg_long(&a, tb->cu_cmp);
            ocl_arg_long(&a, tb->tok_seq);
            ocl_arg_long(&a, plan->batch);
            ocl_arg_long(&a, cfg->num_kv_heads);
            ocl_arg_long(&a, D);
            ocl_arg_long(&a, cfg->cmp_block);
            ocl_arg_long(&a, cfg->cmp_stride);
            s = launch_elem(c, op, &a, total);
        }
        if (s != NSA_SUCCESS || !linear || (!dw->buf && !dpe->buf)) continue;
        const int64_t total = cfg->num_kv_heads * cfg->cmp_block * D * D;
        ocl_args_begin(&a, op->prog->kernel[OCL_K_BWD_COMPRESS_W], "bwd_compress_w");
        ocl_arg_tensor(&a, x->buf ? x : dc, x->buf ? es : 4, 1);
        ocl_arg_tensor(&a, pe->buf ? pe : dc, pe->buf ? es : 4, 0);
        ocl_arg_int(&a, pe->buf != NULL);
        ocl_arg_tensor(&a, w, es, 0);
        ocl_arg_tensor(&a, dc, 4, 1);
        ocl_arg_tensor(&a, dw->buf ? dw : dc, 4, 0);
        ocl_arg_int(&a, dw->buf != NULL);
        ocl_arg_tensor(&a, dpe->buf ? dpe : dc, 4, 0);
        ocl_arg_int(&a, dpe->buf != NULL);
        ocl_arg_mem(&a, tb->mem);
        ocl_arg_long(&a, tb->cu_k); /* the kernel's cu_seq: compressed rows are of key rows */
        ocl_arg_long(&a, tb->cu_cmp);
        ocl_arg_long(&a, plan->batch);
        ocl_arg_long(&a, plan->total_cmp);
        ocl_arg_long(&a, cfg->num_kv_heads);
        ocl_arg_long(&a, D);
        ocl_arg_long(&a, cfg->cmp_block);
        ocl_arg_long(&a, cfg->cmp_stride);
        s = launch_elem(c, op, &a, total);
    }
    return s;
}

static nsa_status run_bwd_store(ocl_context *c, ocl_plan *op, const nsa_bk_args *args)
{
    for (int i = 0; i < args->num_store; i++) {
        const nsa_bk_store *st = &args->store[i];
        const int64_t total = st->rows * st->heads * st->dim;
        if (total == 0) continue;
        ocl_args a;
        /* f32 outputs of a non-f32 call: NSA_BACKWARD_FLOAT_KEY_GRADS */
        const int f32 = st->out.dtype == NSA_DTYPE_F32 && args->plan->cfg.dtype != NSA_DTYPE_F32;
        ocl_args_begin(&a, op->prog->kernel[f32 ? OCL_K_BWD_STORE_F32 : OCL_K_BWD_STORE],
                       f32 ? "bwd_store_f32" : "bwd_store");
        ocl_arg_tensor(&a, &st->acc, 4, 1);
        ocl_arg_tensor(&a, &st->out, dtype_size(st->out.dtype), 1);
        ocl_arg_long(&a, st->heads);
        ocl_arg_long(&a, st->dim);
        nsa_status s = launch_elem(c, op, &a, total);
        if (s != NSA_SUCCESS) return s;
    }
    return NSA_SUCCESS;
}

static nsa_status run_stage(ocl_context *c, ocl_plan *op, nsa_stage stage, const nsa_bk_args *args);

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* NSA_OPENCL_PROFILE=1: finish the queue around every stage and print its wall time
 * to stderr (a debugging aid; it makes run() blocking). */
nsa_status ocl_run(void *bctx, nsa_stage stage, const nsa_bk_args *args)
{
    ocl_context *c = bctx;
    ocl_plan *op = args->plan->backend_plan;
    const char *prof = getenv("NSA_OPENCL_PROFILE");
    if (!prof || !*prof || strcmp(prof, "0") == 0) return run_stage(c, op, stage, args);
    clFinish(c->queue);
    const double t0 = now_ms();
    nsa_status s = run_stage(c, op, stage, args);
    clFinish(c->queue);
    fprintf(stderr, "opencl: stage %-13s %9.3f ms\n", nsa_stage_name(stage), now_ms() - t0);
    return s;
}

static nsa_status run_stage(ocl_context *c, ocl_plan *op, nsa_stage stage, const nsa_bk_args *args)
{
    if (!op) return OCL_ERR(NSA_ERR_INTERNAL, "opencl: run(%d) on a plan that plan_prepare did not see", (int)stage);
    /* the decode stages read their lengths and page tables on the device (no plan tables) */
    if (stage == NSA_STAGE_DECODE_APPEND) return ocl_decode_append(c, op, args);
    if (stage == NSA_STAGE_DECODE_ATTN) return ocl_decode_attn(c, op, args);
    /* (a shard plan without queries still has its keys' zero gradients to store) */
    if (args->plan->total_tokens == 0 && args->plan->total_keys == 0) return NSA_SUCCESS;
    tables tb;
    nsa_status s = get_tables(args->plan, &tb);
    if (s != NSA_SUCCESS) return s;
    switch (stage) {
    case NSA_STAGE_COMPRESS: return run_compress(c, op, args, &tb);
    case NSA_STAGE_CMP_ATTN: return run_cmp_attn(c, op, args, &tb);
    case NSA_STAGE_BLOCK_SCORES: return run_block_scores(c, op, args, &tb);
    case NSA_STAGE_SELECT_TOPN: return run_select_topn(c, op, args, &tb);
    case NSA_STAGE_SCORES_TOPN: return run_scores_topn(c, op, args, &tb);
    case NSA_STAGE_SLC_ATTN: return run_sparse_attn(c, op, args, &tb, NSA_BRANCH_SLC, NULL, 0, args->plan->total_tokens);
    case NSA_STAGE_WIN_ATTN: return run_sparse_attn(c, op, args, &tb, NSA_BRANCH_WIN, NULL, 0, args->plan->total_tokens);
    case NSA_STAGE_COMBINE: return run_combine(c, op, args, NULL, 0, args->plan->total_tokens);
    case NSA_STAGE_WIN_COMBINE: return run_fused_runs(c, op, args, &tb, NSA_BRANCH_WIN);
    case NSA_STAGE_SLC_COMBINE: return run_fused_runs(c, op, args, &tb, NSA_BRANCH_SLC);
    case NSA_STAGE_BWD_CMP_ATTN: return run_bwd_attn(c, op, args, &tb, NSA_BRANCH_CMP);
    case NSA_STAGE_BWD_COMPRESS: return run_bwd_compress(c, op, args, &tb);
    case NSA_STAGE_BWD_SLC_ATTN: return run_bwd_attn(c, op, args, &tb, NSA_BRANCH_SLC);
    case NSA_STAGE_BWD_WIN_ATTN: return run_bwd_attn(c, op, args, &tb, NSA_BRANCH_WIN);
    case NSA_STAGE_BWD_STORE: return run_bwd_store(c, op, args);
    default:
        return OCL_ERR(NSA_ERR_UNSUPPORTED, "opencl: stage %d is not implemented by this backend", (int)stage);
    }
}
