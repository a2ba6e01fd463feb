/*
 * compress_linear.c: LINEAR compression through CLBlast GEMMs (f32 throughout), in
 * a module built with CLBlast (NSA_OPENCL_CLBLAST); without it, the compress_linear
 * kernel of compress.cl runs instead (stages.c) and this file is the stubs.
 *
 * For KV head g, compressed row i of a sequence is
 *     kc_i = sum_{j<l} (k[i*d + j] + pe[g, j]) @ W[g, j]
 *          = pe_g(flat, 1 x l*D) @ W_g(l*D x D)  +  X_i(1 x l*D) @ W_g
 * where X_i is the block of l tokens flattened. The first term does not depend on i:
 * it is one small GEMM per head into `bias`. For the second, the l tokens of block i
 * are l/d sub-blocks of d tokens, sub-block p starting at token (i + p) * d. With the
 * keys copied head-major into stage_x[g][t][:] (f32), sub-block p of rows i = 0..Nc-1
 * is a plain row-major matrix: first element (cu_seqlens_k[b] + p*d) * D, leading
 * dimension d*D, d*D columns. So
 *     kc[rows of b, g, :] = bias[g] + sum_{p < l/d} A_p(Nc x d*D) @ W_g[p*d*D .. , :]
 * = l/d GEMMs per (sequence, head), accumulated into kc in a fixed order (beta = 1):
 * deterministic. The inputs are converted to f32 first (stage_heads, convert_dense)
 * because CLBlast's half needs cl_khr_fp16 and it has no bf16. For f16 / bf16 a last
 * element-wise pass (round_rows) rounds the f32 sums of kc once to the dtype: kc / vc
 * are tensors of the call's dtype (semantics section 7).
 *
 * CLBlast's temporary buffer is sized in plan_prepare (for the largest of the plan's
 * GEMMs) and passed to every call, so run() allocates nothing itself.
 */
#include <stdio.h>

#include "opencl_internal.h"

#ifndef NSA_OPENCL_CLBLAST
/* Built without CLBlast: stages.c runs the compress_linear kernel (compress.cl),
 * which needs no scratch. */
const char *ocl_linear_engine(void) { return "built-in kernel"; }
nsa_status ocl_linear_prepare(ocl_context *c, const nsa_bk_plan *plan, ocl_plan *op)
{
    (void)c;
    (void)plan;
    (void)op;
    return NSA_SUCCESS;
}
void ocl_linear_forget(ocl_context *c) { (void)c; }
nsa_status ocl_linear_run(ocl_context *c, const nsa_bk_args *args, ocl_plan *op)
{
    (void)c;
    (void)args;
    (void)op;
    return OCL_ERR(NSA_ERR_INTERNAL, "opencl: the CLBlast LINEAR path in a module built without CLBlast");
}
#else
#include <clblast_c.h>

const char *ocl_linear_engine(void) { return "CLBlast"; }


static size_t dtype_size(nsa_dtype d) { return d == NSA_DTYPE_F32 ? 4 : 2; }

static nsa_status clblast_fail(CLBlastStatusCode st, const char *what)
{
    if (st == CLBlastOpenCLBuildProgramFailure)
        return OCL_ERR(NSA_ERR_KERNEL_BUILD, "opencl: CLBlast could not build its %s kernels (status %d)", what,
                       (int)st);
    if (st == CLBlastTempBufferAllocFailure || st == CLBlastOpenCLOutOfHostMemory)
        return OCL_ERR(NSA_ERR_OUT_OF_MEMORY, "opencl: CLBlast %s: out of memory (status %d)", what, (int)st);
    return OCL_ERR(NSA_ERR_DEVICE, "opencl: CLBlast %s failed with status %d", what, (int)st);
}

static cl_mem alloc_f32(ocl_context *c, size_t elems, nsa_status *s, const char *what)
{
    cl_int err;
    cl_mem m = clCreateBuffer(c->context, CL_MEM_READ_WRITE, (elems ? elems : 1) * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS) {
        *s = OCL_ERR(NSA_ERR_OUT_OF_MEMORY, "opencl: LINEAR compression scratch (%s, %zu floats): %d (%s)", what,
                     elems, (int)err, ocl_error_name(err));
        return NULL;
    }
    return m;
}

