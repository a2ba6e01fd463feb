/*
 * libFuzzer target: nsa_plan_create (or nsa_plan_create_varlen, with key
 * offsets mostly at least the query lengths) on a config and cu_seqlens decoded
 * from the input, then, when the plan is small, a cpu forward with dense
 * tensors one of which gets fuzzed offsets and strides; for a training plan
 * (NSA_CONFIG_TRAINING from the input) then a backward the same way, with
 * fuzzed flags and a fuzzed choice of gradients. Through the public API only.
 *
 * Each input byte of a field picks a value: most are small (0..39) so that
 * valid configs are common, some are extremes (-1, INT64_MAX, INT64_MIN,
 * 2^31, 2^40, 2^62, ...), and 0xFF takes the next 8 bytes raw. Inputs whose
 * total token count cu_seqlens[batch] is in (2^24, 2^40] are skipped: such a
 * plan may be valid, and then its host tables (8 bytes per token) legitimately
 * need more than the fuzzer's memory limit (tests/test_invalid.c covers
 * T = 2^40 with a workspace that overflows; larger totals are refused).
 *
 * Findings: a crash, a sanitizer report, a leak, an allocation beyond
 * -malloc_limit_mb, a status outside nsa_status, or a failure whose
 * nsa_last_error() is empty (every failure must say why).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nsa.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static nsa_context *ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    setenv("NSA_CPU_THREADS", "1", 1);
    if (nsa_context_create("cpu", 0, &ctx) != NSA_SUCCESS) abort();
    return 0;
}

typedef struct bytes_in {
    const uint8_t *p;
    size_t n;
} bytes_in;

static uint8_t byte(bytes_in *in)
{
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

static int64_t value(bytes_in *in)
{
    static const int64_t extreme[] = {-1, INT64_MAX, INT64_MIN, INT64_C(1) << 31, INT64_C(1) << 40,
                                      (INT64_C(1) << 40) + 1, INT64_C(1) << 62, 1 << 14, 1 << 16,
                                      (1 << 16) + 1, 1 << 20, -(INT64_C(1) << 40), INT64_MAX - 1, 64};
    uint8_t b = byte(in);
    if (b < 0xF0) return b % 40;
    if (b == 0xFF) {
        uint64_t u = 0;
        for (int i = 0; i < 8; i++) u |= (uint64_t)byte(in) << (8 * i);
        return (int64_t)u;
    }
    return extreme[(b - 0xF0) % (int)(sizeof extreme / sizeof extreme[0])];
}

/* A sequence length: small, or (rarely) past the limit. */
static int64_t length(bytes_in *in)
{
    int64_t v = value(in);
    if (v >= 0 && v <= (INT64_C(1) << 24)) return v * (byte(in) % 8 + 1);
    if (v > 0 && v <= (INT64_C(1) << 40)) return v + (INT64_C(1) << 40); /* never a valid huge plan */
    return v;
}

static void check_status(nsa_status s)
{
    if ((int)s < NSA_SUCCESS || (int)s > NSA_ERR_INTERNAL) abort();
    if (s != NSA_SUCCESS && !nsa_last_error()[0]) abort(); /* a failure without a message */
}

#define MAX_BUFS 24

/* A buffer of elems (at least one) elements of esize bytes filled with the byte
 * fill, kept in bufs[*nb] for the caller to free; NULL when the allocation failed. */
static nsa_buffer *fuzz_buf(nsa_buffer **bufs, int *nb, int64_t elems, size_t esize, unsigned char fill)
{
    nsa_buffer *b = NULL;
    const size_t bytes = (size_t)(elems > 0 ? elems : 1) * esize;
    check_status(nsa_buffer_alloc(ctx, bytes, &b));
    if (b) {
        bufs[(*nb)++] = b;
        check_status(nsa_buffer_fill(b, 0, fill, bytes));
    }
    return b;
}


static void backward(nsa_plan *plan, const nsa_config *c, const nsa_plan_info *info, bytes_in *in);

