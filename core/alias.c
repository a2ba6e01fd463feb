/*
 * Aliasing rules of nsa_forward (include/nsa.h, "Aliasing"): outputs share no
 * byte with an input, another output or the caller's workspace, and inputs
 * share none with the workspace; inputs may alias each other.
 *
 * Two views can be compared when they lie in one allocation: the same
 * nsa_buffer, or buffers that wrap the same caller handle (their offsets from
 * it are known). Views in different allocations are taken as disjoint: the
 * core cannot see device addresses. Within one allocation two views are
 * disjoint when their byte ranges are, or when both repeat on one period P
 * (every element of each lies in a cell k*P + [0, w) of its own phase) and
 * their phases leave the cells' bytes apart: interleaved layouts such as
 * three LSEs in one [T, Hq, 3] tensor pass, anything else that overlaps is
 * refused with NSA_ERR_INVALID_VALUE.
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
     * buffer's base + size within int64 (nsa_buffer_wrap) */
    v->st = bk->stride_token * es;
    v->sh = bk->stride_head * es;
    v->w = dim * es;
    v->rows = rows;
    v->heads = heads;
    v->b0 = t->buffer->base + bk->offset * es;
    v->b1 = v->b0 + (rows - 1) * v->st + (heads - 1) * v->sh + v->w;
}

/* The period of a view's cells (0: none; the view is one interval or its
 * cells would overlap). */
static int64_t period(const nsa_alias_view *v)
{
    int64_t p = 0;
    if (v->heads > 1 && (v->rows == 1 || (v->sh > 0 && v->st % v->sh == 0))) p = v->sh;
    else if (v->heads == 1 && v->rows > 1) p = v->st;
    return p >= v->w ? p : 0;
}

static int disjoint(const nsa_alias_view *a, const nsa_alias_view *b)
{
    if (a->root != b->root || a->b1 <= b->b0 || b->b1 <= a->b0) return 1;
    const int64_t p = period(a);
    if (p == 0 || p != period(b)) return 0;
    int64_t d = (b->b0 - a->b0) % p;
    if (d < 0) d += p;
    return d >= a->w && d + b->w <= p;
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
