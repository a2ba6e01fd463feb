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
    if (plan->bk.decode)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_forward: plan is a decode plan (nsa_decode_plan_create): it "
                             "runs nsa_decode steps only; make a forward plan with nsa_plan_create");
    nsa_forward_args args; /* the fields a caller's older header lacks are absent (zero) */
    memset(&args, 0, sizeof args);
    nsa_status s = nsa_struct_in(&args, sizeof args, NSA_FORWARD_ARGS_SIZE_FIRST, args_in, args_size, "nsa_forward",
                                 "args");
    return s != NSA_SUCCESS ? s : forward(plan, &args, workspace);
}

static nsa_status forward(nsa_plan *plan, const nsa_forward_args *args, nsa_buffer *workspace)
{
    const nsa_config *c = &plan->bk.cfg;
    const int64_t T = plan->bk.total_tokens, TK = plan->bk.total_keys, hq = c->num_q_heads, hkv = c->num_kv_heads;
    const int64_t dk = c->head_dim_qk, dv = c->head_dim_v, l = c->cmp_block, nsel = c->num_selected;
    const nsa_dtype dt = c->dtype, fdt = nsa_bk_float_dtype(dt); /* gates, LSEs, dgate, workspace */
    const int on[3] = {1, nsel > 0, c->window > 0};
    const int linear = c->compress == NSA_COMPRESS_LINEAR, external = c->compress == NSA_COMPRESS_EXTERNAL;
    nsa_bk_args a;
    memset(&a, 0, sizeof a);
    a.plan = &plan->bk;
    nsa_status s;
    char nm[64];

#define CHECK(tensor, ...)                                                                \
    do {                                                                                  \
        nsa_tspec sp_ = {__VA_ARGS__};                                                        \
        if ((s = nsa_check_tensor(plan, "nsa_forward", &(tensor), &sp_, &(tensor##_out))) != NSA_SUCCESS) return s; \
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
        snprintf(nm, sizeof nm, "args->k[%s]", nsa_branch_name[b]);
        CHECK(kb, nm, TK, hkv, dk, dt, need_kv, 0, 0);
        snprintf(nm, sizeof nm, "args->v[%s]", nsa_branch_name[b]);
        CHECK(vb, nm, TK, hkv, dv, dt, need_kv, 0, 0);
        snprintf(nm, sizeof nm, "args->gate[%s]", nsa_branch_name[b]);
        CHECK(gb, nm, T, hq, 1, fdt, on[b], 0, 0);
        snprintf(nm, sizeof nm, "args->lse[%s]", nsa_branch_name[b]);
        CHECK(lb, nm, T, hq, 1, fdt, 0, 1, 0);
        if (need_kv) {
            a.k[b] = kb_out;
            a.v[b] = vb_out;
            snprintf(nm, sizeof nm, "args->k[%s]", nsa_branch_name[b]);
            nsa_alias_add(&al, nm, &kb, &kb_out, TK, hkv, dk, 0);
            snprintf(nm, sizeof nm, "args->v[%s]", nsa_branch_name[b]);
            nsa_alias_add(&al, nm, &vb, &vb_out, TK, hkv, dv, 0);
        }
        snprintf(nm, sizeof nm, "args->lse[%s]", nsa_branch_name[b]);
        if (on[b]) {
            a.gate[b] = gb_out;
            a.lse[b] = lb_out;
            nsa_alias_add(&al, nm, &lb, &lb_out, T, hq, 1, 1);
            snprintf(nm, sizeof nm, "args->gate[%s]", nsa_branch_name[b]);
            nsa_alias_add(&al, nm, &gb, &gb_out, T, hq, 1, 0);
        } else if (lb_out.buf) {
            return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_forward: %s is given, but the %s branch is off", nm,
                                 nsa_branch_name[b]);
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

    if ((s = nsa_workspace_check(plan, workspace, "nsa_forward")) != NSA_SUCCESS) return s;
    if ((s = nsa_alias_check(&al, workspace, (int64_t)plan->ws.bytes, "nsa_forward")) != NSA_SUCCESS) return s;
    if (T == 0) return NSA_SUCCESS;
    if (given_out.buf && !(args->flags & NSA_FORWARD_TRUST_INDICES) &&
        (s = nsa_check_indices(plan, &given, "nsa_forward", "args->block_indices")))
        return s;
    if ((s = nsa_workspace_get(plan, &workspace)) != NSA_SUCCESS) return s;

    const nsa_ws_layout *w = &plan->ws;
    a.q = q_out;
    a.o = o_out;
    a.kc = nsa_ws_view(workspace, w->kc, hkv, dk, fdt);
    a.vc = nsa_ws_view(workspace, w->vc, hkv, dv, fdt);
    if (!a.lse[NSA_BRANCH_CMP].buf) a.lse[NSA_BRANCH_CMP] = nsa_ws_view(workspace, w->lse_cmp, hq, 1, fdt);
    a.scores = nsa_ws_view(workspace, w->scores, hkv, plan->bk.max_ns, NSA_DTYPE_F32);
    a.indices = given_out.buf ? given_out
                : selected_out.buf ? selected_out
                                   : nsa_ws_view(workspace, w->indices, hkv, nsel, NSA_DTYPE_I32);
    /* a branch that is on has its o_b in the workspace, but for WIN_COMBINE's window branch and
     * SLC_COMBINE's selected branch (none: their terms go straight into the sum) */
    for (int b = 0; b < 3; b++)
        a.o_b[b] = on[b] && w->o_b[b] >= 0 ? nsa_ws_view(workspace, w->o_b[b], hq, dv, fdt) : (nsa_bk_tensor){0};

    for (int i = 0; i < plan->num_stages; i++) {
        nsa_stage st = plan->stages[i];
        if (given_out.buf && (st == NSA_STAGE_BLOCK_SCORES || st == NSA_STAGE_SELECT_TOPN || st == NSA_STAGE_SCORES_TOPN))
            continue;
        s = plan->ctx->be->run(plan->ctx->bctx, st, &a);
        if (s != NSA_SUCCESS) return nsa_backend_error(s, plan->ctx->backend_name, "in stage %s", nsa_stage_name(st));
    }
    return NSA_SUCCESS;
}
