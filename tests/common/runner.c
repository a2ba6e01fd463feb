/*
 * The runner: one case through the public API, as a user would call it.
 *
 * Every buffer is built as a host image first: poison everywhere, then the
 * tensor elements at their (offset, stride) positions, converted to the case
 * dtype. Input images are uploaded whole, so a backend that reads padding reads
 * NaN (floats) or 0x7f7f7f7f (indices). Output buffers are filled with the
 * poison on the device (0xFF: NaN for f32/f16/bf16; 0x7F for indices) so that
 * any element a backend forgets to write fails the comparison. After the run the
 * runner reads everything back: output padding must still be poison, and input
 * buffers must be unchanged.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

#define POISON_FLOAT 0xFF
#define POISON_INDEX 0x7F
#define MAX_SLOTS 24

typedef struct view {
    int64_t off, st, sh; /* elements */
} view;

typedef struct slot {
    const char *name;
    nsa_buffer *buf;
    unsigned char *img;  /* host image of the whole buffer */
    unsigned char *mask; /* outputs: 1 where an element of some tensor lives */
    size_t bytes;
    size_t esz;
    unsigned char poison;
    int output;
} slot;

typedef struct runner {
    slot slots[MAX_SLOTS];
    int nslots;
    nsa_context *ctx;
    char *msg;
    size_t msg_size;
    nsa_status alloc_status; /* why new_slot failed, when a device allocation did */
} runner;

static nsa_status fail(runner *r, const char *what, nsa_status s)
{
    if (r->msg && r->msg_size)
        snprintf(r->msg, r->msg_size, "%s: %s: %s", what, nsa_status_string(s), nsa_last_error());
    return s;
}

static int64_t extent(view v, int64_t T, int64_t H, int64_t D)
{
    if (T <= 0 || H <= 0 || D <= 0) return v.off;
    return v.off + (T - 1) * v.st + (H - 1) * v.sh + D;
}

/* A new slot of `elements` elements of size esz plus a tail of poison. */
static slot *new_slot(runner *r, const char *name, int64_t elements, size_t esz, unsigned char poison,
                      int output, int tail)
{
    if (r->nslots >= MAX_SLOTS) return NULL;
    slot *s = &r->slots[r->nslots++];
    memset(s, 0, sizeof *s);
    s->name = name;
    s->esz = esz;
    s->bytes = (size_t)(elements + (tail ? 5 : 0)) * esz;
    if (s->bytes < 16) s->bytes = 16;
    s->poison = poison;
    s->output = output;
    s->img = malloc(s->bytes);
    if (output) s->mask = calloc(s->bytes, 1);
    if (!s->img || (output && !s->mask)) return NULL;
    memset(s->img, poison, s->bytes);
    /* the device buffer exists from the start so that tensors can name it */
    nsa_status st = nsa_buffer_alloc(r->ctx, s->bytes, &s->buf);
    if (st != NSA_SUCCESS) {
        r->alloc_status = st;
        fail(r, "nsa_buffer_alloc", st);
        return NULL;
    }
    return s;
}

/* Writes a logical dense [T, H, D] float array into a slot at view v, converted
 * to dtype (or int32 when dtype is I32, src then being int32_t). */
static nsa_status put(slot *s, view v, int64_t T, int64_t H, int64_t D, nsa_dtype dtype, const void *src)
{
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
            unsigned char *dst = s->img + (size_t)(v.off + t * v.st + h * v.sh) * s->esz;
            if (dtype == NSA_DTYPE_I32) {
                memcpy(dst, (const int32_t *)src + (t * H + h) * D, (size_t)D * 4);
            } else {
                nsa_status st = nsa_convert((const float *)src + (t * H + h) * D, NSA_DTYPE_F32, dst, dtype, D);
                if (st != NSA_SUCCESS) return st;
            }
        }
    return NSA_SUCCESS;
}

/* Marks the elements of an output tensor in the slot's mask. */
static void mark(slot *s, view v, int64_t T, int64_t H, int64_t D)
{
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
            memset(s->mask + (size_t)(v.off + t * v.st + h * v.sh) * s->esz, 1, (size_t)D * s->esz);
}

/* Reads a tensor out of a slot image into a logical dense array (elements of
 * `to`, F32 or F64; or int32 when dtype is I32). */
