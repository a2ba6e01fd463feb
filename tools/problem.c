/* One NSA problem on one context, set up once and timed (see problem.h). */
#include "problem.h"

#include <stdlib.h>
#include <string.h>

#include "tool.h"

static nsa_status new_buffer(problem *p, size_t bytes, nsa_buffer **out, const char **what)
{
    nsa_status s;
    if (p->nbufs >= PROBLEM_MAX_BUFS) {
        *what = "problem_setup (too many buffers)";
        return NSA_ERR_INTERNAL;
    }
    s = nsa_buffer_alloc(p->ctx, bytes ? bytes : 16, out);
    if (s != NSA_SUCCESS) {
        *what = "nsa_buffer_alloc";
        return s;
    }
    p->bufs[p->nbufs++] = *out;
    return NSA_SUCCESS;
}

/* Converts n floats to dtype and uploads them into a new buffer. */
static nsa_status upload(problem *p, const float *src, int64_t n, nsa_dtype dtype, nsa_buffer **out,
                         const char **what)
{
    size_t esz = nsa_dtype_size(dtype);
    size_t bytes = (size_t)n * esz;
    void *tmp;
    nsa_status s = new_buffer(p, bytes, out, what);
    if (s != NSA_SUCCESS)
        return s;
    p->input_bytes += bytes;
    if (n == 0)
        return NSA_SUCCESS;
    if (dtype == NSA_DTYPE_F32) {
        s = nsa_buffer_write(*out, 0, src, bytes);
        if (s != NSA_SUCCESS)
            *what = "nsa_buffer_write";
        return s;
    }
    tmp = malloc(bytes);
    if (!tmp) {
        *what = "malloc (host staging)";
        return NSA_ERR_OUT_OF_MEMORY;
    }
    s = nsa_convert(src, NSA_DTYPE_F32, tmp, dtype, n);
    if (s != NSA_SUCCESS) {
        *what = "nsa_convert";
    } else {
        s = nsa_buffer_write(*out, 0, tmp, bytes);
        if (s != NSA_SUCCESS)
            *what = "nsa_buffer_write";
    }
    free(tmp);
    return s;
}

static nsa_tensor rows(nsa_buffer *b, int64_t heads, int64_t dim)
{
    return nsa_tensor_dense(b, 0, heads, dim);
}

