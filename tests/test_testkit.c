/*
 * Self-test of the comparison machinery (tests/common/compare.c): without any
 * backend, feed tk_compare outputs made from the oracle itself and check that
 * it passes exact results, fails perturbed / NaN / -inf-mismatched / wrongly
 * selected ones, and accepts a selection that differs only at an exact tie
 * (judging o against the oracle re-run with the other indices). With a sampled
 * oracle (tk_case.rows): its rows equal the full run's bitwise, and the
 * comparison still fails any error in them and any unwritten row elsewhere.
 * Also checks corpus invariants (size, validity, coverage).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

/* A tk_output holding the oracle's own values, as a backend would return them. */
static void output_from_oracle(const tk_case *c, const tk_oracle *r, tk_output *out)
{
    const nsa_config *g = &c->cfg;
    int64_t T = r->tokens, hq = g->num_q_heads, hkv = g->num_kv_heads, dv = g->head_dim_v, n = g->num_selected;
    memset(out, 0, sizeof *out);
    out->tokens = T;
    out->o = malloc((size_t)(T * hq * dv) * sizeof(float));
    ck_assert_ptr_nonnull(out->o);
    for (int64_t i = 0; i < T * hq * dv; ++i) out->o[i] = (float)r->o[i];
    for (int b = 0; b < 3; ++b) {
        if (!r->lse[b]) continue;
        out->lse[b] = malloc((size_t)(T * hq) * sizeof(float));
        ck_assert_ptr_nonnull(out->lse[b]);
        for (int64_t i = 0; i < T * hq; ++i) out->lse[b][i] = (float)r->lse[b][i];
    }
    if (n > 0 && !c->fixed_indices) {
        out->sel = malloc((size_t)(T * hkv * n) * sizeof(int32_t));
        ck_assert_ptr_nonnull(out->sel);
        memcpy(out->sel, r->sel, (size_t)(T * hkv * n) * sizeof(int32_t));
    }
}

static tk_case find_case(const char *corpus, const char *label)
{
    tk_case *cases;
    int n = tk_corpus(corpus, &cases);
    ck_assert_int_gt(n, 0);
    tk_case found;
    int ok = 0;
    for (int i = 0; i < n; ++i)
        if (strcmp(cases[i].label, label) == 0) {
            found = cases[i];
            ok = 1;
        }
    free(cases);
    ck_assert_msg(ok, "case %s not in corpus %s", label, corpus);
    return found;
}

START_TEST(compare_accepts_exact_and_rejects_errors)
{
    static const nsa_dtype dtypes[] = {NSA_DTYPE_F32, NSA_DTYPE_F16, NSA_DTYPE_BF16};
    for (int d = 0; d < 3; ++d) {
        tk_case c = find_case("small", "s-basic");
        tk_case_set_dtype(&c, dtypes[d]);
        tk_inputs in;
        tk_oracle ref;
        tk_output got;
        tk_verdict v;
        ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
        ck_assert_int_eq(tk_oracle_run(&c, &in, NULL, &ref), NSA_SUCCESS);
        output_from_oracle(&c, &ref, &got);
        ck_assert_msg(tk_compare(&c, &in, &ref, &got, &v), "exact output rejected: %s", v.msg);

        /* one o element off by 20 tolerances */
        tk_tolerance tol = tk_tolerance_for(dtypes[d]);
        float saved = got.o[5];
        got.o[5] += (float)(20.0 * (tol.o_rms * 1.0 + tol.o_abs) + 20.0 * tol.o_rel * fabs(saved));
        ck_assert_msg(!tk_compare(&c, &in, &ref, &got, &v), "perturbed o accepted");
        ck_assert_msg(strstr(v.msg, "o[t="), "message: %s", v.msg);
        got.o[5] = NAN;
        ck_assert_msg(!tk_compare(&c, &in, &ref, &got, &v), "NaN in o accepted");
        got.o[5] = saved;

        /* lse: -inf where the oracle is finite, and a finite value where it is -inf */
        float l0 = got.lse[NSA_BRANCH_CMP][0], lend = got.lse[NSA_BRANCH_CMP][c.cfg.num_q_heads * 20];
        ck_assert_msg(isinf(l0) && l0 < 0, "token 0 sees no compressed block, lse must be -inf");
        got.lse[NSA_BRANCH_CMP][0] = 0.0f;
        ck_assert_msg(!tk_compare(&c, &in, &ref, &got, &v), "finite lse where -inf accepted");
        got.lse[NSA_BRANCH_CMP][0] = l0;
        got.lse[NSA_BRANCH_CMP][c.cfg.num_q_heads * 20] = -INFINITY;
        ck_assert_msg(!tk_compare(&c, &in, &ref, &got, &v), "-inf lse where finite accepted");
        got.lse[NSA_BRANCH_CMP][c.cfg.num_q_heads * 20] = lend;

        /* a stray write reported by the runner */
        got.stray_writes = 1;
        ck_assert_msg(!tk_compare(&c, &in, &ref, &got, &v), "stray write accepted");
        got.stray_writes = 0;
        ck_assert_msg(tk_compare(&c, &in, &ref, &got, &v), "restored output rejected: %s", v.msg);
        tk_output_free(&got);
        tk_oracle_free(&ref);
        tk_inputs_free(&in);
    }
}
END_TEST

