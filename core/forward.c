/*
 * nsa_forward: checks the caller's tensors against the plan (presence,
 * context, dtype, strides, extents), lays out the workspace views, and walks
 * the plan's stage list, calling the backend once per stage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

static const char *const branch_name[3] = {"cmp", "slc", "win"};

/* A [rows, heads, dim] view (dim contiguous). Checks and converts one tensor. */
typedef struct tspec {
    const char *name;  /* "args->q" */
    int64_t rows, heads, dim;
    nsa_dtype dtype;
    int required;
    int output;        /* outputs must not overlap themselves */
    int contiguous;    /* strides ignored: rows*heads*dim dense elements */
} tspec;

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

static nsa_status check_tensor(const nsa_plan *p, const nsa_tensor *t, const tspec *sp, nsa_bk_tensor *out)
{
    memset(out, 0, sizeof *out);
    out->dtype = sp->dtype;
    if (!t->buffer) {
        if (sp->required)
            return nsa_set_error(NSA_ERR_MISSING_TENSOR, "nsa_forward: %s is missing (its buffer is NULL), but this "
                                 "config needs it", sp->name);
        return NSA_SUCCESS;
    }
    if (t->buffer->ctx != p->ctx)
        return nsa_set_error(NSA_ERR_WRONG_CONTEXT, "nsa_forward: %s's buffer belongs to another context than the plan",
                             sp->name);
    if (t->offset < 0)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_forward: %s.offset = %lld is negative", sp->name,
                             (long long)t->offset);
    int64_t st = t->stride_token, sh = t->stride_head;
    if (sp->contiguous) {
        st = sp->heads * sp->dim;
        sh = sp->dim;
    } else if (st < 0 || sh < 0) {
        return nsa_set_error(NSA_ERR_INVALID_STRIDE, "nsa_forward: %s has a negative stride (stride_token = %lld, "
                             "stride_head = %lld)", sp->name, (long long)st, (long long)sh);
    }
    if (sp->output && overlaps(sp->rows, st, sp->heads, sh, sp->dim))
        return nsa_set_error(NSA_ERR_INVALID_STRIDE,
                             "nsa_forward: output %s [%lld, %lld, %lld] with stride_token = %lld, stride_head = %lld "
                             "would write some elements twice",
                             sp->name, (long long)sp->rows, (long long)sp->heads, (long long)sp->dim, (long long)st,
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
                             "nsa_forward: %s [%lld, %lld, %lld] of %s at element offset %lld with stride_token = %lld, "
                             "stride_head = %lld reaches past the end of its %zu-byte buffer",
                             sp->name, (long long)sp->rows, (long long)sp->heads, (long long)sp->dim,
                             nsa_dtype_name(sp->dtype), (long long)t->offset, (long long)st, (long long)sh,
                             t->buffer->size);
    return NSA_SUCCESS;
}

