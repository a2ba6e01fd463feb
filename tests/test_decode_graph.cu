/*
 * test_decode_graph.cu -- a CUDA decode step (nsa_decode on the cuda backend)
 * captured in a CUDA graph and replayed (include/nsa.h "decoding": the step
 * lengths and page tables are device tensors, so a step replays with new
 * ones and the step needs no host round trip).
 *
 *   1. an eager step, then the same step captured on the context's stream
 *      and replayed twice: o, the LSEs, the selected blocks and the status
 *      are bitwise the eager step's (a step is idempotent on its caches: it
 *      rewrites the same entries with the same values);
 *   2. new lengths written on the device, the graph replayed, then the same
 *      step eager: bitwise equal (the graph reads the lengths on the device);
 *   3. a page-table entry made bad: the replay writes no output row, and
 *      nsa_decode_check and the status tensor name the sequence.
 *
 * Usage: test_decode_graph [time]. "time": batch 1 at a 64k context on the
 * paper's shape (bf16), the mean time of a replayed one-token step. Exits 77
 * without a CUDA device.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "nsa.h"

#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            fprintf(stderr, "decode-graph: FAIL at line %d: ", __LINE__);                                     \
            fprintf(stderr, __VA_ARGS__);                                                                      \
            fprintf(stderr, " (last error: %s)\n", nsa_last_error());                                         \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)
#define OK(call) CHECK((call) == NSA_SUCCESS, "%s", #call)
#define CUOK(call) CHECK((call) == cudaSuccess, "%s", #call)

static uint64_t g_rs = 0x1234567;
static float urand()
{
    g_rs ^= g_rs << 13;
    g_rs ^= g_rs >> 7;
    g_rs ^= g_rs << 17;
    return (float)((g_rs >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}
static uint16_t bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

struct Run {
    nsa_context *ctx;
    nsa_plan *plan;
    nsa_config cfg;
    nsa_decode_limits lim;
    nsa_buffer *q, *k, *v, *gate[3], *kc, *vc, *kcc, *vcc, *o, *lse[3], *sel, *status, *cuq, *csl, *bt, *cbt, *ws;
    std::vector<int32_t> table;
    nsa_decode_args a;
    size_t o_bytes, lse_bytes, sel_bytes;
};

static nsa_buffer *alloc_rand(nsa_context *ctx, size_t elems, bool is_bf16, float amp)
{
    nsa_buffer *b = NULL;
    OK(nsa_buffer_alloc(ctx, elems * (is_bf16 ? 2 : 4), &b));
    const size_t chunk = 1 << 20;
    std::vector<uint16_t> h16;
    std::vector<float> h32;
    for (size_t at = 0; at < elems; at += chunk) {
        const size_t n = elems - at < chunk ? elems - at : chunk;
        if (is_bf16) {
            h16.resize(n);
            for (size_t i = 0; i < n; i++) h16[i] = bf16(amp * urand());
            OK(nsa_buffer_write(b, at * 2, h16.data(), n * 2));
        } else {
            h32.resize(n);
            for (size_t i = 0; i < n; i++) h32[i] = amp * urand();
            OK(nsa_buffer_write(b, at * 4, h32.data(), n * 4));
        }
    }
    return b;
}

/* a plan and every tensor; one raw cache shared by the three branches, the caches random */
static void make(Run &r, nsa_context *ctx, const nsa_config &cfg, const nsa_decode_limits &lim)
{
    memset(&r.a, 0, sizeof r.a);
    r.ctx = ctx;
    r.cfg = cfg;
    r.lim = lim;
    OK(nsa_decode_plan_create(ctx, &cfg, &lim, &r.plan));
    nsa_plan_info info;
    OK(nsa_plan_get_info(r.plan, &info));
    OK(nsa_buffer_alloc(ctx, info.workspace_bytes ? info.workspace_bytes : 16, &r.ws));
    const int64_t MT = lim.max_total_tokens, Hq = cfg.num_q_heads, Hkv = cfg.num_kv_heads;
    const int64_t Dqk = cfg.head_dim_qk, Dv = cfg.head_dim_v, n = cfg.num_selected;
    const int64_t pool = lim.num_pages * lim.page_size, cpool = lim.num_cmp_pages * lim.cmp_page_size;
    r.q = alloc_rand(ctx, (size_t)(MT * Hq * Dqk), true, 1.f);
    r.k = alloc_rand(ctx, (size_t)(MT * Hkv * Dqk), true, 1.f);
    r.v = alloc_rand(ctx, (size_t)(MT * Hkv * Dv), true, 1.f);
    r.kc = alloc_rand(ctx, (size_t)(pool * Hkv * Dqk), true, 1.f);
    r.vc = alloc_rand(ctx, (size_t)(pool * Hkv * Dv), true, 1.f);
    r.kcc = alloc_rand(ctx, (size_t)(cpool * Hkv * Dqk), true, 1.f);
    r.vcc = alloc_rand(ctx, (size_t)(cpool * Hkv * Dv), true, 1.f);
    r.o_bytes = (size_t)(MT * Hq * Dv) * 2;
    r.lse_bytes = (size_t)(MT * Hq) * 4;
    r.sel_bytes = (size_t)(MT * Hkv * (n > 0 ? n : 1)) * 4;
    OK(nsa_buffer_alloc(ctx, r.o_bytes, &r.o));
    for (int b = 0; b < 3; b++) {
        r.gate[b] = alloc_rand(ctx, (size_t)(MT * Hq), false, 0.5f);
        OK(nsa_buffer_alloc(ctx, r.lse_bytes, &r.lse[b]));
    }
    OK(nsa_buffer_alloc(ctx, r.sel_bytes, &r.sel));
    OK(nsa_buffer_alloc(ctx, 8, &r.status));
    OK(nsa_buffer_alloc(ctx, (size_t)(lim.batch + 1) * 4, &r.cuq));
    OK(nsa_buffer_alloc(ctx, (size_t)lim.batch * 4, &r.csl));
    /* pages: sequence b's column x is page (x * B + b) reversed: anywhere in the pool */
    r.table.resize((size_t)(lim.batch * lim.max_pages));
    for (int64_t b = 0; b < lim.batch; b++)
        for (int64_t x = 0; x < lim.max_pages; x++)
            r.table[b * lim.max_pages + x] = (int32_t)(lim.num_pages - 1 - (x * lim.batch + b));
    OK(nsa_buffer_alloc(ctx, r.table.size() * 4, &r.bt));
    OK(nsa_buffer_write(r.bt, 0, r.table.data(), r.table.size() * 4));
    std::vector<int32_t> ct((size_t)(lim.batch * lim.max_cmp_pages) + 1);
    for (int64_t b = 0; b < lim.batch; b++)
        for (int64_t x = 0; x < lim.max_cmp_pages; x++) ct[b * lim.max_cmp_pages + x] = (int32_t)(x * lim.batch + b);
    OK(nsa_buffer_alloc(ctx, ct.size() * 4, &r.cbt));
    OK(nsa_buffer_write(r.cbt, 0, ct.data(), ct.size() * 4));
    nsa_decode_args &a = r.a;
    a.q = nsa_tensor_dense(r.q, 0, Hq, Dqk);
    a.o = nsa_tensor_dense(r.o, 0, Hq, Dv);
    for (int b = 0; b < 3; b++) {
        a.k[b] = nsa_tensor_dense(r.k, 0, Hkv, Dqk);
        a.v[b] = nsa_tensor_dense(r.v, 0, Hkv, Dv);
        a.k_cache[b] = nsa_tensor_dense(r.kc, 0, Hkv, Dqk);
        a.v_cache[b] = nsa_tensor_dense(r.vc, 0, Hkv, Dv);
        a.gate[b] = nsa_tensor_dense(r.gate[b], 0, Hq, 1);
        a.lse[b] = nsa_tensor_dense(r.lse[b], 0, Hq, 1);
    }
    a.cu_seqlens_q = nsa_tensor_dense(r.cuq, 0, 1, 1);
    a.cache_seqlens = nsa_tensor_dense(r.csl, 0, 1, 1);
    a.block_table = nsa_tensor_dense(r.bt, 0, 1, lim.max_pages);
    a.cmp_block_table = nsa_tensor_dense(r.cbt, 0, 1, lim.max_cmp_pages);
    a.kc_cache = nsa_tensor_dense(r.kcc, 0, Hkv, Dqk);
    a.vc_cache = nsa_tensor_dense(r.vcc, 0, Hkv, Dv);
    if (n > 0) a.selected = nsa_tensor_dense(r.sel, 0, Hkv, n);
    a.status = nsa_tensor_dense(r.status, 0, 1, 2);
}

