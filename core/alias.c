/*
 * Aliasing rules of nsa_forward (include/nsa.h, "Aliasing"): outputs share no
 * byte with an input, another output or the caller's workspace, and inputs
 * share none with the workspace; inputs may alias each other.
 *
 * Two views can be compared when they lie in one allocation: the same
 * nsa_buffer, or buffers that wrap the same caller handle (their offsets from
 * it are known). Views in different allocations are taken as disjoint: the
 * core cannot see device addresses. Within one allocation two views are
 * disjoint when their byte ranges are, or when they share a token stride and
 * their heads' cells do not meet modulo it: interleaved layouts such as three
 * LSEs in one [T, Hq, 3] tensor with padded rows pass; anything else that
 * overlaps is refused with NSA_ERR_INVALID_VALUE.
 */
#include <stdio.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

void nsa_alias_add(nsa_alias_set *set, const char *name, const nsa_tensor *t, const nsa_bk_tensor *bk, int64_t rows,
                   int64_t heads, int64_t dim, int output)
{
    if (!t->buffer || rows == 0 || heads == 0 || dim == 0 || set->n >= NSA_ALIAS_MAX) return;
    nsa_alias_view *v = &set->v[set->n++];
    const int64_t es = (int64_t)nsa_dtype_size(bk->dtype);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->root = t->buffer->root;
    v->output = output;
    /* the tensor's own checks proved offset + extent within its buffer, and the
     * buffer's base + size within int64 (nsa_buffer_wrap), so a stride that
     * steps (more than one row or head) times the element size fits; a stride
     * that never steps may be anything (INT64_MAX) and is not used */
    v->st = rows > 1 ? bk->stride_token * es : 0;
    v->sh = heads > 1 ? bk->stride_head * es : 0;
    v->w = dim * es;
    v->rows = rows;
    v->heads = heads;
    v->b0 = t->buffer->base + bk->offset * es;
    v->b1 = v->b0 + (rows - 1) * v->st + (heads - 1) * v->sh + v->w;
}

/* Head h's bytes of one token row of v, reduced modulo p (p == 0: not reduced):
 * one or two intervals [lo, hi) in iv; returns how many (0: the row is wider
 * than p, so it overlaps itself modulo p). */
static int row_cells(const nsa_alias_view *v, int64_t h, int64_t p, int64_t iv[2][2])
{
    int64_t lo = v->b0 + h * v->sh;
    if (p == 0) {
        iv[0][0] = lo;
        iv[0][1] = lo + v->w;
        return 1;
    }
    if (v->w > p) return 0;
    lo %= p;
    if (lo + v->w <= p) {
        iv[0][0] = lo;
        iv[0][1] = lo + v->w;
        return 1;
    }
    iv[0][0] = lo;
    iv[0][1] = p;
    iv[1][0] = 0;
    iv[1][1] = lo + v->w - p;
    return 2;
}

/* 1 when a and b share no byte (or cannot be compared: different
 * allocations), 0 when they may. Past disjoint byte ranges: when the views
 * repeat on one token stride p (or are single rows), every byte of a view lies
 * at a row start plus one of its heads' cells, so cells that do not meet
 * modulo p prove the views disjoint (interleaved layouts). */
static int disjoint(const nsa_alias_view *a, const nsa_alias_view *b)
{
    if (a->root != b->root || a->b1 <= b->b0 || b->b1 <= a->b0) return 1;
    int64_t p;
    if (a->rows > 1 && b->rows > 1) p = a->st == b->st ? a->st : -1;
    else p = a->rows > 1 ? a->st : b->rows > 1 ? b->st : 0;
    if (p < 0 || (p == 0 && (a->rows > 1 || b->rows > 1))) return 0;
    if (a->heads > 4096 || b->heads > 4096) return 0; /* too many cells to compare: refuse */
    for (int64_t h = 0; h < a->heads; h++) {
        int64_t ia[2][2], ib[2][2];
        const int na = row_cells(a, h, p, ia);
        if (na == 0) return 0;
        for (int64_t g = 0; g < b->heads; g++) {
            const int nb = row_cells(b, g, p, ib);
            if (nb == 0) return 0;
            for (int i = 0; i < na; i++)
                for (int j = 0; j < nb; j++)
                    if (ia[i][0] < ib[j][1] && ib[j][0] < ia[i][1]) return 0;
        }
    }
    return 1;
}

nsa_status nsa_alias_check(const nsa_alias_set *set, const nsa_buffer *ws, int64_t ws_bytes, const char *fn)
{
    for (int i = 0; i < set->n; i++)
        for (int j = i + 1; j < set->n; j++) {
            const nsa_alias_view *a = &set->v[i], *b = &set->v[j];
            if (!(a->output || b->output) || disjoint(a, b)) continue;
            const nsa_alias_view *out = a->output ? a : b, *other = a->output ? b : a;
            return nsa_set_error(NSA_ERR_INVALID_VALUE,
                                 "%s: output %s (bytes %lld .. %lld of its allocation) overlaps %s %s (bytes %lld .. "
                                 "%lld); outputs must not alias inputs or other outputs",
                                 fn, out->name, (long long)out->b0, (long long)out->b1, other->output ? "output" : "input",
                                 other->name, (long long)other->b0, (long long)other->b1);
        }
    if (!ws || ws_bytes <= 0) return NSA_SUCCESS;
    const int64_t w0 = ws->base, w1 = ws->base + ws_bytes;
    for (int i = 0; i < set->n; i++) {
        const nsa_alias_view *a = &set->v[i];
        if (a->root == ws->root && a->b0 < w1 && w0 < a->b1)
            return nsa_set_error(NSA_ERR_INVALID_VALUE,
                                 "%s: %s %s (bytes %lld .. %lld of its allocation) overlaps the workspace's first "
                                 "%lld bytes (from byte %lld); the workspace must not alias any tensor",
                                 fn, a->output ? "output" : "input", a->name, (long long)a->b0, (long long)a->b1,
                                 (long long)ws_bytes, (long long)w0);
    }
    return NSA_SUCCESS;
}
