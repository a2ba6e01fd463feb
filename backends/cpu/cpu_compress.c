/*
 * cpu_compress.c: stage COMPRESS, semantics section 1 ("Compression").
 *
 * Compressed block i of sequence b covers its tokens [i*d, i*d + l - 1] and is
 * stored in row cu_cmp[b] + i of kc / vc (float [total_cmp, Hkv, D]: f32, or f64
 * in an f64 call):
 *   MEAN      kc_i = (1/l) sum_{j<l} k[i*d + j]
 *   LINEAR    kc_i = sum_{j<l} (k[i*d + j] + pe_K[g, j]) @ W_K[g, j]
 *             out[c] = sum_r x[r] * W[g][j][r][c]  (W row = input feature)
 *   EXTERNAL  kc_i = kc_in[row]  (the caller's values, already of the dtype)
 * and the same for v / vc with Dv. kc / vc are tensors of the call's dtype
 * (semantics section 7): MEAN and LINEAR sum in fp64 and then round each element
 * once, to nearest even, to cfg->dtype; the workspace holds that rounded value
 * (exact for f16 / bf16; f64 keeps the fp64 sum itself). Parallel over compressed rows; each row is computed
 * wholly by one thread, sums in ascending j, then r.
 */
#include <string.h>

#include "cpu_backend.h"
#include "cpu_dtype.h"
#include "cpu_parallel.h"

typedef struct compress_job {
    const nsa_bk_args *a;
    int64_t dmax; /* max(Dqk, Dv) */
} compress_job;

/* Rounds each of acc[0 .. D-1] once to dt (f16 / bf16: correctly rounded from the
 * double; f32: left to the store, which rounds to float; f64: nothing to do). */
static void round_to_dtype(double *acc, int64_t D, nsa_dtype dt)
{
    if (dt == NSA_DTYPE_F16)
        for (int64_t c = 0; c < D; c++)
            acc[c] = (double)nsa_cpu_f16_to_f32(nsa_cpu_f64_to_f16(acc[c]));
    else if (dt == NSA_DTYPE_BF16)
        for (int64_t c = 0; c < D; c++)
            acc[c] = (double)nsa_cpu_bf16_to_f32(nsa_cpu_f64_to_bf16(acc[c]));
}

/* MEAN: the average of the l rows of the block (section 1), rounded to dt. */
static void compress_mean(const nsa_bk_tensor *x, const nsa_bk_tensor *out, int64_t tok0, int64_t row,
                          int64_t g, int64_t D, int64_t l, nsa_dtype dt, double *acc)
{
    const void *xb = nsa_cpu_base(x);
    for (int64_t c = 0; c < D; c++)
        acc[c] = 0.0;
    for (int64_t j = 0; j < l; j++)
        nsa_cpu_axpy_row(1.0, xb, x->dtype, nsa_cpu_at(x, tok0 + j, g), D, acc);
    for (int64_t c = 0; c < D; c++)
        acc[c] /= (double)l;
    round_to_dtype(acc, D, dt);
    nsa_cpu_store_row(acc, nsa_cpu_base(out), out->dtype, nsa_cpu_at(out, row, g), D);
}

/* LINEAR: sum_j (x[j] + pe[g, j]) @ W[g, j] (section 1), rounded to dt. W is
 * [Hkv, l, D, D] and pe [Hkv, l, D], both contiguous from their element offsets. */