static void forward(nsa_plan *plan, const nsa_config *c, const nsa_plan_info *info, bytes_in *in)
{
    const int64_t T = info->total_tokens, TK = info->total_keys, total_cmp = info->total_cmp_blocks;
    const int64_t hq = c->num_q_heads, hkv = c->num_kv_heads, dk = c->head_dim_qk, dv = c->head_dim_v;
    const int64_t l = c->cmp_block, n = c->num_selected;
    nsa_buffer *bufs[MAX_BUFS];
    int nb = 0;
    nsa_forward_args a;
    memset(&a, 0, sizeof a);
#define BUF(elems, esize) fuzz_buf(bufs, &nb, (elems), (esize), 0x3c) /* small finite values in every dtype */
    const size_t es = nsa_dtype_size(c->dtype);
    const size_t fs = c->dtype == NSA_DTYPE_F64 ? 8 : 4; /* gates and LSEs: the call's float type */
    a.q = nsa_tensor_dense(BUF(T * hq * dk, es), 0, hq, dk);
    a.o = nsa_tensor_dense(BUF(T * hq * dv, es), 0, hq, dv);
    for (int b = 0; b < 3; b++) {
        a.k[b] = nsa_tensor_dense(BUF(TK * hkv * dk, es), 0, hkv, dk);
        a.v[b] = nsa_tensor_dense(BUF(TK * hkv * dv, es), 0, hkv, dv);
        a.gate[b] = nsa_tensor_dense(BUF(T * hq, fs), 0, hq, 1);
    }
    if (byte(in) & 1) a.lse[0] = nsa_tensor_dense(BUF(T * hq, fs), 0, hq, 1);
    if (c->compress == NSA_COMPRESS_LINEAR) {
        a.w_k = nsa_tensor_dense(BUF(hkv * l * dk * dk, es), 0, 0, 0);
        a.w_v = nsa_tensor_dense(BUF(hkv * l * dv * dv, es), 0, 0, 0);
    } else if (c->compress == NSA_COMPRESS_EXTERNAL) {
        a.kc = nsa_tensor_dense(BUF(total_cmp * hkv * dk, es), 0, hkv, dk);
        a.vc = nsa_tensor_dense(BUF(total_cmp * hkv * dv, es), 0, hkv, dv);
    }
    if (n > 0 && (byte(in) & 1)) a.selected = nsa_tensor_dense(BUF(T * hkv * n, 4), 0, hkv, n);
    /* one tensor gets fuzzed offset and strides */
    nsa_tensor *pick[] = {&a.q, &a.o, &a.k[0], &a.v[1], &a.gate[2], &a.lse[0], &a.kc, &a.selected};
    uint8_t which = byte(in);
    if (which & 0x80) {
        nsa_tensor *t = pick[which % (sizeof pick / sizeof pick[0])];
        t->offset = value(in);
        t->stride_token = value(in);
        t->stride_head = value(in);
    }
    a.flags = byte(in) == 0xAA ? 0x80u : 0u;
    /* the plan's own workspace, or a caller's (of the right size, or 4 bytes short) */
    nsa_buffer *ws = NULL;
    uint8_t w = byte(in);
    if ((w & 1) && info->workspace_bytes > 4)
        ws = BUF((int64_t)(info->workspace_bytes / 4) - (w & 2 ? 1 : 0), 4);
    nsa_status s = nsa_forward(plan, &a, ws);
    check_status(s);
    if (s == NSA_SUCCESS) check_status(nsa_context_synchronize(ctx));
    for (int i = 0; i < nb; i++) nsa_buffer_free(bufs[i]);
    if (info->num_bwd_stages > 0) backward(plan, c, info, in);
#undef BUF
}

/* The backward of a training plan: inputs filled with small finite values, LSEs
 * 0x3c.., indices all -1 (padding: valid), each gradient wanted or not by a bit,
 * one view with fuzzed offset and strides, fuzzed flags. */
