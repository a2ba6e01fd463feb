/* forward.c -- one NSA forward over two packed sequences, from host data to
 * host results, on whatever backend NSA_BACKEND names (else the best one
 * present). The README's "API in short" is this file. Build against an
 * installed libnsa:
 *     cc forward.c $(pkg-config --cflags --libs nsa) -o forward */
#include <nsa.h>
#include <stdio.h>
#include <stdlib.h>

/* on failure: the status, the library's message (it names the argument and why), cleanup */
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
    nsa_buffer *q = NULL, *kv = NULL, *gate = NULL, *o = NULL;
    float *host = NULL;
    uint16_t *bf16 = NULL;

    CHECK(nsa_context_create(NULL, -1, &ctx)); /* NSA_BACKEND / NSA_DEVICE, else the best */

    nsa_config cfg;
    CHECK(nsa_config_init(&cfg)); /* the paper's l, d, l_s, n, w; bf16 */
    cfg.num_q_heads = 16;         /* a small model: G = 16 / 2 = 8 */
    cfg.num_kv_heads = 2;
    cfg.head_dim_qk = 64;
    cfg.head_dim_v = 64;
    const int64_t cu_seqlens[] = {0, 1000, 1600}; /* two packed sequences: 1000 and 600 tokens */
    const int64_t T = cu_seqlens[2], Hq = cfg.num_q_heads, Hkv = cfg.num_kv_heads, D = 64;
    CHECK(nsa_plan_create(ctx, &cfg, cu_seqlens, 2, &plan));

    /* device buffers: q [T, Hq, D]; k and v [T, Hkv, D] side by side in one buffer;
     * three fp32 gates [T, Hq]; o [T, Hq, D] */
    const int64_t nq = T * Hq * D, nk = T * Hkv * D, ng = T * Hq;
    CHECK(nsa_buffer_alloc(ctx, (size_t)nq * 2, &q));
    CHECK(nsa_buffer_alloc(ctx, (size_t)(2 * nk) * 2, &kv));
    CHECK(nsa_buffer_alloc(ctx, (size_t)(3 * ng) * 4, &gate));
    CHECK(nsa_buffer_alloc(ctx, (size_t)nq * 2, &o));

    /* host data: uniform in [-1, 1) (gates in [0, 1)), rounded to bf16 with nsa_convert */
    host = malloc((size_t)nq * sizeof(float));
    bf16 = malloc((size_t)nq * sizeof(uint16_t));
    if (!host || !bf16) {
        fprintf(stderr, "out of host memory\n");
        goto done;
    }
    CHECK(nsa_random_uniform(1, 0, 0, nq, -1.f, 1.f, host));
    CHECK(nsa_convert(host, NSA_DTYPE_F32, bf16, NSA_DTYPE_BF16, nq));
    CHECK(nsa_buffer_write(q, 0, bf16, (size_t)nq * 2));
    CHECK(nsa_random_uniform(1, 1, 0, 2 * nk, -1.f, 1.f, host));
    CHECK(nsa_convert(host, NSA_DTYPE_F32, bf16, NSA_DTYPE_BF16, 2 * nk));
    CHECK(nsa_buffer_write(kv, 0, bf16, (size_t)(2 * nk) * 2));
    CHECK(nsa_random_uniform(1, 2, 0, 3 * ng, 0.f, 1.f, host));
    CHECK(nsa_buffer_write(gate, 0, host, (size_t)(3 * ng) * 4));

    nsa_forward_args a = {0};
    a.q = nsa_tensor_dense(q, 0, Hq, D);
    for (int b = 0; b < 3; b++) { /* cmp, slc, win: one k and one v for all three branches */
        a.k[b] = nsa_tensor_dense(kv, 0, Hkv, D);
        a.v[b] = nsa_tensor_dense(kv, nk, Hkv, D);
        a.gate[b] = nsa_tensor_dense(gate, b * ng, Hq, 1);
    }
    a.o = nsa_tensor_dense(o, 0, Hq, D);
    CHECK(nsa_forward(plan, &a, NULL)); /* NULL: the plan's own workspace */
    CHECK(nsa_context_synchronize(ctx));

    CHECK(nsa_buffer_read(o, 0, bf16, (size_t)nq * 2));
    CHECK(nsa_convert(bf16, NSA_DTYPE_BF16, host, NSA_DTYPE_F32, nq));
    double sum = 0;
    for (int64_t i = 0; i < nq; i++) sum += host[i];
    printf("%s on %s: o[0, 0, 0..3] = %.4f %.4f %.4f %.4f, mean %.6f\n", nsa_context_backend(ctx),
           nsa_context_device(ctx), host[0], host[1], host[2], host[3], sum / (double)nq);
    rc = 0;

done:
    free(host);
    free(bf16);
    nsa_buffer_free(q);
    nsa_buffer_free(kv);
    nsa_buffer_free(gate);
    nsa_buffer_free(o);
    nsa_plan_destroy(plan);
    nsa_context_destroy(ctx);
    return rc;
}
