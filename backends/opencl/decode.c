/*
 * decode.c: the decode stages on OpenCL (semantics section 10; kernels/opencl/decode.cl).
 *
 *   DECODE_APPEND  decode_check (one work-item) checks the step's lengths and page
 *                  tables where they are, in the device's memory, and writes the
 *                  plan's verdict buffer and the caller's status tensor; then
 *                  decode_store copies the new tokens' k, v into each distinct raw
 *                  cache and (MEAN, LINEAR) decode_compress forms the compressed
 *                  rows the step completes. Those kernels read the verdict and do
 *                  nothing when a check failed, so a bad step writes nothing.
 *   DECODE_ATTN    decode_cmp_attn, decode_scores_topn (n > 0), decode_slc_attn
 *                  (n > 0), decode_win_attn (w > 0), decode_combine: the forward's
 *                  per-row computations (softmax.cl's version 1 chunk loop,
 *                  scores_topn's sums and ranking) with keys read through the page
 *                  tables; each reads the verdict first too.
 *
 * The host never reads the step's data: run() only queues. nsa_decode_check (the
 * core, after synchronizing) calls ocl_decode_status, which reads the verdict back
 * and turns it into the named status and the message the cpu reference gives.
 * Work decomposition: one work-group per (packed row, query head) for attention,
 * per (packed row, KV group) for scores and top-n, over lim.max_total_tokens rows
 * (groups past the step's rows return at once); element-wise kernels otherwise.
 */
#include <stdio.h>
#include <string.h>

#include "checked.h"
#include "opencl_internal.h"

/* The verdict's layout (decode.cl's DV_*). */
enum { DV_STATUS, DV_SEQ, DV_CODE, DV_COL, DV_VALUE, DV_COUNT, DV_CU0, DV_CU1, DV_TK0, DV_SIZE = 16 };

static size_t es_of(nsa_dtype d) { return d == NSA_DTYPE_F32 ? 4 : 2; }

/* decode_slc_attn's local memory (the largest of the three attention kernels): qs, acc,
 * p, red, row (softmax.cl) and blk. */
static size_t dec_attn_bytes(const nsa_config *cfg, size_t wg)
{
    return (size_t)(cfg->head_dim_qk + cfg->head_dim_v + cfg->num_selected + 1) * 4 + wg * 16;
}

int ocl_decode_supports(ocl_context *c, const nsa_config *cfg)
{
    size_t kt, jc;
    return cfg->num_selected == 0 || ocl_scores_topn_tile(c, cfg, &kt, &jc);
}

/* A kernel's work-group size: at most `want` and its CL_KERNEL_WORK_GROUP_SIZE, a power of two. */
static size_t fit_wg(const ocl_plan *op, size_t want, int kid)
{
    size_t wg = want;
    while (wg > 1 && op->prog->kernel_wg[kid] && wg > op->prog->kernel_wg[kid]) wg /= 2;
    return wg;
}