static void set_lengths(Run &r, const std::vector<int32_t> &tk0, const std::vector<int32_t> &tq)
{
    std::vector<int32_t> cu(tq.size() + 1, 0);
    for (size_t b = 0; b < tq.size(); b++) cu[b + 1] = cu[b] + tq[b];
    OK(nsa_buffer_write(r.cuq, 0, cu.data(), cu.size() * 4));
    OK(nsa_buffer_write(r.csl, 0, tk0.data(), tk0.size() * 4));
}

struct Out {
    std::vector<unsigned char> o, lse[3], sel;
    int32_t status[2];
};
static void poison(Run &r)
{
    OK(nsa_buffer_fill(r.o, 0, 0xFF, r.o_bytes));
    for (int b = 0; b < 3; b++) OK(nsa_buffer_fill(r.lse[b], 0, 0xFF, r.lse_bytes));
    OK(nsa_buffer_fill(r.sel, 0, 0xFF, r.sel_bytes));
    OK(nsa_buffer_fill(r.status, 0, 0xFF, 8));
}
static Out read_out(Run &r)
{
    Out x;
    x.o.resize(r.o_bytes);
    OK(nsa_buffer_read(r.o, 0, x.o.data(), r.o_bytes));
    for (int b = 0; b < 3; b++) {
        x.lse[b].resize(r.lse_bytes);
        OK(nsa_buffer_read(r.lse[b], 0, x.lse[b].data(), r.lse_bytes));
    }
    x.sel.resize(r.sel_bytes);
    OK(nsa_buffer_read(r.sel, 0, x.sel.data(), r.sel_bytes));
    OK(nsa_buffer_read(r.status, 0, x.status, 8));
    return x;
}
static bool same(const Out &a, const Out &b)
{
    bool s = a.o == b.o && a.sel == b.sel && memcmp(a.status, b.status, 8) == 0;
    for (int i = 0; i < 3; i++) s = s && a.lse[i] == b.lse[i];
    return s;
}

