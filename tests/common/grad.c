/*
 * The gradient reference: docs/nsa-semantics.md section 9 computed literally in
 * fp64 from double inputs, with the block selection given (a constant of the
 * backward pass). tk_ref64_forward is the same forward as the oracle
 * (oracle.c), written again over double inputs so that finite differences can
 * perturb them without rounding; tk_ref64_backward is its exact gradient.
 * tests/test_grad.c checks the backward against central differences of the
 * forward, and the forward against the oracle.
 *
 * Per branch b, query row (t, h) over its key list r = 1 .. R (compressed rows
 * for cmp, token rows for slc and win), with z_r = scale q . k_r and
 * p = softmax(z), o_b = sum_r p_r v_r:
 *     dO_b  = g_b(t, h) dO(t, h)          dg_b(t, h) = dO(t, h) . o_b
 *     dp_r  = dO_b . v_r                  D = sum_r p_r dp_r  (= dO_b . o_b)
 *     ds_r  = p_r (dp_r - D)
 *     dq   += scale sum_r ds_r k_r        dk_r += scale ds_r q     dv_r += p_r dO_b
 * and the compressed rows' gradients flow back through phi (MEAN: 1/l to each
 * of the block's l rows; LINEAR: dW, dpe and the rows through W^T; EXTERNAL:
 * dkc, dvc are the result). The dtype rounding of MEAN / LINEAR kc, vc
 * (semantics 7) passes gradients straight through; tk_ref64_forward applies it
 * only when asked (round = 1: the oracle's forward).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

#define IDX3(a, b, c, B, C) (((a) * (B) + (b)) * (C) + (c))

/* tk_ref64_emulate (testkit.h): off by default, and then every product below is the reference's */
static int g_emu;
static nsa_dtype g_emu_dt = NSA_DTYPE_BF16;
void tk_ref64_emulate(int mode, nsa_dtype dt)
{
    g_emu = mode;
    g_emu_dt = dt;
}
static double emu16(int bit, double x)
{
    if (!(g_emu & bit)) return x;
    uint16_t h;
    double y;
    if (nsa_convert(&x, NSA_DTYPE_F64, &h, g_emu_dt, 1) != NSA_SUCCESS ||
        nsa_convert(&h, g_emu_dt, &y, NSA_DTYPE_F64, 1) != NSA_SUCCESS)
        return NAN;
    return y;
}

/* Element counts of the tensors of case c (tk_ref64 layout). */
static void counts(const tk_case *c, int64_t n[TK_G_COUNT])
{
    const nsa_config *g = &c->cfg;
    const int64_t T = tk_case_tokens(c), Hq = g->num_q_heads, Hkv = g->num_kv_heads;
    const int64_t Dk = g->head_dim_qk, Dv = g->head_dim_v, l = g->cmp_block;
    int64_t nc = 0;
    for (int64_t b = 0; b < c->batch; b++) nc += tk_num_cmp_blocks(g, c->cu_seqlens[b + 1] - c->cu_seqlens[b]);
    const int lin = g->compress == NSA_COMPRESS_LINEAR, ext = g->compress == NSA_COMPRESS_EXTERNAL;
    const int on[3] = {1, g->num_selected > 0, g->window > 0};
    memset(n, 0, sizeof(int64_t) * TK_G_COUNT);
    n[TK_G_Q] = T * Hq * Dk;
    for (int b = 0; b < 3; b++) {
        const int kv = on[b] && !(b == 0 && ext);
        n[TK_G_K + b] = kv ? T * Hkv * Dk : 0;
        n[TK_G_V + b] = kv ? T * Hkv * Dv : 0;
        n[TK_G_GATE + b] = on[b] ? T * Hq : 0;
    }
    if (lin) {
        n[TK_G_WK] = Hkv * l * Dk * Dk;
        n[TK_G_WV] = Hkv * l * Dv * Dv;
        if (c->use_pe) {
            n[TK_G_PEK] = Hkv * l * Dk;
            n[TK_G_PEV] = Hkv * l * Dv;
        }
    }
    if (ext) {
        n[TK_G_KC] = nc * Hkv * Dk;
        n[TK_G_VC] = nc * Hkv * Dv;
    }
}

nsa_status tk_ref64_alloc(const tk_case *c, tk_ref64 *x)
{
    memset(x, 0, sizeof *x);
    counts(c, x->n);
    for (int i = 0; i < TK_G_COUNT; i++) {
        if (x->n[i] == 0) continue;
        x->t[i] = calloc((size_t)x->n[i], sizeof(double));
        if (!x->t[i]) {
            tk_ref64_free(x);
            return NSA_ERR_OUT_OF_MEMORY;
        }
    }
    return NSA_SUCCESS;
}