/* A selection that replaces a clearly better block must fail; a malformed row too. */
START_TEST(compare_rejects_wrong_selection)
{
    tk_case c = find_case("full", "i0o0"); /* n = 3, nothing forced, T = 100, l_s = 16 */
    tk_inputs in;
    tk_oracle ref;
    tk_output got;
    tk_verdict v;
    ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
    ck_assert_int_eq(tk_oracle_run(&c, &in, NULL, &ref), NSA_SUCCESS);
    output_from_oracle(&c, &ref, &got);
    const int64_t n = c.cfg.num_selected, t = 99; /* eligible blocks 0..6 */
    int32_t *row = got.sel + t * n;
    const double *s = ref.scores + t * ref.max_ns;
    /* find the lowest-scoring unselected block and the best selected one */
    int64_t worst = -1;
    for (int64_t j = 0; j <= 6; ++j) {
        int in_row = 0;
        for (int64_t k = 0; k < n; ++k) in_row |= row[k] == j;
        if (!in_row && (worst < 0 || s[j] < s[worst])) worst = j;
    }
    int64_t best_k = 0;
    for (int64_t k = 1; k < n; ++k)
        if (s[row[k]] > s[row[best_k]]) best_k = k;
    ck_assert_msg(s[row[best_k]] - s[worst] > 1e-3, "scores too close for this test");
    int32_t saved[8];
    memcpy(saved, row, (size_t)n * sizeof *row);
    row[best_k] = (int32_t)worst;
    /* keep it ascending so that only the choice is wrong */
    for (int64_t a = 0; a < n; ++a)
        for (int64_t b = a + 1; b < n; ++b)
            if (row[b] < row[a]) {
                int32_t x = row[a];
                row[a] = row[b];
                row[b] = x;
            }
    ck_assert_msg(!tk_compare(&c, &in, &ref, &got, &v), "a clearly worse selection was accepted");
    ck_assert_msg(strstr(v.msg, "block"), "message: %s", v.msg);
    /* malformed: descending */
    memcpy(row, saved, (size_t)n * sizeof *row);
    int32_t x = row[0];
    row[0] = row[1];
    row[1] = x;
    ck_assert_msg(!tk_compare(&c, &in, &ref, &got, &v), "a descending row was accepted");
    /* malformed: an ineligible block */
    memcpy(row, saved, (size_t)n * sizeof *row);
    row[n - 1] = 7;
    ck_assert_msg(!tk_compare(&c, &in, &ref, &got, &v), "an ineligible block was accepted");
    memcpy(row, saved, (size_t)n * sizeof *row);
    ck_assert_msg(tk_compare(&c, &in, &ref, &got, &v), "restored selection rejected: %s", v.msg);
    tk_output_free(&got);
    tk_oracle_free(&ref);
    tk_inputs_free(&in);
}
END_TEST

