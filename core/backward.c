/*
 * nsa_backward: checks the caller's tensors against a training plan (the
 * forward's inputs, what the forward returned, dO and the wanted gradients),
 * maps gradients that one shared input receives onto one accumulator, lays out
 * the workspace views, zero-fills the accumulators and walks the plan's
 * backward stage list (docs/nsa-semantics.md section 9).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

#define FN "nsa_backward"

static nsa_status backward(nsa_plan *plan, const nsa_backward_args *args, nsa_buffer *workspace);

nsa_status nsa_backward_sized(nsa_plan *plan, const nsa_backward_args *args_in, size_t args_size,
                              nsa_buffer *workspace)
{
    nsa_clear_error();
    if (!plan) return nsa_set_error(NSA_ERR_NULL_POINTER, FN ": plan is NULL");
    if (!args_in) return nsa_set_error(NSA_ERR_NULL_POINTER, FN ": args is NULL");
    if (plan->bk.decode)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, FN ": plan is a decode plan (nsa_decode_plan_create): it runs "
                             "nsa_decode steps only; make a training plan with nsa_plan_create");
    nsa_backward_args args;
    memset(&args, 0, sizeof args);
    nsa_status s = nsa_struct_in(&args, sizeof args, NSA_BACKWARD_ARGS_SIZE_FIRST, args_in, args_size, FN, "args");
    return s != NSA_SUCCESS ? s : backward(plan, &args, workspace);
}

/* The same view: one buffer, offset and strides (how a caller says "one tensor"). */
static int same_view(const nsa_tensor *a, const nsa_tensor *b)
{
    return a->buffer && a->buffer == b->buffer && a->offset == b->offset && a->stride_token == b->stride_token &&
           a->stride_head == b->stride_head;
}

/* For each branch b whose gradient out[b] is given: slot[b] = the first branch
 * with the same gradient view (b itself when none). A gradient view shared by
 * branches whose input views differ is refused. */
static nsa_status share_slots(const nsa_tensor in[3], const nsa_tensor out[3], const int used[3], const char *din,
                              const char *dname, int slot[3])
{
    for (int b = 0; b < 3; b++) {
        slot[b] = b;
        if (!used[b]) continue;
        for (int a = 0; a < b; a++) {
            if (!used[a] || !same_view(&out[a], &out[b])) continue;
            if (!same_view(&in[a], &in[b]))
                return nsa_set_error(NSA_ERR_INVALID_VALUE,
                                     FN ": args->%s[%s] and args->%s[%s] are the same view, but args->%s[%s] and "
                                     "args->%s[%s] are not: one gradient tensor sums the branches of one shared "
                                     "input (pass distinct views to get each branch's own part)",
                                     dname, nsa_branch_name[a], dname, nsa_branch_name[b], din, nsa_branch_name[a], din,
                                     nsa_branch_name[b]);
            slot[b] = a;
            break;
        }
    }
    return NSA_SUCCESS;
}