static cudaGraphExec_t capture(Run &r, cudaStream_t st)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUOK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    const nsa_status s = nsa_decode(r.plan, &r.a, r.ws);
    cudaGraph_t tmp;
    const cudaError_t e = cudaStreamEndCapture(st, &tmp);
    CHECK(s == NSA_SUCCESS, "nsa_decode under capture: %s", nsa_status_string(s));
    CHECK(e == cudaSuccess, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
    g = tmp;
    CUOK(cudaGraphInstantiate(&ge, g, 0));
    CUOK(cudaGraphDestroy(g));
    return ge;
}

static int timing(nsa_context *ctx, cudaStream_t st)
{
    nsa_config cfg;
    OK(nsa_config_init(&cfg)); /* the paper's shape, bf16, MEAN */
    const int64_t ctxlen = 65536;
    nsa_decode_limits lim = {};
    lim.batch = 1;
    lim.max_step_tokens = 1;
    lim.max_total_tokens = 1;
    lim.max_context = ctxlen + 1;
    lim.page_size = 64;
    lim.max_pages = (ctxlen + 1 + 63) / 64;
    lim.num_pages = lim.max_pages;
    lim.cmp_page_size = 64;
    lim.max_cmp_pages = ((ctxlen + 1 - 32) / 16 + 1 + 63) / 64;
    lim.num_cmp_pages = lim.max_cmp_pages;
    Run r;
    make(r, ctx, cfg, lim);
    set_lengths(r, {(int32_t)ctxlen}, {1});
    char kern[160] = "";
    nsa_plan_stage_kernel(r.plan, 1, kern, sizeof kern); /* stage 1: decode_attn */
    OK(nsa_decode(r.plan, &r.a, r.ws));
    OK(nsa_decode_check(r.plan));
    cudaGraphExec_t ge = capture(r, st);
    for (int i = 0; i < 5; i++) CUOK(cudaGraphLaunch(ge, st));
    cudaEvent_t e0, e1;
    CUOK(cudaEventCreate(&e0));
    CUOK(cudaEventCreate(&e1));
    const int iters = 50;
    CUOK(cudaEventRecord(e0, st));
    for (int i = 0; i < iters; i++) CUOK(cudaGraphLaunch(ge, st));
    CUOK(cudaEventRecord(e1, st));
    CUOK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CUOK(cudaEventElapsedTime(&ms, e0, e1));
    OK(nsa_decode_check(r.plan));
    printf("decode-graph timing: batch 1, TK0 %lld, TQ 1, Hq 64 Hkv 4 Dqk 192 Dv 128 l 32 d 16 l_s 64 n 16 w 512 "
           "bf16: %.3f ms per step (graph replay, mean of %d) [%s]\n",
           (long long)ctxlen, ms / iters, iters, kern);
    return 0;
}