void tk_ref64_free(tk_ref64 *x)
{
    for (int i = 0; i < TK_G_COUNT; i++) free(x->t[i]);
    memset(x, 0, sizeof *x);
}

nsa_status tk_ref64_from_inputs(const tk_case *c, const tk_inputs *in, tk_ref64 *x)
{
    nsa_status s = tk_ref64_alloc(c, x);
    if (s != NSA_SUCCESS) return s;
    const float *src[TK_G_COUNT] = {in->q,       in->k[0],  in->k[1],  in->k[2],  in->v[0],  in->v[1],
                                    in->v[2],    in->gate[0], in->gate[1], in->gate[2], in->w_k, in->w_v,
                                    in->pe_k,    in->pe_v,  in->kc,    in->vc};
    for (int i = 0; i < TK_G_COUNT; i++)
        for (int64_t e = 0; e < x->n[i]; e++) x->t[i][e] = src[i] ? (double)src[i][e] : 0.0;
    return NSA_SUCCESS;
}

/* Compressed rows of one sequence (nc rows from cmp_base in the packed
 * EXTERNAL layout), fp64; rounded to the dtype when round. */
static void compress64(const tk_case *c, const tk_ref64 *x, int64_t seq, int64_t nc, int64_t cmp_base, int round,
                       double *kc, double *vc)
{
    const nsa_config *g = &c->cfg;
    const int64_t Hkv = g->num_kv_heads, l = g->cmp_block, d = g->cmp_stride, base = c->cu_seqlens[seq];
    for (int pass = 0; pass < 2; pass++) {
        const int64_t D = pass == 0 ? g->head_dim_qk : g->head_dim_v;
        const double *src = x->t[pass == 0 ? TK_G_K : TK_G_V], *W = x->t[pass == 0 ? TK_G_WK : TK_G_WV];
        const double *pe = x->t[pass == 0 ? TK_G_PEK : TK_G_PEV], *ext = x->t[pass == 0 ? TK_G_KC : TK_G_VC];
        double *dst = pass == 0 ? kc : vc;
        for (int64_t i = 0; i < nc; i++)
            for (int64_t h = 0; h < Hkv; h++) {
                double *row = dst + IDX3(i, h, 0, Hkv, D);
                for (int64_t e = 0; e < D; e++) row[e] = 0.0;
                if (g->compress == NSA_COMPRESS_EXTERNAL) {
                    for (int64_t e = 0; e < D; e++) row[e] = ext[IDX3(cmp_base + i, h, e, Hkv, D)];
                    continue;
                }
                for (int64_t j = 0; j < l; j++) {
                    const double *kr = src + IDX3(base + i * d + j, h, 0, Hkv, D);
                    if (g->compress == NSA_COMPRESS_MEAN) {
                        for (int64_t e = 0; e < D; e++) row[e] += kr[e];
                    } else {
                        for (int64_t xi = 0; xi < D; xi++) {
                            const double a = kr[xi] + (pe ? pe[IDX3(h, j, xi, l, D)] : 0.0);
                            const double *wr = W + ((h * l + j) * D + xi) * D;
                            for (int64_t xo = 0; xo < D; xo++) row[xo] += a * wr[xo];
                        }
                    }
                }
                if (g->compress == NSA_COMPRESS_MEAN)
                    for (int64_t e = 0; e < D; e++) row[e] /= (double)l;
                if (round)
                    for (int64_t e = 0; e < D; e++) row[e] = tk_round_to_dtype(row[e], g->dtype);
            }
    }
}

/* The key list of branch b for local query t of KV head kh: rows (compressed
 * for cmp, tokens of the sequence for slc / win) into keys; returns how many. */
static int64_t key_list(const tk_case *c, int b, int64_t t, const int32_t *sel_row, int64_t nc, int64_t *keys)
{
    const nsa_config *g = &c->cfg;
    int64_t m = 0;
    if (b == NSA_BRANCH_CMP) {
        for (int64_t i = 0; i < nc; i++)
            if (i * g->cmp_stride + g->cmp_block - 1 <= t) keys[m++] = i;
    } else if (b == NSA_BRANCH_SLC) {
        for (int64_t k = 0; k < g->num_selected; k++) {
            const int64_t j = sel_row[k];
            if (j < 0) continue;
            for (int64_t s = j * g->slc_block; s < (j + 1) * g->slc_block; s++)
                if (s <= t) keys[m++] = s;
        }
    } else {
        for (int64_t s = t - g->window + 1 > 0 ? t - g->window + 1 : 0; s <= t; s++) keys[m++] = s;
    }
    return m;
}