/* With every key equal, every fully visible block scores the same: a backend
 * may pick any of them. The oracle picks the lowest index; a "backend" picking
 * the highest must pass, with o judged against the oracle re-run on its indices.
 * Twice: every row, and a sample of a longer sequence (the swaps counted and the
 * re-run judged on the sampled rows only; the backend's rows are the full run's). */
START_TEST(compare_accepts_exact_ties)
{
    for (int sampled = 0; sampled < 2; ++sampled) {
        tk_case c = find_case("full", "l=d=ls8"); /* n = 3, init 1, local 1 */
        c.cfg.num_init = 0;
        c.cfg.num_local = 0;
        c.cfg.num_selected = 1;
        if (sampled) {
            c.cu_seqlens[1] = 400;
            c.rows = 120;
        }
        tk_case every = c; /* the "backend" computes every row */
        every.rows = 0;
        tk_inputs in;
        tk_oracle ref, alt, own;
        tk_output got;
        tk_verdict v;
        ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
        int64_t T = in.tokens, hkv = c.cfg.num_kv_heads, dk = c.cfg.head_dim_qk;
        for (int64_t i = 0; i < T * hkv * dk; ++i) in.k[0][i] = 0.5f; /* aliased by k[1], k[2] */
        ck_assert_int_eq(tk_oracle_run(&c, &in, NULL, &ref), NSA_SUCCESS);
        /* the alternative: the highest-index fully visible block (j <= (t+1)/l_s - 1) */
        int32_t *alt_idx = malloc((size_t)(T * hkv) * sizeof *alt_idx);
        ck_assert_ptr_nonnull(alt_idx);
        int64_t differing = 0, rows = 0;
        for (int64_t t = 0; t < T; ++t) {
            int64_t full = (t + 1) / c.cfg.slc_block; /* blocks wholly at or before t */
            alt_idx[t] = full >= 1 ? (int32_t)(full - 1) : 0;
            if (ref.sampled && !ref.sampled[t]) continue;
            if (alt_idx[t] != ref.sel[t]) ++differing;
            ++rows;
        }
        ck_assert_int_gt(differing, 0);
        ck_assert(sampled ? rows < T : rows == T);
        ck_assert_int_eq(tk_oracle_run(&every, &in, alt_idx, &alt), NSA_SUCCESS);
        output_from_oracle(&c, &alt, &got);
        ck_assert_msg(tk_compare(&c, &in, &ref, &got, &v), "an exact tie was rejected: %s", v.msg);
        ck_assert_int_eq(v.tie_swaps, differing);
        ck_assert_int_eq(v.rows_checked, rows);
        /* ... but the o of the oracle's own choice does not match the other choice */
        ck_assert_int_eq(tk_oracle_run(&every, &in, NULL, &own), NSA_SUCCESS);
        tk_output mixed;
        output_from_oracle(&c, &own, &mixed);
        memcpy(mixed.sel, alt_idx, (size_t)(T * hkv) * sizeof *alt_idx);
        ck_assert_msg(!tk_compare(&c, &in, &ref, &mixed, &v), "o of other indices accepted for a tie swap");
        tk_output_free(&mixed);
        tk_output_free(&got);
        free(alt_idx);
        tk_oracle_free(&own);
        tk_oracle_free(&alt);
        tk_oracle_free(&ref);
        tk_inputs_free(&in);
    }
}
END_TEST

/* A sampled oracle run (tk_case.rows) computes its rows exactly as the full run
 * does (bitwise: o, the LSEs, the selection and the scores), fills the others
 * with NaN / TK_SEL_UNSAMPLED, and samples both ends of every sequence, about
 * `rows` tokens of a long one and block edges in between. Packed sequences,
 * LINEAR and EXTERNAL compression, given indices, sequences shorter than 96. */
