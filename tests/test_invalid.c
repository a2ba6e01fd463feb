/*
 * Invalid arguments: every field that can be wrong returns its named status
 * (include/nsa.h, enum nsa_status) and a non-empty nsa_last_error() message
 * that names the field. The expected values come from the header; where the
 * core disagrees with the header, the header wins.
 *
 * Each test starts from a valid fixture (a cpu context, a small config, a plan
 * and dense buffers for every tensor; a positive control checks that it runs)
 * and breaks exactly one thing. Runs under valgrind with CK_FORK=no to check the
 * error paths for leaks.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"
#include "nsa.h"

/* ------------------------------------------------------------------ helpers */

/* The fixture: one sequence of T tokens, every tensor dense in its own buffer. */
enum { T = 20 };

typedef struct fixture {
    nsa_context *ctx, *ctx2;
    nsa_config cfg;
    int64_t cu[2];
    nsa_plan *plan;
    nsa_forward_args args;
    nsa_buffer *bufs[128];
    int nbufs;
    nsa_buffer *ws;
    nsa_plan_info info;
    size_t esz; /* bytes per element of buffer(): 4, or 8 for an f64 fixture */
} fixture;

static fixture F;

static void small_config(nsa_config *c)
{
    ck_assert_int_eq(nsa_config_init(c), NSA_SUCCESS);
    c->num_q_heads = 2;
    c->num_kv_heads = 1;
    c->head_dim_qk = 4;
    c->head_dim_v = 3;
    c->cmp_block = 4;
    c->cmp_stride = 2;
    c->slc_block = 8;
    c->num_selected = 2;
    c->num_init = 1;
    c->num_local = 1;
    c->window = 8;
    c->scale = 0.0f;
    c->compress = NSA_COMPRESS_MEAN;
    c->dtype = NSA_DTYPE_F32;
}

/* A zero-filled buffer of `elements` elements of F.esz bytes (4 unless a test
 * makes an f64 fixture), freed by teardown. */
static nsa_buffer *buffer(nsa_context *ctx, int64_t elements)
{
    nsa_buffer *b = NULL;
    size_t bytes = (size_t)elements * F.esz;
    ck_assert_int_eq(nsa_buffer_alloc(ctx, bytes, &b), NSA_SUCCESS);
    ck_assert_int_eq(nsa_buffer_fill(b, 0, 0, bytes), NSA_SUCCESS);
    ck_assert_int_lt(F.nbufs, 128);
    F.bufs[F.nbufs++] = b;
    return b;
}

static nsa_tensor dense(nsa_buffer *b, int64_t heads, int64_t dim)
{
    return nsa_tensor_dense(b, 0, heads, dim);
}

/* (Re)builds the plan and the args for F.cfg: all tensors the config needs,
 * plus every optional output. */
static void build(void)
{
    const nsa_config *c = &F.cfg;
    int64_t hq = c->num_q_heads, hkv = c->num_kv_heads, dk = c->head_dim_qk, dv = c->head_dim_v;
    int64_t l = c->cmp_block, n = c->num_selected;
    if (F.plan) nsa_plan_destroy(F.plan);
    F.plan = NULL;
    ck_assert_msg(nsa_plan_create(F.ctx, c, F.cu, 1, &F.plan) == NSA_SUCCESS, "fixture plan: %s", nsa_last_error());
    ck_assert_int_eq(nsa_plan_get_info(F.plan, &F.info), NSA_SUCCESS);
    nsa_forward_args *a = &F.args;
    memset(a, 0, sizeof *a);
    a->q = dense(buffer(F.ctx, T * hq * dk), hq, dk);
    nsa_tensor k = dense(buffer(F.ctx, T * hkv * dk), hkv, dk), v = dense(buffer(F.ctx, T * hkv * dv), hkv, dv);
    int on[3] = {1, n > 0, c->window > 0};
    for (int b = 0; b < 3; ++b) {
        a->k[b] = k;
        a->v[b] = v;
        if (on[b]) {
            a->gate[b] = dense(buffer(F.ctx, T * hq), hq, 1);
            a->lse[b] = dense(buffer(F.ctx, T * hq), hq, 1);
        }
    }
    if (c->compress == NSA_COMPRESS_LINEAR) {
        a->w_k = nsa_tensor_dense(buffer(F.ctx, hkv * l * dk * dk), 0, 0, 0);
        a->w_v = nsa_tensor_dense(buffer(F.ctx, hkv * l * dv * dv), 0, 0, 0);
        a->pe_k = nsa_tensor_dense(buffer(F.ctx, hkv * l * dk), 0, 0, 0);
        a->pe_v = nsa_tensor_dense(buffer(F.ctx, hkv * l * dv), 0, 0, 0);
    }
    if (c->compress == NSA_COMPRESS_EXTERNAL) {
        int64_t nc = F.info.total_cmp_blocks;
        a->kc = dense(buffer(F.ctx, nc * hkv * dk), hkv, dk);
        a->vc = dense(buffer(F.ctx, nc * hkv * dv), hkv, dv);
    }
    a->o = dense(buffer(F.ctx, T * hq * dv), hq, dv);
    if (n > 0) a->selected = dense(buffer(F.ctx, T * hkv * n), hkv, n);
    F.ws = buffer(F.ctx, (int64_t)(F.info.workspace_bytes / 4 + 1));
}

static void setup(void)
{
    memset(&F, 0, sizeof F);
    F.esz = 4;
    ck_assert_int_eq(nsa_context_create("cpu", 0, &F.ctx), NSA_SUCCESS);
    ck_assert_int_eq(nsa_context_create("cpu", 0, &F.ctx2), NSA_SUCCESS);
    small_config(&F.cfg);
    F.cu[0] = 0;
    F.cu[1] = T;
    build();
}

static void teardown(void)
{
    nsa_plan_destroy(F.plan);
    for (int i = 0; i < F.nbufs; ++i) nsa_buffer_free(F.bufs[i]);
    ck_assert_int_eq(nsa_context_destroy(F.ctx2), NSA_SUCCESS);
    ck_assert_int_eq(nsa_context_destroy(F.ctx), NSA_SUCCESS);
}

/* Given indices [T, Hkv, n] that are valid for the fixture config: block 0 and
 * the query's own block (or -1). */
static nsa_tensor given_indices(int32_t *host)
{
    const nsa_config *c = &F.cfg;
    int64_t hkv = c->num_kv_heads, n = c->num_selected;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t g = 0; g < hkv; ++g) {
            int32_t *row = host + (t * hkv + g) * n;
            int64_t own = t / c->slc_block;
            for (int64_t k = 0; k < n; ++k) row[k] = -1;
            row[0] = 0;
            if (own > 0 && n > 1) row[1] = (int32_t)own;
        }
    nsa_buffer *b = buffer(F.ctx, T * hkv * n);
    ck_assert_int_eq(nsa_buffer_write(b, 0, host, (size_t)(T * hkv * n) * 4), NSA_SUCCESS);
    return dense(b, hkv, n);
}

/* ------------------------------------------------------------------ positive controls */

