/* nsa run's check on sequence prefixes (see run_check.h). */
#include "run_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nsa.h"
#include "ref_output.h"
#include "tool.h"

double run_check_cost(const nsa_config *cfg, int64_t P)
{
    const int64_t n = cfg->num_selected, ls = cfg->slc_block, w = cfg->window;
    double pairs = 0.0;
    for (int64_t t = 0; t < P; t++) {
        int64_t slc = n > 0 ? (n * ls < t + 1 ? n * ls : t + 1) : 0;
        int64_t win = w > 0 ? (w < t + 1 ? w : t + 1) : 0;
        /* compressed keys are visited twice: attention and block scores */
        pairs += (double)(2 * tk_num_cmp_blocks(cfg, t + 1) + slc + win);
    }
    return pairs * (double)cfg->num_q_heads * 2.0 *
           (double)(cfg->head_dim_qk + cfg->head_dim_v);
}

int64_t run_check_auto_prefix(const nsa_config *cfg, int64_t len, double budget_flops)
{
    int64_t lo = len < cfg->slc_block ? len : cfg->slc_block, hi = len;
    if (run_check_cost(cfg, hi) <= budget_flops)
        return hi;
    while (hi - lo > 1) { /* cost grows with P */
        int64_t mid = lo + (hi - lo) / 2;
        if (run_check_cost(cfg, mid) <= budget_flops)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Copies rows [first, first + count) of a [*, width] float array. */
static float *rows_f(const float *src, int64_t first, int64_t count, int64_t width, float *dst)
{
    if (src)
        memcpy(dst, src + first * width, sizeof(float) * (size_t)(count * width));
    return dst;
}

/* The same for doubles (the outputs as read back: an f64 run's are not floats). */
static double *rows_d(const double *src, int64_t first, int64_t count, int64_t width, double *dst)
{
    if (src && dst)
        memcpy(dst, src + first * width, sizeof(double) * (size_t)(count * width));
    return dst;
}

static double *alloc_d(const void *want, int64_t n, int *bad)
{
    if (!want)
        return NULL;
    double *p = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!p)
        *bad = 1;
    return p;
}

typedef struct sub_problem {
    tk_case c;
    tk_inputs in;
    tk_output got;
} sub_problem;

static void sub_free(sub_problem *s)
{
    free(s->in.q);
    for (int b = 0; b < 3; b++) {
        if (b == 0 || s->in.k[b] != s->in.k[0])
            free(s->in.k[b]);
        if (b == 0 || s->in.v[b] != s->in.v[0])
            free(s->in.v[b]);
        free(s->in.gate[b]);
        free(s->got.lse[b]);
        free(s->got.lse_d[b]);
    }
    free(s->got.o_d);
    free(s->in.kc);
    free(s->in.vc);
    free(s->in.given);
    free(s->got.o);
    free(s->got.sel);
    /* w_k, w_v, pe_k, pe_v are borrowed from the full inputs */
    memset(s, 0, sizeof *s);
}

static float *alloc_f(int64_t n, int *bad)
{
    float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!p)
        *bad = 1;
    return p;
}

