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
        s = upload(p, in->gate[br], T * Hq, tk_float_dtype(cfg->dtype), &b, what); /* f32; f64 in an f64 call */
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
        const size_t lbytes = (size_t)(T * Hq) * nsa_dtype_size(tk_float_dtype(cfg->dtype));
        s = new_buffer(p, lbytes, &b, what);
        if (s != NSA_SUCCESS)
            goto fail;
        p->args.lse[br] = rows(b, Hq, 1);
        p->output_bytes += lbytes;
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

nsa_status problem_backward_setup(problem *p, char *err, size_t err_size)
{
    const char *what_s = "";
    const char **what = &what_s;
    const nsa_config *cfg = &p->c.cfg;
    const int64_t T = p->tokens, Hq = cfg->num_q_heads, Hkv = cfg->num_kv_heads;
    const int64_t Dqk = cfg->head_dim_qk, Dv = cfg->head_dim_v, l = cfg->cmp_block;
    const int64_t nc = p->info.total_cmp_blocks, no = T * Hq * Dv;
    const int on[3] = {1, cfg->num_selected > 0, cfg->window > 0};
    const int ext = cfg->compress == NSA_COMPRESS_EXTERNAL, lin = cfg->compress == NSA_COMPRESS_LINEAR;
    nsa_backward_args *b = &p->bargs;
    nsa_buffer *buf;
    nsa_status s;
    memset(b, 0, sizeof *b);
    b->q = p->args.q;
    for (int br = 0; br < 3; br++) {
        b->k[br] = p->args.k[br];
        b->v[br] = p->args.v[br];
        b->gate[br] = p->args.gate[br];
        b->lse[br] = p->args.lse[br];
    }
    b->w_k = p->args.w_k;
    b->w_v = p->args.w_v;
    b->pe_k = p->args.pe_k;
    b->pe_v = p->args.pe_v;
    b->kc = p->args.kc;
    b->vc = p->args.vc;
    b->block_indices = p->args.block_indices.buffer ? p->args.block_indices : p->args.selected;
    b->flags = NSA_BACKWARD_TRUST_INDICES;

    /* dO: uniform [-1, 1) from the case's seed (its own stream) */
    float *dO = NULL;
    s = tk_dout_make(&p->c, p->c.seed, 0xd0, &dO); /* the same dO as nsa run --backward */
    if (s == NSA_SUCCESS) s = upload(p, dO, no, cfg->dtype, &buf, what);
    else *what = "tk_dout_make (dO)";
    free(dO);
    if (s != NSA_SUCCESS) goto fail;
    b->dout = rows(buf, Hq, Dv);

#define GRAD(view, count, dt)                                                                      \
    do {                                                                                           \
        s = new_buffer(p, (size_t)(count) * nsa_dtype_size(dt), &buf, what);                       \
        if (s != NSA_SUCCESS) goto fail;                                                           \
        view;                                                                                      \
    } while (0)
    GRAD(b->dq = rows(buf, Hq, Dqk), T * Hq * Dqk, cfg->dtype);
    for (int br = 0; br < 3; br++) {
        if (!on[br]) continue;
        GRAD(b->dgate[br] = rows(buf, Hq, 1), T * Hq, tk_float_dtype(cfg->dtype));
        if (br == NSA_BRANCH_CMP && ext) continue;
        int same_k = -1, same_v = -1; /* an earlier branch with the same tensor shares its gradient */
        for (int a = 0; a < br; a++) {
            if (!b->dk[a].buffer) continue;
            if (same_k < 0 && b->k[a].buffer == b->k[br].buffer && b->k[a].offset == b->k[br].offset) same_k = a;
            if (same_v < 0 && b->v[a].buffer == b->v[br].buffer && b->v[a].offset == b->v[br].offset) same_v = a;
        }
        if (same_k >= 0) b->dk[br] = b->dk[same_k];
        else GRAD(b->dk[br] = rows(buf, Hkv, Dqk), T * Hkv * Dqk, cfg->dtype);
        if (same_v >= 0) b->dv[br] = b->dv[same_v];
        else GRAD(b->dv[br] = rows(buf, Hkv, Dv), T * Hkv * Dv, cfg->dtype);
    }
    if (lin) {
        GRAD(b->dw_k = rows(buf, l * Dqk, Dqk), Hkv * l * Dqk * Dqk, cfg->dtype);
        GRAD(b->dw_v = rows(buf, l * Dv, Dv), Hkv * l * Dv * Dv, cfg->dtype);
        if (b->pe_k.buffer) GRAD(b->dpe_k = rows(buf, l, Dqk), Hkv * l * Dqk, cfg->dtype);
        if (b->pe_v.buffer) GRAD(b->dpe_v = rows(buf, l, Dv), Hkv * l * Dv, cfg->dtype);
    }
    if (ext) {
        GRAD(b->dkc = rows(buf, Hkv, Dqk), nc * Hkv * Dqk, cfg->dtype);
        GRAD(b->dvc = rows(buf, Hkv, Dv), nc * Hkv * Dv, cfg->dtype);
    }
#undef GRAD
    return NSA_SUCCESS;
fail:
    return tool_format_error(err, err_size, *what, s);
}