static nsa_status get_as(const slot *s, view v, int64_t T, int64_t H, int64_t D, nsa_dtype dtype, void *dst,
                         nsa_dtype to)
{
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
            const unsigned char *src = s->img + (size_t)(v.off + t * v.st + h * v.sh) * s->esz;
            if (dtype == NSA_DTYPE_I32) {
                memcpy((int32_t *)dst + (t * H + h) * D, src, (size_t)D * 4);
            } else {
                unsigned char *d = (unsigned char *)dst + (size_t)((t * H + h) * D) * nsa_dtype_size(to);
                nsa_status st = nsa_convert(src, dtype, d, to, D);
                if (st != NSA_SUCCESS) return st;
            }
        }
    return NSA_SUCCESS;
}

static nsa_status get(const slot *s, view v, int64_t T, int64_t H, int64_t D, nsa_dtype dtype, void *dst)
{
    return get_as(s, v, T, H, D, dtype, dst, NSA_DTYPE_F32);
}

static nsa_status upload(runner *r, slot *s)
{
    nsa_status st;
    if (s->output) st = nsa_buffer_fill(s->buf, 0, s->poison, s->bytes);
    else st = nsa_buffer_write(s->buf, 0, s->img, s->bytes);
    if (st != NSA_SUCCESS) return fail(r, s->output ? "nsa_buffer_fill" : "nsa_buffer_write", st);
    return NSA_SUCCESS;
}

static nsa_tensor tensor(const slot *s, view v)
{
    nsa_tensor t;
    t.buffer = s ? s->buf : NULL;
    t.offset = v.off;
    t.stride_token = v.st;
    t.stride_head = v.sh;
    return t;
}