START_TEST(fixture_runs)
{
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    EXPECT_OK(nsa_forward(F.plan, &F.args, NULL));
    /* a disabled branch's gate, k and v are not needed */
    F.cfg.num_selected = 0;
    F.cfg.window = 0;
    build();
    F.args.k[1].buffer = F.args.k[2].buffer = NULL;
    F.args.v[1].buffer = F.args.v[2].buffer = NULL;
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
}
END_TEST

START_TEST(fixture_runs_linear_external)
{
    F.cfg.compress = NSA_COMPRESS_LINEAR;
    build();
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    F.args.pe_k.buffer = F.args.pe_v.buffer = NULL; /* pe is optional */
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    F.cfg.compress = NSA_COMPRESS_EXTERNAL;
    build();
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
}
END_TEST

START_TEST(fixture_runs_given_indices)
{
    int32_t host[T * 2];
    F.args.selected.buffer = NULL;
    F.args.block_indices = given_indices(host);
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
}
END_TEST

/* ------------------------------------------------------------------ NULL pointers */

START_TEST(null_pointers)
{
    nsa_config cfg;
    small_config(&cfg);
    nsa_context *ctx = NULL;
    nsa_buffer *buf = NULL;
    nsa_plan *plan = NULL;
    nsa_plan_info info;
    char name[64];
    float f[4] = {0};
    int count = 0;

    ck_assert_ptr_nonnull(nsa_status_string(NSA_ERR_NULL_POINTER));
    ck_assert_ptr_nonnull(nsa_status_string((nsa_status)12345));
    ck_assert_str_eq(nsa_status_string(NSA_ERR_INVALID_CONFIG), "NSA_ERR_INVALID_CONFIG");

    EXPECT(nsa_config_init(NULL), NSA_ERR_NULL_POINTER, "cfg");
    EXPECT(nsa_config_validate(NULL), NSA_ERR_NULL_POINTER, "cfg");
    EXPECT(nsa_backend_list(NULL, 0, NULL), NSA_ERR_NULL_POINTER, "count");
    EXPECT(nsa_device_name(NULL, 0, name, sizeof name), NSA_ERR_NULL_POINTER, "backend");
    EXPECT(nsa_device_name("cpu", 0, NULL, sizeof name), NSA_ERR_NULL_POINTER, "name");
    EXPECT(nsa_context_create("cpu", 0, NULL), NSA_ERR_NULL_POINTER, "out");
    EXPECT(nsa_context_create_with_stream("cpu", 0, NULL, NULL), NSA_ERR_NULL_POINTER, "out");
    EXPECT(nsa_context_synchronize(NULL), NSA_ERR_NULL_POINTER, "ctx");
    EXPECT(nsa_buffer_alloc(NULL, 16, &buf), NSA_ERR_NULL_POINTER, "ctx");
    EXPECT(nsa_buffer_alloc(F.ctx, 16, NULL), NSA_ERR_NULL_POINTER, "out");
    EXPECT(nsa_buffer_wrap(NULL, f, 0, sizeof f, &buf), NSA_ERR_NULL_POINTER, "ctx");
    EXPECT(nsa_buffer_wrap(F.ctx, NULL, 0, sizeof f, &buf), NSA_ERR_NULL_POINTER, "handle");
    EXPECT(nsa_buffer_wrap(F.ctx, f, 0, sizeof f, NULL), NSA_ERR_NULL_POINTER, "out");
    EXPECT(nsa_buffer_write(NULL, 0, f, 4), NSA_ERR_NULL_POINTER, "buf");
    EXPECT(nsa_buffer_write(F.bufs[0], 0, NULL, 4), NSA_ERR_NULL_POINTER, "src");
    EXPECT(nsa_buffer_read(NULL, 0, f, 4), NSA_ERR_NULL_POINTER, "buf");
    EXPECT(nsa_buffer_read(F.bufs[0], 0, NULL, 4), NSA_ERR_NULL_POINTER, "dst");
    EXPECT(nsa_buffer_fill(NULL, 0, 0, 4), NSA_ERR_NULL_POINTER, "buf");
    EXPECT(nsa_plan_create(NULL, &cfg, F.cu, 1, &plan), NSA_ERR_NULL_POINTER, "ctx");
    EXPECT(nsa_plan_create(F.ctx, NULL, F.cu, 1, &plan), NSA_ERR_NULL_POINTER, "cfg");
    EXPECT(nsa_plan_create(F.ctx, &cfg, NULL, 1, &plan), NSA_ERR_NULL_POINTER, "cu_seqlens");
    EXPECT(nsa_plan_create(F.ctx, &cfg, F.cu, 1, NULL), NSA_ERR_NULL_POINTER, "out");
    EXPECT(nsa_plan_get_info(NULL, &info), NSA_ERR_NULL_POINTER, "plan");
    EXPECT(nsa_plan_get_info(F.plan, NULL), NSA_ERR_NULL_POINTER, "info");
    EXPECT(nsa_forward(NULL, &F.args, F.ws), NSA_ERR_NULL_POINTER, "plan");
    EXPECT(nsa_forward(F.plan, NULL, F.ws), NSA_ERR_NULL_POINTER, "args");
    EXPECT(nsa_convert(NULL, NSA_DTYPE_F32, f, NSA_DTYPE_F16, 2), NSA_ERR_NULL_POINTER, "src");
    EXPECT(nsa_convert(f, NSA_DTYPE_F32, NULL, NSA_DTYPE_F16, 2), NSA_ERR_NULL_POINTER, "dst");
    EXPECT(nsa_random_uniform(1, 2, 0, 4, 0.0f, 1.0f, NULL), NSA_ERR_NULL_POINTER, "out");
    nsa_device_kind kind = NSA_DEVICE_KIND_OTHER;
    EXPECT(nsa_context_device_kind(NULL, &kind), NSA_ERR_NULL_POINTER, "ctx");
    EXPECT(nsa_context_device_kind(F.ctx, NULL), NSA_ERR_NULL_POINTER, "kind");
    EXPECT_OK(nsa_context_device_kind(F.ctx, &kind));
    ck_assert_int_eq(kind, NSA_DEVICE_KIND_CPU); /* the fixture runs on the cpu backend */

    /* NULL is accepted (and ignored) by the destructors; pure queries do not crash */
    EXPECT_OK(nsa_context_destroy(NULL));
    EXPECT_OK(nsa_buffer_free(NULL));
    EXPECT_OK(nsa_plan_destroy(NULL));
    ck_assert_uint_eq(nsa_buffer_size(NULL), 0);
    (void)nsa_context_backend(NULL);
    (void)nsa_context_device(NULL);
    (void)ctx;
    (void)count;
}
END_TEST

/* ------------------------------------------------------------------ config fields */

typedef struct field_case {
    const char *field;
    size_t offset;
    int64_t value;
    nsa_status want;
} field_case;

#define FIELD(f, v, s) {#f, offsetof(nsa_config, f), (v), (s)}

