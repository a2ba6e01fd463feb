/*
 * The oracle: docs/nsa-semantics.md computed literally, in fp64, by brute force.
 *
 * Written from the semantics page alone (not from any backend). Every rule is
 * applied in its most explicit form, so that a reader can check it line by line
 * against the page:
 *   - compressed block i of a sequence is the token range [i*d, i*d + l - 1];
 *   - query t's compressed key set is the list of i whose last token is <= t;
 *   - the overlap between compressed block i and selection block j is counted
 *     token by token;
 *   - s(t, g, j) sums overlap/d * p_cmp over the group's heads and visible i;
 *   - eligible blocks start at or before t; the selection sorts every eligible
 *     block by (forced first, higher score, lower index) and keeps the first n;
 *   - selected and window attention build their key-token lists explicitly and
 *     run a dense softmax over them.
 * Speed is not a goal; cost is O(T * (nc + n*l_s + w) * H * D) per case, T
 * counting only the sampled tokens where the case samples (tk_case.rows: the
 * gpu corpus, whose every row took 276 s a mode on one core). A sampled row is
 * computed exactly as in a full run: only the loop over tokens skips the others.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

#define IDX3(a, b, c, B, C) (((a) * (B) + (b)) * (C) + (c))

typedef struct rank_entry {
    int forced;
    double score;
    int64_t j;
} rank_entry;

/* forced first, then the higher score, then the lower index */
static int rank_cmp(const void *pa, const void *pb)
{
    const rank_entry *a = pa, *b = pb;
    if (a->forced != b->forced) return a->forced ? -1 : 1;
    if (a->score > b->score) return -1;
    if (a->score < b->score) return 1;
    return (a->j > b->j) - (a->j < b->j);
}

static int cmp_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return (a > b) - (a < b);
}

/* Dense softmax attention of one query vector qv[D] over nkeys keys: key r has
 * key vector keys + key_off[r] and value vector vals + val_off[r]. Writes out[Dv]
 * and returns the log-sum-exp of the scaled logits (-inf when nkeys == 0, with
 * out = 0). p (nkeys doubles of scratch) receives the probabilities. */
static double attend(const float *qv, int64_t D, int64_t Dv, double scale, const double *keys,
                     const float *keys_f, const int64_t *key_off, const double *vals, const float *vals_f,
                     const int64_t *val_off, int64_t nkeys, double *p, double *out)
{
    for (int64_t x = 0; x < Dv; ++x) out[x] = 0.0;
    if (nkeys == 0) return -INFINITY;
    double mx = -INFINITY;
    for (int64_t r = 0; r < nkeys; ++r) {
        double dot = 0.0;
        for (int64_t x = 0; x < D; ++x) {
            double kx = keys ? keys[key_off[r] + x] : (double)keys_f[key_off[r] + x];
            dot += (double)qv[x] * kx;
        }
        p[r] = scale * dot;
        if (p[r] > mx) mx = p[r];
    }
    double sum = 0.0;
    for (int64_t r = 0; r < nkeys; ++r) {
        p[r] = exp(p[r] - mx);
        sum += p[r];
    }
    for (int64_t r = 0; r < nkeys; ++r) {
        p[r] /= sum;
        for (int64_t x = 0; x < Dv; ++x) {
            double vx = vals ? vals[val_off[r] + x] : (double)vals_f[val_off[r] + x];
            out[x] += p[r] * vx;
        }
    }
    return mx + log(sum);
}

/* x rounded once to the nearest value of `dtype` (ties to even), as a double.
 * Written out from the formats' parameters, not from any conversion code of the
 * library: p significand bits (implicit bit included), smallest normal exponent
 * emin, largest finite value max. Beyond max (after rounding) the value overflows
 * to infinity, as IEEE round-to-nearest does. */