START_TEST(oracle_sampled_rows_equal_full)
{
    static const char *labels[] = {"long-varlen-lin", "long1000", "long-ext", "B8-mixed"};
    for (size_t k = 0; k < sizeof labels / sizeof labels[0]; ++k) {
        tk_case c = find_case("full", labels[k]);
        c.fixed_indices = strcmp(labels[k], "long1000") == 0;
        tk_case_set_dtype(&c, NSA_DTYPE_BF16);
        const nsa_config *g = &c.cfg;
        const int64_t T = tk_case_tokens(&c), Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dv = g->head_dim_v;
        const int64_t n = g->num_selected;
        tk_inputs in;
        tk_oracle full, part;
        ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
        const int32_t *given = c.fixed_indices ? in.given : NULL;
        ck_assert_int_eq(tk_oracle_run(&c, &in, given, &full), NSA_SUCCESS);
        ck_assert_ptr_null(full.sampled);
        c.rows = 150;
        ck_assert_int_eq(tk_oracle_run(&c, &in, given, &part), NSA_SUCCESS);
        ck_assert_ptr_nonnull(part.sampled);
        uint8_t *mask = malloc((size_t)T + 1);
        ck_assert_ptr_nonnull(mask);
        const int64_t count = tk_case_sample(&c, mask);
        ck_assert(memcmp(mask, part.sampled, (size_t)T) == 0);

        int64_t seen = 0, edges = 0;
        for (int64_t b = 0; b < c.batch; ++b) {
            const int64_t base = c.cu_seqlens[b], len = c.cu_seqlens[b + 1] - base;
            int64_t in_seq = 0;
            for (int64_t t = 0; t < len; ++t) {
                in_seq += mask[base + t];
                if (t < 48 || t >= len - 48) ck_assert_msg(mask[base + t], "%s: end token %lld", c.label, (long long)t);
                /* a selection-block edge in the interior, both sides sampled */
                edges += t >= 48 && t < len - 48 && t % g->slc_block == 0 && mask[base + t] && mask[base + t - 1];
            }
            ck_assert_msg(in_seq <= (len < c.rows ? len : c.rows), "%s: %lld sampled of %lld", c.label,
                          (long long)in_seq, (long long)len);
            if (len >= 400) ck_assert_msg(in_seq > 120, "%s: only %lld sampled", c.label, (long long)in_seq);
        }
        ck_assert_msg(strcmp(labels[k], "B8-mixed") == 0 || (edges > 0 && count < T / 2),
                      "%s: %lld of %lld, %lld edges", c.label, (long long)count, (long long)T, (long long)edges);
        for (int64_t t = 0; t < T; ++t) {
            const double *o = part.o + t * Hq * Dv;
            if (!part.sampled[t]) {
                for (int64_t e = 0; e < Hq * Dv; ++e) ck_assert(isnan(o[e]));
                for (int64_t e = 0; e < Hkv * n; ++e) ck_assert_int_eq(part.sel[t * Hkv * n + e], TK_SEL_UNSAMPLED);
                continue;
            }
            ++seen;
            ck_assert_msg(memcmp(o, full.o + t * Hq * Dv, (size_t)(Hq * Dv) * sizeof *o) == 0, "%s: o row %lld",
                          c.label, (long long)t);
            for (int b = 0; b < 3; ++b)
                ck_assert(!full.lse[b] ||
                          memcmp(part.lse[b] + t * Hq, full.lse[b] + t * Hq, (size_t)Hq * sizeof(double)) == 0);
            if (n == 0) continue;
            ck_assert(memcmp(part.sel + t * Hkv * n, full.sel + t * Hkv * n, (size_t)(Hkv * n) * sizeof(int32_t)) == 0);
            ck_assert(memcmp(part.scores + t * Hkv * full.max_ns, full.scores + t * Hkv * full.max_ns,
                             (size_t)(Hkv * full.max_ns) * sizeof(double)) == 0);
        }
        ck_assert_int_eq(seen, count);
        free(mask);
        tk_oracle_free(&part);
        tk_oracle_free(&full);
        tk_inputs_free(&in);
    }
}
END_TEST

/* Against a sampled oracle tk_compare checks the sampled rows (and counts them):
 * an error in one fails as it would in a full run; a row left out is not
 * compared, but one still holding the runner's poison fails. */
