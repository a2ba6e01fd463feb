/* opencl_queue.c -- libnsa on the caller's OpenCL objects: the program owns the
 * cl_context, the cl_command_queue and the cl_mem buffers; libnsa wraps them
 * (nsa_context_create_with_stream, nsa_buffer_wrap), queues its forward on that
 * queue, and the program reads the result with its own clEnqueueReadBuffer.
 * Exit 77 when no OpenCL device is present.
 *     cc opencl_queue.c $(pkg-config --cflags --libs nsa OpenCL) -o opencl_queue */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
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
#define CL_CHECK(call, what)                                                         \
    do {                                                                             \
        cl_int e_ = (call);                                                          \
        if (e_ != CL_SUCCESS) {                                                      \
            fprintf(stderr, "%s failed: OpenCL error %d\n", what, (int)e_);          \
            goto done;                                                               \
        }                                                                            \
    } while (0)

int main(void)
{
    int rc = 1;
    cl_platform_id platform;
    cl_device_id device;
    cl_uint np = 0;
    if (clGetPlatformIDs(1, &platform, &np) != CL_SUCCESS || np == 0 ||
        clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL) != CL_SUCCESS) {
        printf("no OpenCL device: skipped\n");
        return 77;
    }
    cl_int err;
    cl_context clctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (!clctx) {
        fprintf(stderr, "clCreateContext: %d\n", (int)err);
        return 1;
    }
    cl_command_queue queue = clCreateCommandQueue(clctx, device, 0, &err);
    cl_mem mem[4] = {NULL, NULL, NULL, NULL};
    nsa_context *ctx = NULL;
    nsa_plan *plan = NULL;
    nsa_buffer *q = NULL, *kv = NULL, *gate = NULL, *o = NULL;
    float *host = NULL;
    CL_CHECK(err, "clCreateCommandQueue");

    /* the caller's queue: its context and device are used */
    nsa_status s = nsa_context_create_with_stream("opencl", 0, queue, &ctx);
    if (s == NSA_ERR_BACKEND_UNAVAILABLE) {
        printf("libnsa's opencl backend is not available (%s): skipped\n", nsa_last_error());
        rc = 77;
        goto done;
    }
    CHECK(s);
    nsa_config cfg;
    CHECK(nsa_config_init(&cfg));
    cfg.num_q_heads = 8;
    cfg.num_kv_heads = 1;
    cfg.head_dim_qk = 32;
    cfg.head_dim_v = 32;
    cfg.dtype = NSA_DTYPE_F32;
    const int64_t cu_seqlens[] = {0, 300, 800};
    const int64_t T = 800, Hq = 8, Hkv = 1, D = 32;
    CHECK(nsa_plan_create(ctx, &cfg, cu_seqlens, 2, &plan));

    const int64_t nq = T * Hq * D, nk = T * Hkv * D, ng = T * Hq;
    const size_t bytes[4] = {(size_t)nq * 4, (size_t)(2 * nk) * 4, (size_t)(3 * ng) * 4, (size_t)nq * 4};
    for (int i = 0; i < 4; i++) {
        mem[i] = clCreateBuffer(clctx, CL_MEM_READ_WRITE, bytes[i], NULL, &err);
        CL_CHECK(err, "clCreateBuffer");
    }
    host = malloc(bytes[0] > bytes[2] ? bytes[0] : bytes[2]);
    if (!host) goto done;
    /* inputs written with the caller's own queue */
    CHECK(nsa_random_uniform(3, 0, 0, nq, -1.f, 1.f, host));
    CL_CHECK(clEnqueueWriteBuffer(queue, mem[0], CL_TRUE, 0, bytes[0], host, 0, NULL, NULL), "write q");
    CHECK(nsa_random_uniform(3, 1, 0, 2 * nk, -1.f, 1.f, host));
    CL_CHECK(clEnqueueWriteBuffer(queue, mem[1], CL_TRUE, 0, bytes[1], host, 0, NULL, NULL), "write k, v");
    CHECK(nsa_random_uniform(3, 2, 0, 3 * ng, 0.f, 1.f, host));
    CL_CHECK(clEnqueueWriteBuffer(queue, mem[2], CL_TRUE, 0, bytes[2], host, 0, NULL, NULL), "write gates");

    CHECK(nsa_buffer_wrap(ctx, mem[0], 0, bytes[0], &q));
    CHECK(nsa_buffer_wrap(ctx, mem[1], 0, bytes[1], &kv));
    CHECK(nsa_buffer_wrap(ctx, mem[2], 0, bytes[2], &gate));
    CHECK(nsa_buffer_wrap(ctx, mem[3], 0, bytes[3], &o));
    nsa_forward_args a = {0};
    a.q = nsa_tensor_dense(q, 0, Hq, D);
    for (int b = 0; b < 3; b++) {
        a.k[b] = nsa_tensor_dense(kv, 0, Hkv, D);
        a.v[b] = nsa_tensor_dense(kv, nk, Hkv, D);
        a.gate[b] = nsa_tensor_dense(gate, b * ng, Hq, 1);
    }
    a.o = nsa_tensor_dense(o, 0, Hq, D);
    CHECK(nsa_forward(plan, &a, NULL)); /* queued on `queue` */
    /* an in-order queue: this read waits for the forward */
    CL_CHECK(clEnqueueReadBuffer(queue, mem[3], CL_TRUE, 0, bytes[3], host, 0, NULL, NULL), "read o");
    double sum = 0;
    for (int64_t i = 0; i < nq; i++) sum += host[i];
    printf("opencl on %s, the caller's queue: o[0, 0, 0..1] = %.5f %.5f, mean %.6f\n", nsa_context_device(ctx),
           host[0], host[1], sum / (double)nq);
    rc = 0;

done:
    free(host);
    nsa_buffer_free(q); /* wrapped: the cl_mem stays the caller's */
    nsa_buffer_free(kv);
    nsa_buffer_free(gate);
    nsa_buffer_free(o);
    nsa_plan_destroy(plan);
    nsa_context_destroy(ctx);
    for (int i = 0; i < 4; i++)
        if (mem[i]) clReleaseMemObject(mem[i]);
    if (queue) clReleaseCommandQueue(queue);
    clReleaseContext(clctx);
    return rc;
}