double tk_round_to_dtype(double x, nsa_dtype dtype)
{
    int p, emin;
    double max;
    switch (dtype) {
    case NSA_DTYPE_F16: p = 11, emin = -14, max = 65504.0; break;
    case NSA_DTYPE_BF16: p = 8, emin = -126, max = ldexp(255.0, 120); break; /* (2 - 2^-7) * 2^127 */
    case NSA_DTYPE_F64: return x;
    default: return (double)(float)x; /* f32: the C conversion rounds to nearest even */
    }
    if (x == 0.0 || !isfinite(x)) return x;
    int e;
    frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
    int lead = e - 1 > emin ? e - 1 : emin; /* exponent of the leading bit (subnormals: emin) */
    int q = lead - (p - 1); /* the format's values near x are the multiples of 2^q */
    double r = ldexp(nearbyint(ldexp(x, -q)), q); /* both scalings are exact */
    return fabs(r) > max ? copysign(INFINITY, x) : r;
}

void tk_compress_row(const tk_case *c, const tk_inputs *in, int kv, int64_t h, const float *const *rows,
                     double *out)
{
    const nsa_config *g = &c->cfg;
    const int64_t l = g->cmp_block;
    const int64_t D = kv == 0 ? g->head_dim_qk : g->head_dim_v;
    const float *W = kv == 0 ? in->w_k : in->w_v;
    const float *pe = kv == 0 ? in->pe_k : in->pe_v;
    for (int64_t x = 0; x < D; ++x) out[x] = 0.0;
    for (int64_t j = 0; j < l; ++j) {
        const float *kr = rows[j] + h * D; /* token i*d + j of the block, head h */
        if (g->compress == NSA_COMPRESS_MEAN) {
            for (int64_t x = 0; x < D; ++x) out[x] += (double)kr[x];
        } else { /* LINEAR: (k[j] + pe[h, j]) @ W[h, j], W[h, j] is [D_in, D_out] */
            for (int64_t xi = 0; xi < D; ++xi) {
                double a = (double)kr[xi] + (pe ? (double)pe[IDX3(h, j, xi, l, D)] : 0.0);
                const float *wrow = W + ((h * l + j) * D + xi) * D;
                for (int64_t xo = 0; xo < D; ++xo) out[xo] += a * (double)wrow[xo];
            }
        }
    }
    if (g->compress == NSA_COMPRESS_MEAN)
        for (int64_t x = 0; x < D; ++x) out[x] /= (double)l;
    for (int64_t x = 0; x < D; ++x) out[x] = tk_round_to_dtype(out[x], g->dtype);
}

/* Compressed keys and values of one sequence (rows 0 .. Nc-1), fp64, each element
 * rounded once to the case dtype (semantics 7: kc and vc are tensors of the call's
 * dtype). */
static void compress_sequence(const tk_case *c, const tk_inputs *in, int64_t seq, int64_t nc,
                              double *kc, double *vc, const float **rows /* [l] scratch */)
{
    const nsa_config *g = &c->cfg;
    int64_t Hkv = g->num_kv_heads, l = g->cmp_block, d = g->cmp_stride;
    int64_t base = c->cu_seqlens[seq];
    int64_t cmp_base = 0;
    for (int64_t b = 0; b < seq; ++b)
        cmp_base += tk_num_cmp_blocks(g, c->cu_seqlens[b + 1] - c->cu_seqlens[b]);

    for (int pass = 0; pass < 2; ++pass) { /* 0: keys, 1: values */
        int64_t D = pass == 0 ? g->head_dim_qk : g->head_dim_v;
        const float *src = pass == 0 ? in->k[NSA_BRANCH_CMP] : in->v[NSA_BRANCH_CMP];
        const float *ext = pass == 0 ? in->kc : in->vc;
        double *dst = pass == 0 ? kc : vc;
        for (int64_t i = 0; i < nc; ++i) {
            for (int64_t j = 0; j < l && g->compress != NSA_COMPRESS_EXTERNAL; ++j)
                rows[j] = src + IDX3(base + i * d + j, 0, 0, Hkv, D); /* token i*d + j of the sequence */
            for (int64_t h = 0; h < Hkv; ++h) {
                double *row = dst + IDX3(i, h, 0, Hkv, D);
                if (g->compress == NSA_COMPRESS_EXTERNAL)
                    for (int64_t x = 0; x < D; ++x) row[x] = ext[IDX3(cmp_base + i, h, x, Hkv, D)];
                else
                    tk_compress_row(c, in, pass, h, rows, row);
            }
        }
    }
}

/* The rows of a token the case's sample leaves out: NaN, so that a reader that
 * forgets out->sampled fails loudly (testkit.h). */