nsa_status ocl_decode_prepare(ocl_context *c, const nsa_bk_plan *plan, ocl_plan *op)
{
    const nsa_config *cfg = &plan->cfg;
    const nsa_decode_limits *lim = &plan->lim;
    /* attention: the forward's version 1 size (op->wg_attn, local memory checked),
     * within the decode kernels' own limits */
    size_t wg = op->wg_attn;
    wg = fit_wg(op, wg, OCL_K_DECODE_CMP_ATTN);
    wg = fit_wg(op, wg, OCL_K_DECODE_SLC_ATTN);
    wg = fit_wg(op, wg, OCL_K_DECODE_WIN_ATTN);
    while (wg > 1 && dec_attn_bytes(cfg, wg) > c->local_mem) wg /= 2;
    if (wg == 0 || dec_attn_bytes(cfg, wg) > c->local_mem)
        return OCL_ERR(NSA_ERR_UNSUPPORTED, "opencl: the decode attention kernels' local memory (Dqk = %lld, Dv = "
                       "%lld) does not fit %s (%llu bytes)", (long long)cfg->head_dim_qk, (long long)cfg->head_dim_v,
                       c->device_name, (unsigned long long)c->local_mem);
    op->wg_dec_attn = wg;
    if (cfg->num_selected > 0) {
        size_t kt, jc;
        if (!ocl_scores_topn_tile(c, cfg, &kt, &jc))
            return OCL_ERR(NSA_ERR_UNSUPPORTED, "opencl: decode_scores_topn's tile does not fit %s's local memory",
                           c->device_name);
        op->kt_dec = (int64_t)kt;
        op->jc_dec = (int64_t)jc;
        op->wg_dec_scores = fit_wg(op, 256, OCL_K_DECODE_SCORES_TOPN);
    }
    op->wg_elem = fit_wg(op, op->wg_elem, OCL_K_DECODE_STORE);
    op->wg_elem = fit_wg(op, op->wg_elem, OCL_K_DECODE_COMPRESS);
    op->wg_elem = fit_wg(op, op->wg_elem, OCL_K_DECODE_COMBINE);
    /* the verdict (zeros: NSA_SUCCESS before the first step) and the page counts */
    cl_int err;
    int32_t zero[DV_SIZE];
    memset(zero, 0, sizeof zero);
    zero[DV_SEQ] = -1;
    op->dec_verdict = clCreateBuffer(c->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zero, zero, &err);
    if (!op->dec_verdict) return ocl_fail(err, "clCreateBuffer (decode verdict)");
    size_t cnt_bytes;
    int64_t pages;
    if (nsa_ck_add(lim->num_pages, lim->num_cmp_pages, &pages) || nsa_ck_bytes(pages, 4, &cnt_bytes))
        return OCL_ERR(NSA_ERR_INVALID_SHAPE, "opencl: a decode plan's page counts (%lld + %lld pages) overflow",
                       (long long)lim->num_pages, (long long)lim->num_cmp_pages);
    op->dec_count = clCreateBuffer(c->context, CL_MEM_READ_WRITE, cnt_bytes, NULL, &err);
    if (!op->dec_count) return ocl_fail(err, "clCreateBuffer (decode page counts)");
    op->bytes += sizeof zero + cnt_bytes;
    return NSA_SUCCESS;
}

void ocl_decode_release(ocl_plan *op)
{
    if (op->dec_verdict) clReleaseMemObject(op->dec_verdict);
    if (op->dec_count) clReleaseMemObject(op->dec_count);
    op->dec_verdict = op->dec_count = NULL;
}

/* An int32 table as (mem, element offset, row stride); absent: NULL and zeros. */
static void arg_table(ocl_args *a, const nsa_bk_tensor *t, int row_stride)
{
    ocl_arg_tensor(a, t, 4, 0);
    if (row_stride) ocl_arg_long(a, t->buf ? t->stride_token : 0);
}

/* The arguments every kernel after decode_check has: cu_seqlens_q, cache_seqlens,
 * one page table (or none) and the verdict. */