static const field_case field_cases[] = {
    FIELD(num_q_heads, 0, NSA_ERR_INVALID_VALUE),     FIELD(num_q_heads, -2, NSA_ERR_INVALID_VALUE),
    FIELD(num_kv_heads, 0, NSA_ERR_INVALID_VALUE),    FIELD(num_kv_heads, -1, NSA_ERR_INVALID_VALUE),
    FIELD(head_dim_qk, 0, NSA_ERR_INVALID_VALUE),     FIELD(head_dim_qk, -4, NSA_ERR_INVALID_VALUE),
    FIELD(head_dim_v, 0, NSA_ERR_INVALID_VALUE),      FIELD(head_dim_v, -3, NSA_ERR_INVALID_VALUE),
    FIELD(cmp_block, 0, NSA_ERR_INVALID_VALUE),       FIELD(cmp_block, -4, NSA_ERR_INVALID_VALUE),
    FIELD(cmp_stride, 0, NSA_ERR_INVALID_VALUE),      FIELD(cmp_stride, -2, NSA_ERR_INVALID_VALUE),
    FIELD(slc_block, 0, NSA_ERR_INVALID_VALUE),       FIELD(slc_block, -8, NSA_ERR_INVALID_VALUE),
    FIELD(num_selected, -1, NSA_ERR_INVALID_VALUE),   FIELD(num_init, -1, NSA_ERR_INVALID_VALUE),
    FIELD(num_local, -1, NSA_ERR_INVALID_VALUE),      FIELD(window, -1, NSA_ERR_INVALID_VALUE),
    /* contradictions between fields */
    FIELD(num_kv_heads, 3, NSA_ERR_INVALID_CONFIG),   /* Hq = 2 % 3 != 0 */
    FIELD(cmp_stride, 3, NSA_ERR_INVALID_CONFIG),     /* d = 3 does not divide l = 4 */
    FIELD(slc_block, 6, NSA_ERR_INVALID_CONFIG),      /* l_s = 6 > l, d = 2 | 6 ... see below */
    FIELD(slc_block, 2, NSA_ERR_INVALID_CONFIG),      /* l = 4 > l_s = 2 */
    FIELD(num_selected, 1, NSA_ERR_INVALID_CONFIG),   /* n = 1 < n_init + n_local = 2 */
};

static void set_field(nsa_config *c, size_t offset, int64_t v)
{
    memcpy((char *)c + offset, &v, sizeof v);
}

START_TEST(config_fields)
{
    for (size_t i = 0; i < sizeof field_cases / sizeof field_cases[0]; ++i) {
        const field_case *fc = &field_cases[i];
        nsa_config c;
        small_config(&c);
        if (strcmp(fc->field, "slc_block") == 0 && fc->value == 6) {
            /* d must divide l_s: d = 4 divides l = 4 but not l_s = 6 */
            c.cmp_stride = 4;
        }
        set_field(&c, fc->offset, fc->value);
        const char *needle = fc->field;
        if (fc->want == NSA_ERR_INVALID_CONFIG && strcmp(fc->field, "slc_block") == 0 && fc->value == 2)
            needle = "slc_block"; /* l > l_s: the message names both; we need l_s */
        nsa_status s = nsa_config_validate(&c);
        ck_assert_msg(s == fc->want, "cfg.%s = %lld: nsa_config_validate returned %s, expected %s (%s)", fc->field,
                      (long long)fc->value, nsa_status_string(s), nsa_status_string(fc->want), nsa_last_error());
        ck_assert_msg(strstr(nsa_last_error(), needle), "cfg.%s = %lld: message \"%s\" does not name %s", fc->field,
                      (long long)fc->value, nsa_last_error(), needle);
        nsa_plan *p = NULL;
        s = nsa_plan_create(F.ctx, &c, F.cu, 1, &p);
        ck_assert_msg(s == fc->want, "cfg.%s = %lld: nsa_plan_create returned %s, expected %s (%s)", fc->field,
                      (long long)fc->value, nsa_status_string(s), nsa_status_string(fc->want), nsa_last_error());
        ck_assert_msg(strstr(nsa_last_error(), needle), "cfg.%s: plan message \"%s\" does not name %s", fc->field,
                      nsa_last_error(), needle);
        if (s == NSA_SUCCESS) nsa_plan_destroy(p);
    }
}
END_TEST

START_TEST(config_scale_dtype_compress)
{
    nsa_config c;
    const float bad_scales[] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; ++i) {
        small_config(&c);
        c.scale = bad_scales[i];
        EXPECT(nsa_config_validate(&c), NSA_ERR_INVALID_VALUE, "scale");
    }
    small_config(&c);
    c.dtype = (nsa_dtype)7;
    EXPECT(nsa_config_validate(&c), NSA_ERR_INVALID_DTYPE, "dtype");
    c.dtype = NSA_DTYPE_I32; /* indices only */
    EXPECT(nsa_config_validate(&c), NSA_ERR_INVALID_DTYPE, "dtype");
    c.dtype = (nsa_dtype)-1;
    EXPECT(nsa_config_validate(&c), NSA_ERR_INVALID_DTYPE, "dtype");
    small_config(&c);
    c.compress = (nsa_compress_mode)3;
    EXPECT(nsa_config_validate(&c), NSA_ERR_INVALID_VALUE, "compress");
    c.compress = (nsa_compress_mode)-1;
    EXPECT(nsa_config_validate(&c), NSA_ERR_INVALID_VALUE, "compress");
    nsa_plan *p = NULL;
    EXPECT(nsa_plan_create(F.ctx, &c, F.cu, 1, &p), NSA_ERR_INVALID_VALUE, "compress");
    /* the valid ones pass */
    small_config(&c);
    EXPECT_OK(nsa_config_validate(&c));
    nsa_config d;
    EXPECT_OK(nsa_config_init(&d));
    EXPECT_OK(nsa_config_validate(&d));
}
END_TEST

/* ------------------------------------------------------------------ batch shape */

START_TEST(cu_seqlens_and_batch)
{
    nsa_plan *p = NULL;
    int64_t non_monotone[4] = {0, 10, 5, 20};
    EXPECT(nsa_plan_create(F.ctx, &F.cfg, non_monotone, 3, &p), NSA_ERR_INVALID_SHAPE, "cu_seqlens");
    int64_t bad_start[3] = {1, 10, 20};
    EXPECT(nsa_plan_create(F.ctx, &F.cfg, bad_start, 2, &p), NSA_ERR_INVALID_SHAPE, "cu_seqlens[0]");
    int64_t negative[3] = {0, -5, 0};
    EXPECT(nsa_plan_create(F.ctx, &F.cfg, negative, 2, &p), NSA_ERR_INVALID_SHAPE, "cu_seqlens");
    EXPECT(nsa_plan_create(F.ctx, &F.cfg, F.cu, -1, &p), NSA_ERR_INVALID_VALUE, "batch");
    ck_assert_ptr_null(p);
    /* zero-length sequences are legal */
    int64_t with_empty[4] = {0, 0, 20, 20};
    EXPECT_OK(nsa_plan_create(F.ctx, &F.cfg, with_empty, 3, &p));
    nsa_plan_destroy(p);
}
END_TEST

/* ------------------------------------------------------------------ tensors */

START_TEST(negative_strides)
{
    F.args.q.stride_token = -(F.args.q.stride_token);
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_STRIDE, "args->q");
    F.args.q.stride_token = -F.args.q.stride_token;
    F.args.k[1].stride_head = -1;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_STRIDE, "args->k[slc]");
    F.args.k[1] = F.args.k[0];
    F.args.gate[2].stride_token = -2;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_STRIDE, "args->gate[win]");
}
END_TEST