nsa_status tk_run(nsa_context *ctx, const tk_case *c, const tk_inputs *in, tk_output *out, char *msg,
                  size_t msg_size)
{
    if (msg && msg_size) msg[0] = '\0';
    if (!out) return NSA_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    if (!ctx || !c || !in) return NSA_ERR_NULL_POINTER;

    runner R;
    memset(&R, 0, sizeof R);
    R.ctx = ctx;
    R.msg = msg;
    R.msg_size = msg_size;
    runner *r = &R;
    nsa_plan *plan = NULL;
    nsa_buffer *ws = NULL;
    nsa_status st = NSA_SUCCESS;

    const nsa_config *g = &c->cfg;
    const nsa_dtype dt = g->dtype, fdt = tk_float_dtype(dt); /* gates and LSEs: f32, f64 in an f64 call */
    const size_t esz = nsa_dtype_size(dt), fsz = nsa_dtype_size(fdt);
    const int64_t T = tk_case_tokens(c), Hq = g->num_q_heads, Hkv = g->num_kv_heads;
    const int64_t Dqk = g->head_dim_qk, Dv = g->head_dim_v, l = g->cmp_block, n = g->num_selected;
    const int64_t Nc = in->total_cmp;
    const int strided = c->layout == TK_LAYOUT_STRIDED, distinct = c->layout == TK_LAYOUT_DISTINCT;
    const int on[3] = {1, n > 0, g->window > 0};
    nsa_forward_args a;
    memset(&a, 0, sizeof a);
    out->tokens = T;

#define SLOT(var, ...)                                   \
    do {                                                 \
        if (!((var) = new_slot(r, __VA_ARGS__))) {       \
            st = r->alloc_status != NSA_SUCCESS ? r->alloc_status : NSA_ERR_OUT_OF_MEMORY; \
            goto done;                                   \
        }                                                \
    } while (0)
#define PUT(s, v, H, D, type, src)                       \
    do {                                                 \
        if ((st = put((s), (v), T, (H), (D), (type), (src))) != NSA_SUCCESS) { \
            fail(r, "nsa_convert", st);                  \
            goto done;                                   \
        }                                                \
    } while (0)

    /* ---- q */
    slot *sq;
    view vq = strided ? (view){7, Hq * (Dqk + 2) + 3, Dqk + 2} : (view){0, Hq * Dqk, Dqk};
    SLOT(sq, "q", extent(vq, T, Hq, Dqk), esz, POISON_FLOAT, 0, strided);
    PUT(sq, vq, Hq, Dqk, dt, in->q);
    a.q = tensor(sq, vq);

    /* ---- k, v */
    if (strided) { /* one packed kv buffer: row = [k heads | v heads | 1 pad] */
        int64_t row = Hkv * Dqk + Hkv * Dv + 1;
        view vk = {3, row, Dqk}, vv = {3 + Hkv * Dqk, row, Dv};
        slot *skv;
        SLOT(skv, "kv", extent(vv, T, Hkv, Dv), esz, POISON_FLOAT, 0, 1);
        PUT(skv, vk, Hkv, Dqk, dt, in->k[0]);
        PUT(skv, vv, Hkv, Dv, dt, in->v[0]);
        for (int b = 0; b < 3; ++b) {
            a.k[b] = tensor(skv, vk);
            a.v[b] = tensor(skv, vv);
        }
    } else {
        view vk = {0, Hkv * Dqk, Dqk}, vv = {0, Hkv * Dv, Dv};
        static const char *kn[3] = {"k_cmp", "k_slc", "k_win"}, *vn[3] = {"v_cmp", "v_slc", "v_win"};
        for (int b = 0; b < (distinct ? 3 : 1); ++b) {
            slot *sk, *sv;
            SLOT(sk, kn[b], extent(vk, T, Hkv, Dqk), esz, POISON_FLOAT, 0, 0);
            SLOT(sv, vn[b], extent(vv, T, Hkv, Dv), esz, POISON_FLOAT, 0, 0);
            PUT(sk, vk, Hkv, Dqk, dt, in->k[b]);
            PUT(sv, vv, Hkv, Dv, dt, in->v[b]);
            a.k[b] = tensor(sk, vk);
            a.v[b] = tensor(sv, vv);
        }
        if (!distinct)
            for (int b = 1; b < 3; ++b) {
                a.k[b] = a.k[0];
                a.v[b] = a.v[0];
            }
    }

    /* ---- gates (the float type, enabled branches only) */
    if (strided) { /* one buffer [T][3][Hq + 1] */
        slot *sgate;
        view vg[3];
        for (int b = 0; b < 3; ++b) vg[b] = (view){2 + b * (Hq + 1), 3 * (Hq + 1) + 1, 1};
        SLOT(sgate, "gates", extent(vg[2], T, Hq, 1), fsz, POISON_FLOAT, 0, 1);
        for (int b = 0; b < 3; ++b)
            if (on[b]) {
                PUT(sgate, vg[b], Hq, 1, fdt, in->gate[b]);
                a.gate[b] = tensor(sgate, vg[b]);
            }
    } else {
        static const char *gn[3] = {"gate_cmp", "gate_slc", "gate_win"};
        view vg = {0, Hq, 1};
        for (int b = 0; b < 3; ++b)
            if (on[b]) {
                slot *sg;
                SLOT(sg, gn[b], extent(vg, T, Hq, 1), fsz, POISON_FLOAT, 0, 0);
                PUT(sg, vg, Hq, 1, fdt, in->gate[b]);
                a.gate[b] = tensor(sg, vg);
            }
    }

    /* ---- LINEAR weights and position encodings: contiguous, offset when strided */
    if (g->compress == NSA_COMPRESS_LINEAR) {
        int64_t off = strided ? 4 : 0;
        const float *src[4] = {in->w_k, in->w_v, in->pe_k, in->pe_v};
        int64_t count[4] = {Hkv * l * Dqk * Dqk, Hkv * l * Dv * Dv, Hkv * l * Dqk, Hkv * l * Dv};
        static const char *names[4] = {"w_k", "w_v", "pe_k", "pe_v"};
        nsa_tensor *dst[4] = {&a.w_k, &a.w_v, &a.pe_k, &a.pe_v};
        for (int i = 0; i < 4; ++i) {
            if (i >= 2 && !c->use_pe) continue;
            slot *s;
            SLOT(s, names[i], off + count[i], esz, POISON_FLOAT, 0, strided);
            /* one "token" of count[i] elements */
            view v = {off, count[i], count[i]};
            if ((st = put(s, v, 1, 1, count[i], dt, src[i])) != NSA_SUCCESS) {
                fail(r, "nsa_convert", st);
                goto done;
            }
            *dst[i] = tensor(s, (view){off, 0, 0});
        }
    }

    /* ---- EXTERNAL compressed K/V */
    if (g->compress == NSA_COMPRESS_EXTERNAL) {
        view vkc = strided ? (view){2, Hkv * (Dqk + 1) + 1, Dqk + 1} : (view){0, Hkv * Dqk, Dqk};
        view vvc = strided ? (view){2, Hkv * (Dv + 1) + 1, Dv + 1} : (view){0, Hkv * Dv, Dv};
        slot *skc, *svc;
        SLOT(skc, "kc", extent(vkc, Nc, Hkv, Dqk), esz, POISON_FLOAT, 0, strided);
        SLOT(svc, "vc", extent(vvc, Nc, Hkv, Dv), esz, POISON_FLOAT, 0, strided);
        if ((st = put(skc, vkc, Nc, Hkv, Dqk, dt, in->kc)) != NSA_SUCCESS ||
            (st = put(svc, vvc, Nc, Hkv, Dv, dt, in->vc)) != NSA_SUCCESS) {
            fail(r, "nsa_convert", st);
            goto done;
        }
        a.kc = tensor(skc, vkc);
        a.vc = tensor(svc, vvc);
    }

    /* ---- caller-given block indices */
    if (c->fixed_indices && n > 0) {
        view vi = strided ? (view){2, Hkv * (n + 1) + 3, n + 1} : (view){0, Hkv * n, n};
        slot *si;
        SLOT(si, "block_indices", extent(vi, T, Hkv, n), 4, POISON_INDEX, 0, strided);
        PUT(si, vi, Hkv, n, NSA_DTYPE_I32, in->given);
        a.block_indices = tensor(si, vi);
        /* strided cases also exercise the unchecked path (valid indices either way) */
        if (strided) a.flags = NSA_FORWARD_TRUST_INDICES;
    }

    /* ---- outputs */
    view vo = strided ? (view){5, Hq * (Dv + 1) + 2, Dv + 1} : (view){0, Hq * Dv, Dv};
    slot *so;
    SLOT(so, "o", extent(vo, T, Hq, Dv), esz, POISON_FLOAT, 1, strided);
    mark(so, vo, T, Hq, Dv);
    a.o = tensor(so, vo);

    view vl[3];
    slot *sl[3] = {NULL, NULL, NULL};
    if (strided) { /* one buffer, [T][Hq][3] interleaved, padded rows */
        for (int b = 0; b < 3; ++b) vl[b] = (view){b, 3 * Hq + 1, 3};
        slot *s;
        SLOT(s, "lse", extent(vl[2], T, Hq, 1), fsz, POISON_FLOAT, 1, 1);
        for (int b = 0; b < 3; ++b)
            if (on[b]) sl[b] = s;
    } else {
        static const char *ln[3] = {"lse_cmp", "lse_slc", "lse_win"};
        for (int b = 0; b < 3; ++b) {
            vl[b] = (view){0, Hq, 1};
            if (on[b]) SLOT(sl[b], ln[b], extent(vl[b], T, Hq, 1), fsz, POISON_FLOAT, 1, 0);
        }
    }
    for (int b = 0; b < 3; ++b)
        if (on[b]) {
            mark(sl[b], vl[b], T, Hq, 1);
            a.lse[b] = tensor(sl[b], vl[b]);
        }

    view vs = strided ? (view){1, Hkv * (n + 2) + 1, n + 2} : (view){0, Hkv * n, n};
    slot *ss = NULL;
    /* not with caller-given indices: the core refuses block_indices and selected
     * together (the output would only repeat the input) */
    const int want_sel = n > 0 && !c->fixed_indices;
    if (want_sel) {
        SLOT(ss, "selected", extent(vs, T, Hkv, n), 4, POISON_INDEX, 1, strided);
        mark(ss, vs, T, Hkv, n);
        a.selected = tensor(ss, vs);
    }

    /* ---- device buffers */
    for (int i = 0; i < r->nslots; ++i)
        if ((st = upload(r, &r->slots[i])) != NSA_SUCCESS) goto done;
#undef SLOT
#undef PUT

    /* ---- plan and run */
    if ((st = nsa_plan_create(ctx, g, c->cu_seqlens, c->batch, &plan)) != NSA_SUCCESS) {
        fail(r, "nsa_plan_create", st);
        goto done;
    }
    nsa_plan_info info;
    if ((st = nsa_plan_get_info(plan, &info)) != NSA_SUCCESS) {
        fail(r, "nsa_plan_get_info", st);
        goto done;
    }
    snprintf(out->stages, sizeof out->stages, "%s", info.stages);
    if (c->layout != TK_LAYOUT_DENSE) {
        size_t wsb = info.workspace_bytes > 0 ? info.workspace_bytes : 1;
        if ((st = nsa_buffer_alloc(ctx, wsb, &ws)) != NSA_SUCCESS ||
            (st = nsa_buffer_fill(ws, 0, POISON_FLOAT, wsb)) != NSA_SUCCESS) {
            fail(r, "workspace", st);
            goto done;
        }
    }
    if ((st = nsa_forward(plan, &a, ws)) != NSA_SUCCESS) {
        fail(r, "nsa_forward", st);
        goto done;
    }
    if ((st = nsa_context_synchronize(ctx)) != NSA_SUCCESS) {
        fail(r, "nsa_context_synchronize", st);
        goto done;
    }

    /* ---- read back; inputs must be unchanged, output padding still poison */
    for (int i = 0; i < r->nslots; ++i) {
        slot *s = &r->slots[i];
        unsigned char *back = malloc(s->bytes);
        if (!back) {
            st = NSA_ERR_OUT_OF_MEMORY;
            goto done;
        }
        if ((st = nsa_buffer_read(s->buf, 0, back, s->bytes)) != NSA_SUCCESS) {
            free(back);
            fail(r, "nsa_buffer_read", st);
            goto done;
        }
        for (size_t b = 0; b < s->bytes; ++b) {
            int stray = s->output ? (!s->mask[b] && back[b] != s->poison) : back[b] != s->img[b];
            if (stray) {
                if (out->stray_writes == 0)
                    snprintf(out->stray_where, sizeof out->stray_where, "%s %s byte %zu",
                             s->output ? "output padding" : "input", s->name, b);
                out->stray_writes++;
            }
        }
        free(s->img);
        s->img = back;
    }

    out->o = malloc((size_t)(T * Hq * Dv > 0 ? T * Hq * Dv : 1) * sizeof(float));
    if (!out->o) {
        st = NSA_ERR_OUT_OF_MEMORY;
        goto done;
    }
    out->o_d = malloc((size_t)(T * Hq * Dv > 0 ? T * Hq * Dv : 1) * sizeof(double));
    if (!out->o_d) {
        st = NSA_ERR_OUT_OF_MEMORY;
        goto done;
    }
    if ((st = get(so, vo, T, Hq, Dv, dt, out->o)) != NSA_SUCCESS ||
        (st = get_as(so, vo, T, Hq, Dv, dt, out->o_d, NSA_DTYPE_F64)) != NSA_SUCCESS)
        goto conv_fail;
    out->o_raw_bytes = so->bytes;
    out->o_raw = malloc(so->bytes);
    if (!out->o_raw) {
        st = NSA_ERR_OUT_OF_MEMORY;
        goto done;
    }
    memcpy(out->o_raw, so->img, so->bytes);
    for (int b = 0; b < 3; ++b) {
        if (!on[b]) continue;
        out->lse[b] = malloc((size_t)(T * Hq > 0 ? T * Hq : 1) * sizeof(float));
        out->lse_d[b] = malloc((size_t)(T * Hq > 0 ? T * Hq : 1) * sizeof(double));
        if (!out->lse[b] || !out->lse_d[b]) {
            st = NSA_ERR_OUT_OF_MEMORY;
            goto done;
        }
        if ((st = get(sl[b], vl[b], T, Hq, 1, fdt, out->lse[b])) != NSA_SUCCESS ||
            (st = get_as(sl[b], vl[b], T, Hq, 1, fdt, out->lse_d[b], NSA_DTYPE_F64)) != NSA_SUCCESS)
            goto conv_fail;
    }
    if (want_sel) {
        out->sel = malloc((size_t)(T * Hkv * n > 0 ? T * Hkv * n : 1) * sizeof(int32_t));
        if (!out->sel) {
            st = NSA_ERR_OUT_OF_MEMORY;
            goto done;
        }
        get(ss, vs, T, Hkv, n, NSA_DTYPE_I32, out->sel);
    }
    st = NSA_SUCCESS;
    goto done;

conv_fail:
    fail(r, "nsa_convert", st);
done:
    if (st == NSA_ERR_OUT_OF_MEMORY && msg && msg_size && !msg[0])
        snprintf(msg, msg_size, "tk_run: out of host memory");
    nsa_buffer_free(ws);
    nsa_plan_destroy(plan);
    for (int i = 0; i < r->nslots; ++i) {
        nsa_buffer_free(r->slots[i].buf);
        free(r->slots[i].img);
        free(r->slots[i].mask);
    }
    if (st != NSA_SUCCESS) tk_output_free(out);
    return st;
}

void tk_output_free(tk_output *out)
{
    if (!out) return;
    free(out->o);
    free(out->o_d);
    for (int b = 0; b < 3; ++b) {
        free(out->lse[b]);
        free(out->lse_d[b]);
    }
    free(out->sel);
    free(out->o_raw);
    memset(out, 0, sizeof *out);
}
