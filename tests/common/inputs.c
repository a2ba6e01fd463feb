/*
 * The inputs of a case: drawn with the library's portable counter-based
 * generator (nsa_random_uniform), so every machine and compiler draws the same
 * numbers, then rounded to the case dtype. The host master copies are floats that
 * already hold the rounded values: the oracle (fp64) and the backend (after
 * conversion, which is then exact) see identical numbers.
 *
 * Each tensor has its own stream of the case seed, so adding a tensor never
 * changes the values of another.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "testkit.h"

enum {
    STREAM_Q = 1,
    STREAM_K = 2,     /* + branch */
    STREAM_V = 5,     /* + branch */
    STREAM_GATE = 8,  /* + branch */
    STREAM_WK = 11,
    STREAM_WV = 12,
    STREAM_PEK = 13,
    STREAM_PEV = 14,
    STREAM_KC = 15,
    STREAM_VC = 16,
    STREAM_INDICES = 17
};

/* Draws prod(dims[0..3]) values of stream `stream` in [lo, hi) and rounds them
 * to dtype. A size whose bytes overflow is NSA_ERR_INVALID_SHAPE, found before
 * anything is allocated. */
static float *draw(uint64_t seed, uint64_t stream, int64_t d0, int64_t d1, int64_t d2, int64_t d3, float lo,
                   float hi, nsa_dtype dtype, nsa_status *st)
{
    if (*st != NSA_SUCCESS) return NULL;
    const int64_t dims[4] = {d0, d1, d2, d3};
    int64_t n;
    size_t bytes;
    if (nsa_ck_prod(dims, 4, &n) || nsa_ck_bytes(n, sizeof(float), &bytes)) {
        *st = NSA_ERR_INVALID_SHAPE;
        return NULL;
    }
    float *p = malloc(bytes ? bytes : sizeof *p);
    if (!p) {
        *st = NSA_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    if (n == 0) return p;
    nsa_status s = nsa_random_uniform(seed, stream, 0, n, lo, hi, p);
    if (s == NSA_SUCCESS && dtype != NSA_DTYPE_F32 && dtype != NSA_DTYPE_F64) { /* floats are f64 values */
        /* round to dtype and back: 4 bytes per element is enough room for both */
        void *tmp = malloc(bytes);
        if (!tmp) {
            s = NSA_ERR_OUT_OF_MEMORY;
        } else {
            s = nsa_convert(p, NSA_DTYPE_F32, tmp, dtype, n);
            if (s == NSA_SUCCESS) s = nsa_convert(tmp, dtype, p, NSA_DTYPE_F32, n);
            free(tmp);
        }
    }
    if (s != NSA_SUCCESS) {
        free(p);
        *st = s;
        return NULL;
    }
    return p;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Caller-given indices: for each (t, g) a random set of distinct eligible blocks,
 * usually min(n, eligible) of them, sometimes fewer (at least one), ascending,
 * -1 padded at the end. */
static int32_t *draw_indices(const tk_case *c, nsa_status *st)
{
    if (*st != NSA_SUCCESS) return NULL;
    const nsa_config *g = &c->cfg;
    int64_t T = tk_case_tokens(c), Hkv = g->num_kv_heads, n = g->num_selected;
    int64_t max_ns = tk_case_max_slc(c);
    const int64_t dims[3] = {T, Hkv, n};
    int64_t count;
    size_t bytes;
    if (nsa_ck_prod(dims, 3, &count) || nsa_ck_bytes(count, sizeof(int32_t), &bytes)) {
        *st = NSA_ERR_INVALID_SHAPE;
        return NULL;
    }
    int32_t *idx = malloc(bytes ? bytes : sizeof *idx);
    int32_t *pool = malloc((size_t)(max_ns > 0 ? max_ns : 1) * sizeof *pool);
    if (!idx || !pool) {
        free(idx);
        free(pool);
        *st = NSA_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    uint64_t draw_no = 0;
    for (int64_t t = 0; t < T; ++t) {
        int64_t local;
        tk_case_token(c, t, NULL, &local);
        int64_t eligible = local / g->slc_block + 1;
        for (int64_t h = 0; h < Hkv; ++h) {
            int32_t *row = idx + (t * Hkv + h) * n;
            int64_t count = eligible < n ? eligible : n;
            if (nsa_random_u64(c->seed, STREAM_INDICES, draw_no++) % 8 == 0)
                count = 1 + (int64_t)(nsa_random_u64(c->seed, STREAM_INDICES, draw_no++) % (uint64_t)count);
            for (int64_t j = 0; j < eligible; ++j) pool[j] = (int32_t)j;
            for (int64_t k = 0; k < count; ++k) { /* partial Fisher-Yates */
                int64_t r = k + (int64_t)(nsa_random_u64(c->seed, STREAM_INDICES, draw_no++) %
                                          (uint64_t)(eligible - k));
                int32_t tmp = pool[k];
                pool[k] = pool[r];
                pool[r] = tmp;
                row[k] = pool[k];
            }
            qsort(row, (size_t)count, sizeof *row, cmp_i32);
            for (int64_t k = count; k < n; ++k) row[k] = -1;
        }
    }
    free(pool);
    return idx;
}

nsa_status tk_inputs_make(const tk_case *c, tk_inputs *in)
{
    memset(in, 0, sizeof *in);
    if (!c) return NSA_ERR_NULL_POINTER;
    const nsa_config *g = &c->cfg;
    nsa_dtype dt = g->dtype;
    int64_t T = tk_case_tokens(c);
    int64_t Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dqk = g->head_dim_qk, Dv = g->head_dim_v;
    int64_t l = g->cmp_block;
    uint64_t seed = c->seed;
    nsa_status st = NSA_SUCCESS;

    in->dtype = dt;
    in->tokens = T;
    in->total_cmp = tk_case_total_cmp(c);
    in->q = draw(seed, STREAM_Q, T, Hq, Dqk, 1, -2.0f, 2.0f, dt, &st);
    int branches = c->layout == TK_LAYOUT_DISTINCT ? 3 : 1;
    for (int b = 0; b < 3; ++b) {
        if (b < branches) {
            in->k[b] = draw(seed, STREAM_K + (uint64_t)b, T, Hkv, Dqk, 1, -2.0f, 2.0f, dt, &st);
            in->v[b] = draw(seed, STREAM_V + (uint64_t)b, T, Hkv, Dv, 1, -1.0f, 1.0f, dt, &st);
        } else {
            in->k[b] = in->k[0];
            in->v[b] = in->v[0];
        }
    }
    int on[3] = {1, g->num_selected > 0, g->window > 0};
    for (int b = 0; b < 3; ++b)
        if (on[b]) in->gate[b] = draw(seed, STREAM_GATE + (uint64_t)b, T, Hq, 1, 1, 0.05f, 0.95f, NSA_DTYPE_F32, &st);
    if (g->compress == NSA_COMPRESS_LINEAR) {
        float ak = (float)(1.7 / sqrt((double)(l * Dqk))), av = (float)(1.7 / sqrt((double)(l * Dv)));
        in->w_k = draw(seed, STREAM_WK, Hkv, l, Dqk, Dqk, -ak, ak, dt, &st);
        in->w_v = draw(seed, STREAM_WV, Hkv, l, Dv, Dv, -av, av, dt, &st);
        if (c->use_pe) {
            in->pe_k = draw(seed, STREAM_PEK, Hkv, l, Dqk, 1, -0.5f, 0.5f, dt, &st);
            in->pe_v = draw(seed, STREAM_PEV, Hkv, l, Dv, 1, -0.5f, 0.5f, dt, &st);
        }
    } else if (g->compress == NSA_COMPRESS_EXTERNAL) {
        in->kc = draw(seed, STREAM_KC, in->total_cmp, Hkv, Dqk, 1, -2.0f, 2.0f, dt, &st);
        in->vc = draw(seed, STREAM_VC, in->total_cmp, Hkv, Dv, 1, -1.0f, 1.0f, dt, &st);
    }
    if (c->fixed_indices && g->num_selected > 0) in->given = draw_indices(c, &st);
    if (st != NSA_SUCCESS) tk_inputs_free(in);
    return st;
}

void tk_inputs_free(tk_inputs *in)
{
    if (!in) return;
    free(in->q);
    for (int b = 0; b < 3; ++b) {
        if (b == 0 || in->k[b] != in->k[0]) free(in->k[b]);
        if (b == 0 || in->v[b] != in->v[0]) free(in->v[b]);
        free(in->gate[b]);
    }
    free(in->w_k);
    free(in->w_v);
    free(in->pe_k);
    free(in->pe_v);
    free(in->kc);
    free(in->vc);
    free(in->given);
    memset(in, 0, sizeof *in);
}