START_TEST(overlapping_output)
{
    /* o with stride_head = 0 writes the heads of a token onto each other */
    F.args.o.stride_head = 0;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_STRIDE, "args->o");
    F.args.o = nsa_tensor_dense(F.args.o.buffer, 0, F.cfg.num_q_heads, F.cfg.head_dim_v);
    F.args.lse[0].stride_token = 0;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_STRIDE, "args->lse[cmp]");
}
END_TEST

/* Aliasing (include/nsa.h, "Aliasing"): outputs share no byte with inputs,
 * other outputs or the workspace; the workspace none with any tensor. */
START_TEST(aliasing)
{
    const int64_t hq = F.cfg.num_q_heads, hkv = F.cfg.num_kv_heads, dk = F.cfg.head_dim_qk;
    const int64_t dv = F.cfg.head_dim_v;
    const nsa_forward_args saved = F.args;
    /* issue 17's reproducers: an LSE output over a gate input, the workspace over k */
    F.args.lse[0] = F.args.gate[1];
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_VALUE, "args->lse[cmp]");
    F.args = saved;
    nsa_buffer *big = buffer(F.ctx, (int64_t)(F.info.workspace_bytes / 4) + T * hkv * dk + 1);
    for (int b = 0; b < 3; b++) F.args.k[b] = nsa_tensor_dense(big, 0, hkv, dk);
    EXPECT(nsa_forward(F.plan, &F.args, big), NSA_ERR_INVALID_VALUE, "workspace");
    /* k past the workspace's bytes in the same buffer: allowed */
    for (int b = 0; b < 3; b++) F.args.k[b] = nsa_tensor_dense(big, (int64_t)(F.info.workspace_bytes / 4) + 1, hkv, dk);
    EXPECT_OK(nsa_forward(F.plan, &F.args, big));
    F.args = saved;
    /* o in place over q (same buffer, overlapping bytes) */
    nsa_buffer *qo = buffer(F.ctx, T * hq * (dk > dv ? dk : dv));
    F.args.q = nsa_tensor_dense(qo, 0, hq, dk);
    F.args.o = nsa_tensor_dense(qo, 0, hq, dv);
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_VALUE, "args->o");
    F.args = saved;
    /* two outputs on one tensor */
    F.args.lse[2] = F.args.lse[1];
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_VALUE, "args->lse[slc]");
    F.args = saved;
    /* the selected indices written over o */
    F.args.selected = nsa_tensor_dense(F.args.o.buffer, 0, hkv, F.cfg.num_selected);
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_VALUE, "args->selected");
    F.args = saved;
    /* two buffers wrapping one host allocation (cpu handles are host pointers):
     * o's bytes over q's through different nsa_buffers */
    float *host = calloc((size_t)(T * hq * (dk + dv)), sizeof *host);
    ck_assert_ptr_nonnull(host);
    nsa_buffer *w1 = NULL, *w2 = NULL;
    const size_t qbytes = (size_t)(T * hq * dk) * 4, obytes = (size_t)(T * hq * dv) * 4;
    ck_assert_int_eq(nsa_buffer_wrap(F.ctx, host, 0, qbytes, &w1), NSA_SUCCESS);
    ck_assert_int_eq(nsa_buffer_wrap(F.ctx, host, 4, obytes, &w2), NSA_SUCCESS);
    F.args.q = nsa_tensor_dense(w1, 0, hq, dk);
    F.args.o = nsa_tensor_dense(w2, 0, hq, dv);
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_VALUE, "args->o");
    nsa_buffer_free(w2);
    w2 = NULL;
    ck_assert_int_eq(nsa_buffer_wrap(F.ctx, host, qbytes, obytes, &w2), NSA_SUCCESS); /* right after q */
    F.args.o = nsa_tensor_dense(w2, 0, hq, dv);
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    nsa_buffer_free(w1);
    nsa_buffer_free(w2);
    free(host);
    F.args = saved;
}
END_TEST

/* Interleaved outputs that share no element pass: three LSEs in one
 * [T, Hq, 3] tensor, and o with the heads of q between its rows' halves,
 * and give the outputs of separate tensors. */
/* The backward's argument checks: the forward's args turned into a backward
 * call (the fixture's k, v serve every branch, so dk / dv are one view each). */
static nsa_backward_args backward_args(void)
{
    const nsa_config *c = &F.cfg;
    const int64_t hq = c->num_q_heads, hkv = c->num_kv_heads, dk = c->head_dim_qk, dv = c->head_dim_v;
    nsa_backward_args b;
    memset(&b, 0, sizeof b);
    b.q = F.args.q;
    nsa_tensor dkt = dense(buffer(F.ctx, T * hkv * dk), hkv, dk), dvt = dense(buffer(F.ctx, T * hkv * dv), hkv, dv);
    for (int i = 0; i < 3; i++) {
        b.k[i] = F.args.k[i];
        b.v[i] = F.args.v[i];
        b.gate[i] = F.args.gate[i];
        b.lse[i] = F.args.lse[i];
        if (F.args.gate[i].buffer) {
            b.dk[i] = dkt;
            b.dv[i] = dvt;
            b.dgate[i] = dense(buffer(F.ctx, T * hq), hq, 1);
        }
    }
    b.block_indices = F.args.selected;
    b.dout = dense(buffer(F.ctx, T * hq * dv), hq, dv);
    b.dq = dense(buffer(F.ctx, T * hq * dk), hq, dk);
    return b;
}

