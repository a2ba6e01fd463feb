/*
 * Shards of one sequence (docs/nsa-semantics.md section 11) through the public
 * API: plans of nsa_plan_create_varlen whose queries are the last rows of their
 * keys.
 *
 *   test_shard BACKEND DTYPES CORPUS
 *
 * For every case of the corpus (cases up to 640 tokens of the full corpus) and
 * dtype (one the backend lacks is skipped), the whole batch runs forward and
 * backward once as one plan (tk_run_shards with P = 1); then for P = 2, 4, 8
 * every sequence is cut at P - 1 random places (empty shards allowed) and shard
 * p runs as one varlen plan over the batch (tk_run_shards): sequence b's queries
 * are its rows [a_b, e_b) and its keys its rows [0, e_b). Checked against the
 * whole run:
 *   - o, the LSEs and the selection of every shard row are the whole forward's
 *     rows (each row of the function depends only on the keys below it);
 *   - the backward (the whole forward's selection and LSEs, the shard's rows of
 *     dO) gives the whole backward's dq and dgate rows;
 *     on cpu both bitwise; on other backends, whose kernels may group rows into
 *     tiles that differ between the two runs, within the parity tolerances
 *     (tk_tolerance_for, tk_grad_tolerance) and the selection equal;
 *   - the key-side gradients (dk, dv, dkc, dvc, dW, dpe), returned unrounded
 *     with NSA_BACKWARD_FLOAT_KEY_GRADS and summed over the shards in position
 *     order in fp64, equal the whole backward's (also NSA_BACKWARD_FLOAT_KEY_GRADS)
 *     within the backward's tolerance (tk_grad_tolerance; f64: 1e-10).
 * NSA_TEST_CASE=<label>[,<label>...] keeps only those cases, NSA_TEST_SHARDS=P only
 * that shard count (subsets for Oclgrind).
 * Every output is poisoned (0xFF) first. A backend that does not run shard
 * plans must refuse them with NSA_ERR_UNSUPPORTED: then the test checks that
 * and skips (77). Also checked: the argument rules of nsa_plan_create_varlen.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nsa.h"
#include "testkit.h"

#define SKIP 77

/* ---- the shards of a case */

static uint64_t g_rng = 0x5eed5a4d;

typedef struct counts {
    long cases, shards, rows, fails;
    double worst;      /* worst key-gradient error / tolerance */
    double worst_rows; /* worst shard-row error / tolerance (0: every row bitwise) */
} counts;

/* cpu: shard rows must be bitwise the whole run's; other backends (whose kernels
 * may group rows into tiles that differ between the runs): within the parity
 * tolerances, |got - ref| <= tol_scale * scale + tol_rel * |ref| + tol_abs */
static int g_exact = 1;

static double rms_of(const double *x, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i] * x[i];
    return n ? sqrt(s / (double)n) : 0.0;
}

static int rows_match(const double *got, const double *ref, int64_t n, double tol_scale, double scale, double tol_rel,
                      double tol_abs, double *worst)
{
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(ref[i])) return 0;
        if (got[i] == ref[i]) continue; /* (both -inf too) */
        if (g_exact || isinf(got[i]) || isinf(ref[i])) return 0;
        const double tol = tol_scale * scale + tol_rel * fabs(ref[i]) + tol_abs, err = fabs(got[i] - ref[i]);
        if (!(err <= tol)) return 0;
        if (err / tol > *worst) *worst = err / tol;
    }
    return 1;
}