static void step_args(ocl_args *a, const nsa_bk_args *args, const nsa_bk_tensor *table, const ocl_plan *op)
{
    arg_table(a, &args->dec_cu_seqlens_q, 0);
    arg_table(a, &args->dec_cache_seqlens, 0);
    if (table) arg_table(a, table, 1);
    ocl_arg_mem(a, op->dec_verdict);
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The last arguments of an element-wise kernel (total, first) and its launch. */
static nsa_status launch_elem(ocl_context *c, const ocl_plan *op, ocl_args *a, int64_t total)
{
    ocl_arg_long(a, total);
    const cl_uint first = a->next;
    ocl_arg_long(a, 0);
    nsa_status s = ocl_args_end(a);
    if (s != NSA_SUCCESS || total == 0) return s;
    return ocl_launch(c, a->kernel, a->kname, first, cdiv(total, (int64_t)op->wg_elem), op->wg_elem,
                      (int64_t)op->wg_elem);
}

static int same_cache(const nsa_bk_tensor *x, const nsa_bk_tensor *y)
{
    return x->buf && x->buf == y->buf && x->offset == y->offset && x->stride_token == y->stride_token &&
           x->stride_head == y->stride_head;
}

/* ------------------------------------------------------------------ DECODE_APPEND */

/* Every tensor of both stages whose buffer offset is not a whole number of elements is
 * refused here, before anything is queued (ocl_arg_tensor would refuse it later, after
 * the step had written part of the caches). */
static nsa_status check_alignment(const nsa_bk_args *args, size_t es)
{
    const struct {
        const nsa_bk_tensor *t;
        size_t size;
        const char *name;
    } all[] = {
        {&args->q, es, "q"}, {&args->o, es, "o"}, {&args->w_k, es, "w_k"}, {&args->w_v, es, "w_v"},
        {&args->pe_k, es, "pe_k"}, {&args->pe_v, es, "pe_v"}, {&args->indices, 4, "indices"},
        {&args->dec_cu_seqlens_q, 4, "cu_seqlens_q"}, {&args->dec_cache_seqlens, 4, "cache_seqlens"},
        {&args->dec_block_table, 4, "block_table"}, {&args->dec_cmp_block_table, 4, "cmp_block_table"},
        {&args->dec_kc_cache, es, "kc_cache"}, {&args->dec_vc_cache, es, "vc_cache"},
        {&args->dec_status, 4, "status"},
        {&args->k[0], es, "k"}, {&args->k[1], es, "k"}, {&args->k[2], es, "k"},
        {&args->v[0], es, "v"}, {&args->v[1], es, "v"}, {&args->v[2], es, "v"},
        {&args->dec_k_cache[0], es, "k_cache"}, {&args->dec_k_cache[1], es, "k_cache"},
        {&args->dec_k_cache[2], es, "k_cache"}, {&args->dec_v_cache[0], es, "v_cache"},
        {&args->dec_v_cache[1], es, "v_cache"}, {&args->dec_v_cache[2], es, "v_cache"},
        {&args->gate[0], 4, "gate"}, {&args->gate[1], 4, "gate"}, {&args->gate[2], 4, "gate"},
        {&args->lse[0], 4, "lse"}, {&args->lse[1], 4, "lse"}, {&args->lse[2], 4, "lse"},
        {&args->o_b[0], 4, "o_b"}, {&args->o_b[1], 4, "o_b"}, {&args->o_b[2], 4, "o_b"},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const nsa_bk_tensor *t = all[i].t;
        if (t->buf && ocl_tensor_elem_offset(t, all[i].size) < 0)
            return OCL_ERR(NSA_ERR_UNSUPPORTED,
                           "opencl: nsa_decode: %s's buffer starts at byte offset %zu, not a multiple of its element "
                           "size %zu (the step was not queued)",
                           all[i].name, ((const ocl_buffer *)t->buf)->offset, all[i].size);
    }
    return NSA_SUCCESS;
}

nsa_status ocl_decode_append(ocl_context *c, ocl_plan *op, const nsa_bk_args *args)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    const nsa_decode_limits *lim = &plan->lim;
    const size_t es = es_of(cfg->dtype);
    const int64_t B = lim->batch, hkv = cfg->num_kv_heads, MT = lim->max_total_tokens;
    const int forms = cfg->compress != NSA_COMPRESS_EXTERNAL;
    if (!plan->decode || !op->dec_verdict)
        return OCL_ERR(NSA_ERR_INTERNAL, "opencl: decode_append on a plan without decode scratch");
    nsa_status s = check_alignment(args, es);
    if (s != NSA_SUCCESS) return s;
    ocl_args a;
    /* 1. the checks */
    ocl_args_begin(&a, op->prog->kernel[OCL_K_DECODE_CHECK], "decode_check");
    arg_table(&a, &args->dec_cu_seqlens_q, 0);
    arg_table(&a, &args->dec_cache_seqlens, 0);
    arg_table(&a, &args->dec_block_table, 1);
    arg_table(&a, &args->dec_cmp_block_table, 1);
    ocl_arg_mem(&a, op->dec_count);
    ocl_arg_long(&a, lim->num_pages);
    ocl_arg_long(&a, lim->num_cmp_pages);
    ocl_arg_mem(&a, op->dec_verdict);
    arg_table(&a, &args->dec_status, 0);
    ocl_arg_int(&a, args->dec_status.buf != NULL);
    ocl_arg_long(&a, B);
    ocl_arg_long(&a, MT);
    ocl_arg_long(&a, lim->max_step_tokens);
    ocl_arg_long(&a, lim->max_context);
    ocl_arg_long(&a, lim->page_size);
    ocl_arg_long(&a, lim->max_pages);
    ocl_arg_long(&a, lim->cmp_page_size);
    ocl_arg_long(&a, lim->max_cmp_pages);
    ocl_arg_long(&a, cfg->cmp_block);
    ocl_arg_long(&a, cfg->cmp_stride);
    ocl_arg_int(&a, forms);
    ocl_arg_int(&a, (int)NSA_ERR_INVALID_SHAPE);
    ocl_arg_int(&a, (int)NSA_ERR_INVALID_VALUE);
    cl_uint first = a.next;
    ocl_arg_long(&a, 0);
    if ((s = ocl_args_end(&a)) != NSA_SUCCESS) return s;
    if ((s = ocl_launch(c, a.kernel, a.kname, first, 1, 1, 1)) != NSA_SUCCESS) return s;

    /* 2. the new tokens into each distinct raw cache, once */
    for (int br = 0; br < 3; br++) {
        if (!args->dec_k_cache[br].buf) continue;
        for (int kv = 0; kv < 2; kv++) {
            const nsa_bk_tensor *cache = kv ? &args->dec_v_cache[br] : &args->dec_k_cache[br];
            int dup = 0;
            for (int e = 0; e < br; e++) dup |= same_cache(kv ? &args->dec_v_cache[e] : &args->dec_k_cache[e], cache);
            if (dup) continue;
            const int64_t D = kv ? cfg->head_dim_v : cfg->head_dim_qk;
            ocl_args_begin(&a, op->prog->kernel[OCL_K_DECODE_STORE], "decode_store");
            ocl_arg_tensor(&a, kv ? &args->v[br] : &args->k[br], es, 1);
            ocl_arg_tensor(&a, cache, es, 1);
            step_args(&a, args, &args->dec_block_table, op);
            ocl_arg_long(&a, B);
            ocl_arg_long(&a, hkv);
            ocl_arg_long(&a, D);
            ocl_arg_long(&a, lim->page_size);
            if ((s = launch_elem(c, op, &a, MT * hkv * D)) != NSA_SUCCESS) return s;
        }
    }

    /* 3. (MEAN, LINEAR) the compressed rows the step completes */
    if (!forms || plan->max_nc == 0) return NSA_SUCCESS;
    const int linear = cfg->compress == NSA_COMPRESS_LINEAR;
    int64_t maxnew = lim->max_step_tokens / cfg->cmp_stride + 1; /* Nc(TK) - Nc(TK0) <= ceil(TQ / d) */
    if (maxnew > plan->max_nc) maxnew = plan->max_nc;
    for (int kv = 0; kv < 2; kv++) {
        const int64_t D = kv ? cfg->head_dim_v : cfg->head_dim_qk;
        const nsa_bk_tensor *w = kv ? &args->w_v : &args->w_k, *pe = kv ? &args->pe_v : &args->pe_k;
        const nsa_bk_tensor *x = kv ? &args->dec_v_cache[NSA_BRANCH_CMP] : &args->dec_k_cache[NSA_BRANCH_CMP];
        const int64_t f[4] = {B, maxnew, hkv, D};
        int64_t total;
        if (nsa_ck_prod(f, 4, &total))
            return OCL_ERR(NSA_ERR_INVALID_SHAPE, "opencl: decode_compress's %lld x %lld x %lld x %lld work-items "
                           "overflow 64 bits", (long long)B, (long long)maxnew, (long long)hkv, (long long)D);
        ocl_args_begin(&a, op->prog->kernel[OCL_K_DECODE_COMPRESS], "decode_compress");
        ocl_arg_tensor(&a, x, es, 1);
        ocl_arg_tensor(&a, kv ? &args->dec_vc_cache : &args->dec_kc_cache, es, 1);
        ocl_arg_tensor(&a, linear ? w : x, es, 0); /* MEAN: W and pe are not read */
        ocl_arg_tensor(&a, linear && pe->buf ? pe : x, es, 0);
        ocl_arg_int(&a, linear && pe->buf != NULL);
        ocl_arg_int(&a, linear);
        arg_table(&a, &args->dec_cu_seqlens_q, 0);
        arg_table(&a, &args->dec_cache_seqlens, 0);
        arg_table(&a, &args->dec_block_table, 1);
        arg_table(&a, &args->dec_cmp_block_table, 1);
        ocl_arg_mem(&a, op->dec_verdict);
        ocl_arg_long(&a, B);
        ocl_arg_long(&a, hkv);
        ocl_arg_long(&a, D);
        ocl_arg_long(&a, cfg->cmp_block);
        ocl_arg_long(&a, cfg->cmp_stride);
        ocl_arg_long(&a, lim->page_size);
        ocl_arg_long(&a, lim->cmp_page_size);
        ocl_arg_long(&a, maxnew);
        if ((s = launch_elem(c, op, &a, total)) != NSA_SUCCESS) return s;
    }
    return NSA_SUCCESS;
}