START_TEST(backward_arguments)
{
    /* a forward-only plan has no backward */
    nsa_backward_args b = backward_args();
    EXPECT(nsa_backward(F.plan, &b, NULL), NSA_ERR_INVALID_VALUE, "NSA_CONFIG_TRAINING");
    F.cfg.flags = NSA_CONFIG_TRAINING;
    build();
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    b = backward_args();
    EXPECT_OK(nsa_backward(F.plan, &b, F.ws));
    EXPECT_OK(nsa_backward(F.plan, &b, NULL));
    EXPECT(nsa_backward(NULL, &b, F.ws), NSA_ERR_NULL_POINTER, "plan");
    EXPECT(nsa_backward(F.plan, NULL, F.ws), NSA_ERR_NULL_POINTER, "args");
    nsa_backward_args x = b;
    x.lse[NSA_BRANCH_SLC].buffer = NULL;
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_MISSING_TENSOR, "args->lse[slc]");
    x = b;
    x.dout.buffer = NULL;
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_MISSING_TENSOR, "args->dout");
    x = b;
    x.block_indices.buffer = NULL;
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_MISSING_TENSOR, "args->block_indices");
    x = b;
    x.dq.stride_token = 1;
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_INVALID_STRIDE, "args->dq");
    x = b;
    x.dq = b.q; /* a gradient over its input */
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_INVALID_VALUE, "args->dq");
    x = b;
    x.dk[NSA_BRANCH_WIN] = x.dq; /* one view for dq and a dk */
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_INVALID_VALUE, "args->dk[win]");
    x = b;
    x.k[NSA_BRANCH_WIN].offset = 4; /* another k view, but the same dk view */
    x.k[NSA_BRANCH_WIN].buffer = b.dout.buffer;
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_INVALID_VALUE, "same view");
    x = b;
    x.dw_k = x.dq;
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_INVALID_VALUE, "args->dw_k");
    x = b;
    x.dkc = x.dq;
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_INVALID_VALUE, "args->dkc");
    x = b;
    x.flags = 0x80;
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_INVALID_VALUE, "flags");
    EXPECT(nsa_backward(F.plan, &b, F.bufs[0]), NSA_ERR_BUFFER_TOO_SMALL, "workspace");
    /* indices the forward could not have selected */
    int32_t bad[T * 2];
    for (int i = 0; i < T * 2; i++) bad[i] = i % 2 ? 5 : 0;
    nsa_buffer *ib = buffer(F.ctx, T * 2);
    ck_assert_int_eq(nsa_buffer_write(ib, 0, bad, sizeof bad), NSA_SUCCESS);
    x = b;
    x.block_indices = dense(ib, 1, 2);
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_INVALID_VALUE, "args->block_indices[token");
    /* disabled branches take no gradients */
    F.cfg.window = 0;
    build();
    b = backward_args();
    x = b;
    x.dgate[NSA_BRANCH_WIN] = x.dgate[NSA_BRANCH_SLC];
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_INVALID_VALUE, "args->dgate[win]");
    /* EXTERNAL: the compressed branch's gradients are dkc, dvc */
    F.cfg.window = 8;
    F.cfg.compress = NSA_COMPRESS_EXTERNAL;
    build();
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    b = backward_args();
    b.kc = F.args.kc;
    b.vc = F.args.vc;
    EXPECT(nsa_backward(F.plan, &b, F.ws), NSA_ERR_INVALID_VALUE, "args->dk[cmp]");
    b.dk[NSA_BRANCH_CMP].buffer = b.dv[NSA_BRANCH_CMP].buffer = NULL;
    EXPECT_OK(nsa_backward(F.plan, &b, F.ws));
    /* unknown config flags */
    F.cfg.flags = 0x10;
    EXPECT(nsa_config_validate(&F.cfg), NSA_ERR_INVALID_VALUE, "cfg->flags");
}
END_TEST

START_TEST(aliasing_interleaved_ok)
{
    const int64_t hq = F.cfg.num_q_heads;
    float ref[3][T * 2], got[T * 2 * 3];
    ck_assert_int_eq(hq, 2);
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    for (int b = 0; b < 3; b++) EXPECT_OK(nsa_buffer_read(F.args.lse[b].buffer, 0, ref[b], sizeof ref[b]));
    nsa_buffer *l3 = buffer(F.ctx, T * hq * 3);
    for (int b = 0; b < 3; b++) F.args.lse[b] = (nsa_tensor){l3, b, hq * 3, 3};
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    EXPECT_OK(nsa_buffer_read(l3, 0, got, sizeof got));
    for (int64_t i = 0; i < T * hq; i++)
        for (int b = 0; b < 3; b++)
            ck_assert_msg(memcmp(&got[i * 3 + b], &ref[b][i], 4) == 0, "lse[%d] row %lld differs", b, (long long)i);
    /* an output overlapping the range of an input but none of its bytes:
     * q's rows padded by dv elements that o fills */
    const int64_t dk = F.cfg.head_dim_qk, dv = F.cfg.head_dim_v;
    nsa_buffer *qo = buffer(F.ctx, T * hq * (dk + dv));
    float *qh = malloc((size_t)(T * hq * dk) * 4), *qd = calloc((size_t)(T * hq * (dk + dv)), 4);
    ck_assert_ptr_nonnull(qh);
    ck_assert_ptr_nonnull(qd);
    EXPECT_OK(nsa_buffer_read(F.args.q.buffer, 0, qh, (size_t)(T * hq * dk) * 4));
    for (int64_t r = 0; r < T * hq; r++) memcpy(qd + r * (dk + dv), qh + r * dk, (size_t)dk * 4);
    EXPECT_OK(nsa_buffer_write(qo, 0, qd, (size_t)(T * hq * (dk + dv)) * 4));
    F.args.q = (nsa_tensor){qo, 0, hq * (dk + dv), dk + dv};
    F.args.o = (nsa_tensor){qo, dk, hq * (dk + dv), dk + dv};
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    free(qh);
    free(qd);
}
END_TEST

START_TEST(negative_offset)
{
    F.args.v[0].offset = -1;
    F.args.v[1] = F.args.v[2] = F.args.v[0];
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_VALUE, "offset");
}
END_TEST

START_TEST(buffers_too_small)
{
    /* q one element past its buffer */
    F.args.q.offset = 1;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->q");
    F.args.q.offset = 0;
    /* o with a padded stride that its dense buffer cannot hold */
    F.args.o.stride_token += 1;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->o");
    F.args.o.stride_token -= 1;
    /* a buffer that is too small outright */
    nsa_buffer *small = buffer(F.ctx, 3);
    F.args.gate[1] = nsa_tensor_dense(small, 0, F.cfg.num_q_heads, 1);
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->gate[slc]");
    F.args.gate[1] = F.args.gate[0];
    F.args.selected = nsa_tensor_dense(small, 0, F.cfg.num_kv_heads, F.cfg.num_selected);
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->selected");
}
END_TEST

START_TEST(workspace_too_small)
{
    ck_assert_uint_gt(F.info.workspace_bytes, 4);
    nsa_buffer *ws = NULL;
    ck_assert_int_eq(nsa_buffer_alloc(F.ctx, F.info.workspace_bytes - 4, &ws), NSA_SUCCESS);
    EXPECT(nsa_forward(F.plan, &F.args, ws), NSA_ERR_BUFFER_TOO_SMALL, "workspace");
    nsa_buffer_free(ws);
}
END_TEST

START_TEST(buffer_ranges)
{
    char host[64] = {0};
    nsa_buffer *b = buffer(F.ctx, 4); /* 16 bytes */
    EXPECT(nsa_buffer_write(b, 8, host, 16), NSA_ERR_BUFFER_TOO_SMALL, "nsa_buffer_write");
    EXPECT(nsa_buffer_read(b, 17, host, 1), NSA_ERR_BUFFER_TOO_SMALL, "nsa_buffer_read");
    EXPECT(nsa_buffer_fill(b, 0, 0xFF, 17), NSA_ERR_BUFFER_TOO_SMALL, "nsa_buffer_fill");
    nsa_buffer *z = NULL;
    EXPECT(nsa_buffer_alloc(F.ctx, 0, &z), NSA_ERR_INVALID_VALUE, "bytes");
    EXPECT_OK(nsa_buffer_write(b, 0, host, 16));
}
END_TEST

/* a required tensor set to "not given" */
static void expect_missing(nsa_tensor *t, const char *name)
{
    nsa_tensor saved = *t;
    t->buffer = NULL;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_MISSING_TENSOR, name);
    *t = saved;
}