static void backward(nsa_plan *plan, const nsa_config *c, const nsa_plan_info *info, bytes_in *in)
{
    const int64_t T = info->total_tokens, TK = info->total_keys, total_cmp = info->total_cmp_blocks;
    const int64_t hq = c->num_q_heads, hkv = c->num_kv_heads, dk = c->head_dim_qk, dv = c->head_dim_v;
    const int64_t l = c->cmp_block, n = c->num_selected;
    const int on[3] = {1, n > 0, c->window > 0};
    nsa_buffer *bufs[MAX_BUFS + 16];
    int nb = 0;
    nsa_backward_args a;
    memset(&a, 0, sizeof a);
#define BUF(elems, esize, fillv) fuzz_buf(bufs, &nb, (elems), (esize), (fillv))
    const size_t es = nsa_dtype_size(c->dtype), fs = c->dtype == NSA_DTYPE_F64 ? 8 : 4;
    a.flags = byte(in);
    a.flags = (a.flags & 3u) | (a.flags == 0xAB ? 0x80u : 0u); /* TRUST, FLOAT_KEY_GRADS, rarely an unknown bit */
    const size_t gs = a.flags & NSA_BACKWARD_FLOAT_KEY_GRADS ? fs : es; /* the key-side gradients' elements */
    const uint8_t want = byte(in);
    a.q = nsa_tensor_dense(BUF(T * hq * dk, es, 0x3c), 0, hq, dk);
    a.dout = nsa_tensor_dense(BUF(T * hq * dv, es, 0x3c), 0, hq, dv);
    if (want & 1) a.dq = nsa_tensor_dense(BUF(T * hq * dk, es, 0xff), 0, hq, dk);
    for (int b = 0; b < 3; b++) {
        if (!on[b]) continue;
        a.gate[b] = nsa_tensor_dense(BUF(T * hq, fs, 0x3c), 0, hq, 1);
        a.lse[b] = nsa_tensor_dense(BUF(T * hq, fs, 0x3c), 0, hq, 1);
        if (want & 2) a.dgate[b] = nsa_tensor_dense(BUF(T * hq, fs, 0xff), 0, hq, 1);
        if (b == 0 && c->compress == NSA_COMPRESS_EXTERNAL) continue;
        a.k[b] = nsa_tensor_dense(BUF(TK * hkv * dk, es, 0x3c), 0, hkv, dk);
        a.v[b] = nsa_tensor_dense(BUF(TK * hkv * dv, es, 0x3c), 0, hkv, dv);
        if (want & 4) a.dk[b] = nsa_tensor_dense(BUF(TK * hkv * dk, gs, 0xff), 0, hkv, dk);
        if (want & 8) a.dv[b] = nsa_tensor_dense(BUF(TK * hkv * dv, gs, 0xff), 0, hkv, dv);
    }
    if (n > 0) a.block_indices = nsa_tensor_dense(BUF(T * hkv * n, 4, 0xff), 0, hkv, n); /* all -1 */
    if (c->compress == NSA_COMPRESS_LINEAR) {
        a.w_k = nsa_tensor_dense(BUF(hkv * l * dk * dk, es, 0x3c), 0, 0, 0);
        a.w_v = nsa_tensor_dense(BUF(hkv * l * dv * dv, es, 0x3c), 0, 0, 0);
        if (want & 16) a.dw_k = nsa_tensor_dense(BUF(hkv * l * dk * dk, gs, 0xff), 0, 0, 0);
        if (want & 32) a.dw_v = nsa_tensor_dense(BUF(hkv * l * dv * dv, gs, 0xff), 0, 0, 0);
    } else if (c->compress == NSA_COMPRESS_EXTERNAL) {
        a.kc = nsa_tensor_dense(BUF(total_cmp * hkv * dk, es, 0x3c), 0, hkv, dk);
        a.vc = nsa_tensor_dense(BUF(total_cmp * hkv * dv, es, 0x3c), 0, hkv, dv);
        if (want & 16) a.dkc = nsa_tensor_dense(BUF(total_cmp * hkv * dk, gs, 0xff), 0, hkv, dk);
        if (want & 32) a.dvc = nsa_tensor_dense(BUF(total_cmp * hkv * dv, gs, 0xff), 0, hkv, dv);
    }
    nsa_tensor *pick[] = {&a.q, &a.dout, &a.dq, &a.k[1], &a.dk[2], &a.dv[0], &a.lse[0], &a.dgate[1],
                          &a.block_indices, &a.dkc};
    const uint8_t which = byte(in);
    if (which & 0x80) {
        nsa_tensor *t = pick[which % (sizeof pick / sizeof pick[0])];
        t->offset = value(in);
        t->stride_token = value(in);
        t->stride_head = value(in);
    }
    nsa_status s = nsa_backward(plan, &a, NULL);
    check_status(s);
    if (s == NSA_SUCCESS) check_status(nsa_context_synchronize(ctx));
    for (int i = 0; i < nb; i++) nsa_buffer_free(bufs[i]);
#undef BUF
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bytes_in in = {data, size};
    nsa_config c;
    nsa_config_init(&c);
    c.num_q_heads = value(&in);
    c.num_kv_heads = value(&in);
    c.head_dim_qk = value(&in);
    c.head_dim_v = value(&in);
    c.cmp_block = value(&in);
    c.cmp_stride = value(&in);
    c.slc_block = value(&in);
    c.num_selected = value(&in);
    c.num_init = value(&in);
    c.num_local = value(&in);
    c.window = value(&in);
    static const float scales[] = {0.0f, 0.5f, 1.0f, -1.0f, 1e-40f, 3e38f};
    uint8_t sc = byte(&in);
    c.scale = sc < 0xFC ? scales[sc % 6] : sc == 0xFC ? __builtin_nanf("") : sc == 0xFD ? __builtin_inff() : -0.0f;
    c.compress = (nsa_compress_mode)(byte(&in) % 4);
    c.dtype = (nsa_dtype)(byte(&in) % 6); /* f32, f16, bf16, i32 (refused), f64, 5 (unknown) */
    const uint8_t fl = byte(&in);
    c.flags = fl == 0xAC ? (uint64_t)1 << 40 : (fl & 1) ? NSA_CONFIG_TRAINING : 0; /* rarely an unknown bit */
    int64_t batch = (int64_t)(byte(&in) % 11) - 2; /* -2 .. 8: the array below has batch + 1 entries */
    int64_t cu[9] = {0};
    if (byte(&in) == 0xEE) cu[0] = value(&in);
    for (int64_t b = 0; b < batch && b < 8; b++) {
        /* the previous offset plus a length, or (rarely) any value: decreasing, negative, huge */
        int64_t len = length(&in);
        if (byte(&in) == 0xEE || __builtin_add_overflow(cu[b], len, &cu[b + 1])) cu[b + 1] = value(&in);
    }

    if (batch >= 0 && cu[batch] > (INT64_C(1) << 24) && cu[batch] <= (INT64_C(1) << 40))
        return 0; /* maybe a valid plan too large for the fuzzer's memory (see the top) */
    /* a varlen plan: each sequence's keys its queries plus a few more, or (rarely) any value */
    const uint8_t vk = byte(&in);
    int64_t ck[9] = {0};
    if (vk & 1) {
        for (int64_t b = 0; b < batch && b < 8; b++) {
            int64_t len, more = byte(&in) % 40;
            if (byte(&in) == 0xEE || __builtin_sub_overflow(cu[b + 1], cu[b], &len) ||
                __builtin_add_overflow(len, more, &more) ||
                __builtin_add_overflow(ck[b], more, &ck[b + 1]))
                ck[b + 1] = value(&in);
        }
        if (vk == 0xEF) ck[0] = value(&in);
    }
    nsa_plan *plan = NULL;
    nsa_status s = vk & 1 ? nsa_plan_create_varlen(ctx, &c, cu, vk == 0xFD ? NULL : ck, batch, &plan)
                          : nsa_plan_create(ctx, &c, cu, batch, &plan);
    check_status(s);
    if (s != NSA_SUCCESS) {
        if (plan) abort();
        return 0;
    }
    nsa_plan_info info;
    check_status(nsa_plan_get_info(plan, &info));
    char name[64];
    for (int i = 0; i < info.num_stages; i++) check_status(nsa_plan_stage_kernel(plan, i, name, sizeof name));
    const int64_t T = info.total_tokens;
    /* forwards only for small problems: the point is the checks, not the arithmetic */
    if (T <= 256 && info.total_keys <= 512 && c.num_q_heads <= 16 && c.head_dim_qk <= 32 && c.head_dim_v <= 32 && c.cmp_block <= 64 &&
        info.total_cmp_blocks <= 256 && c.num_selected <= 64 && info.workspace_bytes <= (64u << 20))
        forward(plan, &c, &info, &in);
    check_status(nsa_plan_destroy(plan));
    return 0;
}
