/*
 * Tensor checks that nsa_forward and nsa_backward share: a caller's view
 * against the plan (presence, context, dtype, strides, extent), caller-given
 * block indices, and workspace views.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

const char *const nsa_branch_name[3] = {"cmp", "slc", "win"};

/* A [rows, heads, dim] view (dim contiguous). Checks and converts one tensor. */
static int overlaps(int64_t rows, int64_t st, int64_t heads, int64_t sh, int64_t dim)
{
    /* Sufficient condition for distinct elements at distinct addresses: sort the
     * dimensions by stride; each stride must reach past the previous extent. */
    int64_t ext[3] = {dim, heads, rows}, str[3] = {1, sh, st};
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (str[j] < str[i] || (str[j] == str[i] && ext[j] < ext[i])) {
                int64_t a = str[i], b = ext[i];
                str[i] = str[j]; ext[i] = ext[j];
                str[j] = a; ext[j] = b;
            }
    int64_t reach = 1;
    for (int i = 0; i < 3; i++) {
        if (ext[i] <= 1) continue;
        if (str[i] < reach) return 1;
        /* past 2^63 elements the view cannot fit any buffer: the extent check
         * that follows refuses it (BUFFER_TOO_SMALL) */
        if (nsa_ck_mul(str[i], ext[i], &reach)) return 0;
    }
    return 0;
}

nsa_status nsa_check_tensor(const nsa_plan *p, const char *fn, const nsa_tensor *t, const nsa_tspec *sp,
                            nsa_bk_tensor *out)
{
    memset(out, 0, sizeof *out);
    out->dtype = sp->dtype;
    if (!t->buffer) {
        if (sp->required)
            return nsa_set_error(NSA_ERR_MISSING_TENSOR, "%s: %s is missing (its buffer is NULL), but this "
                                 "config needs it", fn, sp->name);
        return NSA_SUCCESS;
    }
    if (t->buffer->ctx != p->ctx)
        return nsa_set_error(NSA_ERR_WRONG_CONTEXT, "%s: %s's buffer belongs to another context than the plan",
                             fn, sp->name);
    if (t->offset < 0)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "%s: %s.offset = %lld is negative", fn, sp->name,
                             (long long)t->offset);
    int64_t st = t->stride_token, sh = t->stride_head;
    if (sp->contiguous) {
        st = sp->heads * sp->dim;
        sh = sp->dim;
    } else if (st < 0 || sh < 0) {
        return nsa_set_error(NSA_ERR_INVALID_STRIDE, "%s: %s has a negative stride (stride_token = %lld, "
                             "stride_head = %lld)", fn, sp->name, (long long)st, (long long)sh);
    }
    if (sp->output && overlaps(sp->rows, st, sp->heads, sh, sp->dim))
        return nsa_set_error(NSA_ERR_INVALID_STRIDE,
                             "%s: output %s [%lld, %lld, %lld] with stride_token = %lld, stride_head = %lld "
                             "would write some elements twice",
                             fn, sp->name, (long long)sp->rows, (long long)sp->heads, (long long)sp->dim, (long long)st,
                             (long long)sh);
    out->buf = t->buffer->bbuf;
    out->offset = t->offset;
    out->stride_token = st;
    out->stride_head = sh;
    if (sp->rows == 0 || sp->heads == 0 || sp->dim == 0) return NSA_SUCCESS;
    int64_t a, b, last;
    size_t esize = nsa_dtype_size(sp->dtype);
    /* one past the last element: offset + (rows-1) st + (heads-1) sh + dim */
    if (nsa_ck_mul(sp->rows - 1, st, &a) || nsa_ck_mul(sp->heads - 1, sh, &b) || nsa_ck_add(a, b, &last) ||
        nsa_ck_add(last, t->offset, &last) || nsa_ck_add(last, sp->dim, &last) ||
        nsa_ck_mul(last, (int64_t)esize, &last) || (uint64_t)last > (uint64_t)t->buffer->size)
        return nsa_set_error(NSA_ERR_BUFFER_TOO_SMALL,
                             "%s: %s [%lld, %lld, %lld] of %s at element offset %lld with stride_token = %lld, "
                             "stride_head = %lld reaches past the end of its %zu-byte buffer",
                             fn, sp->name, (long long)sp->rows, (long long)sp->heads, (long long)sp->dim,
                             nsa_dtype_name(sp->dtype), (long long)t->offset, (long long)st, (long long)sh,
                             t->buffer->size);
    return NSA_SUCCESS;
}

