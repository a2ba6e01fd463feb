/*
 * nsa_decode: one step of decoding or chunked prefill on a decode plan
 * (docs/nsa-semantics.md section 10; include/nsa.h "decoding"). The core checks
 * the caller's views against the plan's capacities as nsa_forward does (dtype,
 * strides, extents, aliasing), lays out the workspace views and runs the
 * plan's two stages. The step lengths and page tables live in the context's
 * memory: the backend checks them (DECODE_APPEND, before it writes anything),
 * never the core, so that a GPU step needs no host round trip.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

#define FN "nsa_decode"

static nsa_status decode(nsa_plan *plan, const nsa_decode_args *args, nsa_buffer *workspace);

nsa_status nsa_decode_sized(nsa_plan *plan, const nsa_decode_args *args_in, size_t args_size, nsa_buffer *workspace)
{
    nsa_clear_error();
    if (!plan) return nsa_set_error(NSA_ERR_NULL_POINTER, FN ": plan is NULL");
    if (!args_in) return nsa_set_error(NSA_ERR_NULL_POINTER, FN ": args is NULL");
    if (!plan->bk.decode)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, FN ": plan was made by nsa_plan_create, not by "
                             "nsa_decode_plan_create: it has no decode step (its capacities and stages)");
    nsa_decode_args args;
    memset(&args, 0, sizeof args);
    nsa_status s = nsa_struct_in(&args, sizeof args, NSA_DECODE_ARGS_SIZE_FIRST, args_in, args_size, FN, "args");
    return s != NSA_SUCCESS ? s : decode(plan, &args, workspace);
}

nsa_status nsa_decode_check(nsa_plan *plan)
{
    nsa_clear_error();
    if (!plan) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_decode_check: plan is NULL");
    if (!plan->bk.decode)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_decode_check: plan was made by nsa_plan_create, not by "
                             "nsa_decode_plan_create");
    nsa_status s = nsa_context_synchronize(plan->ctx);
    if (s != NSA_SUCCESS) return s;
    if (plan->dec_status == NSA_SUCCESS && plan->ctx->be->decode_status && plan->prepared) {
        /* a device that checks the step asynchronously: the record of its last step */
        nsa_clear_error();
        s = plan->ctx->be->decode_status(plan->ctx->bctx, &plan->bk);
        return s == NSA_SUCCESS ? NSA_SUCCESS
                                : nsa_backend_error(s, plan->ctx->backend_name, "reading a decode step's status");
    }
    if (plan->dec_status == NSA_SUCCESS) return NSA_SUCCESS;
    return nsa_set_error(plan->dec_status, "%s", plan->dec_msg);
}

/* The same view: one buffer, offset and strides (how a caller says "one tensor"). */
static int same_view(const nsa_tensor *a, const nsa_tensor *b)
{
    return a->buffer && a->buffer == b->buffer && a->offset == b->offset && a->stride_token == b->stride_token &&
           a->stride_head == b->stride_head;
}