/* One case, one dtype: the whole problem as one plan (P = 1), then P = 2, 4, 8 shards. */
static int check_case(nsa_context *ctx, const tk_case *c, counts *ct)
{
    char desc[256], msg[TK_MSG_MAX];
    tk_case_describe(c, desc, sizeof desc);
    const nsa_config *g = &c->cfg;
    const nsa_dtype dt = g->dtype;
    const int64_t T = tk_case_tokens(c), Hq = g->num_q_heads, Hkv = g->num_kv_heads,
                  Dk = g->head_dim_qk, Dv = g->head_dim_v, n = g->num_selected;
    const int on[3] = {1, n > 0, g->window > 0};
    const int64_t wq = Hq * Dk, wo = Hq * Dv, wsel = Hkv * n;
    tk_inputs in;
    float *dO = NULL;
    if (tk_inputs_make(c, &in) != NSA_SUCCESS || tk_dout_make(c, c->seed, 7, &dO) != NSA_SUCCESS) {
        printf("FAIL %s: inputs\n", desc);
        tk_inputs_free(&in);
        return 0;
    }
    int64_t cut[TK_MAX_BATCH][TK_MAX_SHARDS + 1];
    tk_output wf;
    tk_grads wb;
    memset(&wf, 0, sizeof wf);
    memset(&wb, 0, sizeof wb);
    tk_shard_cuts(c, 1, NULL, cut);
    int ok = 1;
    if (tk_run_shards(ctx, c, &in, 1, cut, NULL, NULL, NULL, &wf, NULL, msg, sizeof msg) != NSA_SUCCESS) {
        printf("FAIL %s: whole forward: %s\n", desc, msg);
        ok = 0;
    }
    const int32_t *sel = c->fixed_indices && n > 0 ? in.given : wf.sel;
    if (ok && tk_run_shards(ctx, c, &in, 1, cut, dO, wf.lse_d, sel, NULL, &wb, msg, sizeof msg) != NSA_SUCCESS) {
        printf("FAIL %s: whole backward: %s\n", desc, msg);
        ok = 0;
    }
    double rms_do = 0;
    for (int64_t e = 0; e < T * Hq * Dv; e++) rms_do += (double)dO[e] * dO[e];
    rms_do = T ? sqrt(rms_do / (double)(T * Hq * Dv)) : 0;
    /* the tolerances of shard rows on backends other than cpu (parity's) */
    const tk_tolerance ft = tk_tolerance_for(dt);
    double g_rms, g_rel;
    tk_grad_tolerance(dt, &g_rms, &g_rel);
    const double o_scale = ok ? rms_of(wf.o_d, T * wo) : 0;
    double dq_scale = ok ? rms_of(wb.t[TK_G_Q], T * wq) : 0, dg_scale[3] = {0, 0, 0};
    if (dq_scale < 0.1 * rms_do) dq_scale = 0.1 * rms_do;
    for (int b = 0; b < 3 && ok; b++) {
        dg_scale[b] = wb.t[TK_G_GATE + b] ? rms_of(wb.t[TK_G_GATE + b], T * Hq) : 0;
        if (dg_scale[b] < 0.1 * rms_do) dg_scale[b] = 0.1 * rms_do;
    }

    /* NSA_TEST_SHARDS=P: only that shard count (Oclgrind's runs) */
    int Ps[3] = {2, 4, 8}, nP = 3;
    const char *only_p = getenv("NSA_TEST_SHARDS");
    if (only_p && atoi(only_p) >= 1 && atoi(only_p) <= TK_MAX_SHARDS) Ps[0] = atoi(only_p), nP = 1;
    for (int pi = 0; pi < nP && ok; pi++) {
        const int P = Ps[pi];
        tk_shard_cuts(c, P, &g_rng, cut);
        tk_output sf;
        tk_grads sb;
        memset(&sb, 0, sizeof sb);
        ct->shards += P;
        if (tk_run_shards(ctx, c, &in, P, cut, NULL, NULL, NULL, &sf, NULL, msg, sizeof msg) != NSA_SUCCESS ||
            tk_run_shards(ctx, c, &in, P, cut, dO, wf.lse_d, sel, NULL, &sb, msg, sizeof msg) != NSA_SUCCESS) {
            printf("FAIL %s P=%d: %s\n", desc, P, msg);
            ok = 0;
            tk_output_free(&sf);
            break;
        }
        /* every row against the whole run's */
        for (int64_t t = 0; t < T && ok; t++) {
            const char *bad = NULL;
            double *wr = &ct->worst_rows;
            if (!rows_match(sf.o_d + t * wo, wf.o_d + t * wo, wo, ft.o_rms, o_scale, ft.o_rel, ft.o_abs, wr)) bad = "o";
            for (int br = 0; br < 3 && !bad; br++)
                if (on[br] && !rows_match(sf.lse_d[br] + t * Hq, wf.lse_d[br] + t * Hq, Hq, 0, 0, ft.lse_rel,
                                          ft.lse_abs, wr))
                    bad = "lse";
            if (!bad && sf.sel && memcmp(sf.sel + t * wsel, wf.sel + t * wsel, (size_t)wsel * 4)) bad = "selection";
            if (!bad && !rows_match(sb.t[TK_G_Q] + t * wq, wb.t[TK_G_Q] + t * wq, wq, g_rms, dq_scale, g_rel, 0, wr))
                bad = "dq";
            for (int br = 0; br < 3 && !bad; br++)
                if (on[br] && !rows_match(sb.t[TK_G_GATE + br] + t * Hq, wb.t[TK_G_GATE + br] + t * Hq, Hq, g_rms,
                                          dg_scale[br], g_rel, 0, wr))
                    bad = "dgate";
            if (bad) {
                int64_t b = 0, local;
                tk_case_token(c, t, &b, &local);
                int p = 0;
                while (p + 1 < P && cut[b][p + 1] <= local) p++;
                printf("FAIL %s P=%d: %s of row %lld (sequence %lld, position %lld, shard %d) differs from the whole "
                       "run's\n",
                       desc, P, bad, (long long)t, (long long)b, (long long)local, p);
                ok = 0;
            }
            ct->rows++;
        }
        /* the key-side sums against the whole backward's */
        for (int i = TK_G_K; i < TK_G_COUNT && ok; i++) {
            if ((i >= TK_G_GATE && i < TK_G_WK) || !wb.t[i]) continue;
            if (!sb.t[i] || sb.n[i] != wb.n[i]) {
                printf("FAIL %s P=%d: the shards returned no %s\n", desc, P, tk_ref64_name(i));
                ok = 0;
                break;
            }
            /* the scale of tk_compare_grads: the tensor's rms, at least 0.1 rms(dO) (dpe: times
             * sqrt(compressed rows), as it sums dkc over them and their sum nearly cancels) */
            double scale = rms_of(wb.t[i], wb.n[i]), floor = 0.1 * rms_do;
            if (i == TK_G_PEK || i == TK_G_PEV) floor *= sqrt((double)in.total_cmp);
            if (scale < floor) scale = floor;
            for (int64_t e = 0; e < wb.n[i]; e++) {
                const double ref = wb.t[i][e], err = fabs(sb.t[i][e] - ref);
                const double tol = g_rms * scale + g_rel * fabs(ref);
                if (!(err <= tol)) {
                    printf("FAIL %s P=%d: the shards' %s[%lld] sum to %.17g, the whole backward gives %.17g "
                           "(tolerance %.3g)\n",
                           desc, P, tk_ref64_name(i), (long long)e, sb.t[i][e], ref, tol);
                    ok = 0;
                    break;
                }
                if (tol > 0 && err / tol > ct->worst) ct->worst = err / tol;
            }
        }
        tk_output_free(&sf);
        tk_grads_free(&sb);
    }
    tk_output_free(&wf);
    tk_grads_free(&wb);
    free(dO);
    tk_inputs_free(&in);
    ct->cases++;
    if (!ok) ct->fails++;
    return ok;
}

