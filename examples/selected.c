/* selected.c -- a packed batch of three sequences (one of them empty) in f32,
 * with the optional outputs: the per-branch log-sum-exps and the blocks the
 * library selected. A second forward is then given those blocks as
 * block_indices (the way a training step replays a selection) and must
 * reproduce o bitwise, since the forward is deterministic.
 *     cc selected.c $(pkg-config --cflags --libs nsa) -o selected */
#include <nsa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        nsa_status s_ = (call);                                                      \
        if (s_ != NSA_SUCCESS) {                                                     \
            fprintf(stderr, "%s: %s: %s\n", #call, nsa_status_string(s_), nsa_last_error()); \
            goto done;                                                               \
        }                                                                            \
    } while (0)

int main(void)
{
    int rc = 1;
    nsa_context *ctx = NULL;
    nsa_plan *plan = NULL;
    nsa_buffer *in = NULL, *out = NULL, *ws = NULL;
    float *host = NULL, *o1 = NULL, *o2 = NULL;
    int32_t *sel = NULL;

    CHECK(nsa_context_create(NULL, -1, &ctx));
    nsa_config cfg;
    CHECK(nsa_config_init(&cfg));
    cfg.num_q_heads = 8;
    cfg.num_kv_heads = 2;
    cfg.head_dim_qk = 48; /* Dqk != Dv, and not a power of two */
    cfg.head_dim_v = 32;
    cfg.dtype = NSA_DTYPE_F32;
    const int64_t cu_seqlens[] = {0, 700, 700, 2200}; /* 700, 0 and 1500 tokens */
    const int64_t B = 3, T = cu_seqlens[B], Hq = 8, Hkv = 2, Dqk = 48, Dv = 32, n = cfg.num_selected;
    CHECK(nsa_plan_create(ctx, &cfg, cu_seqlens, B, &plan));
    nsa_plan_info info;
    CHECK(nsa_plan_get_info(plan, &info));
    printf("plan: %lld tokens, %lld compressed blocks, stages: %s\n", (long long)info.total_tokens,
           (long long)info.total_cmp_blocks, info.stages);

    /* inputs in one buffer at element offsets: q, k, v, gates */
    const int64_t nq = T * Hq * Dqk, nk = T * Hkv * Dqk, nv = T * Hkv * Dv, ng = T * Hq;
    const int64_t q0 = 0, k0 = q0 + nq, v0 = k0 + nk, g0 = v0 + nv, nin = g0 + 3 * ng;
    /* outputs: o twice, three LSEs; the selection in its own int32 region */
    const int64_t no = T * Hq * Dv, o1_0 = 0, o2_0 = no, l0 = 2 * no, nout = l0 + 3 * ng;
    const int64_t nsel = T * Hkv * n;
    CHECK(nsa_buffer_alloc(ctx, (size_t)nin * 4, &in));
    CHECK(nsa_buffer_alloc(ctx, (size_t)nout * 4 + (size_t)nsel * 4, &out));
    CHECK(nsa_buffer_alloc(ctx, info.workspace_bytes, &ws)); /* a caller workspace: forward then allocates nothing */
    host = malloc((size_t)nin * 4);
    o1 = malloc((size_t)no * 4);
    o2 = malloc((size_t)no * 4);
    sel = malloc((size_t)nsel * 4);
    if (!host || !o1 || !o2 || !sel) {
        fprintf(stderr, "out of host memory\n");
        goto done;
    }
    CHECK(nsa_random_uniform(7, 0, 0, g0, -1.f, 1.f, host));
    CHECK(nsa_random_uniform(7, 1, 0, 3 * ng, 0.f, 1.f, host + g0));
    CHECK(nsa_buffer_write(in, 0, host, (size_t)nin * 4));

    nsa_forward_args a = {0};
    a.q = nsa_tensor_dense(in, q0, Hq, Dqk);
    for (int b = 0; b < 3; b++) {
        a.k[b] = nsa_tensor_dense(in, k0, Hkv, Dqk);
        a.v[b] = nsa_tensor_dense(in, v0, Hkv, Dv);
        a.gate[b] = nsa_tensor_dense(in, g0 + b * ng, Hq, 1);
        a.lse[b] = nsa_tensor_dense(out, l0 + b * ng, Hq, 1);
    }
    a.o = nsa_tensor_dense(out, o1_0, Hq, Dv);
    a.selected = nsa_tensor_dense(out, nout, Hkv, n); /* int32 [T, Hkv, n] */
    CHECK(nsa_forward(plan, &a, ws));
    CHECK(nsa_context_synchronize(ctx));
    CHECK(nsa_buffer_read(out, (size_t)o1_0 * 4, o1, (size_t)no * 4));
    CHECK(nsa_buffer_read(out, (size_t)nout * 4, sel, (size_t)nsel * 4));
    printf("last token, kv head 0, selected blocks:");
    for (int64_t j = 0; j < n; j++) printf(" %d", sel[((T - 1) * Hkv + 0) * n + j]);
    printf("\n");

    /* the same forward with the selection given: no scoring or top-n stage runs */
    nsa_forward_args b = a;
    b.selected = (nsa_tensor){0};
    b.block_indices = a.selected;
    b.o = nsa_tensor_dense(out, o2_0, Hq, Dv);
    CHECK(nsa_forward(plan, &b, ws));
    CHECK(nsa_context_synchronize(ctx));
    CHECK(nsa_buffer_read(out, (size_t)o2_0 * 4, o2, (size_t)no * 4));
    if (memcmp(o1, o2, (size_t)no * 4) != 0) {
        fprintf(stderr, "the replayed selection gave another o\n");
        goto done;
    }
    printf("%s: o with the given blocks is bitwise the o of the selecting forward\n", nsa_context_backend(ctx));
    rc = 0;

done:
    free(host);
    free(o1);
    free(o2);
    free(sel);
    nsa_buffer_free(in);
    nsa_buffer_free(out);
    nsa_buffer_free(ws);
    nsa_plan_destroy(plan);
    nsa_context_destroy(ctx);
    return rc;
}