static void unsampled_row(const nsa_config *g, int64_t max_ns, int64_t tg, tk_oracle *out)
{
    const int64_t Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dv = g->head_dim_v, n = g->num_selected;
    for (int64_t e = 0; e < Hq * Dv; ++e) out->o[tg * Hq * Dv + e] = NAN;
    for (int b = 0; b < 3; ++b)
        for (int64_t h = 0; h < Hq && out->lse[b]; ++h) out->lse[b][tg * Hq + h] = NAN;
    for (int64_t e = 0; e < Hkv * n && out->sel; ++e) out->sel[tg * Hkv * n + e] = TK_SEL_UNSAMPLED;
    for (int64_t e = 0; e < Hkv * max_ns && out->scores; ++e) out->scores[tg * Hkv * max_ns + e] = NAN;
}

nsa_status tk_oracle_run(const tk_case *c, const tk_inputs *in, const int32_t *indices, tk_oracle *out)
{
    memset(out, 0, sizeof *out);
    if (!c || !in) return NSA_ERR_NULL_POINTER;
    const nsa_config *g = &c->cfg;
    const int64_t T = tk_case_tokens(c);
    const int64_t Hq = g->num_q_heads, Hkv = g->num_kv_heads, G = Hq / Hkv;
    const int64_t Dqk = g->head_dim_qk, Dv = g->head_dim_v;
    const int64_t l = g->cmp_block, d = g->cmp_stride, ls = g->slc_block, n = g->num_selected;
    const int64_t w = g->window;
    const double scale = tk_case_scale(c);
    const int slc_on = n > 0, win_on = w > 0;

    int64_t max_len = 0, max_nc = 0, max_ns = tk_case_max_slc(c);
    for (int64_t b = 0; b < c->batch; ++b) {
        int64_t len = c->cu_seqlens[b + 1] - c->cu_seqlens[b];
        if (len > max_len) max_len = len;
        if (tk_num_cmp_blocks(g, len) > max_nc) max_nc = tk_num_cmp_blocks(g, len);
    }
    out->tokens = T;
    out->max_ns = max_ns;

    size_t one = 1;
#define ALLOC(ptr, count) ptr = malloc(((size_t)(count) > 0 ? (size_t)(count) : one) * sizeof *(ptr))
    ALLOC(out->o, T * Hq * Dv);
    ALLOC(out->lse[NSA_BRANCH_CMP], T * Hq);
    if (slc_on) {
        ALLOC(out->lse[NSA_BRANCH_SLC], T * Hq);
        ALLOC(out->sel, T * Hkv * n);
        ALLOC(out->scores, T * Hkv * max_ns);
    }
    if (win_on) ALLOC(out->lse[NSA_BRANCH_WIN], T * Hq);
    if (c->rows > 0) ALLOC(out->sampled, T);

    double *kc, *vc, *p, *o_cmp, *o_slc, *o_win, *pcmp;
    int64_t *keys, *koff, *voff, *ov_first, *ov_count, *sel_sorted;
    rank_entry *ranks;
    ALLOC(kc, max_nc * Hkv * Dqk);
    ALLOC(vc, max_nc * Hkv * Dv);
    ALLOC(p, max_len > max_nc ? max_len : max_nc);
    const int64_t pstride = max_nc > 0 ? max_nc : 1; /* row of pcmp per head of the group */
    ALLOC(pcmp, G * pstride);
    const int64_t max_keys = max_len > max_nc ? max_len : max_nc;
    ALLOC(keys, max_keys);
    ALLOC(koff, max_keys);
    ALLOC(voff, max_keys);
    ALLOC(o_cmp, Dv);
    ALLOC(o_slc, Dv);
    ALLOC(o_win, Dv);
    /* overlap table: compressed block i overlaps selection blocks
     * ov_first[i] .. ov_first[i] + (#) with token counts ov_count[i * span + k] */
    const int64_t span = l / ls + 2;
    ALLOC(ov_first, max_nc);
    ALLOC(ov_count, max_nc * span);
    ALLOC(ranks, max_ns);
    ALLOC(sel_sorted, n > 0 ? n : 1);
    const float **crows;
    ALLOC(crows, l);
#undef ALLOC
    nsa_status st = NSA_SUCCESS;
    if (!out->o || !out->lse[0] || (slc_on && (!out->lse[1] || !out->sel || !out->scores)) ||
        (win_on && !out->lse[2]) || (c->rows > 0 && !out->sampled) || !kc || !vc || !p || !pcmp || !keys ||
        !koff || !voff || !o_cmp || !o_slc || !o_win || !ov_first || !ov_count || !ranks || !sel_sorted || !crows) {
        st = NSA_ERR_OUT_OF_MEMORY;
        goto done;
    }
    if (out->sampled) tk_case_sample(c, out->sampled);

    for (int64_t b = 0; b < c->batch; ++b) {
        const int64_t base = c->cu_seqlens[b];
        const int64_t len = c->cu_seqlens[b + 1] - base;
        const int64_t nc = tk_num_cmp_blocks(g, len);
        const int64_t ns = tk_num_slc_blocks(g, len);
        if (len == 0) continue;
        compress_sequence(c, in, b, nc, kc, vc, crows);

        /* token-by-token overlap counting */
        for (int64_t i = 0; i < nc; ++i) {
            int64_t first_tok = i * d, last_tok = i * d + l - 1;
            ov_first[i] = first_tok / ls;
            for (int64_t k = 0; k < span; ++k) ov_count[i * span + k] = 0;
            for (int64_t s = first_tok; s <= last_tok; ++s) {
                int64_t j = s / ls; /* selection block j covers [j*ls, (j+1)*ls - 1] */
                ov_count[i * span + (j - ov_first[i])] += 1;
            }
        }

        for (int64_t t = 0; t < len; ++t) {
            const int64_t tg = base + t;
            if (out->sampled && !out->sampled[tg]) {
                unsampled_row(g, max_ns, tg, out);
                continue;
            }
            for (int64_t kh = 0; kh < Hkv; ++kh) {
                /* ---- compressed attention, for every head of the group */
                int64_t nvis = 0;
                for (int64_t i = 0; i < nc; ++i)
                    if (i * d + l - 1 <= t) keys[nvis++] = i;
                for (int64_t gi = 0; gi < G; ++gi) {
                    int64_t h = kh * G + gi;
                    const float *qv = in->q + IDX3(tg, h, 0, Hq, Dqk);
                    for (int64_t r = 0; r < nvis; ++r) {
                        koff[r] = IDX3(keys[r], kh, 0, Hkv, Dqk);
                        voff[r] = IDX3(keys[r], kh, 0, Hkv, Dv);
                    }
                    double lse = attend(qv, Dqk, Dv, scale, kc, NULL, koff, vc, NULL, voff, nvis, p, o_cmp);
                    out->lse[NSA_BRANCH_CMP][tg * Hq + h] = lse;
                    for (int64_t r = 0; r < nvis; ++r) pcmp[gi * pstride + r] = p[r];
                    double gate = (double)in->gate[NSA_BRANCH_CMP][tg * Hq + h];
                    for (int64_t x = 0; x < Dv; ++x) out->o[IDX3(tg, h, x, Hq, Dv)] = gate * o_cmp[x];
                }
                if (!slc_on) continue;

                /* ---- block scores s(t, g, j) over the eligible blocks */
                double *srow = out->scores + (tg * Hkv + kh) * max_ns;
                for (int64_t j = 0; j < max_ns; ++j) {
                    int eligible = j < ns && j * ls <= t; /* block j starts at or before t */
                    srow[j] = eligible ? 0.0 : NAN;
                }
                for (int64_t gi = 0; gi < G; ++gi)
                    for (int64_t r = 0; r < nvis; ++r) {
                        int64_t i = keys[r];
                        for (int64_t k = 0; k < span; ++k) {
                            int64_t j = ov_first[i] + k, cnt = ov_count[i * span + k];
                            if (cnt == 0) continue;
                            double contrib = ((double)cnt / (double)d) * pcmp[gi * pstride + r];
                            if (j < ns && j * ls <= t) srow[j] += contrib;
                        }
                    }

                /* ---- selection */
                int32_t *sel = out->sel + (tg * Hkv + kh) * n;
                int64_t nsel;
                if (indices) {
                    const int32_t *given = indices + (tg * Hkv + kh) * n;
                    nsel = 0;
                    for (int64_t k = 0; k < n; ++k) {
                        sel[k] = given[k];
                        if (given[k] >= 0) sel_sorted[nsel++] = given[k];
                    }
                } else {
                    int64_t m = 0;
                    for (int64_t j = 0; j < ns; ++j) {
                        if (!(j * ls <= t)) continue;
                        ranks[m].forced = tk_block_forced(g, t, j);
                        ranks[m].score = srow[j];
                        ranks[m].j = j;
                        ++m;
                    }
                    qsort(ranks, (size_t)m, sizeof *ranks, rank_cmp);
                    nsel = m < n ? m : n;
                    for (int64_t k = 0; k < nsel; ++k) sel_sorted[k] = ranks[k].j;
                    qsort(sel_sorted, (size_t)nsel, sizeof *sel_sorted, cmp_i64);
                    for (int64_t k = 0; k < n; ++k) sel[k] = k < nsel ? (int32_t)sel_sorted[k] : -1;
                }

                /* ---- selected attention: tokens of the selected blocks, causal */
                int64_t nkeys = 0;
                for (int64_t k = 0; k < nsel; ++k) {
                    int64_t j = sel_sorted[k];
                    for (int64_t s = j * ls; s <= (j + 1) * ls - 1; ++s)
                        if (s <= t) keys[nkeys++] = s;
                }
                for (int64_t gi = 0; gi < G; ++gi) {
                    int64_t h = kh * G + gi;
                    const float *qv = in->q + IDX3(tg, h, 0, Hq, Dqk);
                    for (int64_t r = 0; r < nkeys; ++r) {
                        koff[r] = IDX3(base + keys[r], kh, 0, Hkv, Dqk);
                        voff[r] = IDX3(base + keys[r], kh, 0, Hkv, Dv);
                    }
                    double lse = attend(qv, Dqk, Dv, scale, NULL, in->k[NSA_BRANCH_SLC], koff, NULL,
                                        in->v[NSA_BRANCH_SLC], voff, nkeys, p, o_slc);
                    out->lse[NSA_BRANCH_SLC][tg * Hq + h] = lse;
                    double gate = (double)in->gate[NSA_BRANCH_SLC][tg * Hq + h];
                    for (int64_t x = 0; x < Dv; ++x) out->o[IDX3(tg, h, x, Hq, Dv)] += gate * o_slc[x];
                }
            }

            /* ---- sliding window: tokens [max(0, t - w + 1), t] */
            if (win_on) {
                int64_t nkeys = 0;
                for (int64_t s = 0; s <= t; ++s)
                    if (s >= t - w + 1) keys[nkeys++] = s;
                for (int64_t h = 0; h < Hq; ++h) {
                    int64_t kh = h / G;
                    const float *qv = in->q + IDX3(tg, h, 0, Hq, Dqk);
                    for (int64_t r = 0; r < nkeys; ++r) {
                        koff[r] = IDX3(base + keys[r], kh, 0, Hkv, Dqk);
                        voff[r] = IDX3(base + keys[r], kh, 0, Hkv, Dv);
                    }
                    double lse = attend(qv, Dqk, Dv, scale, NULL, in->k[NSA_BRANCH_WIN], koff, NULL,
                                        in->v[NSA_BRANCH_WIN], voff, nkeys, p, o_win);
                    out->lse[NSA_BRANCH_WIN][tg * Hq + h] = lse;
                    double gate = (double)in->gate[NSA_BRANCH_WIN][tg * Hq + h];
                    for (int64_t x = 0; x < Dv; ++x) out->o[IDX3(tg, h, x, Hq, Dv)] += gate * o_win[x];
                }
            }
        }
    }

done:
    free(kc);
    free(vc);
    free(p);
    free(pcmp);
    free(keys);
    free(koff);
    free(voff);
    free(o_cmp);
    free(o_slc);
    free(o_win);
    free(ov_first);
    free(ov_count);
    free(ranks);
    free(sel_sorted);
    free((void *)crows);
    if (st != NSA_SUCCESS) tk_oracle_free(out);
    return st;
}

void tk_oracle_free(tk_oracle *r)
{
    if (!r) return;
    free(r->o);
    for (int b = 0; b < 3; ++b) free(r->lse[b]);
    free(r->sel);
    free(r->scores);
    free(r->sampled);
    memset(r, 0, sizeof *r);
}