START_TEST(compare_sampled_rows)
{
    tk_case c = find_case("full", "long1000"); /* T = 1000, H = 2/1, D = 4/4, l_s = 32, n = 4 */
    tk_case_set_dtype(&c, NSA_DTYPE_BF16);
    const int64_t T = tk_case_tokens(&c), Hq = c.cfg.num_q_heads, Dv = c.cfg.head_dim_v, n = c.cfg.num_selected;
    tk_inputs in;
    tk_oracle full, part;
    tk_output got;
    tk_verdict v;
    ck_assert_int_eq(tk_inputs_make(&c, &in), NSA_SUCCESS);
    ck_assert_int_eq(tk_oracle_run(&c, &in, NULL, &full), NSA_SUCCESS);
    output_from_oracle(&c, &full, &got); /* a backend writes every row */
    c.rows = 200;
    ck_assert_int_eq(tk_oracle_run(&c, &in, NULL, &part), NSA_SUCCESS);
    int64_t count = 0, ts = -1, tu = -1; /* a sampled and an unsampled token of the interior */
    for (int64_t t = 0; t < T; ++t) {
        count += part.sampled[t];
        if (t >= 48 && part.sampled[t] && ts < 0) ts = t;
        if (t >= 48 && !part.sampled[t] && tu < 0) tu = t;
    }
    ck_assert(ts >= 0 && tu >= 0);
    ck_assert_msg(tk_compare(&c, &in, &part, &got, &v), "exact output rejected: %s", v.msg);
    ck_assert_int_eq(v.rows_checked, count);

    /* the sampled row: o, an LSE, the selection */
    const tk_tolerance tol = tk_tolerance_for(c.cfg.dtype);
    float *o = got.o + ts * Hq * Dv + 1, saved = *o;
    *o += (float)(20.0 * (tol.o_rms * 1.0 + tol.o_abs) + 20.0 * tol.o_rel * fabs(saved));
    ck_assert_msg(!tk_compare(&c, &in, &part, &got, &v), "a perturbed sampled o accepted");
    char where[64];
    snprintf(where, sizeof where, "o[t=%lld ", (long long)ts);
    ck_assert_msg(strstr(v.msg, where), "message: %s", v.msg);
    *o = saved;
    float *l = got.lse[NSA_BRANCH_WIN] + ts * Hq, lsaved = *l;
    *l += 0.1f;
    ck_assert_msg(!tk_compare(&c, &in, &part, &got, &v), "a perturbed sampled lse accepted");
    *l = lsaved;
    int32_t *sel = got.sel + ts * c.cfg.num_kv_heads * n, ssaved = sel[n - 1];
    sel[n - 1] = (int32_t)(ts / c.cfg.slc_block + 1); /* not yet eligible */
    ck_assert_msg(!tk_compare(&c, &in, &part, &got, &v), "an ineligible sampled block accepted");
    sel[n - 1] = ssaved;

    /* the unsampled row: not compared, but it must be written */
    o = got.o + tu * Hq * Dv + 1;
    saved = *o;
    *o += 1.0f;
    ck_assert_msg(tk_compare(&c, &in, &part, &got, &v), "an unsampled row was compared: %s", v.msg);
    *o = NAN;
    ck_assert_msg(!tk_compare(&c, &in, &part, &got, &v), "NaN in an unsampled o accepted");
    ck_assert_msg(strstr(v.msg, "must be written"), "message: %s", v.msg);
    *o = saved;
    l = got.lse[NSA_BRANCH_CMP] + tu * Hq;
    lsaved = *l;
    *l = NAN;
    ck_assert_msg(!tk_compare(&c, &in, &part, &got, &v), "NaN in an unsampled lse accepted");
    *l = lsaved;
    sel = got.sel + tu * c.cfg.num_kv_heads * n;
    ssaved = sel[0];
    sel[0] = 0x7f7f7f7f;
    ck_assert_msg(!tk_compare(&c, &in, &part, &got, &v), "a poisoned unsampled selection accepted");
    sel[0] = ssaved;
    ck_assert_msg(tk_compare(&c, &in, &part, &got, &v), "restored output rejected: %s", v.msg);

    /* the summary says how many rows were checked, only where a case samples */
    tk_stats st;
    memset(&st, 0, sizeof st);
    tk_stats_add(&st, &c, &v);
    char want[96], line[512] = "";
    snprintf(want, sizeof want, "rows checked: %lld of %lld\n", (long long)count, (long long)T);
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    tk_stats_print(f, "bf16", &st);
    rewind(f);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_msg(strstr(line, want), "summary: %s", line);
    c.rows = 0;
    ck_assert(tk_compare(&c, &in, &full, &got, &v));
    ck_assert_int_eq(v.rows_checked, T);
    memset(&st, 0, sizeof st);
    tk_stats_add(&st, &c, &v);
    rewind(f);
    tk_stats_print(f, "bf16", &st);
    rewind(f);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_msg(!strstr(line, "rows checked"), "summary: %s", line);
    fclose(f);
    tk_output_free(&got);
    tk_oracle_free(&part);
    tk_oracle_free(&full);
    tk_inputs_free(&in);
}
END_TEST

