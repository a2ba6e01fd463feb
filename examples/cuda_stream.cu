/* cuda_stream.cu -- libnsa on the caller's CUDA memory and stream: the program
 * cudaMallocs the tensors and owns a stream; libnsa wraps the device pointers
 * (nsa_buffer_wrap), queues its forward on that stream without synchronizing
 * (nsa_context_create_with_stream), and the program's own kernel and copy
 * queued after it on the same stream see the result. The same holds for HIP
 * with hipMalloc / hipStream_t and the "hip" backend. Exit 77 without a CUDA
 * device.
 *     nvcc cuda_stream.cu $(pkg-config --cflags --libs nsa) -o cuda_stream */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nsa.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        nsa_status s_ = (call);                                                      \
        if (s_ != NSA_SUCCESS) {                                                     \
            fprintf(stderr, "%s: %s: %s\n", #call, nsa_status_string(s_), nsa_last_error()); \
            goto done;                                                               \
        }                                                                            \
    } while (0)
#define CU(call)                                                                     \
    do {                                                                             \
        cudaError_t e_ = (call);                                                     \
        if (e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));              \
            goto done;                                                               \
        }                                                                            \
    } while (0)

/* the caller's work after the forward, on the same stream: o (bf16) summed into one float */
__global__ void sum_bf16(const __nv_bfloat16 *x, long long n, float *out)
{
    float acc = 0.f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        acc += __bfloat162float(x[i]);
    atomicAdd(out, acc);
}

int main(void)
{
    int rc = 1, ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const long long T = 2048, Hq = 16, Hkv = 1, D = 128;
    const long long nq = T * Hq * D, nk = T * Hkv * D, ng = T * Hq;
    cudaStream_t stream = nullptr;
    void *q = nullptr, *kv = nullptr, *gate = nullptr, *o = nullptr;
    float *dsum = nullptr, sum = 0.f, *host = nullptr;
    unsigned short *bf = nullptr;
    nsa_context *ctx = nullptr;
    nsa_plan *plan = nullptr;
    nsa_buffer *bq = nullptr, *bkv = nullptr, *bg = nullptr, *bo = nullptr;
    nsa_config cfg;
    const int64_t cu_seqlens[] = {0, T};
    nsa_forward_args a = {};

    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CU(cudaMalloc(&q, nq * 2));
    CU(cudaMalloc(&kv, 2 * nk * 2));
    CU(cudaMalloc(&gate, 3 * ng * 4));
    CU(cudaMalloc(&o, nq * 2));
    CU(cudaMalloc((void **)&dsum, sizeof(float)));
    host = (float *)malloc(nq * sizeof(float));
    bf = (unsigned short *)malloc(nq * 2);
    if (!host || !bf) goto done;
    /* inputs: uniform values rounded to bf16 (gates fp32 in [0, 1)), copied with the caller's stream */
    CHECK(nsa_random_uniform(5, 0, 0, nq, -1.f, 1.f, host));
    CHECK(nsa_convert(host, NSA_DTYPE_F32, bf, NSA_DTYPE_BF16, nq));
    CU(cudaMemcpyAsync(q, bf, nq * 2, cudaMemcpyHostToDevice, stream));
    CU(cudaStreamSynchronize(stream));
    CHECK(nsa_random_uniform(5, 1, 0, 2 * nk, -1.f, 1.f, host));
    CHECK(nsa_convert(host, NSA_DTYPE_F32, bf, NSA_DTYPE_BF16, 2 * nk));
    CU(cudaMemcpyAsync(kv, bf, 2 * nk * 2, cudaMemcpyHostToDevice, stream));
    CU(cudaStreamSynchronize(stream));
    CHECK(nsa_random_uniform(5, 2, 0, 3 * ng, 0.f, 1.f, host));
    CU(cudaMemcpyAsync(gate, host, 3 * ng * 4, cudaMemcpyHostToDevice, stream));
    CU(cudaMemsetAsync(dsum, 0, sizeof(float), stream));
    CU(cudaStreamSynchronize(stream));

    CHECK(nsa_context_create_with_stream("cuda", 0, stream, &ctx));
    CHECK(nsa_config_init(&cfg));
    cfg.num_q_heads = Hq;
    cfg.num_kv_heads = Hkv;
    cfg.head_dim_qk = D;
    cfg.head_dim_v = D;
    CHECK(nsa_plan_create(ctx, &cfg, cu_seqlens, 1, &plan));
    CHECK(nsa_buffer_wrap(ctx, q, 0, nq * 2, &bq));
    CHECK(nsa_buffer_wrap(ctx, kv, 0, 2 * nk * 2, &bkv));
    CHECK(nsa_buffer_wrap(ctx, gate, 0, 3 * ng * 4, &bg));
    CHECK(nsa_buffer_wrap(ctx, o, 0, nq * 2, &bo));
    a.q = nsa_tensor_dense(bq, 0, Hq, D);
    for (int b = 0; b < 3; b++) {
        a.k[b] = nsa_tensor_dense(bkv, 0, Hkv, D);
        a.v[b] = nsa_tensor_dense(bkv, nk, Hkv, D);
        a.gate[b] = nsa_tensor_dense(bg, b * ng, Hq, 1);
    }
    a.o = nsa_tensor_dense(bo, 0, Hq, D);
    /* the first forward allocates the plan's workspace; from then on a forward only queues work */
    CHECK(nsa_forward(plan, &a, nullptr));
    sum_bf16<<<64, 256, 0, stream>>>((const __nv_bfloat16 *)o, nq, dsum); /* after the forward, same stream */
    CU(cudaGetLastError());
    CU(cudaMemcpyAsync(&sum, dsum, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CU(cudaStreamSynchronize(stream));
    printf("cuda on %s, the caller's stream: mean of o = %.6f\n", nsa_context_device(ctx), sum / (double)nq);
    rc = 0;

done:
    nsa_buffer_free(bq); /* wrapped: the memory stays the caller's */
    nsa_buffer_free(bkv);
    nsa_buffer_free(bg);
    nsa_buffer_free(bo);
    nsa_plan_destroy(plan);
    nsa_context_destroy(ctx); /* does not destroy the caller's stream */
    cudaFree(q);
    cudaFree(kv);
    cudaFree(gate);
    cudaFree(o);
    cudaFree(dsum);
    if (stream) cudaStreamDestroy(stream);
    free(host);
    free(bf);
    return rc;
}