START_TEST(missing_tensors)
{
    nsa_forward_args *a = &F.args;
    expect_missing(&a->q, "args->q");
    expect_missing(&a->o, "args->o");
    expect_missing(&a->k[0], "args->k[cmp]");
    expect_missing(&a->v[0], "args->v[cmp]");
    expect_missing(&a->k[1], "args->k[slc]");
    expect_missing(&a->v[1], "args->v[slc]");
    expect_missing(&a->k[2], "args->k[win]");
    expect_missing(&a->v[2], "args->v[win]");
    expect_missing(&a->gate[0], "args->gate[cmp]");
    expect_missing(&a->gate[1], "args->gate[slc]");
    expect_missing(&a->gate[2], "args->gate[win]");

    F.cfg.compress = NSA_COMPRESS_LINEAR;
    build();
    expect_missing(&a->w_k, "args->w_k");
    expect_missing(&a->w_v, "args->w_v");

    F.cfg.compress = NSA_COMPRESS_EXTERNAL;
    build();
    ck_assert_int_gt(F.info.total_cmp_blocks, 0);
    expect_missing(&a->kc, "args->kc");
    expect_missing(&a->vc, "args->vc");
}
END_TEST

START_TEST(given_indices_invalid)
{
    int32_t host[T * 2];
    const int64_t n = F.cfg.num_selected; /* 2, Hkv = 1 */
    F.args.selected.buffer = NULL;
    F.args.block_indices = given_indices(host);
    nsa_buffer *b = F.args.block_indices.buffer;
    const int64_t t = 17; /* local block 2 */

    struct {
        int32_t row[2];
        const char *what;
    } bad[] = {
        {{0, 3}, "ineligible (after the query's block)"},
        {{0, 99}, "out of range"},
        {{-2, -1}, "negative"},
        {{2, 0}, "not ascending"},
        {{1, 1}, "duplicate"},
        {{-1, 1}, "index after -1 padding"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        int32_t saved[2] = {host[t * n], host[t * n + 1]};
        ck_assert_int_eq(nsa_buffer_write(b, (size_t)(t * n) * 4, bad[i].row, 8), NSA_SUCCESS);
        nsa_status s = nsa_forward(F.plan, &F.args, F.ws);
        ck_assert_msg(s == NSA_ERR_INVALID_VALUE, "%s: nsa_forward returned %s, expected NSA_ERR_INVALID_VALUE (%s)",
                      bad[i].what, nsa_status_string(s), nsa_last_error());
        ck_assert_msg(strstr(nsa_last_error(), "block_indices"), "%s: message \"%s\" does not name block_indices",
                      bad[i].what, nsa_last_error());
        ck_assert_int_eq(nsa_buffer_write(b, (size_t)(t * n) * 4, saved, 8), NSA_SUCCESS);
    }
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    /* given indices and the selected output together */
    F.args.selected = nsa_tensor_dense(buffer(F.ctx, T * n), 0, 1, n);
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_VALUE, "selected");
}
END_TEST

START_TEST(unknown_flags)
{
    F.args.flags = 0x80u;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_VALUE, "flags");
}
END_TEST

START_TEST(wrong_context)
{
    /* a tensor from another context */
    nsa_buffer *other = NULL;
    size_t qbytes = nsa_buffer_size(F.args.q.buffer);
    ck_assert_int_eq(nsa_buffer_alloc(F.ctx2, qbytes, &other), NSA_SUCCESS);
    nsa_tensor saved = F.args.q;
    F.args.q.buffer = other;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_WRONG_CONTEXT, "args->q");
    F.args.q = saved;
    /* a workspace from another context */
    nsa_buffer *ws2 = NULL;
    ck_assert_int_eq(nsa_buffer_alloc(F.ctx2, F.info.workspace_bytes + 4, &ws2), NSA_SUCCESS);
    EXPECT(nsa_forward(F.plan, &F.args, ws2), NSA_ERR_WRONG_CONTEXT, "workspace");
    /* an output from another context */
    size_t obytes = nsa_buffer_size(F.args.o.buffer);
    nsa_buffer *o2 = NULL;
    ck_assert_int_eq(nsa_buffer_alloc(F.ctx2, obytes, &o2), NSA_SUCCESS);
    saved = F.args.o;
    F.args.o.buffer = o2;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_WRONG_CONTEXT, "args->o");
    F.args.o = saved;
    nsa_buffer_free(o2);
    nsa_buffer_free(ws2);
    nsa_buffer_free(other);
}
END_TEST

/* f64 (semantics 7): every float tensor of an f64 call is 8 bytes an element,
 * the gates, LSEs and dgate included; a view sized for f32 (or an f32 gate
 * beside f64 tensors) reaches past its buffer, and the message names the
 * tensor and f64. The workspace grows for 8-byte rows. */