START_TEST(corpus_invariants)
{
    tk_case *full, *small;
    int nf = tk_corpus("full", &full), ns = tk_corpus("small", &small);
    ck_assert_int_ge(nf, 120);
    ck_assert_int_ge(ns, 15);
    tk_case *unknown = NULL;
    ck_assert_int_eq(tk_corpus("nope", &unknown), -1);
    int groups[17] = {0}, modes[4] = {0}, layouts[3] = {0}, zero_len = 0, fixed = 0, n0 = 0, w0 = 0, wbig = 0;
    int odd = 0, dne = 0, lds = 0, scale = 0, nbig = 0, t_lt_l = 0, long_t = 0;
    for (int i = 0; i < nf; ++i) {
        const tk_case *c = &full[i];
        const nsa_config *g = &c->cfg;
        ck_assert_msg(nsa_config_validate(g) == NSA_SUCCESS, "%s: %s", c->label, nsa_last_error());
        for (int j = 0; j < i; ++j) ck_assert_msg(strcmp(full[j].label, c->label) != 0, "duplicate %s", c->label);
        int64_t G = g->num_q_heads / g->num_kv_heads, T = tk_case_tokens(c);
        ck_assert_int_gt(T, 0);
        if (G <= 16) groups[G]++;
        modes[g->compress == NSA_COMPRESS_LINEAR && c->use_pe ? 3 : g->compress]++;
        layouts[c->layout]++;
        for (int64_t b = 0; b < c->batch; ++b) zero_len += c->cu_seqlens[b + 1] == c->cu_seqlens[b] && c->batch > 1;
        fixed += c->fixed_indices;
        n0 += g->num_selected == 0;
        w0 += g->window == 0;
        wbig += g->window >= T;
        odd += g->head_dim_qk % 2 == 1 && g->head_dim_qk > 1;
        dne += g->head_dim_qk != g->head_dim_v;
        lds += g->cmp_block == g->cmp_stride && g->cmp_block == g->slc_block;
        scale += g->scale != 0.0f;
        nbig += g->num_selected > tk_case_max_slc(c);
        t_lt_l += T < g->cmp_block;
        long_t += T >= 1000;
    }
    int need[] = {1, 2, 3, 4, 8, 16};
    for (int k = 0; k < 6; ++k) ck_assert_msg(groups[need[k]] > 0, "no case with G = %d", need[k]);
    for (int k = 0; k < 4; ++k) ck_assert_msg(modes[k] > 0, "compression mode %d missing", k);
    for (int k = 0; k < 3; ++k) ck_assert_msg(layouts[k] > 0, "layout %d missing", k);
    ck_assert(zero_len > 0 && fixed > 0 && n0 > 0 && w0 > 0 && wbig > 0 && odd > 0 && dne > 0 && lds > 0);
    ck_assert(scale > 0 && nbig > 0 && t_lt_l > 0 && long_t >= 3);
    for (int i = 0; i < ns; ++i) {
        ck_assert_msg(nsa_config_validate(&small[i].cfg) == NSA_SUCCESS, "%s", small[i].label);
        ck_assert_int_eq(small[i].rows, 0);
    }
    for (int i = 0; i < nf; ++i) ck_assert_int_eq(full[i].rows, 0); /* full and small check every row */
    /* the gpu corpus: every case valid, and sampled (its fp64 oracle over every row takes hours) */
    tk_case *gpu;
    int ng = tk_corpus("gpu", &gpu);
    ck_assert_int_ge(ng, 10);
    for (int i = 0; i < ng; ++i) {
        ck_assert_msg(nsa_config_validate(&gpu[i].cfg) == NSA_SUCCESS, "%s: %s", gpu[i].label, nsa_last_error());
        ck_assert_msg(gpu[i].rows > 0, "%s checks every row", gpu[i].label);
    }
    free(gpu);
    free(full);
    free(small);
}
END_TEST