nsa_status problem_setup(nsa_context *ctx, const tk_case *c, const tk_inputs *in,
                         const int32_t *indices, problem *p, char *err, size_t err_size)
{
    const char *what_s = "";
    const char **what = &what_s;
    const nsa_config *cfg = &c->cfg;
    const int64_t T = tk_case_tokens(c);
    const int64_t Hq = cfg->num_q_heads, Hkv = cfg->num_kv_heads;
    const int64_t Dqk = cfg->head_dim_qk, Dv = cfg->head_dim_v, l = cfg->cmp_block;
    const int64_t n = cfg->num_selected;
    const int on[3] = {1, n > 0, cfg->window > 0};
    nsa_buffer *b;
    nsa_status s;

    memset(p, 0, sizeof *p);
    p->ctx = ctx;
    p->c = *c;
    p->tokens = T;

    s = nsa_plan_create(ctx, cfg, c->cu_seqlens, c->batch, &p->plan);
    if (s != NSA_SUCCESS) {
        *what = "nsa_plan_create";
        goto fail;
    }
    s = nsa_plan_get_info(p->plan, &p->info);
    if (s != NSA_SUCCESS) {
        *what = "nsa_plan_get_info";
        goto fail;
    }

#define UP(src, count, view)                                                                       \
    do {                                                                                           \
        s = upload(p, (src), (count), cfg->dtype, &b, what);                                       \
        if (s != NSA_SUCCESS)                                                                      \
            goto fail;                                                                             \
        view;                                                                                      \
    } while (0)

    UP(in->q, T * Hq * Dqk, p->args.q = rows(b, Hq, Dqk));
    for (int br = 0; br < 3; br++) {
        if (br > 0 && in->k[br] == in->k[0])
            p->args.k[br] = p->args.k[0];
        else
            UP(in->k[br], T * Hkv * Dqk, p->args.k[br] = rows(b, Hkv, Dqk));
        if (br > 0 && in->v[br] == in->v[0])
            p->args.v[br] = p->args.v[0];
        else
            UP(in->v[br], T * Hkv * Dv, p->args.v[br] = rows(b, Hkv, Dv));
    }
    for (int br = 0; br < 3; br++) {
        if (!on[br] || !in->gate[br])
            continue;
        s = upload(p, in->gate[br], T * Hq, NSA_DTYPE_F32, &b, what);
        if (s != NSA_SUCCESS)
            goto fail;
        p->args.gate[br] = rows(b, Hq, 1);
    }
    if (cfg->compress == NSA_COMPRESS_LINEAR) {
        UP(in->w_k, Hkv * l * Dqk * Dqk, p->args.w_k = rows(b, l * Dqk, Dqk));
        UP(in->w_v, Hkv * l * Dv * Dv, p->args.w_v = rows(b, l * Dv, Dv));
        if (in->pe_k)
            UP(in->pe_k, Hkv * l * Dqk, p->args.pe_k = rows(b, l, Dqk));
        if (in->pe_v)
            UP(in->pe_v, Hkv * l * Dv, p->args.pe_v = rows(b, l, Dv));
    } else if (cfg->compress == NSA_COMPRESS_EXTERNAL) {
        UP(in->kc, in->total_cmp * Hkv * Dqk, p->args.kc = rows(b, Hkv, Dqk));
        UP(in->vc, in->total_cmp * Hkv * Dv, p->args.vc = rows(b, Hkv, Dv));
    }
#undef UP
    if (indices && n > 0) {
        size_t bytes = (size_t)(T * Hkv * n) * sizeof(int32_t);
        s = new_buffer(p, bytes, &b, what);
        if (s != NSA_SUCCESS)
            goto fail;
        if (bytes && (s = nsa_buffer_write(b, 0, indices, bytes)) != NSA_SUCCESS) {
            *what = "nsa_buffer_write (block_indices)";
            goto fail;
        }
        p->input_bytes += bytes;
        p->args.block_indices = rows(b, Hkv, n);
    }

    /* outputs */
    s = new_buffer(p, (size_t)(T * Hq * Dv) * nsa_dtype_size(cfg->dtype), &b, what);
    if (s != NSA_SUCCESS)
        goto fail;
    p->args.o = rows(b, Hq, Dv);
    p->output_bytes += (size_t)(T * Hq * Dv) * nsa_dtype_size(cfg->dtype);
    for (int br = 0; br < 3; br++) {
        if (!on[br])
            continue;
        s = new_buffer(p, (size_t)(T * Hq) * sizeof(float), &b, what);
        if (s != NSA_SUCCESS)
            goto fail;
        p->args.lse[br] = rows(b, Hq, 1);
        p->output_bytes += (size_t)(T * Hq) * sizeof(float);
    }
    p->given = indices && n > 0 ? indices : NULL;
    if (n > 0 && !p->given) { /* the library refuses `selected` next to given indices */
        s = new_buffer(p, (size_t)(T * Hkv * n) * sizeof(int32_t), &b, what);
        if (s != NSA_SUCCESS)
            goto fail;
        p->args.selected = rows(b, Hkv, n);
        p->output_bytes += (size_t)(T * Hkv * n) * sizeof(int32_t);
    }
    if (p->info.workspace_bytes > 0) {
        s = nsa_buffer_alloc(ctx, p->info.workspace_bytes, &p->workspace);
        if (s != NSA_SUCCESS) {
            *what = "nsa_buffer_alloc (workspace)";
            goto fail;
        }
    }
    return NSA_SUCCESS;

fail:
    tool_format_error(err, err_size, *what, s); /* before problem_free resets the message */
    problem_free(p);
    return s;
}

nsa_status problem_forward(problem *p, char *err, size_t err_size)
{
    nsa_status s = nsa_forward(p->plan, &p->args, p->workspace);
    if (s != NSA_SUCCESS)
        return tool_format_error(err, err_size, "nsa_forward", s);
    s = nsa_context_synchronize(p->ctx);
    if (s != NSA_SUCCESS)
        return tool_format_error(err, err_size, "nsa_context_synchronize", s);
    return s;
}

nsa_status problem_time(problem *p, int warmup, int iters, const char *label, double *median_s,
                        double *min_s, char *err, size_t err_size)
{
    double *t;
    nsa_status s = NSA_SUCCESS;
    if (iters < 1)
        iters = 1;
    t = malloc(sizeof *t * (size_t)iters);
    if (!t) {
        snprintf(err, err_size, "malloc: out of host memory");
        return NSA_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < warmup && s == NSA_SUCCESS; i++) {
        tool_progress("%s: warm-up %d/%d", label, i + 1, warmup);
        s = problem_forward(p, err, err_size);
    }
    for (int i = 0; i < iters && s == NSA_SUCCESS; i++) {
        double t0;
        tool_progress("%s: iteration %d/%d", label, i + 1, iters);
        t0 = tool_now();
        s = problem_forward(p, err, err_size);
        t[i] = tool_now() - t0;
    }
    tool_progress_end();
    if (s == NSA_SUCCESS) {
        double lo = t[0];
        for (int i = 1; i < iters; i++)
            lo = t[i] < lo ? t[i] : lo;
        *min_s = lo;
        *median_s = tool_median(t, iters);
    }
    free(t);
    return s;
}

