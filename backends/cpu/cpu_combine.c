/*
 * cpu_combine.c: stage COMBINE, semantics section 6 ("Output").
 *
 *   o(t, h) = sum over enabled branches b of g_b(t, h) * o_b(t, h)
 *
 * in double, branches in the order cmp, slc, win (o_b and the gates of the
 * call's float type: f32, or f64 in an f64 call), stored once in cfg dtype
 * (round to nearest even). A disabled branch has o_b[b].buf == NULL; its gate
 * is not read. With no branch enabled o = 0.
 */
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