/* The oracle's rounding (its own code) and the library's nsa_convert must agree
 * on every float: f16 and bf16 normals, subnormals, exact ties (both ways) and
 * overflow. A disagreement would make the oracle's compressed keys differ from
 * every backend's. */
START_TEST(oracle_rounding_matches_library)
{
    enum { N = 1 << 16 };
    static float x[N + 64];
    int n = 0;
    const float special[] = {0.f, -0.f, 1.f, -1.f, 65504.f, 65519.99f, 65520.f, -65520.f, 6.0e-8f, 2.98e-8f,
                             2.9802322e-8f, 5.9604645e-8f, 1.0009765625f, 1.00048828125f, 1.001953125f,
                             3.3895313892515355e38f, 3.4028235e38f, 1.1754944e-38f, 9.18e-41f, 1e-45f};
    for (unsigned i = 0; i < sizeof special / sizeof special[0]; ++i) x[n++] = special[i];
    for (int i = 0; i < N; ++i) {
        uint32_t bits = (uint32_t)nsa_random_u64(7, 11, (uint64_t)i);
        if (i % 4 == 0) bits = (bits & 0xffff0000u) | 0x8000u;          /* a bf16 tie */
        if (i % 4 == 1) bits = (bits & 0x8fffe000u) | 0x38001000u;      /* an f16-range tie */
        float f;
        memcpy(&f, &bits, sizeof f);
        if (isnan(f)) continue;
        x[n++] = f;
    }
    const nsa_dtype dts[2] = {NSA_DTYPE_F16, NSA_DTYPE_BF16};
    static uint16_t h[N + 64];
    static float back[N + 64];
    for (int d = 0; d < 2; ++d) {
        ck_assert_int_eq(nsa_convert(x, NSA_DTYPE_F32, h, dts[d], n), NSA_SUCCESS);
        ck_assert_int_eq(nsa_convert(h, dts[d], back, NSA_DTYPE_F32, n), NSA_SUCCESS);
        for (int i = 0; i < n; ++i) {
            double want = tk_round_to_dtype((double)x[i], dts[d]);
            uint32_t xb;
            memcpy(&xb, &x[i], sizeof xb);
            ck_assert_msg(want == (double)back[i] && !signbit(want) == !signbit(back[i]),
                          "%s: x = %.9g (0x%08x): oracle %.9g, nsa_convert %.9g",
                          dts[d] == NSA_DTYPE_F16 ? "f16" : "bf16", x[i], (unsigned)xb, want, (double)back[i]);
        }
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("testkit");
    TCase *tc = tcase_create("testkit");
    tcase_set_timeout(tc, 0);
    tcase_add_test(tc, compare_accepts_exact_and_rejects_errors);
    tcase_add_test(tc, compare_rejects_wrong_selection);
    tcase_add_test(tc, compare_accepts_exact_ties);
    tcase_add_test(tc, oracle_sampled_rows_equal_full);
    tcase_add_test(tc, compare_sampled_rows);
    tcase_add_test(tc, corpus_invariants);
    tcase_add_test(tc, oracle_rounding_matches_library);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