/* Builds the sub-problem of the first prefix[i] tokens of sequences seq[i]. */
static int sub_make(const tk_case *c, const tk_inputs *in, const tk_output *got, int nseq,
                    const int64_t *seq, const int64_t *prefix, sub_problem *s)
{
    const nsa_config *g = &c->cfg;
    const int64_t Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dqk = g->head_dim_qk;
    const int64_t Dv = g->head_dim_v, n = g->num_selected;
    int64_t T = 0, Nc = 0, at = 0, atc = 0;
    int bad = 0;

    memset(s, 0, sizeof *s);
    s->c = *c;
    snprintf(s->c.label, sizeof s->c.label, "%.38s-prefix", c->label);
    s->c.batch = nseq;
    s->c.cu_seqlens[0] = 0;
    s->c.layout = TK_LAYOUT_DENSE;
    for (int i = 0; i < nseq; i++) {
        s->c.cu_seqlens[i + 1] = s->c.cu_seqlens[i] + prefix[i];
        T += prefix[i];
        Nc += tk_num_cmp_blocks(g, prefix[i]);
    }
    s->in.dtype = in->dtype;
    s->in.tokens = T;
    s->in.total_cmp = Nc;
    s->in.q = alloc_f(T * Hq * Dqk, &bad);
    for (int b = 0; b < 3; b++) {
        s->in.k[b] = (b > 0 && in->k[b] == in->k[0]) ? s->in.k[0] : alloc_f(T * Hkv * Dqk, &bad);
        s->in.v[b] = (b > 0 && in->v[b] == in->v[0]) ? s->in.v[0] : alloc_f(T * Hkv * Dv, &bad);
        if (in->gate[b])
            s->in.gate[b] = alloc_f(T * Hq, &bad);
        if (got->lse[b])
            s->got.lse[b] = alloc_f(T * Hq, &bad);
        s->got.lse_d[b] = alloc_d(got->lse_d[b], T * Hq, &bad);
    }
    s->in.w_k = in->w_k;
    s->in.w_v = in->w_v;
    s->in.pe_k = in->pe_k;
    s->in.pe_v = in->pe_v;
    if (in->kc) {
        s->in.kc = alloc_f(Nc * Hkv * Dqk, &bad);
        s->in.vc = alloc_f(Nc * Hkv * Dv, &bad);
    }
    if (in->given)
        s->in.given = malloc(sizeof(int32_t) * (size_t)(T * Hkv * n + 1));
    s->got.tokens = T;
    s->got.o = alloc_f(T * Hq * Dv, &bad);
    s->got.o_d = alloc_d(got->o_d, T * Hq * Dv, &bad);
    if (got->sel)
        s->got.sel = malloc(sizeof(int32_t) * (size_t)(T * Hkv * n + 1));
    if (bad || (in->given && !s->in.given) || (got->sel && !s->got.sel)) {
        sub_free(s);
        return -1;
    }
    snprintf(s->got.stages, sizeof s->got.stages, "%s", got->stages);

    for (int i = 0; i < nseq; i++) {
        const int64_t first = c->cu_seqlens[seq[i]], P = prefix[i];
        int64_t cmp_first = 0, ncp = tk_num_cmp_blocks(g, P);
        for (int64_t b = 0; b < seq[i]; b++)
            cmp_first += tk_num_cmp_blocks(g, c->cu_seqlens[b + 1] - c->cu_seqlens[b]);
        rows_f(in->q, first, P, Hq * Dqk, s->in.q + at * Hq * Dqk);
        for (int b = 0; b < 3; b++) {
            if (b == 0 || s->in.k[b] != s->in.k[0])
                rows_f(in->k[b], first, P, Hkv * Dqk, s->in.k[b] + at * Hkv * Dqk);
            if (b == 0 || s->in.v[b] != s->in.v[0])
                rows_f(in->v[b], first, P, Hkv * Dv, s->in.v[b] + at * Hkv * Dv);
            if (s->in.gate[b])
                rows_f(in->gate[b], first, P, Hq, s->in.gate[b] + at * Hq);
            if (s->got.lse[b])
                rows_f(got->lse[b], first, P, Hq, s->got.lse[b] + at * Hq);
            if (s->got.lse_d[b])
                rows_d(got->lse_d[b], first, P, Hq, s->got.lse_d[b] + at * Hq);
        }
        if (in->kc) {
            rows_f(in->kc, cmp_first, ncp, Hkv * Dqk, s->in.kc + atc * Hkv * Dqk);
            rows_f(in->vc, cmp_first, ncp, Hkv * Dv, s->in.vc + atc * Hkv * Dv);
        }
        if (in->given)
            memcpy(s->in.given + at * Hkv * n, in->given + first * Hkv * n,
                   sizeof(int32_t) * (size_t)(P * Hkv * n));
        rows_f(got->o, first, P, Hq * Dv, s->got.o + at * Hq * Dv);
        if (s->got.o_d)
            rows_d(got->o_d, first, P, Hq * Dv, s->got.o_d + at * Hq * Dv);
        if (got->sel)
            memcpy(s->got.sel + at * Hkv * n, got->sel + first * Hkv * n,
                   sizeof(int32_t) * (size_t)(P * Hkv * n));
        at += P;
        atc += ncp;
    }
    return 0;
}