static void compress_linear(const nsa_bk_tensor *x, const nsa_bk_tensor *w, const nsa_bk_tensor *pe,
                            const nsa_bk_tensor *out, int64_t tok0, int64_t row, int64_t g, int64_t D,
                            int64_t l, nsa_dtype dt, double *acc, double *xr, double *per)
{
    const void *xb = nsa_cpu_base(x);
    const void *wb = nsa_cpu_base(w);
    for (int64_t c = 0; c < D; c++)
        acc[c] = 0.0;
    for (int64_t j = 0; j < l; j++) {
        nsa_cpu_load_row(xb, x->dtype, nsa_cpu_at(x, tok0 + j, g), D, xr);
        if (pe->buf) {
            nsa_cpu_load_row(nsa_cpu_base(pe), pe->dtype, pe->offset + (g * l + j) * D, D, per);
            for (int64_t r = 0; r < D; r++)
                xr[r] += per[r];
        }
        int64_t wrow0 = w->offset + (g * l + j) * D * D; /* W[g][j][0][0] */
        for (int64_t r = 0; r < D; r++)
            nsa_cpu_axpy_row(xr[r], wb, w->dtype, wrow0 + r * D, D, acc);
    }
    round_to_dtype(acc, D, dt);
    nsa_cpu_store_row(acc, nsa_cpu_base(out), out->dtype, nsa_cpu_at(out, row, g), D);
}

/* EXTERNAL: the caller's compressed row (already of the dtype: exact in the float type). */
static void compress_external(const nsa_bk_tensor *in, const nsa_bk_tensor *out, int64_t row, int64_t g,
                              int64_t D, double *acc)
{
    nsa_cpu_load_row(nsa_cpu_base(in), in->dtype, nsa_cpu_at(in, row, g), D, acc);
    nsa_cpu_store_row(acc, nsa_cpu_base(out), out->dtype, nsa_cpu_at(out, row, g), D);
}

/* MEAN or LINEAR: compressed row `row` of kc / vc (every KV head) from the l
 * token rows tok0 .. tok0 + l - 1 of k / v; scratch: 3 * nsa_cpu_doubles(max(Dqk, Dv)).
 * The forward's COMPRESS and the decode step's both form their rows here. */
void nsa_cpu_compress_block(const nsa_bk_args *a, const nsa_bk_tensor *k, const nsa_bk_tensor *v, int64_t tok0,
                            const nsa_bk_tensor *kc, const nsa_bk_tensor *vc, int64_t row, double *scratch)
{
    const nsa_config *cfg = &a->plan->cfg;
    const int64_t dmax = nsa_cpu_dmax(cfg);
    double *acc = scratch;
    double *xr = acc + nsa_cpu_doubles(dmax) / sizeof(double);
    double *per = xr + nsa_cpu_doubles(dmax) / sizeof(double);
    const int64_t l = cfg->cmp_block, Dqk = cfg->head_dim_qk, Dv = cfg->head_dim_v;
    const nsa_dtype dt = cfg->dtype;
    for (int64_t g = 0; g < cfg->num_kv_heads; g++) {
        if (cfg->compress == NSA_COMPRESS_MEAN) {
            compress_mean(k, kc, tok0, row, g, Dqk, l, dt, acc);
            compress_mean(v, vc, tok0, row, g, Dv, l, dt, acc);
        } else if (cfg->compress == NSA_COMPRESS_LINEAR) {
            compress_linear(k, &a->w_k, &a->pe_k, kc, tok0, row, g, Dqk, l, dt, acc, xr, per);
            compress_linear(v, &a->w_v, &a->pe_v, vc, tok0, row, g, Dv, l, dt, acc, xr, per);
        }
    }
}