int main(int argc, char **argv)
{
    cudaStream_t st;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
        printf("decode-graph: SKIPPED (no CUDA device)\n");
        return 77;
    }
    nsa_context *ctx = NULL;
    if (nsa_context_create_with_stream("cuda", 0, st, &ctx) != NSA_SUCCESS) {
        printf("decode-graph: SKIPPED (no cuda context: %s)\n", nsa_last_error());
        return 77;
    }
    if (argc > 1 && strcmp(argv[1], "time") == 0) return timing(ctx, st);

    nsa_config cfg;
    OK(nsa_config_init(&cfg));
    cfg.num_q_heads = 16;
    cfg.num_kv_heads = 2;
    cfg.head_dim_qk = 64;
    cfg.head_dim_v = 64;
    cfg.num_selected = 4;
    cfg.window = 96;
    nsa_decode_limits lim = {};
    lim.batch = 3;
    lim.max_step_tokens = 4;
    lim.max_total_tokens = 8;
    lim.max_context = 2048;
    lim.page_size = 16;
    lim.max_pages = 2048 / 16;
    lim.num_pages = 3 * lim.max_pages;
    lim.cmp_page_size = 8;
    lim.max_cmp_pages = ((2048 - 32) / 16 + 1 + 7) / 8;
    lim.num_cmp_pages = 3 * lim.max_cmp_pages;
    Run r;
    make(r, ctx, cfg, lim);

    /* 1. eager, then captured and replayed twice */
    set_lengths(r, {1500, 37, 700}, {3, 1, 4});
    poison(r);
    OK(nsa_decode(r.plan, &r.a, r.ws));
    OK(nsa_decode_check(r.plan));
    const Out ref = read_out(r);
    CHECK(ref.status[0] == 0 && ref.status[1] == -1, "status (%d, %d)", ref.status[0], ref.status[1]);
    cudaGraphExec_t ge = capture(r, st);
    for (int rep = 0; rep < 2; rep++) {
        poison(r);
        CUOK(cudaGraphLaunch(ge, st));
        OK(nsa_decode_check(r.plan));
        CHECK(same(read_out(r), ref), "replay %d differs from the eager step", rep);
    }
    printf("decode-graph: 2 replays bitwise equal to the eager step\n");

    /* 2. new lengths on the device: the replay equals the eager step of those lengths */
    set_lengths(r, {1503, 38, 0}, {1, 4, 2});
    poison(r);
    CUOK(cudaGraphLaunch(ge, st));
    OK(nsa_decode_check(r.plan));
    const Out g2 = read_out(r);
    poison(r);
    OK(nsa_decode(r.plan, &r.a, r.ws));
    OK(nsa_decode_check(r.plan));
    CHECK(same(read_out(r), g2), "replay with new lengths differs from the eager step");
    CHECK(memcmp(g2.o.data(), ref.o.data(), 64) != 0, "new lengths gave the old rows");
    printf("decode-graph: replay with new device lengths bitwise equal to the eager step\n");

    /* 3. a bad page-table entry: nothing written, the status names sequence 1 */
    const int32_t bad = -1, good = r.table[1 * lim.max_pages + 0];
    OK(nsa_buffer_write(r.bt, (size_t)(1 * lim.max_pages) * 4, &bad, 4));
    poison(r);
    CUOK(cudaGraphLaunch(ge, st));
    const nsa_status s = nsa_decode_check(r.plan);
    CHECK(s == NSA_ERR_INVALID_VALUE, "nsa_decode_check after a bad table: %s", nsa_status_string(s));
    CHECK(strstr(nsa_last_error(), "block_table[1][0] = -1"), "message '%s'", nsa_last_error());
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nsa_last_error());
    const Out bo = read_out(r);
    CHECK(bo.status[0] == NSA_ERR_INVALID_VALUE && bo.status[1] == 1, "status (%d, %d)", bo.status[0], bo.status[1]);
    for (size_t i = 0; i < bo.o.size(); i++) CHECK(bo.o[i] == 0xFF, "the refused replay wrote o byte %zu", i);
    OK(nsa_buffer_write(r.bt, (size_t)(1 * lim.max_pages) * 4, &good, 4));
    CUOK(cudaGraphLaunch(ge, st));
    OK(nsa_decode_check(r.plan));
    printf("decode-graph: a bad table entry under replay writes nothing and is reported (%s)\n", msg);
    CUOK(cudaGraphExecDestroy(ge));
    printf("decode-graph: PASS\n");
    return 0;
}