static nsa_status problem_backward(problem *p, char *err, size_t err_size)
{
    nsa_status s = nsa_backward(p->plan, &p->bargs, p->workspace);
    if (s != NSA_SUCCESS)
        return tool_format_error(err, err_size, "nsa_backward", s);
    s = nsa_context_synchronize(p->ctx);
    if (s != NSA_SUCCESS)
        return tool_format_error(err, err_size, "nsa_context_synchronize", s);
    return s;
}

static nsa_status time_pass(problem *p, int backward, int warmup, int iters, const char *label, double *median_s,
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
        s = backward ? problem_backward(p, err, err_size) : problem_forward(p, err, err_size);
    }
    for (int i = 0; i < iters && s == NSA_SUCCESS; i++) {
        double t0;
        tool_progress("%s: iteration %d/%d", label, i + 1, iters);
        t0 = tool_now();
        s = backward ? problem_backward(p, err, err_size) : problem_forward(p, err, err_size);
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

nsa_status problem_time(problem *p, int warmup, int iters, const char *label, double *median_s,
                        double *min_s, char *err, size_t err_size)
{
    return time_pass(p, 0, warmup, iters, label, median_s, min_s, err, err_size);
}

nsa_status problem_time_backward(problem *p, int warmup, int iters, const char *label, double *median_s,
                                 double *min_s, char *err, size_t err_size)
{
    return time_pass(p, 1, warmup, iters, label, median_s, min_s, err, err_size);
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
    /* o as doubles only where floats would round it (an f64 call): at T = 1,048,576, paper shape,
     * the doubles alone would be 64 GiB of host memory */
    const int want_d = cfg->dtype == NSA_DTYPE_F64;
    out->o = malloc(sizeof(float) * (size_t)(no ? no : 1));
    if (want_d) out->o_d = malloc(sizeof(double) * (size_t)(no ? no : 1));
    out->o_raw = malloc(obytes ? obytes : 1);
    out->o_raw_bytes = obytes;
    if (!out->o || (want_d && !out->o_d) || !out->o_raw) {
        *what = "malloc";
        s = NSA_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    if (obytes && (s = nsa_buffer_read(p->args.o.buffer, 0, out->o_raw, obytes)) != NSA_SUCCESS) {
        *what = "nsa_buffer_read (o)";
        goto fail;
    }
    if (no && ((s = nsa_convert(out->o_raw, cfg->dtype, out->o, NSA_DTYPE_F32, no)) != NSA_SUCCESS ||
               (want_d && (s = nsa_convert(out->o_raw, cfg->dtype, out->o_d, NSA_DTYPE_F64, no)) != NSA_SUCCESS))) {
        *what = "nsa_convert (o)";
        goto fail;
    }
    const nsa_dtype fdt = tk_float_dtype(cfg->dtype); /* the LSEs' type: f32, f64 in an f64 call */
    for (int br = 0; br < 3; br++) {
        if (!p->args.lse[br].buffer)
            continue;
        out->lse[br] = malloc(sizeof(float) * (size_t)(T > 0 ? T * Hq : 1));
        out->lse_d[br] = malloc(sizeof(double) * (size_t)(T > 0 ? T * Hq : 1));
        if (!out->lse[br] || !out->lse_d[br]) {
            *what = "malloc";
            s = NSA_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        /* read into the doubles' room (large enough for either type), then convert */
        if (T > 0 && (s = nsa_buffer_read(p->args.lse[br].buffer, 0, out->lse_d[br],
                                           nsa_dtype_size(fdt) * (size_t)(T * Hq))) != NSA_SUCCESS) {
            *what = "nsa_buffer_read (lse)";
            goto fail;
        }
        if (T > 0 && fdt == NSA_DTYPE_F32) {
            memcpy(out->lse[br], out->lse_d[br], sizeof(float) * (size_t)(T * Hq));
            for (int64_t i = T * Hq - 1; i >= 0; i--) /* widen in place, from the end */
                out->lse_d[br][i] = (double)out->lse[br][i];
        } else if (T > 0 && (s = nsa_convert(out->lse_d[br], NSA_DTYPE_F64, out->lse[br], NSA_DTYPE_F32, T * Hq)) !=
                                NSA_SUCCESS) {
            *what = "nsa_convert (lse)";
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
    free(out->o_d);
    free(out->o_raw);
    for (int br = 0; br < 3; br++) {
        free(out->lse[br]);
        free(out->lse_d[br]);
    }
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