static nsa_status backward(nsa_plan *plan, const nsa_backward_args *args, nsa_buffer *workspace)
{
    const nsa_config *c = &plan->bk.cfg;
    const int64_t T = plan->bk.total_tokens, TK = plan->bk.total_keys, hq = c->num_q_heads, hkv = c->num_kv_heads;
    const int64_t nc = plan->bk.total_cmp;
    const int64_t dk = c->head_dim_qk, dv = c->head_dim_v, l = c->cmp_block, nsel = c->num_selected;
    const nsa_dtype dt = c->dtype, fdt = nsa_bk_float_dtype(dt); /* gates, LSEs, dgate, workspace */
    const int on[3] = {1, nsel > 0, c->window > 0};
    const int linear = c->compress == NSA_COMPRESS_LINEAR, external = c->compress == NSA_COMPRESS_EXTERNAL;
    nsa_status s;
    char nm[64];
    if (!(c->flags & NSA_CONFIG_TRAINING))
        return nsa_set_error(NSA_ERR_INVALID_VALUE, FN ": the plan was made without NSA_CONFIG_TRAINING in "
                             "cfg->flags, so it has no backward stages or workspace");

    if (args->flags & ~(unsigned)(NSA_BACKWARD_TRUST_INDICES | NSA_BACKWARD_FLOAT_KEY_GRADS))
        return nsa_set_error(NSA_ERR_INVALID_VALUE, FN ": args->flags = 0x%x has unknown bits", args->flags);
    const int float_keys = (args->flags & NSA_BACKWARD_FLOAT_KEY_GRADS) != 0;
    if (float_keys && !plan->ctx->be->shards)
        return nsa_set_error(NSA_ERR_UNSUPPORTED, FN ": args->flags has NSA_BACKWARD_FLOAT_KEY_GRADS, but backend %s "
                             "stores gradients in cfg.dtype only (the cpu and opencl backends have it)", plan->ctx->backend_name);
    /* the key-side gradients' dtype: cfg.dtype, or the float type unrounded */
    const nsa_dtype gdt = float_keys ? fdt : dt;

    nsa_bk_args a;
    memset(&a, 0, sizeof a);
    a.plan = &plan->bk;
    nsa_alias_set al;
    al.n = 0;

#define CHECK(tensor, out, ...)                                                                     \
    do {                                                                                            \
        nsa_tspec sp_ = {__VA_ARGS__};                                                              \
        if ((s = nsa_check_tensor(plan, FN, &(tensor), &sp_, &(out))) != NSA_SUCCESS) return s;     \
        nsa_alias_add(&al, sp_.name, &(tensor), &(out), sp_.rows, sp_.heads, sp_.dim, sp_.output); \
    } while (0)
#define REFUSE(tensor, why)                                                                                         \
    do {                                                                                                            \
        if ((tensor).buffer)                                                                                        \
            return nsa_set_error(NSA_ERR_INVALID_VALUE, FN ": %s is given, but %s", nm, why);                       \
    } while (0)

    /* inputs */
    CHECK(args->q, a.q, "args->q", T, hq, dk, dt, 1, 0, 0);
    CHECK(args->dout, a.dout, "args->dout", T, hq, dv, dt, 1, 0, 0);
    int used_k[3] = {0, 0, 0}, want_dk[3], want_dv[3];
    for (int b = 0; b < 3; b++) {
        const int need_kv = on[b] && !(b == NSA_BRANCH_CMP && external);
        const char *off = b == NSA_BRANCH_SLC ? "cfg.num_selected = 0 turns the selected branch off"
                                              : "cfg.window = 0 turns the window branch off";
        used_k[b] = need_kv;
        snprintf(nm, sizeof nm, "args->k[%s]", nsa_branch_name[b]);
        if (need_kv) CHECK(args->k[b], a.k[b], nm, TK, hkv, dk, dt, 1, 0, 0);
        snprintf(nm, sizeof nm, "args->v[%s]", nsa_branch_name[b]);
        if (need_kv) CHECK(args->v[b], a.v[b], nm, TK, hkv, dv, dt, 1, 0, 0);
        snprintf(nm, sizeof nm, "args->gate[%s]", nsa_branch_name[b]);
        if (on[b]) CHECK(args->gate[b], a.gate[b], nm, T, hq, 1, fdt, 1, 0, 0);
        snprintf(nm, sizeof nm, "args->lse[%s]", nsa_branch_name[b]);
        if (on[b])
            CHECK(args->lse[b], a.lse[b], nm, T, hq, 1, fdt, 1, 0, 0);
        else
            REFUSE(args->lse[b], off);
        /* gradients of this branch */
        snprintf(nm, sizeof nm, "args->dk[%s]", nsa_branch_name[b]);
        if (!on[b]) REFUSE(args->dk[b], off);
        if (b == NSA_BRANCH_CMP && external) REFUSE(args->dk[b], "EXTERNAL compression returns dkc, dvc instead");
        snprintf(nm, sizeof nm, "args->dv[%s]", nsa_branch_name[b]);
        if (!on[b]) REFUSE(args->dv[b], off);
        if (b == NSA_BRANCH_CMP && external) REFUSE(args->dv[b], "EXTERNAL compression returns dkc, dvc instead");
        snprintf(nm, sizeof nm, "args->dgate[%s]", nsa_branch_name[b]);
        if (!on[b]) REFUSE(args->dgate[b], off);
        want_dk[b] = used_k[b] && args->dk[b].buffer;
        want_dv[b] = used_k[b] && args->dv[b].buffer;
    }
    snprintf(nm, sizeof nm, "args->block_indices");
    if (nsel > 0)
        CHECK(args->block_indices, a.indices, "args->block_indices", T, hkv, nsel, NSA_DTYPE_I32, 1, 0, 0);
    else
        REFUSE(args->block_indices, "cfg.num_selected = 0 turns the selected branch off");
    nsa_bk_tensor wk, wv, pek, pev, kci, vci;
    if (linear) {
        CHECK(args->w_k, wk, "args->w_k", hkv, l, dk * dk, dt, 1, 0, 1);
        CHECK(args->w_v, wv, "args->w_v", hkv, l, dv * dv, dt, 1, 0, 1);
        CHECK(args->pe_k, pek, "args->pe_k", hkv, l, dk, dt, 0, 0, 1);
        CHECK(args->pe_v, pev, "args->pe_v", hkv, l, dv, dt, 0, 0, 1);
        a.w_k = wk;
        a.w_v = wv;
        a.pe_k = pek;
        a.pe_v = pev;
    }
    if (external) {
        CHECK(args->kc, kci, "args->kc", nc, hkv, dk, dt, nc > 0, 0, 0);
        CHECK(args->vc, vci, "args->vc", nc, hkv, dv, dt, nc > 0, 0, 0);
        a.kc_in = kci;
        a.vc_in = vci;
    }

    /* gradients: one accumulator (and one output) per distinct view */
    int kslot[3], vslot[3];
    if ((s = share_slots(args->k, args->dk, want_dk, "k", "dk", kslot)) ||
        (s = share_slots(args->v, args->dv, want_dv, "v", "dv", vslot)))
        return s;
    nsa_bk_tensor dq, dkb[3], dvb[3], dwk, dwv, dpek, dpev, dkc, dvc;
    memset(dkb, 0, sizeof dkb);
    memset(dvb, 0, sizeof dvb);
    memset(&dq, 0, sizeof dq);
    CHECK(args->dq, dq, "args->dq", T, hq, dk, dt, 0, 1, 0);
    for (int b = 0; b < 3; b++) {
        snprintf(nm, sizeof nm, "args->dk[%s]", nsa_branch_name[b]);
        if (want_dk[b] && kslot[b] == b) CHECK(args->dk[b], dkb[b], nm, TK, hkv, dk, gdt, 0, 1, 0);
        snprintf(nm, sizeof nm, "args->dv[%s]", nsa_branch_name[b]);
        if (want_dv[b] && vslot[b] == b) CHECK(args->dv[b], dvb[b], nm, TK, hkv, dv, gdt, 0, 1, 0);
        snprintf(nm, sizeof nm, "args->dgate[%s]", nsa_branch_name[b]);
        if (on[b]) CHECK(args->dgate[b], a.dgate[b], nm, T, hq, 1, fdt, 0, 1, 0);
    }
    snprintf(nm, sizeof nm, "args->dw_k");
    if (!linear) REFUSE(args->dw_k, "only LINEAR compression has weights");
    snprintf(nm, sizeof nm, "args->dw_v");
    if (!linear) REFUSE(args->dw_v, "only LINEAR compression has weights");
    snprintf(nm, sizeof nm, "args->dpe_k");
    if (!linear || !args->pe_k.buffer) REFUSE(args->dpe_k, "args->pe_k is not (only LINEAR with pe has it)");
    snprintf(nm, sizeof nm, "args->dpe_v");
    if (!linear || !args->pe_v.buffer) REFUSE(args->dpe_v, "args->pe_v is not (only LINEAR with pe has it)");
    snprintf(nm, sizeof nm, "args->dkc");
    if (!external) REFUSE(args->dkc, "only EXTERNAL compression takes kc");
    snprintf(nm, sizeof nm, "args->dvc");
    if (!external) REFUSE(args->dvc, "only EXTERNAL compression takes vc");
    memset(&dwk, 0, sizeof dwk);
    dwv = dpek = dpev = dkc = dvc = dwk;
    if (linear) {
        CHECK(args->dw_k, dwk, "args->dw_k", hkv, l, dk * dk, gdt, 0, 1, 1);
        CHECK(args->dw_v, dwv, "args->dw_v", hkv, l, dv * dv, gdt, 0, 1, 1);
        CHECK(args->dpe_k, dpek, "args->dpe_k", hkv, l, dk, gdt, 0, 1, 1);
        CHECK(args->dpe_v, dpev, "args->dpe_v", hkv, l, dv, gdt, 0, 1, 1);
    }
    if (external) {
        CHECK(args->dkc, dkc, "args->dkc", nc, hkv, dk, gdt, 0, 1, 0);
        CHECK(args->dvc, dvc, "args->dvc", nc, hkv, dv, gdt, 0, 1, 0);
    }
#undef CHECK
#undef REFUSE

    if ((s = nsa_workspace_check(plan, workspace, FN)) != NSA_SUCCESS) return s;
    if ((s = nsa_alias_check(&al, workspace, (int64_t)plan->ws.bytes, FN)) != NSA_SUCCESS) return s;
    if (plan->num_bwd_stages == 0) { /* no token: the gradients that have elements (LINEAR's) are 0 */
        const nsa_tensor *zero[4] = {&args->dw_k, &args->dw_v, &args->dpe_k, &args->dpe_v};
        const int64_t cnt[4] = {hkv * l * dk * dk, hkv * l * dv * dv, hkv * l * dk, hkv * l * dv};
        for (int i = 0; i < 4 && linear; i++)
            if (zero[i]->buffer &&
                (s = nsa_buffer_fill(zero[i]->buffer, (size_t)zero[i]->offset * nsa_dtype_size(gdt), 0,
                                     (size_t)cnt[i] * nsa_dtype_size(gdt))) != NSA_SUCCESS)
                return s;
        return NSA_SUCCESS;
    }
    if (nsel > 0 && !(args->flags & NSA_BACKWARD_TRUST_INDICES) &&
        (s = nsa_check_indices(plan, &args->block_indices, FN, "args->block_indices")))
        return s;
    if ((s = nsa_workspace_get(plan, &workspace)) != NSA_SUCCESS) return s;

    const nsa_ws_layout *w = &plan->ws;
    a.kc = nsa_ws_view(workspace, w->kc, hkv, dk, fdt);
    a.vc = nsa_ws_view(workspace, w->vc, hkv, dv, fdt);
    a.dkc_acc = nsa_ws_view(workspace, w->dkc_acc, hkv, dk, fdt);
    a.dvc_acc = nsa_ws_view(workspace, w->dvc_acc, hkv, dv, fdt);
    a.delta = nsa_ws_view(workspace, w->delta, hq, 1, fdt);
    if (dq.buf) a.dq_acc = nsa_ws_view(workspace, w->dq_acc, hq, dk, fdt);
    for (int b = 0; b < 3; b++) {
        if (want_dk[b]) a.dk_acc[b] = nsa_ws_view(workspace, w->dk_acc[kslot[b]], hkv, dk, fdt);
        if (want_dv[b]) a.dv_acc[b] = nsa_ws_view(workspace, w->dv_acc[vslot[b]], hkv, dv, fdt);
    }
    if (dwk.buf) a.dw_k_acc = nsa_ws_view(workspace, w->dw_k_acc, l, dk * dk, fdt);
    if (dwv.buf) a.dw_v_acc = nsa_ws_view(workspace, w->dw_v_acc, l, dv * dv, fdt);
    if (dpek.buf) a.dpe_k_acc = nsa_ws_view(workspace, w->dpe_k_acc, l, dk, fdt);
    if (dpev.buf) a.dpe_v_acc = nsa_ws_view(workspace, w->dpe_v_acc, l, dv, fdt);

    /* what BWD_STORE rounds to the dtype */
#define STORE(acc_, out_, r_, h_, d_)                                                                  \
    do {                                                                                               \
        if ((out_).buf)                                                                                \
            a.store[a.num_store++] = (nsa_bk_store){(acc_), (out_), (r_), (h_), (d_)};         \
    } while (0)
    STORE(a.dq_acc, dq, T, hq, dk);
    for (int b = 0; b < 3; b++) {
        STORE(a.dk_acc[b], dkb[b], TK, hkv, dk);
        STORE(a.dv_acc[b], dvb[b], TK, hkv, dv);
    }
    STORE(a.dkc_acc, dkc, nc, hkv, dk);
    STORE(a.dvc_acc, dvc, nc, hkv, dv);
    STORE(a.dw_k_acc, dwk, hkv, l, dk * dk);
    STORE(a.dw_v_acc, dwv, hkv, l, dv * dv);
    STORE(a.dpe_k_acc, dpek, hkv, l, dk);
    STORE(a.dpe_v_acc, dpev, hkv, l, dv);
#undef STORE

    const nsa_backend *be = plan->ctx->be;
    if (w->acc_end > w->acc_begin &&
        (s = be->buffer_fill(plan->ctx->bctx, workspace->bbuf, (size_t)w->acc_begin, 0,
                             (size_t)(w->acc_end - w->acc_begin))) != NSA_SUCCESS)
        return nsa_backend_error(s, plan->ctx->backend_name, "zero-filling the backward's accumulators");
    for (int i = 0; i < plan->num_bwd_stages; i++) {
        nsa_stage st = plan->bwd_stages[i];
        s = be->run(plan->ctx->bctx, st, &a);
        if (s != NSA_SUCCESS) return nsa_backend_error(s, plan->ctx->backend_name, "in stage %s", nsa_stage_name(st));
    }
    return NSA_SUCCESS;
}