int run_check_do(const char *cmd, const char *backend, const tk_case *c, const tk_inputs *in,
                 const tk_output *got, int64_t prefix, int max_seqs, double budget_flops,
                 run_check *r)
{
    const nsa_config *g = &c->cfg;
    sub_problem sp;
    tk_oracle orc;
    nsa_status s;
    int is_cpu = strcmp(backend, "cpu") == 0;
    int nonempty = 0, rc = 0;
    double t0;
    int64_t nonempty_seq[TK_MAX_BATCH];

    memset(r, 0, sizeof *r);
    r->total_rows = tk_case_tokens(c);
    r->reference = is_cpu ? "testkit fp64 oracle"
                          : "cpu backend";
    for (int64_t b = 0; b < c->batch; b++)
        if (c->cu_seqlens[b + 1] > c->cu_seqlens[b])
            nonempty_seq[nonempty++] = b;
    if (nonempty == 0 || max_seqs <= 0) {
        snprintf(r->note, sizeof r->note, "nothing to check (no tokens)");
        return 0;
    }
    r->nseq = max_seqs < nonempty ? max_seqs : nonempty;
    for (int i = 0; i < r->nseq; i++) {
        /* spread the sample over the batch */
        int64_t b = nonempty_seq[(int64_t)i * nonempty / r->nseq];
        int64_t len = c->cu_seqlens[b + 1] - c->cu_seqlens[b];
        r->seq[i] = b;
        if (prefix > 0) {
            r->prefix[i] = prefix < len ? prefix : len;
        } else {
            r->prefix[i] = run_check_auto_prefix(g, len, budget_flops / r->nseq);
            if (!is_cpu && g->num_selected > 0) {
                /* make top-n drop blocks: the point of checking a new backend */
                int64_t want = (g->num_selected + 2) * g->slc_block;
                want = want < len ? want : len;
                r->prefix[i] = r->prefix[i] > want ? r->prefix[i] : want;
            }
        }
        r->rows += r->prefix[i];
        if (g->num_selected > 0 && (r->prefix[i] - 1) / g->slc_block + 1 > g->num_selected)
            r->selection_exercised = 1;
    }
    r->sel_rows = g->num_selected > 0 ? r->rows * g->num_kv_heads : 0;

    if (sub_make(c, in, got, r->nseq, r->seq, r->prefix, &sp) != 0) {
        fprintf(stderr, "%s: check: out of host memory\n", cmd);
        return TOOL_EXIT_FAIL;
    }
    t0 = tool_now();
    memset(&orc, 0, sizeof orc);
    if (is_cpu) {
        tool_progress("check: fp64 oracle on %lld query tokens", (long long)r->rows);
        s = tk_oracle_run(&sp.c, &sp.in, sp.c.fixed_indices ? sp.in.given : NULL, &orc);
        if (s != NSA_SUCCESS) {
            tool_progress_end();
            fprintf(stderr, "%s: check: the testkit oracle failed: %s\n", cmd, nsa_status_string(s));
            sub_free(&sp);
            return TOOL_EXIT_FAIL;
        }
        r->oracle_used = 1;
        tk_compare(&sp.c, &sp.in, &orc, &sp.got, &r->v);
    } else {
        nsa_context *cpu = NULL;
        tk_output cpu_out;
        tk_oracle ref;
        char msg[TOOL_ERR_MAX];
        memset(&cpu_out, 0, sizeof cpu_out);
        tool_progress("check: cpu backend on %lld query tokens", (long long)r->rows);
        s = nsa_context_create("cpu", 0, &cpu);
        if (s != NSA_SUCCESS) {
            tool_progress_end();
            tool_report(cmd, "check: nsa_context_create(cpu)", s);
            rc = TOOL_EXIT_FAIL;
        } else if ((s = tk_run(cpu, &sp.c, &sp.in, &cpu_out, msg, sizeof msg)) != NSA_SUCCESS) {
            tool_progress_end();
            fprintf(stderr, "%s: check: the cpu reference failed: %s\n", cmd, msg);
            rc = TOOL_EXIT_FAIL;
        }
        /* The oracle (slow: fp64, one thread) is needed only for its block
         * scores, and those only where the selections differ. */
        if (!rc && g->num_selected > 0 && cpu_out.sel && sp.got.sel &&
            memcmp(cpu_out.sel, sp.got.sel,
                   sizeof(int32_t) * (size_t)(r->rows * g->num_kv_heads * g->num_selected)) != 0) {
            tool_progress("check: selections differ; fp64 oracle scores on %lld query tokens",
                          (long long)r->rows);
            s = tk_oracle_run(&sp.c, &sp.in, sp.c.fixed_indices ? sp.in.given : NULL, &orc);
            if (s != NSA_SUCCESS) {
                tool_progress_end();
                fprintf(stderr, "%s: check: the testkit oracle failed: %s\n", cmd,
                        nsa_status_string(s));
                rc = TOOL_EXIT_FAIL;
            }
            r->oracle_used = 1;
        }
        if (!rc && ref_from_output(&sp.c, &cpu_out, r->oracle_used ? &orc : NULL, &ref) != 0) {
            fprintf(stderr, "%s: check: out of host memory\n", cmd);
            rc = TOOL_EXIT_FAIL;
        } else if (!rc) {
            tk_compare(&sp.c, &sp.in, &ref, &sp.got, &r->v);
            ref_output_free(&ref);
        }
        tk_output_free(&cpu_out);
        nsa_context_destroy(cpu);
    }
    tool_progress_end();
    r->seconds = tool_now() - t0;
    tk_oracle_free(&orc);
    sub_free(&sp);
    if (rc)
        return rc;
    r->done = 1;
    r->tie_fraction = r->sel_rows ? (double)r->v.tie_swaps / (double)r->sel_rows : 0.0;
    if (!r->selection_exercised && g->num_selected > 0)
        snprintf(r->note, sizeof r->note,
                 "the checked prefixes are too short for top-n to drop any block (every eligible "
                 "block is selected); raise --check-tokens above %lld to exercise it",
                 (long long)(g->num_selected * g->slc_block));
    return 0;
}