/* Is label one of the comma list's entries? */
static int in_list(const char *list, const char *label)
{
    const size_t n = strlen(label);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, label, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* ---- argument rules of nsa_plan_create_varlen */

static int expect(nsa_status got, nsa_status want, const char *what, const char *needle)
{
    if (got == want && (!needle || strstr(nsa_last_error(), needle))) return 1;
    printf("FAIL %s: %s (%s), expected %s%s%s\n", what, nsa_status_string(got), nsa_last_error(),
           nsa_status_string(want), needle ? " naming " : "", needle ? needle : "");
    return 0;
}

static int check_arguments(nsa_context *ctx, int shards)
{
    nsa_config cfg;
    nsa_config_init(&cfg);
    cfg.dtype = NSA_DTYPE_F32;
    cfg.num_q_heads = 4, cfg.num_kv_heads = 2, cfg.head_dim_qk = 16, cfg.head_dim_v = 8;
    nsa_plan *plan = NULL;
    int ok = 1;
    const int64_t q2[3] = {0, 10, 30}, k2[3] = {0, 50, 90}, kshort[3] = {0, 5, 90}, kdown[3] = {0, 50, 40};
    const int64_t kbig[3] = {0, 50, (INT64_C(1) << 40) + 1}, q0[3] = {1, 10, 30};
    ok &= expect(nsa_plan_create_varlen(ctx, &cfg, NULL, k2, 2, &plan), NSA_ERR_NULL_POINTER, "cu_seqlens_q NULL",
                 "cu_seqlens_q");
    ok &= expect(nsa_plan_create_varlen(ctx, &cfg, q0, k2, 2, &plan), NSA_ERR_INVALID_SHAPE, "cu_seqlens_q[0] = 1",
                 "cu_seqlens_q[0]");
    ok &= expect(nsa_plan_create_varlen(ctx, &cfg, q2, kdown, 2, &plan), NSA_ERR_INVALID_SHAPE,
                 "decreasing cu_seqlens_k", "cu_seqlens_k decreases");
    ok &= expect(nsa_plan_create_varlen(ctx, &cfg, q2, kbig, 2, &plan), NSA_ERR_INVALID_SHAPE,
                 "2^40 + 1 keys", "2^40");
    ok &= expect(nsa_plan_create_varlen(ctx, &cfg, q2, kshort, 2, &plan), NSA_ERR_INVALID_SHAPE,
                 "more queries than keys", "sequence 0 has 10 queries");
    ok &= expect(plan ? NSA_ERR_INTERNAL : NSA_SUCCESS, NSA_SUCCESS, "no plan after a refusal", NULL);
    /* cu_seqlens_k NULL, or equal to cu_seqlens_q: a plan of nsa_plan_create on every backend */
    if (expect(nsa_plan_create_varlen(ctx, &cfg, q2, NULL, 2, &plan), NSA_SUCCESS, "cu_seqlens_k NULL", NULL)) {
        nsa_plan_info pi;
        nsa_plan_get_info(plan, &pi);
        if (pi.total_keys != 30 || pi.total_tokens != 30) {
            printf("FAIL cu_seqlens_k NULL: total_keys %lld, total_tokens %lld\n", (long long)pi.total_keys,
                   (long long)pi.total_tokens);
            ok = 0;
        }
        nsa_plan_destroy(plan);
        plan = NULL;
    } else {
        ok = 0;
    }
    nsa_status s = nsa_plan_create_varlen(ctx, &cfg, q2, k2, 2, &plan);
    if (shards) {
        if (expect(s, NSA_SUCCESS, "a shard plan", NULL)) {
            nsa_plan_info pi;
            nsa_plan_get_info(plan, &pi);
            /* keys 50 and 40 long: Nc = (50 - 32) / 16 + 1 = 2 and (40 - 32) / 16 + 1 = 1 */
            if (pi.total_keys != 90 || pi.total_tokens != 30 || pi.total_cmp_blocks != 3 || pi.max_slc_blocks != 1) {
                printf("FAIL shard plan info: total_keys %lld, total_tokens %lld, total_cmp_blocks %lld, "
                       "max_slc_blocks %lld (expected 90, 30, 3, 1)\n",
                       (long long)pi.total_keys, (long long)pi.total_tokens, (long long)pi.total_cmp_blocks,
                       (long long)pi.max_slc_blocks);
                ok = 0;
            }
            nsa_plan_destroy(plan);
        } else {
            ok = 0;
        }
    } else {
        ok &= expect(s, NSA_ERR_UNSUPPORTED, "a shard plan on a backend without shards", nsa_context_backend(ctx));
    }
    return ok;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: test_shard BACKEND DTYPES CORPUS\n");
        return 2;
    }
    nsa_context *ctx = NULL;
    nsa_status s = nsa_context_create(argv[1], 0, &ctx);
    if (s != NSA_SUCCESS) {
        printf("SKIP backend %s: %s\n", argv[1], nsa_last_error());
        return SKIP;
    }
    /* does the backend run shard plans? */
    nsa_config probe;
    nsa_config_init(&probe);
    probe.dtype = NSA_DTYPE_F32;
    nsa_plan *pp = NULL;
    const int64_t pq[2] = {0, 1}, pk[2] = {0, 2};
    s = nsa_plan_create_varlen(ctx, &probe, pq, pk, 1, &pp);
    const int shards = s == NSA_SUCCESS;
    nsa_plan_destroy(pp);
    int ok = check_arguments(ctx, shards);
    g_exact = !strcmp(nsa_context_backend(ctx), "cpu");
    if (!shards) {
        nsa_context_destroy(ctx);
        printf("%s: the backend refuses shard plans (NSA_ERR_UNSUPPORTED, checked); %s\n", argv[1],
               ok ? "skipped" : "FAILED");
        return ok ? SKIP : 1;
    }
    tk_case *cases = NULL;
    const int nc = tk_corpus(argv[3], &cases);
    if (nc < 0) {
        fprintf(stderr, "unknown corpus %s\n", argv[3]);
        nsa_context_destroy(ctx);
        return 2;
    }
    char dts[64];
    snprintf(dts, sizeof dts, "%s", argv[2]);
    for (char *tok = strtok(dts, ","); tok; tok = strtok(NULL, ",")) {
        nsa_dtype dt = !strcmp(tok, "f32") ? NSA_DTYPE_F32 : !strcmp(tok, "f16") ? NSA_DTYPE_F16
                       : !strcmp(tok, "bf16") ? NSA_DTYPE_BF16 : !strcmp(tok, "f64") ? NSA_DTYPE_F64 : (nsa_dtype)-1;
        if ((int)dt < 0) {
            fprintf(stderr, "unknown dtype %s\n", tok);
            ok = 0;
            continue;
        }
        /* a dtype the backend lacks (f64 off the cpu backend) is refused at plan creation: skipped */
        nsa_config pc;
        nsa_config_init(&pc);
        pc.dtype = dt;
        nsa_plan *dp = NULL;
        if (nsa_plan_create_varlen(ctx, &pc, pq, pk, 1, &dp) == NSA_ERR_UNSUPPORTED) {
            printf("%s %s: the backend lacks the dtype (%s); skipped\n", argv[1], tok, nsa_last_error());
            continue;
        }
        nsa_plan_destroy(dp);
        counts ct = {0};
        const char *only = getenv("NSA_TEST_CASE");
        for (int i = 0; i < nc; i++) {
            tk_case c = cases[i];
            if (tk_case_tokens(&c) > 640 || c.rows > 0) continue; /* the full corpus's small cases */
            if (only && *only && !in_list(only, c.label)) continue;
            tk_case_set_dtype(&c, dt);
            ok &= check_case(ctx, &c, &ct);
        }
        char rows[64];
        if (ct.worst_rows > 0) snprintf(rows, sizeof rows, "within %.3g of tolerance of", ct.worst_rows);
        else snprintf(rows, sizeof rows, "bitwise");
        printf("%s %s: %ld cases, %ld shards, %ld shard rows (o, LSEs, selection, dq, dgate) %s the whole run's, "
               "key gradients' sums worst %.3g of tolerance, %ld failed\n",
               argv[1], tok, ct.cases, ct.shards, ct.rows, rows, ct.worst, ct.fails);
    }
    free(cases);
    nsa_context_destroy(ctx);
    return ok ? 0 : 1;
}
