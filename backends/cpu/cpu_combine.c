/*
 * cpu_combine.c: stage COMBINE, semantics section 6 ("Output").
 *
 *   o(t, h) = sum over enabled branches b of g_b(t, h) * o_b(t, h)
 *
 * in double, branches in the order cmp, slc, win (o_b and the gates of the
 * call's float type: f32, or f64 in an f64 call), stored once in cfg dtype
 * (round to nearest even). A disabled branch has o_b[b].buf == NULL; its gate
 * is not read. With no branch enabled o = 0.
 *
 * WIN_COMBINE (the fused WIN_ATTN + COMBINE the planner takes in place of both):
 * the window branch's rows go to a scratch of at most WIN_CHUNK_BYTES, a run of
 * tokens at a time, and COMBINE's loop above reads them there: the same
 * functions in the same order as the two stages, so o is bitwise the same, and
 * the workspace holds no o_win.
 */
#include <stdlib.h>

#include "cpu_backend.h"
#include "cpu_dtype.h"
#include "cpu_parallel.h"

typedef struct combine_job {
    const nsa_bk_args *a;
    int64_t first; /* items [begin, end) are tokens first + [begin, end) */
} combine_job;

static void combine_tokens(void *user, int64_t begin, int64_t end, void *mem)
{
    const combine_job *job = user;
    const nsa_bk_args *a = job->a;
    const nsa_config *cfg = &a->plan->cfg;
    const int64_t Dv = cfg->head_dim_v;
    double *acc = mem;
    for (int64_t t = job->first + begin; t < job->first + end; t++)
        for (int64_t h = 0; h < cfg->num_q_heads; h++) {
            for (int64_t c = 0; c < Dv; c++)
                acc[c] = 0.0;
            for (int b = 0; b < 3; b++) {
                if (!a->o_b[b].buf)
                    continue;
                double gate = nsa_cpu_fget(&a->gate[b], nsa_cpu_at(&a->gate[b], t, h));
                nsa_cpu_axpy_row(gate, nsa_cpu_base(&a->o_b[b]), a->o_b[b].dtype, nsa_cpu_at(&a->o_b[b], t, h), Dv,
                                 acc);
            }
            nsa_cpu_store_row(acc, nsa_cpu_base(&a->o), a->o.dtype, nsa_cpu_at(&a->o, t, h), Dv);
        }
}

nsa_status nsa_cpu_combine(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    return nsa_cpu_combine_rows(ctx, a, 0, a->plan->total_tokens);
}

nsa_status nsa_cpu_combine_rows(const nsa_cpu_context *ctx, const nsa_bk_args *a, int64_t t0, int64_t t1)
{
    static const char *const names[3][2] = {{"o_cmp", "gate_cmp"}, {"o_slc", "gate_slc"}, {"o_win", "gate_win"}};
    nsa_status st = nsa_cpu_need(&a->o, "combine", "o", 1, 0);
    if (st)
        return st;
    for (int b = 0; b < 3; b++) {
        if (!a->o_b[b].buf)
            continue;
        if ((st = nsa_cpu_need_float(a, &a->gate[b], "combine", names[b][1], 0, NSA_ERR_UNSUPPORTED)) ||
            (st = nsa_cpu_need_float(a, &a->o_b[b], "combine", names[b][0], 0, NSA_ERR_UNSUPPORTED)))
            return st;
    }
    const nsa_bk_plan *p = a->plan;
    combine_job job = {a, t0};
    return nsa_cpu_parallel_for(ctx->threads, t1 - t0, 0, nsa_cpu_doubles(p->cfg.head_dim_v), combine_tokens, &job);
}

#define WIN_CHUNK_BYTES ((size_t)64 << 20)

nsa_status nsa_cpu_win_combine(const nsa_cpu_context *ctx, const nsa_bk_args *a)
{
    const nsa_bk_plan *p = a->plan;
    const nsa_config *cfg = &p->cfg;
    if (a->o_b[NSA_BRANCH_WIN].buf)
        return nsa_cpu_host()->set_error(NSA_ERR_INTERNAL, "cpu backend: win_combine given an o_win");
    const nsa_dtype fdt = nsa_bk_float_dtype(cfg->dtype);
    const size_t fe = fdt == NSA_DTYPE_F64 ? 8 : 4;
    /* one token's rows are Hq * Dv floats (< 2^30 by config.c's bounds on heads and dims) */
    const size_t row = (size_t)cfg->num_q_heads * (size_t)cfg->head_dim_v * fe;
    const int64_t T = p->total_tokens;
    int64_t chunk = (int64_t)(WIN_CHUNK_BYTES / row);
    if (chunk < 1) chunk = 1;
    if (chunk > T) chunk = T;
    if (chunk == 0) return NSA_SUCCESS;
    nsa_cpu_buffer scratch = {NULL, (size_t)chunk * row, NULL};
    scratch.owned = malloc(scratch.bytes);
    if (!scratch.owned)
        return nsa_cpu_host()->set_error(NSA_ERR_OUT_OF_MEMORY,
                                         "cpu backend: win_combine: out of host memory for a %zu-byte scratch",
                                         scratch.bytes);
    scratch.ptr = scratch.owned;
    nsa_bk_args fa = *a;
    nsa_status st = NSA_SUCCESS;
    for (int64_t t0 = 0; t0 < T && st == NSA_SUCCESS; t0 += chunk) {
        const int64_t t1 = T - t0 < chunk ? T : t0 + chunk;
        /* token t's rows at scratch row t - t0 */
        fa.o_b[NSA_BRANCH_WIN] = (nsa_bk_tensor){&scratch, -t0 * cfg->num_q_heads * cfg->head_dim_v,
                                                 cfg->num_q_heads * cfg->head_dim_v, cfg->head_dim_v, fdt};
        st = nsa_cpu_win_attn_rows(ctx, &fa, t0, t1);
        if (st == NSA_SUCCESS) st = nsa_cpu_combine_rows(ctx, &fa, t0, t1);
    }
    free(scratch.owned);
    return st;
}