static nsa_status decode(nsa_plan *plan, const nsa_decode_args *args, nsa_buffer *workspace)
{
    const nsa_config *c = &plan->bk.cfg;
    const nsa_decode_limits *lim = &plan->bk.lim;
    const int64_t MT = lim->max_total_tokens, B = lim->batch, hq = c->num_q_heads, hkv = c->num_kv_heads;
    const int64_t dk = c->head_dim_qk, dv = c->head_dim_v, l = c->cmp_block, nsel = c->num_selected;
    const int64_t pool = lim->num_pages * lim->page_size, cpool = lim->num_cmp_pages * lim->cmp_page_size;
    const int has_cmp = plan->bk.max_nc > 0; /* a max_context sequence has a compressed block */
    const nsa_dtype dt = c->dtype, fdt = nsa_bk_float_dtype(dt);
    const int on[3] = {1, nsel > 0, c->window > 0};
    const int linear = c->compress == NSA_COMPRESS_LINEAR, external = c->compress == NSA_COMPRESS_EXTERNAL;
    nsa_bk_args a;
    memset(&a, 0, sizeof a);
    a.plan = &plan->bk;
    nsa_status s;
    char nm[64];

#define CHECK(tensor, ...)                                                                                          \
    do {                                                                                                            \
        nsa_tspec sp_ = {__VA_ARGS__};                                                                              \
        if ((s = nsa_check_tensor(plan, FN, &(tensor), &sp_, &(tensor##_out))) != NSA_SUCCESS) return s;            \
    } while (0)

    nsa_bk_tensor q_out, o_out, wk_out, wv_out, pek_out, pev_out, selected_out, status_out;
    nsa_bk_tensor cuq_out, csl_out, bt_out, cbt_out, kcc_out, vcc_out;
    nsa_alias_set al;
    al.n = 0;
    nsa_tensor q = args->q, o = args->o, wk = args->w_k, wv = args->w_v, pek = args->pe_k, pev = args->pe_v;
    nsa_tensor selected = args->selected, status = args->status, cuq = args->cu_seqlens_q;
    nsa_tensor csl = args->cache_seqlens, bt = args->block_table, cbt = args->cmp_block_table;
    nsa_tensor kcc = args->kc_cache, vcc = args->vc_cache;
    CHECK(q, "args->q", MT, hq, dk, dt, 1, 0, 0);
    CHECK(o, "args->o", MT, hq, dv, dt, 1, 1, 0);
    nsa_alias_add(&al, "args->q", &q, &q_out, MT, hq, dk, 0);
    nsa_alias_add(&al, "args->o", &o, &o_out, MT, hq, dv, 1);
    CHECK(cuq, "args->cu_seqlens_q", 1, 1, B + 1, NSA_DTYPE_I32, 1, 0, 1);
    CHECK(csl, "args->cache_seqlens", 1, 1, B, NSA_DTYPE_I32, 1, 0, 1);
    CHECK(bt, "args->block_table", B, 1, lim->max_pages, NSA_DTYPE_I32, 1, 0, 0);
    CHECK(cbt, "args->cmp_block_table", B, 1, lim->max_cmp_pages, NSA_DTYPE_I32, has_cmp && lim->max_cmp_pages > 0, 0,
          0);
    nsa_alias_add(&al, "args->cu_seqlens_q", &cuq, &cuq_out, 1, 1, B + 1, 0);
    nsa_alias_add(&al, "args->cache_seqlens", &csl, &csl_out, 1, 1, B, 0);
    nsa_alias_add(&al, "args->block_table", &bt, &bt_out, B, 1, lim->max_pages, 0);
    a.dec_cu_seqlens_q = cuq_out;
    a.dec_cache_seqlens = csl_out;
    a.dec_block_table = bt_out;
    if (has_cmp) {
        nsa_alias_add(&al, "args->cmp_block_table", &cbt, &cbt_out, B, 1, lim->max_cmp_pages, 0);
        a.dec_cmp_block_table = cbt_out;
    }

    for (int b = 0; b < 3; b++) {
        /* the branches that read raw keys: their new tokens and their caches */
        const int raw = on[b] && !(b == NSA_BRANCH_CMP && external);
        nsa_tensor kb = args->k[b], vb = args->v[b], gb = args->gate[b], lb = args->lse[b];
        nsa_tensor kcb = args->k_cache[b], vcb = args->v_cache[b];
        nsa_bk_tensor kb_out, vb_out, gb_out, lb_out, kcb_out, vcb_out;
        const char *br = nsa_branch_name[b];
        snprintf(nm, sizeof nm, "args->k[%s]", br);
        CHECK(kb, nm, MT, hkv, dk, dt, raw, 0, 0);
        snprintf(nm, sizeof nm, "args->v[%s]", br);
        CHECK(vb, nm, MT, hkv, dv, dt, raw, 0, 0);
        snprintf(nm, sizeof nm, "args->k_cache[%s]", br);
        CHECK(kcb, nm, pool, hkv, dk, dt, raw, 1, 0);
        snprintf(nm, sizeof nm, "args->v_cache[%s]", br);
        CHECK(vcb, nm, pool, hkv, dv, dt, raw, 1, 0);
        snprintf(nm, sizeof nm, "args->gate[%s]", br);
        CHECK(gb, nm, MT, hq, 1, fdt, on[b], 0, 0);
        snprintf(nm, sizeof nm, "args->lse[%s]", br);
        CHECK(lb, nm, MT, hq, 1, fdt, 0, 1, 0);
        if (raw) {
            a.k[b] = kb_out;
            a.v[b] = vb_out;
            snprintf(nm, sizeof nm, "args->k[%s]", br);
            nsa_alias_add(&al, nm, &kb, &kb_out, MT, hkv, dk, 0);
            snprintf(nm, sizeof nm, "args->v[%s]", br);
            nsa_alias_add(&al, nm, &vb, &vb_out, MT, hkv, dv, 0);
            /* a cache given for several branches is one cache: written once, so
             * those branches' new tokens must be one tensor too */
            int k_seen = 0, v_seen = 0;
            for (int e = 0; e < b; e++) {
                if (!on[e] || (e == NSA_BRANCH_CMP && external)) continue;
                for (int kv = 0; kv < 2; kv++) {
                    const nsa_tensor *ce = kv ? &args->v_cache[e] : &args->k_cache[e];
                    const nsa_tensor *cb = kv ? &vcb : &kcb;
                    if (!same_view(ce, cb)) continue;
                    const nsa_tensor *ne = kv ? &args->v[e] : &args->k[e], *nb = kv ? &vb : &kb;
                    if (!same_view(ne, nb))
                        return nsa_set_error(NSA_ERR_INVALID_VALUE,
                                             FN ": args->%s_cache[%s] and args->%s_cache[%s] are one cache (the same "
                                             "view), but args->%s[%s] and args->%s[%s] are different views: one cache "
                                             "holds one tensor (pass distinct caches for distinct keys)",
                                             kv ? "v" : "k", nsa_branch_name[e], kv ? "v" : "k", br, kv ? "v" : "k",
                                             nsa_branch_name[e], kv ? "v" : "k", br);
                    if (kv) v_seen = 1;
                    else k_seen = 1;
                }
            }
            a.dec_k_cache[b] = kcb_out;
            a.dec_v_cache[b] = vcb_out;
            /* caches are written: outputs for the aliasing rules, each distinct one once */
            snprintf(nm, sizeof nm, "args->k_cache[%s]", br);
            if (!k_seen) nsa_alias_add(&al, nm, &kcb, &kcb_out, pool, hkv, dk, 1);
            snprintf(nm, sizeof nm, "args->v_cache[%s]", br);
            if (!v_seen) nsa_alias_add(&al, nm, &vcb, &vcb_out, pool, hkv, dv, 1);
        } else if (kcb_out.buf || vcb_out.buf) {
            return nsa_set_error(NSA_ERR_INVALID_VALUE,
                                 FN ": args->%s_cache[%s] is given, but the %s branch %s", kcb_out.buf ? "k" : "v", br,
                                 br, on[b] ? "reads no raw keys (EXTERNAL compression: the caller writes kc_cache "
                                             "and vc_cache)" : "is off");
        }
        snprintf(nm, sizeof nm, "args->lse[%s]", br);
        if (on[b]) {
            a.gate[b] = gb_out;
            a.lse[b] = lb_out;
            nsa_alias_add(&al, nm, &lb, &lb_out, MT, hq, 1, 1);
            snprintf(nm, sizeof nm, "args->gate[%s]", br);
            nsa_alias_add(&al, nm, &gb, &gb_out, MT, hq, 1, 0);
        } else if (lb_out.buf) {
            return nsa_set_error(NSA_ERR_INVALID_VALUE, FN ": %s is given, but the %s branch is off", nm, br);
        }
    }
    CHECK(kcc, "args->kc_cache", cpool, hkv, dk, dt, has_cmp && cpool > 0, 1, 0);
    CHECK(vcc, "args->vc_cache", cpool, hkv, dv, dt, has_cmp && cpool > 0, 1, 0);
    if (has_cmp) {
        a.dec_kc_cache = kcc_out;
        a.dec_vc_cache = vcc_out;
        nsa_alias_add(&al, "args->kc_cache", &kcc, &kcc_out, cpool, hkv, dk, 1);
        nsa_alias_add(&al, "args->vc_cache", &vcc, &vcc_out, cpool, hkv, dv, 1);
    }
    CHECK(wk, "args->w_k", hkv, l, dk * dk, dt, linear, 0, 1);
    CHECK(wv, "args->w_v", hkv, l, dv * dv, dt, linear, 0, 1);
    CHECK(pek, "args->pe_k", hkv, l, dk, dt, 0, 0, 1);
    CHECK(pev, "args->pe_v", hkv, l, dv, dt, 0, 0, 1);
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
    CHECK(selected, "args->selected", MT, hkv, nsel, NSA_DTYPE_I32, 0, 1, 0);
    if (selected_out.buf && nsel == 0)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, FN ": args->selected is given, but cfg.num_selected = 0 turns the "
                             "selected branch off");
    nsa_alias_add(&al, "args->selected", &selected, &selected_out, MT, hkv, nsel, 1);
    CHECK(status, "args->status", 1, 1, 2, NSA_DTYPE_I32, 0, 1, 1);
    nsa_alias_add(&al, "args->status", &status, &status_out, 1, 1, 2, 1);
    a.dec_status = status_out;
#undef CHECK

    if ((s = nsa_workspace_check(plan, workspace, FN)) != NSA_SUCCESS) return s;
    if ((s = nsa_alias_check(&al, workspace, (int64_t)plan->ws.bytes, FN)) != NSA_SUCCESS) return s;
    if ((s = nsa_workspace_get(plan, &workspace)) != NSA_SUCCESS) return s;

    const nsa_ws_layout *w = &plan->ws;
    a.q = q_out;
    a.o = o_out;
    if (!a.lse[NSA_BRANCH_CMP].buf) a.lse[NSA_BRANCH_CMP] = nsa_ws_view(workspace, w->lse_cmp, hq, 1, fdt);
    a.indices = selected_out.buf ? selected_out : nsa_ws_view(workspace, w->indices, hkv, nsel, NSA_DTYPE_I32);
    for (int b = 0; b < 3; b++) a.o_b[b] = on[b] ? nsa_ws_view(workspace, w->o_b[b], hq, dv, fdt) : (nsa_bk_tensor){0};

    /* the step: its status (the backend's checks of the lengths and tables) is
     * the plan's until the next step, for nsa_decode_check */
    plan->dec_status = NSA_SUCCESS;
    plan->dec_msg[0] = '\0';
    for (int i = 0; i < plan->num_stages; i++) {
        nsa_stage st = plan->stages[i];
        s = plan->ctx->be->run(plan->ctx->bctx, st, &a);
        if (s != NSA_SUCCESS) {
            s = nsa_backend_error(s, plan->ctx->backend_name, "in stage %s", nsa_stage_name(st));
            plan->dec_status = s;
            snprintf(plan->dec_msg, sizeof plan->dec_msg, "%s", nsa_last_error());
            return s;
        }
    }
    return NSA_SUCCESS;
}