static void compress_rows(void *user, int64_t begin, int64_t end, void *scratch)
{
    const compress_job *job = user;
    const nsa_bk_args *a = job->a;
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    double *acc = scratch;
    double *xr = acc + nsa_cpu_doubles(job->dmax) / sizeof(double);
    double *per = xr + nsa_cpu_doubles(job->dmax) / sizeof(double);
    const int64_t l = cfg->cmp_block, d = cfg->cmp_stride;
    const int64_t Dqk = cfg->head_dim_qk, Dv = cfg->head_dim_v;
    const nsa_dtype dt = cfg->dtype;

    for (int64_t row = begin; row < end; row++) {
        int64_t b = nsa_cpu_cmp_row_sequence(p, row);
        int64_t i = row - p->cu_cmp[b];
        int64_t tok0 = p->cu_seqlens_k[b] + i * d; /* key row of the block's first token */
        for (int64_t g = 0; g < cfg->num_kv_heads; g++) {
            switch (cfg->compress) {
            case NSA_COMPRESS_MEAN:
                compress_mean(&a->k[NSA_BRANCH_CMP], &a->kc, tok0, row, g, Dqk, l, dt, acc);
                compress_mean(&a->v[NSA_BRANCH_CMP], &a->vc, tok0, row, g, Dv, l, dt, acc);
                break;
            case NSA_COMPRESS_LINEAR:
                compress_linear(&a->k[NSA_BRANCH_CMP], &a->w_k, &a->pe_k, &a->kc, tok0, row, g, Dqk, l, dt,
                                acc, xr, per);
                compress_linear(&a->v[NSA_BRANCH_CMP], &a->w_v, &a->pe_v, &a->vc, tok0, row, g, Dv, l, dt,
                                acc, xr, per);
                break;
            case NSA_COMPRESS_EXTERNAL:
                compress_external(&a->kc_in, &a->kc, row, g, Dqk, acc);
                compress_external(&a->vc_in, &a->vc, row, g, Dv, acc);
                break;
            }
        }
    }
}

nsa_status nsa_cpu_compress(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    const nsa_bk_plan *p = a->plan;
    const char *s = "compress";
    nsa_status st;
    if (p->total_cmp == 0) /* no sequence reaches l tokens: nothing to compress */
        return NSA_SUCCESS;
    if ((st = nsa_cpu_need(&a->kc, s, "kc", 1, 0)) || (st = nsa_cpu_need(&a->vc, s, "vc", 1, 0)))
        return st;
    switch (p->cfg.compress) {
    case NSA_COMPRESS_MEAN:
        if ((st = nsa_cpu_need(&a->k[NSA_BRANCH_CMP], s, "k_cmp", 1, 0)) ||
            (st = nsa_cpu_need(&a->v[NSA_BRANCH_CMP], s, "v_cmp", 1, 0)))
            return st;
        break;
    case NSA_COMPRESS_LINEAR:
        if ((st = nsa_cpu_need(&a->k[NSA_BRANCH_CMP], s, "k_cmp", 1, 0)) ||
            (st = nsa_cpu_need(&a->v[NSA_BRANCH_CMP], s, "v_cmp", 1, 0)) ||
            (st = nsa_cpu_need(&a->w_k, s, "w_k", 1, 0)) || (st = nsa_cpu_need(&a->w_v, s, "w_v", 1, 0)))
            return st;
        if ((a->pe_k.buf && (st = nsa_cpu_need(&a->pe_k, s, "pe_k", 1, 0))) ||
            (a->pe_v.buf && (st = nsa_cpu_need(&a->pe_v, s, "pe_v", 1, 0))))
            return st;
        break;
    case NSA_COMPRESS_EXTERNAL:
        if ((st = nsa_cpu_need(&a->kc_in, s, "kc_in", 1, 0)) || (st = nsa_cpu_need(&a->vc_in, s, "vc_in", 1, 0)))
            return st;
        break;
    default:
        return nsa_cpu_host()->set_error(NSA_ERR_UNSUPPORTED, "cpu backend: unknown compress mode %d",
                                         (int)p->cfg.compress);
    }
    if ((st = nsa_cpu_need_float(a, &a->kc, s, "kc", 0, NSA_ERR_INTERNAL)) ||
        (st = nsa_cpu_need_float(a, &a->vc, s, "vc", 0, NSA_ERR_INTERNAL)))
        return st;

    compress_job job = {a, nsa_cpu_dmax(&p->cfg)};
    size_t scratch = 3 * nsa_cpu_doubles(job.dmax);
    return nsa_cpu_parallel_for(ctx->threads, p->total_cmp, 0, scratch, compress_rows, &job);
}