/* One pass over every (token, head, branch): the forward (o, lse) when grad is
 * NULL, else the backward of the packed rows [r0, r1) into grad (dO given; section
 * 11's shard: the other rows' dO taken as absent). */
static nsa_status run64(const tk_case *c, const tk_ref64 *x, const int32_t *sel, int round, double *o, double *lse[3],
                        const double *dO, tk_ref64 *grad, int64_t r0, int64_t r1)
{
    const nsa_config *g = &c->cfg;
    const int64_t Hq = g->num_q_heads, Hkv = g->num_kv_heads, G = Hq / Hkv;
    const int64_t Dk = g->head_dim_qk, Dv = g->head_dim_v, l = g->cmp_block, d = g->cmp_stride;
    const int64_t n = g->num_selected;
    const double scale = tk_case_scale(c);
    const int on[3] = {1, n > 0, g->window > 0};
    int64_t max_len = 0, max_nc = 0;
    for (int64_t b = 0; b < c->batch; b++) {
        const int64_t len = c->cu_seqlens[b + 1] - c->cu_seqlens[b];
        if (len > max_len) max_len = len;
        if (tk_num_cmp_blocks(g, len) > max_nc) max_nc = tk_num_cmp_blocks(g, len);
    }
    const int64_t mk = (max_len > max_nc ? max_len : max_nc) + 1;
    double *kc = malloc(((size_t)(max_nc * Hkv * Dk) + 1) * sizeof *kc);
    double *vc = malloc(((size_t)(max_nc * Hkv * Dv) + 1) * sizeof *vc);
    double *dkc = calloc((size_t)(max_nc * Hkv * Dk) + 1, sizeof *dkc);
    double *dvc = calloc((size_t)(max_nc * Hkv * Dv) + 1, sizeof *dvc);
    double *p = malloc((size_t)mk * sizeof *p), *ob = malloc(((size_t)Dv + 1) * sizeof *ob);
    int64_t *keys = malloc((size_t)mk * sizeof *keys);
    /* TK_EMU_CENTER: the branches' mean keys per KV head; TK_EMU_ONE: a row's two dq sums */
    double *kmean = g_emu ? malloc(((size_t)(3 * Hkv * Dk) + 1) * sizeof *kmean) : NULL;
    double *ab = g_emu ? malloc(((size_t)(2 * Dk) + 1) * sizeof *ab) : NULL;
    nsa_status st = NSA_SUCCESS;
    if (!kc || !vc || !dkc || !dvc || !p || !ob || !keys || (g_emu && (!kmean || !ab))) {
        st = NSA_ERR_OUT_OF_MEMORY;
        goto done;
    }
    if (o) memset(o, 0, (size_t)(tk_case_tokens(c) * Hq * Dv) * sizeof *o);
    int64_t cmp_base = 0;
    for (int64_t seq = 0; seq < c->batch; seq++) {
        const int64_t base = c->cu_seqlens[seq], len = c->cu_seqlens[seq + 1] - base;
        const int64_t nc = tk_num_cmp_blocks(g, len);
        compress64(c, x, seq, nc, cmp_base, round, kc, vc);
        if (g_emu & TK_EMU_CENTER)
            for (int b = 0; b < 3; b++)
                for (int64_t h = 0; h < Hkv && on[b]; h++)
                    for (int64_t e = 0; e < Dk; e++) {
                        const int64_t rows = b == 0 ? nc : len;
                        double s = 0.0;
                        for (int64_t r = 0; r < rows; r++)
                            s += b == 0 ? kc[IDX3(r, h, e, Hkv, Dk)] : x->t[TK_G_K + b][IDX3(base + r, h, e, Hkv, Dk)];
                        kmean[IDX3(b, h, e, Hkv, Dk)] = rows ? s / (double)rows : 0.0;
                    }
        if (grad) {
            memset(dkc, 0, (size_t)(nc * Hkv * Dk) * sizeof *dkc);
            memset(dvc, 0, (size_t)(nc * Hkv * Dv) * sizeof *dvc);
        }
        for (int64_t t = 0; t < len; t++) {
            const int64_t tg = base + t;
            if (grad && (tg < r0 || tg >= r1)) continue;
            for (int64_t h = 0; h < Hq; h++) {
                const int64_t kh = h / G;
                const double *qv = x->t[TK_G_Q] + IDX3(tg, h, 0, Hq, Dk);
                for (int b = 0; b < 3; b++) {
                    if (!on[b]) continue;
                    const int64_t m = key_list(c, b, t, sel ? sel + (tg * Hkv + kh) * n : NULL, nc, keys);
                    /* the key and value rows of key r */
                    const double *K = b == 0 ? kc : x->t[TK_G_K + b], *V = b == 0 ? vc : x->t[TK_G_V + b];
                    const int64_t kb = b == 0 ? 0 : base; /* row offset of the sequence */
                    double mx = -INFINITY, sum = 0.0;
                    for (int64_t r = 0; r < m; r++) {
                        const double *kr = K + IDX3(kb + keys[r], kh, 0, Hkv, Dk);
                        double dot = 0.0;
                        for (int64_t e = 0; e < Dk; e++) dot += qv[e] * kr[e];
                        p[r] = scale * dot;
                        if (p[r] > mx) mx = p[r];
                    }
                    for (int64_t r = 0; r < m; r++) sum += (p[r] = exp(p[r] - mx));
                    for (int64_t e = 0; e < Dv; e++) ob[e] = 0.0;
                    for (int64_t r = 0; r < m; r++) {
                        p[r] /= sum;
                        const double *vr = V + IDX3(kb + keys[r], kh, 0, Hkv, Dv);
                        for (int64_t e = 0; e < Dv; e++) ob[e] += p[r] * vr[e];
                    }
                    const double gate = x->t[TK_G_GATE + b][tg * Hq + h];
                    if (!grad) {
                        if (lse[b]) lse[b][tg * Hq + h] = m ? mx + log(sum) : -INFINITY;
                        for (int64_t e = 0; e < Dv; e++) o[IDX3(tg, h, e, Hq, Dv)] += gate * ob[e];
                        continue;
                    }
                    const double *dOr = dO + IDX3(tg, h, 0, Hq, Dv);
                    double dg = 0.0, D = 0.0;
                    for (int64_t e = 0; e < Dv; e++) dg += dOr[e] * ob[e];
                    grad->t[TK_G_GATE + b][tg * Hq + h] += dg;
                    D = gate * dg; /* dO_b . o_b */
                    double *dK = b == 0 ? dkc : grad->t[TK_G_K + b], *dV = b == 0 ? dvc : grad->t[TK_G_V + b];
                    double *dq = grad->t[TK_G_Q] + IDX3(tg, h, 0, Hq, Dk);
                    const double *kbar = g_emu & TK_EMU_CENTER ? kmean + IDX3(b, kh, 0, Hkv, Dk) : NULL;
                    const int one = (g_emu & TK_EMU_ONE) != 0;
                    if (one) memset(ab, 0, (size_t)(2 * Dk) * sizeof *ab);
                    for (int64_t r = 0; r < m; r++) {
                        const double *kr = K + IDX3(kb + keys[r], kh, 0, Hkv, Dk);
                        const double *vr = V + IDX3(kb + keys[r], kh, 0, Hkv, Dv);
                        double dp = 0.0;
                        for (int64_t e = 0; e < Dv; e++) dp += gate * dOr[e] * vr[e];
                        const double ds = p[r] * (dp - D);
                        const double sdq = emu16(TK_EMU_DQ, scale * ds), sdk = emu16(TK_EMU_DK, scale * ds);
                        const double pv = emu16(TK_EMU_DV, p[r] * gate);
                        const double pa = one ? emu16(TK_EMU_ONE, p[r] * dp) : 0.0, pb = one ? emu16(TK_EMU_ONE, p[r]) : 0.0;
                        double *dkr = dK + IDX3(kb + keys[r], kh, 0, Hkv, Dk);
                        double *dvr = dV + IDX3(kb + keys[r], kh, 0, Hkv, Dv);
                        for (int64_t e = 0; e < Dk; e++) {
                            if (one) {
                                ab[e] += pa * kr[e];
                                ab[Dk + e] += pb * kr[e];
                            } else {
                                dq[e] += sdq * (kbar ? emu16(TK_EMU_CENTER, kr[e] - kbar[e]) : kr[e]);
                            }
                            dkr[e] += sdk * qv[e];
                        }
                        for (int64_t e = 0; e < Dv; e++) dvr[e] += pv * dOr[e];
                    }
                    if (one)
                        for (int64_t e = 0; e < Dk; e++) dq[e] += scale * (ab[e] - D * ab[Dk + e]);
                }
            }
        }
        /* the compressed rows' gradients back through phi */
        if (grad && nc > 0) {
            for (int pass = 0; pass < 2; pass++) {
                const int64_t D = pass == 0 ? Dk : Dv;
                const double *dc = pass == 0 ? dkc : dvc;
                if (g->compress == NSA_COMPRESS_EXTERNAL) {
                    double *dext = grad->t[pass == 0 ? TK_G_KC : TK_G_VC];
                    for (int64_t e = 0; e < nc * Hkv * D; e++) dext[cmp_base * Hkv * D + e] += dc[e];
                    continue;
                }
                const double *src = x->t[pass == 0 ? TK_G_K : TK_G_V], *W = x->t[pass == 0 ? TK_G_WK : TK_G_WV];
                const double *pe = x->t[pass == 0 ? TK_G_PEK : TK_G_PEV];
                double *dsrc = grad->t[pass == 0 ? TK_G_K : TK_G_V], *dW = grad->t[pass == 0 ? TK_G_WK : TK_G_WV];
                double *dpe = grad->t[pass == 0 ? TK_G_PEK : TK_G_PEV];
                for (int64_t i = 0; i < nc; i++)
                    for (int64_t h = 0; h < Hkv; h++) {
                        const double *dr = dc + IDX3(i, h, 0, Hkv, D);
                        for (int64_t j = 0; j < l; j++) {
                            const int64_t tok = base + i * d + j;
                            double *dk = dsrc + IDX3(tok, h, 0, Hkv, D);
                            if (g->compress == NSA_COMPRESS_MEAN) {
                                for (int64_t e = 0; e < D; e++) dk[e] += dr[e] / (double)l;
                                continue;
                            }
                            const double *kr = src + IDX3(tok, h, 0, Hkv, D);
                            for (int64_t xi = 0; xi < D; xi++) {
                                const double a = kr[xi] + (pe ? pe[IDX3(h, j, xi, l, D)] : 0.0);
                                const double *wr = W + ((h * l + j) * D + xi) * D;
                                double *dwr = dW + ((h * l + j) * D + xi) * D;
                                double da = 0.0;
                                for (int64_t xo = 0; xo < D; xo++) {
                                    dwr[xo] += a * dr[xo];
                                    da += wr[xo] * dr[xo];
                                }
                                dk[xi] += da;
                                if (pe) dpe[IDX3(h, j, xi, l, D)] += da;
                            }
                        }
                    }
            }
        }
        cmp_base += nc;
    }
done:
    free(kc);
    free(vc);
    free(dkc);
    free(dvc);
    free(p);
    free(ob);
    free(keys);
    free(kmean);
    free(ab);
    return st;
}