/* ------------------------------------------------------------------ DECODE_ATTN */

/* softmax.cl's local arrays (qs, acc, p, red, row) */
static void attn_local_args(ocl_args *a, const nsa_config *cfg, size_t wg)
{
    ocl_arg_local(a, (size_t)cfg->head_dim_qk * 4);
    ocl_arg_local(a, (size_t)cfg->head_dim_v * 4);
    ocl_arg_local(a, wg * 4);
    ocl_arg_local(a, wg * 4);
    ocl_arg_local(a, wg * 8);
}

nsa_status ocl_decode_attn(ocl_context *c, ocl_plan *op, const nsa_bk_args *args)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    const nsa_decode_limits *lim = &plan->lim;
    const size_t es = es_of(cfg->dtype), wg = op->wg_dec_attn;
    const int64_t B = lim->batch, hq = cfg->num_q_heads, hkv = cfg->num_kv_heads, MT = lim->max_total_tokens;
    const int64_t n = cfg->num_selected;
    if (!plan->decode || !op->dec_verdict)
        return OCL_ERR(NSA_ERR_INTERNAL, "opencl: decode_attn on a plan without decode scratch");
    if (!args->lse[NSA_BRANCH_CMP].buf || !args->o_b[NSA_BRANCH_CMP].buf || (n > 0 && !args->indices.buf))
        return OCL_ERR(NSA_ERR_MISSING_TENSOR, "opencl: decode_attn: lse[cmp], o_b[cmp] or indices is absent");
    nsa_status s;
    ocl_args a;
    cl_uint first;

    /* compressed attention (always: a row with nc = 0 gets 0 and -inf) */
    ocl_args_begin(&a, op->prog->kernel[OCL_K_DECODE_CMP_ATTN], "decode_cmp_attn");
    ocl_arg_tensor(&a, &args->q, es, 1);
    ocl_arg_tensor(&a, &args->dec_kc_cache, es, 1);
    ocl_arg_tensor(&a, &args->dec_vc_cache, es, 1);
    ocl_arg_tensor(&a, &args->o_b[NSA_BRANCH_CMP], 4, 1);
    ocl_arg_tensor(&a, &args->lse[NSA_BRANCH_CMP], 4, 1);
    step_args(&a, args, &args->dec_cmp_block_table, op);
    ocl_arg_long(&a, B);
    ocl_arg_long(&a, hq);
    ocl_arg_long(&a, hkv);
    ocl_arg_long(&a, cfg->head_dim_qk);
    ocl_arg_long(&a, cfg->head_dim_v);
    ocl_arg_long(&a, cfg->cmp_block);
    ocl_arg_long(&a, cfg->cmp_stride);
    ocl_arg_long(&a, lim->cmp_page_size);
    ocl_arg_float(&a, cfg->scale);
    first = a.next;
    ocl_arg_long(&a, 0);
    attn_local_args(&a, cfg, wg);
    if ((s = ocl_args_end(&a)) != NSA_SUCCESS || (s = ocl_launch(c, a.kernel, a.kname, first, MT * hq, wg, 1)))
        return s;

    if (n > 0) {
        /* block scores and top-n, then selected attention */
        const size_t kt = (size_t)op->kt_dec, jc = (size_t)op->jc_dec;
        const int64_t pc = (int64_t)((jc * (size_t)cfg->slc_block + (size_t)cfg->cmp_block) / (size_t)cfg->cmp_stride + 2);
        ocl_args_begin(&a, op->prog->kernel[OCL_K_DECODE_SCORES_TOPN], "decode_scores_topn");
        ocl_arg_tensor(&a, &args->q, es, 1);
        ocl_arg_tensor(&a, &args->dec_kc_cache, es, 1);
        ocl_arg_tensor(&a, &args->lse[NSA_BRANCH_CMP], 4, 1);
        ocl_arg_tensor(&a, &args->indices, 4, 1);
        step_args(&a, args, &args->dec_cmp_block_table, op);
        ocl_arg_long(&a, B);
        ocl_arg_long(&a, hq);
        ocl_arg_long(&a, hkv);
        ocl_arg_long(&a, cfg->head_dim_qk);
        ocl_arg_long(&a, cfg->cmp_block);
        ocl_arg_long(&a, cfg->cmp_stride);
        ocl_arg_long(&a, cfg->slc_block);
        ocl_arg_long(&a, lim->cmp_page_size);
        ocl_arg_float(&a, cfg->scale);
        ocl_arg_long(&a, n);
        ocl_arg_long(&a, cfg->num_init);
        ocl_arg_long(&a, cfg->num_local);
        first = a.next;
        ocl_arg_long(&a, 0);
        ocl_arg_long(&a, (int64_t)kt);
        ocl_arg_long(&a, (int64_t)jc);
        ocl_arg_long(&a, pc);
        ocl_arg_local(&a, ocl_scores_topn_bytes(cfg, kt, jc));
        if ((s = ocl_args_end(&a)) != NSA_SUCCESS ||
            (s = ocl_launch(c, a.kernel, a.kname, first, MT * hkv, op->wg_dec_scores, 1)))
            return s;

        ocl_args_begin(&a, op->prog->kernel[OCL_K_DECODE_SLC_ATTN], "decode_slc_attn");
        ocl_arg_tensor(&a, &args->q, es, 1);
        ocl_arg_tensor(&a, &args->dec_k_cache[NSA_BRANCH_SLC], es, 1);
        ocl_arg_tensor(&a, &args->dec_v_cache[NSA_BRANCH_SLC], es, 1);
        ocl_arg_tensor(&a, &args->indices, 4, 1);
        ocl_arg_tensor(&a, &args->o_b[NSA_BRANCH_SLC], 4, 1);
        ocl_arg_tensor(&a, &args->lse[NSA_BRANCH_SLC], 4, 1);
        ocl_arg_int(&a, args->lse[NSA_BRANCH_SLC].buf != NULL);
        step_args(&a, args, &args->dec_block_table, op);
        ocl_arg_long(&a, B);
        ocl_arg_long(&a, hq);
        ocl_arg_long(&a, hkv);
        ocl_arg_long(&a, cfg->head_dim_qk);
        ocl_arg_long(&a, cfg->head_dim_v);
        ocl_arg_long(&a, cfg->slc_block);
        ocl_arg_long(&a, n);
        ocl_arg_long(&a, lim->page_size);
        ocl_arg_float(&a, cfg->scale);
        first = a.next;
        ocl_arg_long(&a, 0);
        attn_local_args(&a, cfg, wg);
        ocl_arg_local(&a, (size_t)(n + 1) * 4); /* blk: count + usable blocks */
        if ((s = ocl_args_end(&a)) != NSA_SUCCESS || (s = ocl_launch(c, a.kernel, a.kname, first, MT * hq, wg, 1)))
            return s;
    }

    if (cfg->window > 0) {
        ocl_args_begin(&a, op->prog->kernel[OCL_K_DECODE_WIN_ATTN], "decode_win_attn");
        ocl_arg_tensor(&a, &args->q, es, 1);
        ocl_arg_tensor(&a, &args->dec_k_cache[NSA_BRANCH_WIN], es, 1);
        ocl_arg_tensor(&a, &args->dec_v_cache[NSA_BRANCH_WIN], es, 1);
        ocl_arg_tensor(&a, &args->o_b[NSA_BRANCH_WIN], 4, 1);
        ocl_arg_tensor(&a, &args->lse[NSA_BRANCH_WIN], 4, 1);
        ocl_arg_int(&a, args->lse[NSA_BRANCH_WIN].buf != NULL);
        step_args(&a, args, &args->dec_block_table, op);
        ocl_arg_long(&a, B);
        ocl_arg_long(&a, hq);
        ocl_arg_long(&a, hkv);
        ocl_arg_long(&a, cfg->head_dim_qk);
        ocl_arg_long(&a, cfg->head_dim_v);
        ocl_arg_long(&a, cfg->window);
        ocl_arg_long(&a, lim->page_size);
        ocl_arg_float(&a, cfg->scale);
        first = a.next;
        ocl_arg_long(&a, 0);
        attn_local_args(&a, cfg, wg);
        if ((s = ocl_args_end(&a)) != NSA_SUCCESS || (s = ocl_launch(c, a.kernel, a.kname, first, MT * hq, wg, 1)))
            return s;
    }

    /* the gated sum into o, the step's rows only */
    ocl_args_begin(&a, op->prog->kernel[OCL_K_DECODE_COMBINE], "decode_combine");
    for (int b = 0; b < 3; ++b) ocl_arg_tensor(&a, &args->o_b[b], 4, 1);
    for (int b = 0; b < 3; ++b) {
        nsa_bk_tensor none = {0}; /* a disabled branch's gate is not read */
        ocl_arg_tensor(&a, args->o_b[b].buf ? &args->gate[b] : &none, 4, 1);
    }
    for (int b = 0; b < 3; ++b) ocl_arg_int(&a, args->o_b[b].buf != NULL);
    ocl_arg_tensor(&a, &args->o, es, 1);
    arg_table(&a, &args->dec_cu_seqlens_q, 0);
    ocl_arg_mem(&a, op->dec_verdict);
    ocl_arg_long(&a, B);
    ocl_arg_long(&a, hq);
    ocl_arg_long(&a, cfg->head_dim_v);
    return launch_elem(c, op, &a, MT * hq * cfg->head_dim_v);
}