START_TEST(f64_dtype_rules)
{
    const size_t ws32 = F.info.workspace_bytes;
    /* positive control: an f64 forward and backward on 8-byte buffers */
    F.cfg.dtype = NSA_DTYPE_F64;
    F.cfg.flags = NSA_CONFIG_TRAINING;
    F.esz = 8;
    build();
    nsa_plan *p32 = NULL;
    nsa_config c32 = F.cfg;
    c32.dtype = NSA_DTYPE_F32;
    ck_assert_int_eq(nsa_plan_create(F.ctx, &c32, F.cu, 1, &p32), NSA_SUCCESS);
    nsa_plan_info i32;
    ck_assert_int_eq(nsa_plan_get_info(p32, &i32), NSA_SUCCESS);
    nsa_plan_destroy(p32);
    ck_assert_msg(F.info.workspace_bytes > i32.workspace_bytes && F.info.workspace_bytes <= 2 * i32.workspace_bytes,
                  "f64 training workspace %zu bytes, f32 %zu: the float rows must be 8 bytes", F.info.workspace_bytes,
                  i32.workspace_bytes);
    ck_assert_uint_gt(ws32, 0);
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    nsa_backward_args b = backward_args();
    EXPECT_OK(nsa_backward(F.plan, &b, F.ws));
    EXPECT_OK(nsa_backward(F.plan, &b, NULL));
    /* a workspace sized for the f32 plan is too small */
    nsa_buffer *small = NULL;
    ck_assert_int_eq(nsa_buffer_alloc(F.ctx, i32.workspace_bytes, &small), NSA_SUCCESS);
    EXPECT(nsa_forward(F.plan, &F.args, small), NSA_ERR_BUFFER_TOO_SMALL, "workspace");
    nsa_buffer_free(small);
    /* mixed dtypes: f32-sized q, gate, LSE, dgate, dout in an f64 call */
    const int64_t hq = F.cfg.num_q_heads, dk = F.cfg.head_dim_qk, dv = F.cfg.head_dim_v;
    F.esz = 4;
    nsa_forward_args a = F.args;
    a.q = dense(buffer(F.ctx, T * hq * dk), hq, dk);
    EXPECT(nsa_forward(F.plan, &a, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->q [20, 2, 4] of f64");
    a = F.args;
    a.gate[NSA_BRANCH_SLC] = dense(buffer(F.ctx, T * hq), hq, 1);
    EXPECT(nsa_forward(F.plan, &a, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->gate[slc] [20, 2, 1] of f64");
    a = F.args;
    a.lse[NSA_BRANCH_WIN] = dense(buffer(F.ctx, T * hq), hq, 1);
    EXPECT(nsa_forward(F.plan, &a, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->lse[win] [20, 2, 1] of f64");
    nsa_backward_args x = b;
    x.dgate[NSA_BRANCH_CMP] = dense(buffer(F.ctx, T * hq), hq, 1);
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->dgate[cmp] [20, 2, 1] of f64");
    x = b;
    x.lse[NSA_BRANCH_CMP] = dense(buffer(F.ctx, T * hq), hq, 1);
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->lse[cmp] [20, 2, 1] of f64");
    x = b;
    x.dout = dense(buffer(F.ctx, T * hq * dv), hq, dv);
    EXPECT(nsa_backward(F.plan, &x, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->dout [20, 2, 3] of f64");
    /* and the other way: f32 views of f64-sized buffers are fine (the dtype is the config's) */
    F.cfg.dtype = NSA_DTYPE_F32;
    F.esz = 8;
    build();
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
    /* nsa_convert: f64 both ways, one rounding to f16 */
    double d[2] = {1.0 + 0x1p-11 + 0x1p-40, -3.0}; /* just above the f16 tie 1 + 2^-11: rounds up */
    uint16_t h[2];
    float f[2];
    double back[2];
    EXPECT_OK(nsa_convert(d, NSA_DTYPE_F64, h, NSA_DTYPE_F16, 2));
    ck_assert_uint_eq(h[0], 0x3c01);
    ck_assert_uint_eq(h[1], 0xc200);
    EXPECT_OK(nsa_convert(d, NSA_DTYPE_F64, f, NSA_DTYPE_F32, 2));
    EXPECT_OK(nsa_convert(f, NSA_DTYPE_F32, back, NSA_DTYPE_F64, 2));
    ck_assert(back[0] == (double)(float)d[0] && back[1] == -3.0);
    EXPECT(nsa_convert(d, NSA_DTYPE_F64, f, NSA_DTYPE_F32, INT64_C(1) << 61), NSA_ERR_INVALID_VALUE, "n");
    ck_assert_uint_eq(nsa_dtype_size(NSA_DTYPE_F64), 8);
    ck_assert_str_eq(nsa_dtype_name(NSA_DTYPE_F64), "f64");
}
END_TEST

/* A backend without f64 (a module without supports(): the core's default is
 * every dtype but f64) refuses an f64 plan with NSA_ERR_UNSUPPORTED naming the
 * backend and the dtype, whatever the batch (T = 0 too), and takes f32. */
START_TEST(f64_on_a_backend_without_it)
{
    ck_assert_int_eq(nsa_set_backend_path(FAKE_FAILING_DIR), NSA_SUCCESS);
    nsa_context *ctx = NULL;
    ck_assert_msg(nsa_context_create("fakeplan", 0, &ctx) == NSA_SUCCESS, "fakeplan context: %s", nsa_last_error());
    nsa_config c = F.cfg;
    c.dtype = NSA_DTYPE_F64;
    nsa_plan *p = NULL;
    EXPECT(nsa_plan_create(ctx, &c, F.cu, 1, &p), NSA_ERR_UNSUPPORTED, "backend fakeplan does not support dtype f64");
    ck_assert_ptr_null(p);
    const int64_t empty[2] = {0, 0};
    EXPECT(nsa_plan_create(ctx, &c, empty, 1, &p), NSA_ERR_UNSUPPORTED, "dtype f64");
    ck_assert_ptr_null(p);
    c.flags = NSA_CONFIG_TRAINING;
    EXPECT(nsa_plan_create(ctx, &c, F.cu, 1, &p), NSA_ERR_UNSUPPORTED, "dtype f64");
    c.flags = 0;
    c.dtype = NSA_DTYPE_F32;
    EXPECT_OK(nsa_plan_create(ctx, &c, F.cu, 1, &p));
    ck_assert_int_eq(nsa_plan_destroy(p), NSA_SUCCESS);
    ck_assert_int_eq(nsa_context_destroy(ctx), NSA_SUCCESS);
    ck_assert_int_eq(nsa_set_backend_path(NULL), NSA_SUCCESS);
}
END_TEST

/* A backend without the decode stages (a module without supports(): the core's
 * default has only the forward's plain stages) refuses a decode plan with
 * NSA_ERR_UNSUPPORTED naming the backend; the same limits make a plan on cpu. */
START_TEST(decode_on_a_backend_without_it)
{
    ck_assert_int_eq(nsa_set_backend_path(FAKE_FAILING_DIR), NSA_SUCCESS);
    nsa_context *ctx = NULL;
    ck_assert_msg(nsa_context_create("fakeplan", 0, &ctx) == NSA_SUCCESS, "fakeplan context: %s", nsa_last_error());
    const nsa_decode_limits lim = {2, 4, 8, 64, 16, 8, 4, 2, 64, 32};
    nsa_plan *p = NULL;
    EXPECT(nsa_decode_plan_create(ctx, &F.cfg, &lim, &p), NSA_ERR_UNSUPPORTED,
           "backend fakeplan has no decode step yet");
    ck_assert_ptr_null(p);
    ck_assert_int_eq(nsa_context_destroy(ctx), NSA_SUCCESS);
    ck_assert_int_eq(nsa_set_backend_path(NULL), NSA_SUCCESS);
    ck_assert_int_eq(nsa_context_create("cpu", 0, &ctx), NSA_SUCCESS);
    EXPECT_OK(nsa_decode_plan_create(ctx, &F.cfg, &lim, &p));
    ck_assert_int_eq(nsa_plan_destroy(p), NSA_SUCCESS);
    ck_assert_int_eq(nsa_context_destroy(ctx), NSA_SUCCESS);
}
END_TEST

START_TEST(misc_values)
{
    nsa_context *ctx = NULL;
    EXPECT(nsa_context_create("cpu", -2, &ctx), NSA_ERR_INVALID_VALUE, "device");
    float f[2] = {1.0f, 2.0f};
    uint16_t h[2];
    EXPECT(nsa_convert(f, NSA_DTYPE_F32, h, (nsa_dtype)9, 2), NSA_ERR_INVALID_DTYPE, "dst_dtype");
    EXPECT(nsa_convert(f, (nsa_dtype)9, h, NSA_DTYPE_F16, 2), NSA_ERR_INVALID_DTYPE, "src_dtype");
    EXPECT(nsa_convert(f, NSA_DTYPE_F32, h, NSA_DTYPE_F16, -1), NSA_ERR_INVALID_VALUE, "n");
    EXPECT(nsa_random_uniform(1, 2, 0, -1, 0.0f, 1.0f, f), NSA_ERR_INVALID_VALUE, "n");
    EXPECT(nsa_random_uniform(1, 2, 0, 2, 0.0f, INFINITY, f), NSA_ERR_INVALID_VALUE, "hi");
    char name[8];
    EXPECT(nsa_device_name("cpu", 0, name, 0), NSA_ERR_INVALID_VALUE, "size");
    ck_assert_uint_eq(nsa_dtype_size((nsa_dtype)42), 0);
    ck_assert_ptr_nonnull(nsa_dtype_name((nsa_dtype)42));
    /* destroying a context that still owns objects is refused */
    EXPECT(nsa_context_destroy(F.ctx), NSA_ERR_INVALID_VALUE, "buffer");
    /* success clears the message */
    EXPECT_OK(nsa_config_validate(&F.cfg));
}
END_TEST


/* ------------------------------------------------------------------ sizes near the 64-bit limits */

/* Item 11: the planner validates every size (the workspace's products too)
 * before it allocates its host tables (8 bytes per token). With T = 2^40 and
 * the largest heads and dims the workspace overflows 64 bits: that is a shape
 * error, found before an 8 TiB table is asked for (the old planner allocated
 * first and answered NSA_ERR_OUT_OF_MEMORY). */
START_TEST(plan_validates_before_allocating)
{
    nsa_config c;
    small_config(&c);
    c.num_q_heads = 1 << 16;
    c.head_dim_v = 1 << 14;
    nsa_plan *p = NULL;
    int64_t cu[2] = {0, INT64_C(1) << 40};
    EXPECT(nsa_plan_create(F.ctx, &c, cu, 1, &p), NSA_ERR_INVALID_SHAPE, "workspace");
    ck_assert_ptr_null(p);
    int64_t cu2[3] = {0, INT64_C(1) << 39, INT64_C(1) << 40};
    EXPECT(nsa_plan_create(F.ctx, &c, cu2, 2, &p), NSA_ERR_INVALID_SHAPE, "workspace");
    ck_assert_ptr_null(p);
}
END_TEST

/* Item 9: too many tokens names cu_seqlens. */
START_TEST(too_many_tokens_names_cu_seqlens)
{
    nsa_plan *p = NULL;
    int64_t cu[3] = {0, 5, (INT64_C(1) << 40) + 1};
    EXPECT(nsa_plan_create(F.ctx, &F.cfg, cu, 2, &p), NSA_ERR_INVALID_SHAPE, "cu_seqlens[2]");
    int64_t huge[2] = {0, INT64_MAX};
    EXPECT(nsa_plan_create(F.ctx, &F.cfg, huge, 1, &p), NSA_ERR_INVALID_SHAPE, "cu_seqlens");
    ck_assert_ptr_null(p);
}
END_TEST

/* Item 7: argument checks near INT64_MAX return their status without signed
 * overflow (the ASan/UBSan build halts on any). */
START_TEST(tensor_extents_near_int64_max)
{
    nsa_tensor saved = F.args.q;
    F.args.q.offset = INT64_MAX - 1; /* offset + Dqk overflows */
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->q");
    F.args.q = saved;
    saved = F.args.o;
    F.args.o.stride_head = INT64_C(1) << 62; /* stride x extent overflows in the overlap test ... */
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->o");
    F.args.o.stride_token = INT64_MAX; /* ... where the product is still used (not the last dimension) */
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->o");
    F.args.o.stride_head = 3; /* = Dv */
    F.args.o.stride_token = INT64_MAX / 3;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->o");
    F.args.o = saved;
    saved = F.args.lse[2];
    F.args.lse[2].stride_token = INT64_MAX;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->lse[win]");
    F.args.lse[2] = saved;
    saved = F.args.k[1];
    F.args.k[1].offset = INT64_MAX;
    F.args.k[1].stride_token = INT64_MAX;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_BUFFER_TOO_SMALL, "args->k[slc]");
    F.args.k[1] = saved;
    EXPECT_OK(nsa_forward(F.plan, &F.args, F.ws));
}
END_TEST

START_TEST(dense_view_overflow)
{
    /* heads * dim overflows: the view gets stride_token = -1, which nsa_forward refuses */
    nsa_tensor t = nsa_tensor_dense(F.args.q.buffer, 0, INT64_MAX, 2);
    ck_assert_int_eq(t.stride_token, -1);
    t = nsa_tensor_dense(F.args.q.buffer, 0, INT64_C(1) << 32, INT64_C(1) << 32);
    ck_assert_int_eq(t.stride_token, -1);
    F.args.q = t;
    EXPECT(nsa_forward(F.plan, &F.args, F.ws), NSA_ERR_INVALID_STRIDE, "args->q");
    t = nsa_tensor_dense(NULL, 0, 3, 5);
    ck_assert_int_eq(t.stride_token, 15);
    ck_assert_int_eq(t.stride_head, 5);
}
END_TEST

START_TEST(utility_index_overflow)
{
    float f[4];
    EXPECT(nsa_random_uniform(1, 2, INT64_MAX - 1, 4, 0.0f, 1.0f, f), NSA_ERR_INVALID_VALUE, "first");
    EXPECT(nsa_random_uniform(1, 2, INT64_MAX, 1, 0.0f, 1.0f, f), NSA_ERR_INVALID_VALUE, "first");
    EXPECT_OK(nsa_random_uniform(1, 2, INT64_MAX - 4, 4, 0.0f, 1.0f, f));
    EXPECT_OK(nsa_random_uniform(1, 2, INT64_MAX, 0, 0.0f, 1.0f, NULL));
    uint16_t h[4];
    EXPECT(nsa_convert(f, NSA_DTYPE_F32, h, NSA_DTYPE_F16, INT64_C(1) << 62), NSA_ERR_INVALID_VALUE, "n");
    EXPECT(nsa_convert(f, NSA_DTYPE_F32, f, NSA_DTYPE_F32, INT64_MAX), NSA_ERR_INVALID_VALUE, "n");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("invalid");
    TCase *tc = tcase_create("invalid");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, fixture_runs);
    tcase_add_test(tc, fixture_runs_linear_external);
    tcase_add_test(tc, fixture_runs_given_indices);
    tcase_add_test(tc, null_pointers);
    tcase_add_test(tc, config_fields);
    tcase_add_test(tc, config_scale_dtype_compress);
    tcase_add_test(tc, cu_seqlens_and_batch);
    tcase_add_test(tc, negative_strides);
    tcase_add_test(tc, overlapping_output);
    tcase_add_test(tc, aliasing);
    tcase_add_test(tc, aliasing_interleaved_ok);
    tcase_add_test(tc, backward_arguments);
    tcase_add_test(tc, negative_offset);
    tcase_add_test(tc, buffers_too_small);
    tcase_add_test(tc, workspace_too_small);
    tcase_add_test(tc, buffer_ranges);
    tcase_add_test(tc, missing_tensors);
    tcase_add_test(tc, given_indices_invalid);
    tcase_add_test(tc, unknown_flags);
    tcase_add_test(tc, wrong_context);
    tcase_add_test(tc, misc_values);
    tcase_add_test(tc, f64_dtype_rules);
    tcase_add_test(tc, f64_on_a_backend_without_it);
    tcase_add_test(tc, decode_on_a_backend_without_it);
    tcase_add_test(tc, plan_validates_before_allocating);
    tcase_add_test(tc, too_many_tokens_names_cu_seqlens);
    tcase_add_test(tc, tensor_extents_near_int64_max);
    tcase_add_test(tc, dense_view_overflow);
    tcase_add_test(tc, utility_index_overflow);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    expect_counts_init();
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    expect_report(sr, "invalid");
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