nsa_status tk_ref64_forward(const tk_case *c, const tk_ref64 *x, const int32_t *sel, int round, double *o,
                            double *lse[3])
{
    if (!c || !x || !o || (c->cfg.num_selected > 0 && !sel)) return NSA_ERR_NULL_POINTER;
    return run64(c, x, sel, round, o, lse, NULL, NULL, 0, 0);
}

nsa_status tk_ref64_backward(const tk_case *c, const tk_ref64 *x, const int32_t *sel, int round, const double *dO,
                             tk_ref64 *grad)
{
    if (!c || !x || !dO || !grad || (c->cfg.num_selected > 0 && !sel)) return NSA_ERR_NULL_POINTER;
    nsa_status s = tk_ref64_alloc(c, grad);
    if (s != NSA_SUCCESS) return s;
    s = tk_ref64_backward_rows(c, x, sel, round, dO, 0, tk_case_tokens(c), grad);
    if (s != NSA_SUCCESS) tk_ref64_free(grad);
    return s;
}

nsa_status tk_ref64_backward_rows(const tk_case *c, const tk_ref64 *x, const int32_t *sel, int round,
                                  const double *dO, int64_t r0, int64_t r1, tk_ref64 *grad)
{
    if (!c || !x || !dO || !grad || (c->cfg.num_selected > 0 && !sel)) return NSA_ERR_NULL_POINTER;
    if (r0 < 0 || r1 < r0 || r1 > tk_case_tokens(c)) return NSA_ERR_INVALID_VALUE;
    double *lse[3] = {NULL, NULL, NULL};
    return run64(c, x, sel, round, NULL, lse, dO, grad, r0, r1);
}

const char *tk_ref64_name(int i)
{
    static const char *const names[TK_G_COUNT] = {"q",      "k_cmp",  "k_slc",  "k_win", "v_cmp", "v_slc",
                                                  "v_win",  "g_cmp",  "g_slc",  "g_win", "w_k",   "w_v",
                                                  "pe_k",   "pe_v",   "kc",     "vc"};
    return i >= 0 && i < TK_G_COUNT ? names[i] : "?";
}