/* ------------------------------------------------------------------ the step's status */

nsa_status ocl_decode_status(void *bctx, const nsa_bk_plan *plan)
{
    ocl_context *c = bctx;
    const ocl_plan *op = plan->backend_plan;
    if (!plan->decode || !op || !op->dec_verdict)
        return OCL_ERR(NSA_ERR_INTERNAL, "opencl: decode_status on a plan without a decode step");
    int32_t v[DV_SIZE];
    cl_int err = clEnqueueReadBuffer(c->queue, op->dec_verdict, CL_TRUE, 0, sizeof v, v, 0, NULL, NULL);
    if (err != CL_SUCCESS) return ocl_fail(err, "clEnqueueReadBuffer (decode verdict)");
    if (v[DV_STATUS] == 0) return NSA_SUCCESS;
    const nsa_status st = (nsa_status)v[DV_STATUS];
    const nsa_decode_limits *lim = &plan->lim;
    const long long b = v[DV_SEQ], x = v[DV_COL], e = v[DV_VALUE], ps = lim->page_size, cps = lim->cmp_page_size;
    static const char *const why[] = {
        [2] = "cu_seqlens_q decreases",
        [3] = "cu_seqlens_q passes the plan's max_total_tokens",
        [4] = "its TQ exceeds the plan's max_step_tokens",
        [5] = "cache_seqlens (TK0) is negative",
        [6] = "TK = TK0 + TQ exceeds the plan's max_context",
        [7] = "TK = TK0 + TQ does not fit its max_pages pages of page_size positions",
        [8] = "its Nc(TK) compressed rows do not fit max_cmp_pages pages of cmp_page_size rows",
    };
    const int code = v[DV_CODE];
    if (code == 1)
        return OCL_ERR(st, "nsa_decode: cu_seqlens_q[0] = %d, but it must be 0", (int)e);
    if (code >= 2 && code <= 8) {
        const long long tq = (long long)v[DV_CU1] - v[DV_CU0], tk0 = v[DV_TK0];
        return OCL_ERR(st,
                       "nsa_decode: sequence %lld: %s (cu_seqlens_q[%lld] = %d, cu_seqlens_q[%lld] = %d, TQ = %lld, "
                       "TK0 = %lld, TK = %lld; limits: max_step_tokens %lld, max_total_tokens %lld, max_context "
                       "%lld, max_pages %lld x page_size %lld, max_cmp_pages %lld x cmp_page_size %lld)",
                       b, why[code], b, (int)v[DV_CU0], b + 1, (int)v[DV_CU1], tq, tk0, tk0 + tq,
                       (long long)lim->max_step_tokens, (long long)lim->max_total_tokens,
                       (long long)lim->max_context, (long long)lim->max_pages, ps, (long long)lim->max_cmp_pages,
                       cps);
    }
    if (code == 9)
        return OCL_ERR(st, "nsa_decode: block_table[%lld][%lld] = %d is outside [0, num_pages = %lld) (sequence %lld "
                       "reads or writes positions %lld .. %lld there)",
                       b, x, (int)e, (long long)lim->num_pages, b, x * ps, x * ps + ps - 1);
    if (code == 10)
        return OCL_ERR(st, "nsa_decode: cmp_block_table[%lld][%lld] = %d is outside [0, num_cmp_pages = %lld) "
                       "(sequence %lld reads or writes compressed rows %lld .. %lld there)",
                       b, x, (int)e, (long long)lim->num_cmp_pages, b, x * cps, x * cps + cps - 1);
    if (code == 11)
        return OCL_ERR(st, "nsa_decode: block_table[%lld][%lld] = %d: sequence %lld writes positions there, but page "
                       "%d appears %d times in the batch's page tables (a page the step writes must belong to one "
                       "sequence)",
                       b, x, (int)e, b, (int)e, (int)v[DV_COUNT]);
    if (code == 12)
        return OCL_ERR(st, "nsa_decode: cmp_block_table[%lld][%lld] = %d: sequence %lld writes compressed rows there, "
                       "but page %d appears %d times in the batch's compressed page tables (a page the step writes "
                       "must belong to one sequence)",
                       b, x, (int)e, b, (int)e, (int)v[DV_COUNT]);
    return OCL_ERR(NSA_ERR_INTERNAL, "opencl: a decode step's verdict is unknown (status %d, check %d, sequence %lld)",
                   (int)st, code, b);
}