nsa_status problem_download(problem *p, tk_output *out, char *err, size_t err_size)
{
    const char *what_s = "";
    const char **what = &what_s;
    const nsa_config *cfg = &p->c.cfg;
    const int64_t T = p->tokens, Hq = cfg->num_q_heads, Hkv = cfg->num_kv_heads;
    const int64_t Dv = cfg->head_dim_v, n = cfg->num_selected;
    const int64_t no = T * Hq * Dv;
    size_t obytes = (size_t)no * nsa_dtype_size(cfg->dtype);
    nsa_status s;

    memset(out, 0, sizeof *out);
    out->tokens = T;
    snprintf(out->stages, sizeof out->stages, "%s", p->info.stages);
    out->o = malloc(sizeof(float) * (size_t)(no ? no : 1));
    out->o_raw = malloc(obytes ? obytes : 1);
    out->o_raw_bytes = obytes;
    if (!out->o || !out->o_raw) {
        *what = "malloc";
        s = NSA_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    if (obytes && (s = nsa_buffer_read(p->args.o.buffer, 0, out->o_raw, obytes)) != NSA_SUCCESS) {
        *what = "nsa_buffer_read (o)";
        goto fail;
    }
    if (no && (s = nsa_convert(out->o_raw, cfg->dtype, out->o, NSA_DTYPE_F32, no)) != NSA_SUCCESS) {
        *what = "nsa_convert (o)";
        goto fail;
    }
    for (int br = 0; br < 3; br++) {
        if (!p->args.lse[br].buffer)
            continue;
        out->lse[br] = malloc(sizeof(float) * (size_t)(T > 0 ? T * Hq : 1));
        if (!out->lse[br]) {
            *what = "malloc";
            s = NSA_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        if (T > 0 && (s = nsa_buffer_read(p->args.lse[br].buffer, 0, out->lse[br],
                                           sizeof(float) * (size_t)(T * Hq))) != NSA_SUCCESS) {
            *what = "nsa_buffer_read (lse)";
            goto fail;
        }
    }
    if (n > 0) {
        size_t bytes = sizeof(int32_t) * (size_t)(T * Hkv * n);
        out->sel = malloc(bytes ? bytes : 1);
        if (!out->sel) {
            *what = "malloc";
            s = NSA_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        if (p->given) {
            memcpy(out->sel, p->given, bytes); /* the indices used are the given ones */
        } else if (bytes &&
                   (s = nsa_buffer_read(p->args.selected.buffer, 0, out->sel, bytes)) != NSA_SUCCESS) {
            *what = "nsa_buffer_read (selected)";
            goto fail;
        }
    }
    return NSA_SUCCESS;
fail:
    tool_format_error(err, err_size, *what, s);
    problem_output_free(out);
    return s;
}

void problem_output_free(tk_output *out)
{
    if (!out)
        return;
    free(out->o);
    free(out->o_raw);
    for (int br = 0; br < 3; br++)
        free(out->lse[br]);
    free(out->sel);
    memset(out, 0, sizeof *out);
}

void problem_free(problem *p)
{
    if (!p)
        return;
    nsa_buffer_free(p->workspace);
    for (int i = 0; i < p->nbufs; i++)
        nsa_buffer_free(p->bufs[i]);
    nsa_plan_destroy(p->plan);
    p->workspace = NULL;
    p->nbufs = 0;
    p->plan = NULL;
}

double problem_pairs(const tk_case *c, const int32_t *sel)
{
    const nsa_config *cfg = &c->cfg;
    const int64_t Hq = cfg->num_q_heads, Hkv = cfg->num_kv_heads, G = Hq / Hkv;
    const int64_t n = cfg->num_selected, ls = cfg->slc_block, w = cfg->window;
    const int64_t T = tk_case_tokens(c);
    double pairs = 0.0;
    for (int64_t t = 0; t < T; t++) {
        int64_t seq, tl, per_head;
        tk_case_token(c, t, &seq, &tl);
        per_head = tk_num_cmp_blocks(cfg, tl + 1) + (w > 0 ? (w < tl + 1 ? w : tl + 1) : 0);
        pairs += (double)(per_head * Hq);
        if (n > 0 && sel) {
            for (int64_t g = 0; g < Hkv; g++) {
                const int32_t *row = sel + (t * Hkv + g) * n;
                int64_t tokens = 0;
                for (int64_t i = 0; i < n; i++) {
                    int64_t seen;
                    if (row[i] < 0)
                        continue;
                    seen = tl - (int64_t)row[i] * ls + 1;
                    tokens += seen < 0 ? 0 : seen > ls ? ls : seen;
                }
                pairs += (double)(tokens * G);
            }
        }
    }
    return pairs;
}

double problem_dense_pairs(const tk_case *c)
{
    double pairs = 0.0;
    for (int64_t b = 0; b < c->batch; b++) {
        double L = (double)(c->cu_seqlens[b + 1] - c->cu_seqlens[b]);
        pairs += L * (L + 1.0) / 2.0;
    }
    return pairs * (double)c->cfg.num_q_heads;
}