/* Caller-given indices: ascending, -1 only as trailing padding, each eligible. */
nsa_status nsa_check_indices(const nsa_plan *p, const nsa_tensor *t, const char *fn, const char *name)
{
    const nsa_config *c = &p->bk.cfg;
    const int64_t T = p->bk.total_tokens, hkv = c->num_kv_heads, n = c->num_selected;
    nsa_status s = nsa_context_synchronize(p->ctx);
    if (s != NSA_SUCCESS) return s;
    int32_t *row = malloc((size_t)n * sizeof *row);
    if (!row) return nsa_set_error(NSA_ERR_OUT_OF_MEMORY, "%s: out of host memory checking %s", fn, name);
    for (int64_t t0 = 0; t0 < T && s == NSA_SUCCESS; t0++) {
        /* the row's position: its sequence's queries are the last positions of its keys */
        int64_t seq = p->tok_seq[t0];
        int64_t tl = t0 - p->cu_seqlens[seq] + (p->bk.cu_seqlens_k[seq + 1] - p->bk.cu_seqlens_k[seq]) -
                     (p->cu_seqlens[seq + 1] - p->cu_seqlens[seq]);
        int64_t last = tl / c->slc_block;
        for (int64_t g = 0; g < hkv && s == NSA_SUCCESS; g++) {
            size_t off = (size_t)(t->offset + t0 * t->stride_token + g * t->stride_head) * 4;
            if ((s = t->buffer->ctx->be->buffer_read(p->ctx->bctx, t->buffer->bbuf, off, row, (size_t)n * 4))) {
                nsa_backend_error(s, p->ctx->backend_name, "reading %s back", name);
                break;
            }
            int64_t prev = -1;
            int padded = 0;
            for (int64_t k = 0; k < n; k++) {
                int64_t j = row[k];
                const char *why = NULL;
                if (j == -1) padded = 1;
                else if (padded) why = "a block index follows -1 padding";
                else if (j < 0 || j > last) why = "the block is not eligible (it must satisfy 0 <= j <= t / l_s at the row's position t)";
                else if (j <= prev) why = "indices must be strictly ascending";
                if (why) {
                    s = nsa_set_error(NSA_ERR_INVALID_VALUE,
                                      "%s: %s[token %lld, kv head %lld, slot %lld] = %lld: %s "
                                      "(sequence %lld, local position %lld)",
                                      fn, name, (long long)t0, (long long)g, (long long)k, (long long)j, why,
                                      (long long)seq,
                                      (long long)tl);
                    break;
                }
                if (j >= 0) prev = j;
            }
        }
    }
    free(row);
    return s;
}


nsa_bk_tensor nsa_ws_view(nsa_buffer *ws, int64_t byte_off, int64_t heads, int64_t dim, nsa_dtype dt)
{
    nsa_bk_tensor v = {0};
    if (byte_off < 0) return v;
    v.buf = ws->bbuf;
    v.offset = byte_off / (int64_t)nsa_dtype_size(dt);
    v.stride_token = heads * dim;
    v.stride_head = dim;
    v.dtype = dt;
    return v;
}

nsa_status nsa_workspace_check(const nsa_plan *plan, const nsa_buffer *ws, const char *fn)
{
    if (!ws) return NSA_SUCCESS;
    if (ws->ctx != plan->ctx)
        return nsa_set_error(NSA_ERR_WRONG_CONTEXT, "%s: workspace belongs to another context than the plan", fn);
    if (ws->size < plan->ws.bytes)
        return nsa_set_error(NSA_ERR_BUFFER_TOO_SMALL, "%s: workspace has %zu bytes, the plan needs %zu", fn, ws->size,
                             plan->ws.bytes);
    return NSA_SUCCESS;
}

nsa_status nsa_workspace_get(nsa_plan *plan, nsa_buffer **ws)
{
    if (*ws) return NSA_SUCCESS;
    if (!plan->own_ws) {
        nsa_status s = nsa_buffer_alloc(plan->ctx, plan->ws.bytes, &plan->own_ws);
        if (s != NSA_SUCCESS) return s;
        nsa_buffer_mark_internal(plan->own_ws);
    }
    *ws = plan->own_ws;
    return NSA_SUCCESS;
}