nsa_status ocl_linear_prepare(ocl_context *c, const nsa_bk_plan *plan, ocl_plan *op)
{
    const nsa_config *cfg = &plan->cfg;
    const size_t H = (size_t)cfg->num_kv_heads, l = (size_t)cfg->cmp_block, d = (size_t)cfg->cmp_stride;
    const size_t D = (size_t)(cfg->head_dim_qk > cfg->head_dim_v ? cfg->head_dim_qk : cfg->head_dim_v);
    const size_t T = (size_t)plan->total_keys; /* rows of k, v */
    nsa_status s = NSA_SUCCESS;
    c->used_clblast = 1;
    if (!(op->stage_x = alloc_f32(c, H * T * D, &s, "stage_x"))) return s;
    if (!(op->stage_w = alloc_f32(c, H * l * D * D, &s, "stage_w"))) return s;
    if (!(op->stage_pe = alloc_f32(c, H * l * D, &s, "stage_pe"))) return s;
    if (!(op->bias = alloc_f32(c, H * D, &s, "bias"))) return s;

    /* The temporary buffer: the largest CLBlast asks for over our GEMM shapes, with
     * nonzero offsets so that the answer covers copies of all three matrices. */
    size_t need = 0;
    for (int kv = 0; kv < 2; ++kv) {
        const size_t Dk = (size_t)(kv ? cfg->head_dim_v : cfg->head_dim_qk);
        const size_t m_main = plan->max_nc > 0 ? (size_t)plan->max_nc : 1;
        const size_t shapes[2][4] = {{m_main, Dk, d * Dk, d * Dk}, {1, Dk, l * Dk, l * Dk}}; /* m, n, k, lda */
        for (int i = 0; i < 2; ++i) {
            size_t bytes = 0;
            CLBlastStatusCode st = CLBlastSGemmTempBufferSize(
                CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, shapes[i][0], shapes[i][1], shapes[i][2],
                1, shapes[i][3], 1, Dk, 1, H * Dk, &c->queue, &bytes);
            if (st != CLBlastSuccess) return clblast_fail(st, "GemmTempBufferSize");
            if (bytes > need) need = bytes;
        }
    }
    /* Counted as floats (generous if CLBlast means bytes); never NULL, so that CLBlast
     * always gets a valid buffer. */
    if (!(op->gemm_tmp = alloc_f32(c, need ? need : 1, &s, "CLBlast temporary buffer"))) return s;
    op->gemm_tmp_bytes = (need ? need : 1) * sizeof(float);
    op->bytes = (H * T * D + H * l * D * D + H * l * D + H * D) * sizeof(float) + op->gemm_tmp_bytes;
    return NSA_SUCCESS;
}

void ocl_linear_forget(ocl_context *c)
{
    (void)c;
    CLBlastClearCache();
}

/* Element-wise helper launch: kernel args are already set up to `first`. */
static nsa_status launch_elem(ocl_context *c, ocl_plan *op, ocl_args *a, cl_uint first, int64_t total)
{
    nsa_status s = ocl_args_end(a);
    if (s != NSA_SUCCESS) return s;
    const int64_t wg = (int64_t)op->wg_elem;
    return ocl_launch(c, a->kernel, a->kname, first, (total + wg - 1) / wg, op->wg_elem, wg);
}

static nsa_status convert_dense(ocl_context *c, ocl_plan *op, const nsa_bk_tensor *src, size_t es, cl_mem dst,
                                int64_t total)
{
    ocl_args a;
    ocl_args_begin(&a, op->prog->kernel[OCL_K_CONVERT_DENSE], "convert_dense");
    ocl_arg_tensor(&a, src, es, 0);
    ocl_arg_mem(&a, dst);
    ocl_arg_long(&a, 0);
    ocl_arg_long(&a, total);
    const cl_uint first = a.next;
    ocl_arg_long(&a, 0);
    return launch_elem(c, op, &a, first, total);
}

static nsa_status gemm(ocl_context *c, ocl_plan *op, size_t m, size_t n, size_t k, cl_mem A, size_t a_off,
                       size_t lda, cl_mem B, size_t b_off, size_t ldb, float beta, cl_mem C, size_t c_off, size_t ldc)
{
    CLBlastStatusCode st = CLBlastSgemmWithTempBuffer(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo,
                                                      m, n, k, 1.0f, A, a_off, lda, B, b_off, ldb, beta, C, c_off, ldc,
                                                      &c->queue, NULL, op->gemm_tmp);
    if (st != CLBlastSuccess) return clblast_fail(st, "Sgemm");
    return ocl_order(c);
}