/* Caller-given indices: ascending, -1 only as trailing padding, each eligible. */
static nsa_status check_given_indices(const nsa_plan *p, const nsa_tensor *t)
{
    const nsa_config *c = &p->bk.cfg;
    const int64_t T = p->bk.total_tokens, hkv = c->num_kv_heads, n = c->num_selected;
    nsa_status s = nsa_context_synchronize(p->ctx);
    if (s != NSA_SUCCESS) return s;
    int32_t *row = malloc((size_t)n * sizeof *row);
    if (!row) return nsa_set_error(NSA_ERR_OUT_OF_MEMORY, "nsa_forward: out of host memory checking block_indices");
    for (int64_t t0 = 0; t0 < T && s == NSA_SUCCESS; t0++) {
        int64_t seq = p->tok_seq[t0], tl = t0 - p->cu_seqlens[seq], last = tl / c->slc_block;
        for (int64_t g = 0; g < hkv && s == NSA_SUCCESS; g++) {
            size_t off = (size_t)(t->offset + t0 * t->stride_token + g * t->stride_head) * 4;
            if ((s = t->buffer->ctx->be->buffer_read(p->ctx->bctx, t->buffer->bbuf, off, row, (size_t)n * 4))) {
                nsa_backend_error(s, p->ctx->backend_name, "reading args->block_indices back");
                break;
            }
            int64_t prev = -1;
            int padded = 0;
            for (int64_t k = 0; k < n; k++) {
                int64_t j = row[k];
                const char *why = NULL;
                if (j == -1) padded = 1;
                else if (padded) why = "a block index follows -1 padding";
                else if (j < 0 || j > last) why = "the block is not eligible (it must satisfy 0 <= j <= t / l_s)";
                else if (j <= prev) why = "indices must be strictly ascending";
                if (why) {
                    s = nsa_set_error(NSA_ERR_INVALID_VALUE,
                                      "nsa_forward: args->block_indices[token %lld, kv head %lld, slot %lld] = %lld: %s "
                                      "(sequence %lld, local position %lld)",
                                      (long long)t0, (long long)g, (long long)k, (long long)j, why, (long long)seq,
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

static nsa_bk_tensor ws_view(nsa_buffer *ws, int64_t byte_off, int64_t heads, int64_t dim, nsa_dtype dt)
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

static nsa_status forward(nsa_plan *plan, const nsa_forward_args *args, nsa_buffer *workspace);

nsa_status (nsa_forward)(nsa_plan *plan, const nsa_forward_args *args, nsa_buffer *workspace)
{
    return nsa_forward_sized(plan, args, NSA_FORWARD_ARGS_SIZE_FIRST, workspace);
}

nsa_status nsa_forward_sized(nsa_plan *plan, const nsa_forward_args *args_in, size_t args_size,
                             nsa_buffer *workspace)
{
    nsa_clear_error();
    if (!plan) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_forward: plan is NULL");
    if (!args_in) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_forward: args is NULL");
    nsa_forward_args args; /* the fields a caller's older header lacks are absent (zero) */
    memset(&args, 0, sizeof args);
    nsa_status s = nsa_struct_in(&args, sizeof args, NSA_FORWARD_ARGS_SIZE_FIRST, args_in, args_size, "nsa_forward",
                                 "args");
    return s != NSA_SUCCESS ? s : forward(plan, &args, workspace);
}

static nsa_status forward(nsa_plan *plan, const nsa_forward_args *args, nsa_buffer *workspace)
{
    const nsa_config *c = &plan->bk.cfg;
    const int64_t T = plan->bk.total_tokens, hq = c->num_q_heads, hkv = c->num_kv_heads;
    const int64_t dk = c->head_dim_qk, dv = c->head_dim_v, l = c->cmp_block, nsel = c->num_selected;
    const nsa_dtype dt = c->dtype;
    const int on[3] = {1, nsel > 0, c->window > 0};
    const int linear = c->compress == NSA_COMPRESS_LINEAR, external = c->compress == NSA_COMPRESS_EXTERNAL;
    nsa_bk_args a;
    memset(&a, 0, sizeof a);
    a.plan = &plan->bk;
    nsa_status s;
    char nm[64];

#define CHECK(tensor, ...)                                                                \
    do {                                                                                  \
        tspec sp_ = {__VA_ARGS__};                                                        \
        if ((s = check_tensor(plan, &(tensor), &sp_, &(tensor##_out))) != NSA_SUCCESS) return s; \
    } while (0)

    nsa_bk_tensor q_out, o_out, wk_out, wv_out, pek_out, pev_out, kc_out, vc_out, given_out, selected_out;
    nsa_alias_set al; /* the tensors this call reads or writes, for the aliasing rules */
    al.n = 0;
    nsa_tensor q = args->q, o = args->o, wk = args->w_k, wv = args->w_v, pek = args->pe_k, pev = args->pe_v;
    nsa_tensor kc = args->kc, vc = args->vc, given = args->block_indices, selected = args->selected;
    CHECK(q, "args->q", T, hq, dk, dt, 1, 0, 0);
    CHECK(o, "args->o", T, hq, dv, dt, 1, 1, 0);
    nsa_alias_add(&al, "args->q", &q, &q_out, T, hq, dk, 0);
    nsa_alias_add(&al, "args->o", &o, &o_out, T, hq, dv, 1);
    for (int b = 0; b < 3; b++) {
        /* the k/v of a disabled branch are not read; the compressed branch reads
         * k/v only when it compresses them itself (MEAN, LINEAR) */
        int need_kv = on[b] && !(b == NSA_BRANCH_CMP && external);
        nsa_tensor kb = args->k[b], vb = args->v[b], gb = args->gate[b], lb = args->lse[b];
        nsa_bk_tensor kb_out, vb_out, gb_out, lb_out;
        snprintf(nm, sizeof nm, "args->k[%s]", branch_name[b]);
        CHECK(kb, nm, T, hkv, dk, dt, need_kv, 0, 0);
        snprintf(nm, sizeof nm, "args->v[%s]", branch_name[b]);
        CHECK(vb, nm, T, hkv, dv, dt, need_kv, 0, 0);
        snprintf(nm, sizeof nm, "args->gate[%s]", branch_name[b]);
        CHECK(gb, nm, T, hq, 1, NSA_DTYPE_F32, on[b], 0, 0);
        snprintf(nm, sizeof nm, "args->lse[%s]", branch_name[b]);
        CHECK(lb, nm, T, hq, 1, NSA_DTYPE_F32, 0, 1, 0);
        if (need_kv) {
            a.k[b] = kb_out;
            a.v[b] = vb_out;
            snprintf(nm, sizeof nm, "args->k[%s]", branch_name[b]);
            nsa_alias_add(&al, nm, &kb, &kb_out, T, hkv, dk, 0);
            snprintf(nm, sizeof nm, "args->v[%s]", branch_name[b]);
            nsa_alias_add(&al, nm, &vb, &vb_out, T, hkv, dv, 0);
        }
        snprintf(nm, sizeof nm, "args->lse[%s]", branch_name[b]);
        if (on[b]) {
            a.gate[b] = gb_out;
            a.lse[b] = lb_out;
            nsa_alias_add(&al, nm, &lb, &lb_out, T, hq, 1, 1);
            snprintf(nm, sizeof nm, "args->gate[%s]", branch_name[b]);
            nsa_alias_add(&al, nm, &gb, &gb_out, T, hq, 1, 0);
        } else if (lb_out.buf) {
            return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_forward: %s is given, but the %s branch is off", nm,
                                 branch_name[b]);
        }
    }
    CHECK(wk, "args->w_k", hkv, l, dk * dk, dt, linear, 0, 1);
    CHECK(wv, "args->w_v", hkv, l, dv * dv, dt, linear, 0, 1);
    CHECK(pek, "args->pe_k", hkv, l, dk, dt, 0, 0, 1);
    CHECK(pev, "args->pe_v", hkv, l, dv, dt, 0, 0, 1);
    CHECK(kc, "args->kc", plan->bk.total_cmp, hkv, dk, dt, external && plan->bk.total_cmp > 0, 0, 0);
    CHECK(vc, "args->vc", plan->bk.total_cmp, hkv, dv, dt, external && plan->bk.total_cmp > 0, 0, 0);
    CHECK(given, "args->block_indices", T, hkv, nsel, NSA_DTYPE_I32, 0, 0, 0);
    CHECK(selected, "args->selected", T, hkv, nsel, NSA_DTYPE_I32, 0, 1, 0);
    if (linear) {
        a.w_k = wk_out;
        a.w_v = wv_out;
        a.pe_k = pek_out;
        a.pe_v = pev_out;
        nsa_alias_add(&al, "args->w_k", &wk, &wk_out, hkv, l, dk * dk, 0);
        nsa_alias_add(&al, "args->w_v", &wv, &wv_out, hkv, l, dv * dv, 0);
        nsa_alias_add(&al, "args->pe_k", &pek, &pek_out, hkv, l, dk, 0);
        nsa_alias_add(&al, "args->pe_v", &pev, &pev_out, hkv, l, dv, 0);
    }
    if (external) {
        a.kc_in = kc_out;
        a.vc_in = vc_out;
        nsa_alias_add(&al, "args->kc", &kc, &kc_out, plan->bk.total_cmp, hkv, dk, 0);
        nsa_alias_add(&al, "args->vc", &vc, &vc_out, plan->bk.total_cmp, hkv, dv, 0);
    }
    nsa_alias_add(&al, "args->block_indices", &given, &given_out, T, hkv, nsel, 0);
    nsa_alias_add(&al, "args->selected", &selected, &selected_out, T, hkv, nsel, 1);
    if ((given_out.buf || selected_out.buf) && nsel == 0)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_forward: args->%s is given, but cfg.num_selected = 0 turns "
                             "the selected branch off", given_out.buf ? "block_indices" : "selected");
    if (given_out.buf && selected_out.buf)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_forward: args->block_indices and args->selected are both "
                             "given; pass one (the selected output would only repeat the given indices)");
#undef CHECK
    if (args->flags & ~(unsigned)NSA_FORWARD_TRUST_INDICES)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_forward: args->flags = 0x%x has unknown bits", args->flags);

    if (workspace) {
        if (workspace->ctx != plan->ctx)
            return nsa_set_error(NSA_ERR_WRONG_CONTEXT, "nsa_forward: workspace belongs to another context than the plan");
        if (workspace->size < plan->ws.bytes)
            return nsa_set_error(NSA_ERR_BUFFER_TOO_SMALL, "nsa_forward: workspace has %zu bytes, the plan needs %zu",
                                 workspace->size, plan->ws.bytes);
    }
    if ((s = nsa_alias_check(&al, workspace, (int64_t)plan->ws.bytes, "nsa_forward")) != NSA_SUCCESS) return s;
    if (T == 0) return NSA_SUCCESS;
    if (given_out.buf && !(args->flags & NSA_FORWARD_TRUST_INDICES) && (s = check_given_indices(plan, &given)))
        return s;
    if (!workspace) {
        if (!plan->own_ws) {
            if ((s = nsa_buffer_alloc(plan->ctx, plan->ws.bytes, &plan->own_ws))) return s;
            nsa_buffer_mark_internal(plan->own_ws);
        }
        workspace = plan->own_ws;
    }

    const nsa_ws_layout *w = &plan->ws;
    a.q = q_out;
    a.o = o_out;
    a.kc = ws_view(workspace, w->kc, hkv, dk, NSA_DTYPE_F32);
    a.vc = ws_view(workspace, w->vc, hkv, dv, NSA_DTYPE_F32);
    if (!a.lse[NSA_BRANCH_CMP].buf) a.lse[NSA_BRANCH_CMP] = ws_view(workspace, w->lse_cmp, hq, 1, NSA_DTYPE_F32);
    a.scores = ws_view(workspace, w->scores, hkv, plan->bk.max_ns, NSA_DTYPE_F32);
    a.indices = given_out.buf ? given_out
                : selected_out.buf ? selected_out
                                   : ws_view(workspace, w->indices, hkv, nsel, NSA_DTYPE_I32);
    for (int b = 0; b < 3; b++) a.o_b[b] = on[b] ? ws_view(workspace, w->o_b[b], hq, dv, NSA_DTYPE_F32) : (nsa_bk_tensor){0};

    for (int i = 0; i < plan->num_stages; i++) {
        nsa_stage st = plan->stages[i];
        if (given_out.buf && (st == NSA_STAGE_BLOCK_SCORES || st == NSA_STAGE_SELECT_TOPN || st == NSA_STAGE_SCORES_TOPN))
            continue;
        s = plan->ctx->be->run(plan->ctx->bctx, st, &a);
        if (s != NSA_SUCCESS) return nsa_backend_error(s, plan->ctx->backend_name, "in stage %s", nsa_stage_name(st));
    }
    return NSA_SUCCESS;
}