/* One of K (kv = 0) or V (kv = 1). */
static nsa_status linear_one(ocl_context *c, const nsa_bk_args *args, ocl_plan *op, int kv)
{
    const nsa_bk_plan *plan = args->plan;
    const nsa_config *cfg = &plan->cfg;
    const size_t es = dtype_size(cfg->dtype);
    const int64_t H = cfg->num_kv_heads, l = cfg->cmp_block, d = cfg->cmp_stride, T = plan->total_keys;
    const int64_t D = kv ? cfg->head_dim_v : cfg->head_dim_qk;
    const nsa_bk_tensor *x = kv ? &args->v[NSA_BRANCH_CMP] : &args->k[NSA_BRANCH_CMP];
    const nsa_bk_tensor *w = kv ? &args->w_v : &args->w_k;
    const nsa_bk_tensor *pe = kv ? &args->pe_v : &args->pe_k;
    const nsa_bk_tensor *out = kv ? &args->vc : &args->kc;
    nsa_status s;
    ocl_args a;
    cl_uint first;

    /* 1. k -> stage_x [H, T, D] f32;  W -> stage_w [H, l*D, D] f32 */
    ocl_args_begin(&a, op->prog->kernel[OCL_K_STAGE_HEADS], "stage_heads");
    ocl_arg_tensor(&a, x, es, 1);
    ocl_arg_mem(&a, op->stage_x);
    ocl_arg_long(&a, 0);
    ocl_arg_long(&a, T);
    ocl_arg_long(&a, H);
    ocl_arg_long(&a, D);
    ocl_arg_long(&a, T * H * D);
    first = a.next;
    ocl_arg_long(&a, 0);
    if ((s = launch_elem(c, op, &a, first, T * H * D)) != NSA_SUCCESS) return s;
    if ((s = convert_dense(c, op, w, es, op->stage_w, H * l * D * D)) != NSA_SUCCESS) return s;

    /* 2. bias[g] = pe_g @ W_g (one 1 x l*D by l*D x D GEMM per head) */
    if (pe->buf) {
        if ((s = convert_dense(c, op, pe, es, op->stage_pe, H * l * D)) != NSA_SUCCESS) return s;
        const cl_float zero = 0.0f;
        cl_int err = clEnqueueFillBuffer(c->queue, op->bias, &zero, sizeof zero, 0, (size_t)(H * D) * sizeof(float),
                                         0, NULL, NULL);
        if (err != CL_SUCCESS) return ocl_fail(err, "clEnqueueFillBuffer(bias)");
        if ((s = ocl_order(c)) != NSA_SUCCESS) return s;
        for (int64_t g = 0; g < H; ++g)
            if ((s = gemm(c, op, 1, (size_t)D, (size_t)(l * D), op->stage_pe, (size_t)(g * l * D), (size_t)(l * D),
                          op->stage_w, (size_t)(g * l * D * D), (size_t)D, 0.0f, op->bias, (size_t)(g * D), (size_t)D)) !=
                NSA_SUCCESS)
                return s;
    }

    /* 3. kc rows = bias (or 0) */
    const int64_t total = plan->total_cmp * H * D;
    ocl_args_begin(&a, op->prog->kernel[OCL_K_FILL_ROWS], "fill_rows");
    ocl_arg_tensor(&a, out, 4, 1);
    ocl_arg_mem(&a, pe->buf ? op->bias : NULL);
    ocl_arg_int(&a, pe->buf != NULL);
    ocl_arg_long(&a, H);
    ocl_arg_long(&a, D);
    ocl_arg_long(&a, total);
    first = a.next;
    ocl_arg_long(&a, 0);
    if ((s = launch_elem(c, op, &a, first, total)) != NSA_SUCCESS) return s;

    /* 4. kc rows += sum_p A_p @ W_g[p] per (sequence, head), p ascending */
    const int64_t out_off = ocl_tensor_elem_offset(out, 4);
    if (out_off < 0) return OCL_ERR(NSA_ERR_INTERNAL, "opencl: misaligned compressed-K/V workspace");
    const cl_mem out_mem = ((const ocl_buffer *)out->buf)->mem;
    for (int64_t b = 0; b < plan->batch; ++b) {
        const int64_t nc = plan->cu_cmp[b + 1] - plan->cu_cmp[b];
        if (nc <= 0) continue;
        for (int64_t p = 0; p < l / d; ++p)
            for (int64_t g = 0; g < H; ++g) {
                const size_t a_off = (size_t)((g * T + plan->cu_seqlens_k[b] + p * d) * D);
                const size_t b_off = (size_t)((g * l + p * d) * D * D);
                const size_t c_off = (size_t)(out_off + plan->cu_cmp[b] * out->stride_token + g * out->stride_head);
                s = gemm(c, op, (size_t)nc, (size_t)D, (size_t)(d * D), op->stage_x, a_off, (size_t)(d * D),
                         op->stage_w, b_off, (size_t)D, 1.0f, out_mem, c_off, (size_t)out->stride_token);
                if (s != NSA_SUCCESS) return s;
            }
    }

    /* 5. f16 / bf16: round the f32 sums once to the dtype, in place */
    if (cfg->dtype == NSA_DTYPE_F32) return NSA_SUCCESS;
    ocl_args_begin(&a, op->prog->kernel[OCL_K_ROUND_ROWS], "round_rows");
    ocl_arg_tensor(&a, out, 4, 1);
    ocl_arg_long(&a, H);
    ocl_arg_long(&a, D);
    ocl_arg_long(&a, total);
    first = a.next;
    ocl_arg_long(&a, 0);
    return launch_elem(c, op, &a, first, total);
}

nsa_status ocl_linear_run(ocl_context *c, const nsa_bk_args *args, ocl_plan *op)
{
    if (args->plan->total_cmp == 0) return NSA_SUCCESS;
    nsa_status s = linear_one(c, args, op, 0);
    return s != NSA_SUCCESS ? s : linear_one(c, args, op, 1);
}
#endif /* NSA_OPENCL_CLBLAST */
