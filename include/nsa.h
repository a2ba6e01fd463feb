/*
 * libnsa: Native Sparse Attention (Yuan et al., ACL 2025) for CPUs and GPUs.
 *
 * One flat C API. Every function returns an nsa_status (or a plain value for
 * pure queries); on failure the calling thread's last-error message
 * (nsa_last_error()) names the offending argument and says why.
 *
 * Flow:
 *   nsa_context_create()      pick a backend (cpu | cuda | hip | opencl) and a device
 *   nsa_plan_create()         validate a config and a packed batch shape once; the core
 *                             computes every block count, the work decomposition and
 *                             the workspace size
 *   nsa_plan_create_varlen()  (0.6) the same with fewer queries than keys per sequence:
 *                             chunked prefill, a context-parallel shard
 *   nsa_buffer_alloc/wrap()   device memory: owned by the library or by the caller
 *   nsa_forward()             run the three branches and the gated sum
 *   nsa_decode_plan_create()  (0.5) a decode plan: capacities of paged caches and steps
 *   nsa_decode()              one decode / chunked-prefill step over the caller's caches
 *
 * The function computed is defined exactly by docs/nsa-semantics (see README):
 * compression (MEAN | LINEAR | EXTERNAL), compressed attention, block importance
 * and top-n selection, selected attention, sliding-window attention, gating.
 *
 * Tensor conventions (FlashAttention's): a batch is B sequences packed along the
 * token axis and described by cu_seqlens (B + 1 non-decreasing offsets starting at
 * 0). A tensor is a buffer plus an element offset and element strides; the last
 * dimension is always contiguous. All sizes, offsets and strides are 64-bit.
 * The default softmax scale is 1/sqrt(Dqk). Log-sum-exp outputs are fp32, natural
 * log, of the scaled logits; in an f64 call gates, LSEs and dgate are f64 instead
 * (the "float type" of the call: f64 for NSA_DTYPE_F64, fp32 otherwise).
 *
 * Thread safety: distinct contexts may be used from distinct threads. One context
 * (and the plans and buffers made from it) must not be used by two threads at once.
 *
 * Growing structs (the ABI rule): nsa_config, nsa_forward_args,
 * nsa_backward_args, nsa_plan_info, nsa_backend_info, nsa_decode_limits and
 * nsa_decode_args gain fields only at
 * their end (nsa_config.flags and nsa_plan_info.backend_bytes were added in 0.3). Every function that takes
 * one is a macro here that passes the struct's size as the caller's header
 * defines it to a *_sized entry point (nsa_plan_create -> nsa_plan_create_sized
 * with sizeof(nsa_config)), and the library reads or writes exactly that many
 * bytes. So a program built against an older header keeps working with a newer
 * library: the fields it does not know take their defaults (nsa_config_init's
 * values; zero elsewhere). A program built against a newer header than the
 * library gets NSA_ERR_VERSION_MISMATCH, naming both sizes, if it sets any field
 * the library does not have (those bytes must be zero), and works otherwise.
 * The plain functions of the first layout (nsa_plan_create, ...) stay exported
 * for binaries built against version 0.1 headers. nsa_tensor never changes.
 *
 * Training: a plan made with NSA_CONFIG_TRAINING in cfg.flags also runs
 * nsa_backward (the gradients of docs/nsa-semantics.md section 9) from what the
 * forward returned (the per-branch LSEs and the selected indices) and dO.
 * Every backend has it (cpu: fp64 arithmetic; cuda: tensor-core kernels for f16
 * and bf16 on every device class, fp32 kernels otherwise; hip, opencl: portable
 * fp32 kernels); a backend without it refuses a training plan with
 * NSA_ERR_UNSUPPORTED.
 *
 * Decoding (added in 0.5): a plan made with nsa_decode_plan_create runs
 * nsa_decode steps over caller-owned paged K/V caches (docs/nsa-semantics.md
 * section 10): each step appends the new tokens of every sequence of a batch
 * and returns their rows of the forward. Backends: cpu (the fp64 reference),
 * cuda (f32, f16, bf16; the step checked and run on the device, CUDA-graph
 * capturable), hip (f32, f16, bf16; the same device step, portable kernels)
 * and opencl (portable fp32 kernels).
 */
#ifndef NSA_H
#define NSA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define NSA_API __declspec(dllexport)
#elif defined(__GNUC__)
#define NSA_API __attribute__((visibility("default")))
#else
#define NSA_API
#endif

#define NSA_VERSION_MAJOR 0
#define NSA_VERSION_MINOR 6
#define NSA_VERSION_PATCH 0

/* ------------------------------------------------------------------ status */

/* Fixed values: they are part of the ABI and never renumbered. */
typedef enum nsa_status {
    NSA_SUCCESS = 0,
    NSA_ERR_NULL_POINTER = 1,        /* a required pointer argument is NULL */
    NSA_ERR_INVALID_VALUE = 2,       /* a scalar is out of range (sizes, enum values) */
    NSA_ERR_INVALID_CONFIG = 3,      /* config fields contradict each other (Hq % Hkv, d | l, ...) */
    NSA_ERR_INVALID_SHAPE = 4,       /* cu_seqlens or a tensor's extent is wrong */
    NSA_ERR_INVALID_STRIDE = 5,      /* a stride is negative, zero where it must not be, or overlaps */
    NSA_ERR_INVALID_DTYPE = 6,       /* unknown dtype, or dtype not allowed for this tensor */
    NSA_ERR_BUFFER_TOO_SMALL = 7,    /* a tensor or workspace reaches past the end of its buffer */
    NSA_ERR_MISSING_TENSOR = 8,      /* the config needs a tensor that was not given */
    NSA_ERR_OUT_OF_MEMORY = 9,       /* host or device allocation failed */
    NSA_ERR_BACKEND_UNAVAILABLE = 10,/* unknown backend, or its runtime/device is missing */
    NSA_ERR_DEVICE_NOT_FOUND = 11,   /* device index out of range for the backend */
    NSA_ERR_UNSUPPORTED = 12,        /* the backend lacks this stage, dtype or config */
    NSA_ERR_VERSION_MISMATCH = 13,   /* a backend module was built for another API version */
    NSA_ERR_KERNEL_BUILD = 14,       /* run-time kernel compilation failed (log in message) */
    NSA_ERR_DEVICE = 15,             /* the vendor runtime reported an error */
    NSA_ERR_WRONG_CONTEXT = 16,      /* objects from different contexts were mixed */
    NSA_ERR_IO = 17,                 /* file input/output failed (tools, caches) */
    NSA_ERR_INTERNAL = 18            /* a bug in libnsa: please report it */
} nsa_status;

/* Name of a status ("NSA_ERR_INVALID_CONFIG"); never NULL. */
NSA_API const char *nsa_status_string(nsa_status status);

/* The calling thread's message for its most recent failure, or "" if the most
 * recent call succeeded. Valid until the thread's next libnsa call. */
NSA_API const char *nsa_last_error(void);

/* "0.6.0" */
NSA_API const char *nsa_version_string(void);

/* ------------------------------------------------------------------ types */

/* Fixed values: part of the ABI, never renumbered. */
typedef enum nsa_dtype {
    NSA_DTYPE_F32 = 0,
    NSA_DTYPE_F16 = 1,
    NSA_DTYPE_BF16 = 2,
    NSA_DTYPE_I32 = 3, /* block indices only */
    /* (added in 0.4) IEEE binary64. Backends: cpu only (fp64 end to end: an f64
     * call's o is its fp64 arithmetic rounded once, and its gradients are those of
     * the fp64 reference; the dtype gradient checks such as torch's gradcheck
     * need). In an f64 call the gates, LSEs and dgate are f64 too (nsa_forward_args,
     * nsa_backward_args). cuda, hip and opencl refuse it in nsa_plan_create with
     * NSA_ERR_UNSUPPORTED, the message naming the backend and the dtype. */
    NSA_DTYPE_F64 = 4
} nsa_dtype;

/* Bytes per element, or 0 for an unknown dtype. */
NSA_API size_t nsa_dtype_size(nsa_dtype dtype);
NSA_API const char *nsa_dtype_name(nsa_dtype dtype); /* "f32", "f16", "bf16", "i32", "f64" */

typedef enum nsa_compress_mode {
    NSA_COMPRESS_MEAN = 0,     /* average of the l rows of a block */
    NSA_COMPRESS_LINEAR = 1,   /* sum_j (k[j] + pe[g,j]) @ W[g,j], W [Hkv, l, D, D] */
    NSA_COMPRESS_EXTERNAL = 2  /* the caller passes kc [Nc, Hkv, Dqk] and vc [Nc, Hkv, Dv] */
} nsa_compress_mode;
/* kc and vc are of cfg.dtype in every mode: MEAN and LINEAR accumulate in fp32 or
 * wider (f64: in fp64) and round each element once to cfg.dtype (nearest even)
 * before it is used. */

/* Every parameter of the semantics. Fill with nsa_config_init() (the paper's
 * defaults) and change what differs. Sizes are int64_t; flags are int. */
typedef struct nsa_config {
    int64_t num_q_heads;     /* Hq >= 1 */
    int64_t num_kv_heads;    /* Hkv >= 1, Hq % Hkv == 0, G = Hq / Hkv */
    int64_t head_dim_qk;     /* Dqk >= 1 */
    int64_t head_dim_v;      /* Dv >= 1 */
    int64_t cmp_block;       /* l >= 1: compression block length */
    int64_t cmp_stride;      /* d >= 1, d divides l */
    int64_t slc_block;       /* l_s >= l, d divides l_s */
    int64_t num_selected;    /* n >= 0; 0 turns the selected branch off */
    int64_t num_init;        /* n_init >= 0: forced initial blocks */
    int64_t num_local;       /* n_local >= 0: forced local blocks; n >= n_init + n_local when n > 0 */
    int64_t window;          /* w >= 0; 0 turns the window branch off */
    float scale;             /* softmax scale, finite and >= 0; 0 means 1/sqrt(Dqk) */
    nsa_compress_mode compress;
    nsa_dtype dtype;         /* F32, F16, BF16 or (cpu only) F64: q, k, v, kc, vc, W, pe
                              * and o; F64 also makes gates, LSEs and dgate f64 */
    /* (added in 0.3) NSA_CONFIG_* bits, 0 by default */
    uint64_t flags;
} nsa_config;

/* nsa_config.flags */
#define NSA_CONFIG_TRAINING (UINT64_C(1) << 0) /* the plan will also run nsa_backward: the backend
                                                * must have it (else nsa_plan_create says
                                                * NSA_ERR_UNSUPPORTED) and the plan's workspace
                                                * covers both passes */

/* Paper defaults: Hq=64 Hkv=4 Dqk=192 Dv=128 l=32 d=16 l_s=64 n=16 n_init=1
 * n_local=2 w=512 scale=0 (1/sqrt(Dqk)) MEAN bf16, flags 0 (forward only). */
NSA_API nsa_status nsa_config_init_sized(nsa_config *cfg, size_t cfg_size);
NSA_API nsa_status nsa_config_init(nsa_config *cfg);
#define nsa_config_init(cfg) nsa_config_init_sized((cfg), sizeof(nsa_config))

/* Checks a config on its own (no batch); the message names the first bad field. */
NSA_API nsa_status nsa_config_validate_sized(const nsa_config *cfg, size_t cfg_size);
NSA_API nsa_status nsa_config_validate(const nsa_config *cfg);
#define nsa_config_validate(cfg) nsa_config_validate_sized((cfg), sizeof(nsa_config))

/* ------------------------------------------------------------------ backends */

typedef struct nsa_context nsa_context;
typedef struct nsa_buffer nsa_buffer;
typedef struct nsa_plan nsa_plan;

#define NSA_NAME_MAX 256
#define NSA_REASON_MAX 512

typedef struct nsa_backend_info {
    char name[32];              /* "cpu", "cuda", "hip", "opencl" */
    int available;              /* 1 when the runtime and at least one device are present */
    int device_count;
    char reason[NSA_REASON_MAX];/* why not available, or where it was loaded from */
} nsa_backend_info;

/* Lists every backend libnsa knows of, loaded or not. Pass infos = NULL to get
 * the count only. *count receives the number of known backends; at most
 * capacity entries are written. */
NSA_API nsa_status nsa_backend_list_sized(nsa_backend_info *infos, size_t info_size, int capacity, int *count);
NSA_API nsa_status nsa_backend_list(nsa_backend_info *infos, int capacity, int *count);
#define nsa_backend_list(infos, capacity, count) \
    nsa_backend_list_sized((infos), sizeof(nsa_backend_info), (capacity), (count))

/* Name of device `index` of backend `backend` ("NVIDIA H200", "pthreads x2"). */
NSA_API nsa_status nsa_device_name(const char *backend, int index, char *name, size_t size);

/* ------------------------------------------------------------------ contexts */

/* backend: "cpu", "cuda", "hip", "opencl", a comma list in order of preference,
 * or NULL (or "") to read NSA_BACKEND (unset: the best available of cuda, hip,
 * opencl, then cpu; an OpenCL backend whose device 0 is a CPU, such as PoCL,
 * ranks after cpu, which is faster on the same cores).
 * device: index, or -1 to read NSA_DEVICE (unset: 0). Explicit arguments win over
 * the environment. The listed backends are tried in order: one that is
 * unavailable, lacks the device, or fails to create its context is passed over
 * for the next. When none can be used the status is that of the first context
 * creation (or device lookup) that failed, else NSA_ERR_BACKEND_UNAVAILABLE (or
 * NSA_ERR_VERSION_MISMATCH for a module of another API version), with a message
 * that says why for each listed name and what every known backend's state is; a
 * single listed backend keeps its own status and message. Backend names are
 * 1-31 characters of a-z, 0-9 and _; a malformed one is named with what is
 * wrong with it. */
NSA_API nsa_status nsa_context_create(const char *backend, int device, nsa_context **out);

/* As nsa_context_create, but around a stream/queue the caller owns and keeps
 * alive: cudaStream_t (cuda), hipStream_t (hip), cl_command_queue (opencl; its
 * context and device are used). NULL means "create one". The cpu backend
 * ignores it. */
NSA_API nsa_status nsa_context_create_with_stream(const char *backend, int device,
                                                  void *native_stream, nsa_context **out);

/* Frees the context. Buffers and plans made from it must be freed first:
 * while any is alive this returns NSA_ERR_INVALID_VALUE and frees nothing.
 * NULL is accepted and ignored. */
NSA_API nsa_status nsa_context_destroy(nsa_context *ctx);

typedef enum nsa_device_kind {
    NSA_DEVICE_KIND_CPU = 0,   /* the cpu backend, or an OpenCL CPU device (PoCL, Intel CPU runtime) */
    NSA_DEVICE_KIND_GPU = 1,
    NSA_DEVICE_KIND_OTHER = 2  /* accelerators that are neither */
} nsa_device_kind;

/* What kind of device the context runs on (tools size sample problems by it). */
NSA_API nsa_status nsa_context_device_kind(const nsa_context *ctx, nsa_device_kind *kind);

NSA_API const char *nsa_context_backend(const nsa_context *ctx); /* "cuda" */
NSA_API const char *nsa_context_device(const nsa_context *ctx);  /* device name */

/* Waits until all work queued on the context's stream/queue has finished. */
NSA_API nsa_status nsa_context_synchronize(nsa_context *ctx);

/* ------------------------------------------------------------------ buffers */

/* Device memory owned by the library (zero-filled is NOT promised). */
NSA_API nsa_status nsa_buffer_alloc(nsa_context *ctx, size_t bytes, nsa_buffer **out);

/* Wraps memory the caller owns and frees: a host pointer (cpu), a device pointer
 * (cuda, hip) or a cl_mem (opencl). offset is in bytes from the handle; bytes is
 * the usable size from there. The buffer keeps no reference to the handle beyond
 * what the vendor API requires. */
NSA_API nsa_status nsa_buffer_wrap(nsa_context *ctx, void *handle, size_t offset, size_t bytes,
                                   nsa_buffer **out);

/* Copies between host memory and a buffer; blocking (returns when done). */
NSA_API nsa_status nsa_buffer_write(nsa_buffer *buf, size_t offset, const void *src, size_t bytes);
NSA_API nsa_status nsa_buffer_read(const nsa_buffer *buf, size_t offset, void *dst, size_t bytes);
/* Fills bytes with a repeated byte value (tests poison outputs with 0xFF = NaN). */
NSA_API nsa_status nsa_buffer_fill(nsa_buffer *buf, size_t offset, unsigned char value, size_t bytes);

NSA_API size_t nsa_buffer_size(const nsa_buffer *buf);

/* Frees a buffer (wrapped memory stays the caller's). NULL is ignored. */
NSA_API nsa_status nsa_buffer_free(nsa_buffer *buf);

/* ------------------------------------------------------------------ plans */

/* Builds a plan for one config and one packed batch shape on one context.
 * cu_seqlens: host array of batch + 1 offsets, cu_seqlens[0] == 0, non-decreasing,
 * at most 2^40 tokens in all (cu_seqlens[batch]); copied, so the caller may free it
 * after the call. Every count, table and workspace size is validated with checked
 * 64-bit arithmetic before anything is allocated: a size that overflows is
 * NSA_ERR_INVALID_SHAPE, never an attempt to allocate it. */
NSA_API nsa_status nsa_plan_create_sized(nsa_context *ctx, const nsa_config *cfg, size_t cfg_size,
                                         const int64_t *cu_seqlens, int64_t batch, nsa_plan **out);
NSA_API nsa_status nsa_plan_create(nsa_context *ctx, const nsa_config *cfg, const int64_t *cu_seqlens,
                                   int64_t batch, nsa_plan **out);
#define nsa_plan_create(ctx, cfg, cu_seqlens, batch, out) \
    nsa_plan_create_sized((ctx), (cfg), sizeof(nsa_config), (cu_seqlens), (batch), (out))

/* (added in 0.6) A plan whose sequences have fewer queries than keys
 * (docs/nsa-semantics.md section 11; FlashAttention's varlen convention with
 * cu_seqlens_q beside cu_seqlens_k and the causal mask aligned bottom-right):
 * sequence b has Tq_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] queries and Tk_b =
 * cu_seqlens_k[b+1] - cu_seqlens_k[b] >= Tq_b keys, and its queries are the last
 * Tq_b positions of its keys: row i of sequence b in q, gates, o, LSEs, selected,
 * block_indices, dout, dq and dgate is position Tk_b - Tq_b + i. k, v, dk and dv
 * have cu_seqlens_k[B] rows (nsa_plan_info.total_keys), kc, vc, dkc and dvc the
 * compressed rows of the keys (total_cmp_blocks). Each output row is the same row
 * of nsa_forward over the sequence's Tk_b tokens: the last Tq_b tokens of a
 * chunked prefill, or a context-parallel shard of rows [a, b) of a longer
 * sequence (Tk = b, Tq = b - a; the shard needs only the keys below b). Its
 * nsa_backward returns the shard's complete dq and dgate rows and its part of
 * the key-side gradients (dk, dv, dkc, dvc, dw_k, dw_v, dpe_k, dpe_v), which
 * summed over the shards of a sequence are the sequence's; with
 * NSA_BACKWARD_FLOAT_KEY_GRADS the parts come unrounded in the float type, for
 * that sum. cu_seqlens_k NULL means cu_seqlens_q (nsa_plan_create). Both arrays
 * are checked as nsa_plan_create checks cu_seqlens; Tq_b > Tk_b is
 * NSA_ERR_INVALID_SHAPE naming the sequence. Backends: cpu (each row bitwise
 * the whole forward's row) and opencl (within the parity tolerance of it: its
 * kernels tile rows together); cuda and hip refuse a plan with some Tq_b < Tk_b
 * (NSA_ERR_UNSUPPORTED). */
NSA_API nsa_status nsa_plan_create_varlen_sized(nsa_context *ctx, const nsa_config *cfg, size_t cfg_size,
                                                const int64_t *cu_seqlens_q, const int64_t *cu_seqlens_k,
                                                int64_t batch, nsa_plan **out);
#define nsa_plan_create_varlen(ctx, cfg, cu_seqlens_q, cu_seqlens_k, batch, out) \
    nsa_plan_create_varlen_sized((ctx), (cfg), sizeof(nsa_config), (cu_seqlens_q), (cu_seqlens_k), (batch), (out))
NSA_API nsa_status nsa_plan_destroy(nsa_plan *plan);

/* Shape facts computed by the planner. */
typedef struct nsa_plan_info {
    int64_t batch;           /* B */
    int64_t total_tokens;    /* cu_seqlens[B] */
    int64_t total_cmp_blocks;/* sum over sequences of Nc; rows of EXTERNAL kc/vc */
    int64_t max_cmp_blocks;  /* max Nc */
    int64_t max_slc_blocks;  /* max Ns */
    size_t workspace_bytes;  /* what nsa_forward (and, with NSA_CONFIG_TRAINING,
                              * nsa_backward) needs in its workspace buffer */
    int num_stages;          /* stages the forward runs (with caller-given block_indices
                              * it skips the selection stages listed here) */
    char stages[256];        /* their names, space separated ("compress cmp_attn ...") */
    /* added in 0.3: */
    size_t backend_bytes;    /* device memory the plan holds outside the workspace, from
                              * nsa_plan_create to nsa_plan_destroy: its tables (the
                              * sequences' offsets, each token's sequence) and what the
                              * backend allocated for its kernels (CUDA: tile lists, packed
                              * compressed rows; for training plans the selection's inverse
                              * map, the backward's partial sums and, in bf16, the f16
                              * copies of q, dO, K and V its keys kernels read (about
                              * T x Hq x (Dqk + Dv) x 2 bytes); OpenCL: LINEAR's
                              * staging buffers) */
    int num_bwd_stages;      /* stages nsa_backward runs (0 unless the plan was made with
                              * NSA_CONFIG_TRAINING) */
    char bwd_stages[128];    /* their names, space separated ("bwd_cmp_attn ... bwd_store") */
    /* added in 0.6: */
    int64_t total_keys;      /* rows of k, v, dk, dv: cu_seqlens_k[B] (nsa_plan_create_varlen),
                              * else total_tokens */
} nsa_plan_info;

NSA_API nsa_status nsa_plan_get_info_sized(const nsa_plan *plan, nsa_plan_info *info, size_t info_size);
NSA_API nsa_status nsa_plan_get_info(const nsa_plan *plan, nsa_plan_info *info);
#define nsa_plan_get_info(plan, info) nsa_plan_get_info_sized((plan), (info), sizeof(nsa_plan_info))

/* The kernel the plan runs for its stage `index` (0 <= index < num_stages, in
 * the order of nsa_plan_info.stages; then num_stages <= index < num_stages +
 * num_bwd_stages for the backward's stages, in the order of bwd_stages), as
 * the backend chose it when the plan was made from the device and the shape:
 * for example "attn_sm90[bn128,1cta,tma]" (cuda: kernel[tile]; docs/cuda.md
 * lists them). Backends without a choice report the stage's name. name
 * receives at most size bytes, NUL-terminated; NSA_ERR_INVALID_VALUE for an
 * index out of range or size 0. */
NSA_API nsa_status nsa_plan_stage_kernel(const nsa_plan *plan, int index, char *name, size_t size);

/* ------------------------------------------------------------------ forward */

/* A view of a buffer: element offset and element strides; the last (head-dim)
 * dimension is contiguous. For [T, H, D] tensors stride_token and stride_head are
 * used; for [T, H] tensors (gates, LSE) stride_token and stride_head (usually 1);
 * for index tensors [T, Hkv, n] stride_token and stride_head, n contiguous.
 * buffer == NULL means "not given". */
typedef struct nsa_tensor {
    nsa_buffer *buffer;
    int64_t offset;        /* elements */
    int64_t stride_token;  /* elements */
    int64_t stride_head;   /* elements */
} nsa_tensor;

/* Convenience: a dense row-major [T, H, D] view (stride_token = H * D, stride_head = D).
 * When H * D overflows int64 the view gets stride_token = -1, which nsa_forward
 * refuses (NSA_ERR_INVALID_STRIDE). */
NSA_API nsa_tensor nsa_tensor_dense(nsa_buffer *buf, int64_t offset, int64_t heads, int64_t dim);

/* Branch index for per-branch arrays. */
typedef enum nsa_branch { NSA_BRANCH_CMP = 0, NSA_BRANCH_SLC = 1, NSA_BRANCH_WIN = 2 } nsa_branch;

typedef struct nsa_forward_args {
    /* inputs, dtype = cfg.dtype */
    nsa_tensor q;            /* [T, Hq, Dqk] */
    nsa_tensor k[3];         /* per branch [T, Hkv, Dqk]; may alias each other (T: nsa_plan_info.total_keys,
                              * the keys' rows, for every k, v, dk, dv of a varlen plan) */
    nsa_tensor v[3];         /* per branch [T, Hkv, Dv]; may alias */
    /* gates, fp32 (f64 when cfg.dtype is F64), [T, Hq], already activated; a disabled
     * branch's gate is not read */
    nsa_tensor gate[3];
    /* LINEAR only, dtype = cfg.dtype, contiguous (strides ignored): */
    nsa_tensor w_k;          /* [Hkv, l, Dqk, Dqk] */
    nsa_tensor w_v;          /* [Hkv, l, Dv, Dv] */
    nsa_tensor pe_k;         /* optional [Hkv, l, Dqk] */
    nsa_tensor pe_v;         /* optional [Hkv, l, Dv] */
    /* EXTERNAL only, dtype = cfg.dtype: [total_cmp_blocks, Hkv, D] */
    nsa_tensor kc;
    nsa_tensor vc;
    /* optional int32 [T, Hkv, n]: replaces the top-n selection (ascending, -1 padded
     * at the end; every index must be eligible for its query) */
    nsa_tensor block_indices;
    /* outputs */
    nsa_tensor o;            /* [T, Hq, Dv], dtype = cfg.dtype */
    nsa_tensor lse[3];       /* optional fp32 (F64 calls: f64) [T, Hq]; -inf where a
                              * branch sees nothing;
                              * giving the LSE of a disabled branch (n = 0 or w = 0)
                              * is NSA_ERR_INVALID_VALUE */
    nsa_tensor selected;     /* optional int32 [T, Hkv, n]: the indices the library
                              * selected; not allowed together with block_indices */
    unsigned flags;          /* NSA_FORWARD_* bits, 0 by default */
} nsa_forward_args;

/* nsa_forward_args.flags */
enum {
    /* Skip the host-side check of caller-given block_indices (ascending, -1 padding
     * at the end, every index eligible for its query). The check reads the indices
     * back, which blocks until they are available; with this flag nsa_forward never
     * reads device memory. Kernels still ignore out-of-range entries, but an
     * unchecked ineligible index gives undefined (though memory-safe) results. */
    NSA_FORWARD_TRUST_INDICES = 1u << 0
};

/* Aliasing. Inputs may share memory with each other (one k for several
 * branches; q, k, v packed in one buffer). An output shares no byte with an
 * input, another output or the workspace, and the workspace shares none with
 * any tensor. nsa_forward refuses an overlap it can see with
 * NSA_ERR_INVALID_VALUE naming both tensors: views in one nsa_buffer, or in
 * buffers that wrap the same handle (their offsets from it are known). It cannot
 * compare device addresses behind different handles; keeping those apart is the
 * caller's part. Interleaved views that share no byte are allowed (three LSEs
 * in one [T, Hq, 3] tensor: offsets 0, 1, 2, stride_token 3 Hq, stride_head 3).
 */

/* Runs the forward pass. workspace: a buffer of at least
 * nsa_plan_info.workspace_bytes from the plan's context, or NULL to use one that
 * the plan allocates on first use and keeps until nsa_plan_destroy. With a
 * caller workspace (or once the plan's own exists) the call allocates nothing
 * and does not synchronize: it returns once the work is queued on the context's
 * stream (cpu: once it is done); call nsa_context_synchronize before reading
 * outputs on the host. The exception is caller-given block_indices without
 * NSA_FORWARD_TRUST_INDICES: they are read back and checked first (blocking).
 * Results are bitwise reproducible run to run on one backend and device. */
NSA_API nsa_status nsa_forward_sized(nsa_plan *plan, const nsa_forward_args *args, size_t args_size,
                                     nsa_buffer *workspace);
NSA_API nsa_status nsa_forward(nsa_plan *plan, const nsa_forward_args *args, nsa_buffer *workspace);
#define nsa_forward(plan, args, workspace) nsa_forward_sized((plan), (args), sizeof(nsa_forward_args), (workspace))

/* ------------------------------------------------------------------ backward */

/* The backward pass of a training plan (NSA_CONFIG_TRAINING): the gradients of a
 * loss L given dO = dL/do, docs/nsa-semantics.md section 9. The inputs are the
 * forward's, given as they were to nsa_forward (same rules), plus what the
 * forward returned: the LSE of every enabled branch and, when n > 0, the
 * selected indices (its `selected` output, or the block_indices it was given).
 * The selection is a constant of the backward; the LSEs fix the softmax
 * weights (the forward's probabilities are recomputed from them, not stored).
 *
 * Every gradient is optional: a NULL buffer means "not wanted" and its work is
 * skipped where it is not needed by another. Gradients have the dtype of their
 * input (cfg.dtype; dgate fp32, f64 in an F64 call; the key-side ones the float
 * type under NSA_BACKWARD_FLOAT_KEY_GRADS) and the shape and layout rules of the input's
 * view (dw_k ... dpe_v contiguous).
 *
 * Shared inputs: when one k (or v) tensor serves several branches, pass the same
 * view in k[a] and k[b] (same buffer, offset and strides) and the same view in
 * dk[a] and dk[b]: that tensor then receives the sum of the branches'
 * gradients, rounded once. Giving one dk view to branches whose k views differ
 * is NSA_ERR_INVALID_VALUE; distinct dk views for one shared k get each branch's
 * own part. For EXTERNAL the compressed branch's gradients are dkc and dvc (dk[cmp]
 * and dv[cmp] are refused); for LINEAR dw_k, dw_v (and dpe_k, dpe_v when pe is
 * given) are its weights' gradients and dk[cmp], dv[cmp] its rows'. */
typedef struct nsa_backward_args {
    /* the forward's inputs (as given to nsa_forward) */
    nsa_tensor q;            /* [T, Hq, Dqk] */
    nsa_tensor k[3];         /* per branch [T, Hkv, Dqk] (varlen plans: total_keys rows, as dk, dv) */
    nsa_tensor v[3];         /* per branch [T, Hkv, Dv] */
    nsa_tensor gate[3];      /* fp32 [T, Hq] (F64 calls: f64, as all three below) */
    nsa_tensor w_k, w_v, pe_k, pe_v; /* LINEAR */
    nsa_tensor kc, vc;       /* EXTERNAL */
    /* what the forward returned */
    nsa_tensor lse[3];       /* fp32 (f64) [T, Hq]: required for every enabled branch, not
                              * allowed for a disabled one */
    nsa_tensor block_indices;/* int32 [T, Hkv, n]: required when n > 0 */
    nsa_tensor dout;         /* [T, Hq, Dv], cfg.dtype: dL/do */
    /* gradients (outputs, each optional) */
    nsa_tensor dq;           /* [T, Hq, Dqk] */
    nsa_tensor dk[3];        /* per branch [T, Hkv, Dqk] (see "Shared inputs") */
    nsa_tensor dv[3];        /* per branch [T, Hkv, Dv] */
    nsa_tensor dgate[3];     /* fp32 (f64) [T, Hq]: dL/dg_b = dO . o_b */
    nsa_tensor dw_k, dw_v;   /* LINEAR: [Hkv, l, D, D] */
    nsa_tensor dpe_k, dpe_v; /* LINEAR with pe: [Hkv, l, D] */
    nsa_tensor dkc, dvc;     /* EXTERNAL: [total_cmp_blocks, Hkv, D] */
    unsigned flags;          /* NSA_BACKWARD_* bits, 0 by default */
} nsa_backward_args;

/* nsa_backward_args.flags */
enum {
    /* Skip the host-side check of block_indices (as NSA_FORWARD_TRUST_INDICES):
     * nsa_backward then never reads device memory. */
    NSA_BACKWARD_TRUST_INDICES = 1u << 0,
    /* (added in 0.6) dk, dv, dkc, dvc, dw_k, dw_v, dpe_k and dpe_v are of the float
     * type (fp32; f64 in an F64 call) instead of cfg.dtype: the accumulated
     * gradients unrounded, for a caller that adds the parts of several shards
     * (nsa_plan_create_varlen) before rounding once. Backends: those that run
     * shard plans (cpu, opencl); the others refuse it (NSA_ERR_UNSUPPORTED). */
    NSA_BACKWARD_FLOAT_KEY_GRADS = 1u << 1
};

/* Runs the backward pass on a plan made with NSA_CONFIG_TRAINING. workspace as
 * for nsa_forward (the same size serves both). The aliasing rules of the
 * forward apply, with the gradients as outputs (the shared-gradient case above
 * excepted). The call queues its work and returns as nsa_forward does; its
 * results are bitwise reproducible run to run on one backend and device (the
 * reductions over queries run in a fixed order, no atomics). */
NSA_API nsa_status nsa_backward_sized(nsa_plan *plan, const nsa_backward_args *args, size_t args_size,
                                      nsa_buffer *workspace);
#define nsa_backward(plan, args, workspace) \
    nsa_backward_sized((plan), (args), sizeof(nsa_backward_args), (workspace))

/* ------------------------------------------------------------------ decoding */

/* Decoding and chunked prefill (docs/nsa-semantics.md section 10). A decode plan
 * is made once for a config and the capacities below; each nsa_decode step then
 * takes a batch's new tokens (TQ_b >= 0 per sequence, at positions TK0_b ..
 * TK_b - 1, TK_b = TK0_b + TQ_b), appends their k, v to caller-owned paged caches,
 * forms the compressed rows their arrival completes, and returns their rows of o
 * (and the LSEs and selected blocks): each row is the row of nsa_forward over the
 * sequence's first TK_b tokens. The step lengths and page tables are tensors in
 * the context's memory, so a step can be replayed (a CUDA graph) with new ones;
 * the plan's capacities bound them. Backends: cpu (the fp64 reference: every row
 * is bitwise the cpu nsa_forward's row); cuda (f32, f16, bf16: the checks, the
 * append, the compressed rows and the three branches run on the device, each
 * row within the forward's parity tolerance of the cuda nsa_forward's row,
 * bitwise reproducible; nsa_decode only queues the step, so it can be captured
 * in a CUDA graph, and nsa_decode_check reports its checks; head dims with
 * Dqk + Dv up to about 2900); hip (f32, f16, bf16: the cuda step's checks,
 * append, compressed rows and split branches in portable kernels, no host
 * round trip; nsa_decode_check reports the checks; each row within the parity
 * tolerance of the hip nsa_forward's row, bitwise reproducible; head dims as
 * for its forward); opencl (portable fp32 kernels; the step checks its
 * lengths and tables on the device, so nsa_decode returns once the step is
 * queued and nsa_decode_check tells; every row is the OpenCL nsa_forward's
 * within the parity tolerance). */

/* Capacities of a decode plan, fixed when it is made (semantics section 10). */
typedef struct nsa_decode_limits {
    int64_t batch;            /* B >= 1: the sequences of every step; a sequence whose TQ is 0
                               * in a step is untouched */
    int64_t max_step_tokens;  /* largest TQ of one sequence in one step (>= 1) */
    int64_t max_total_tokens; /* rows of a step's packed q, k, v, gates, o, LSEs, selected:
                               * the sum of the TQ is at most this (>= max_step_tokens) */
    int64_t max_context;      /* largest TK = TK0 + TQ of a sequence (>= 1) */
    int64_t page_size;        /* positions per page of the raw K/V caches (>= 1) */
    int64_t num_pages;        /* pages in each raw cache (>= 1) */
    int64_t max_pages;        /* columns of block_table (>= 1) */
    int64_t cmp_page_size;    /* compressed rows per page of the compressed caches (>= 1) */
    int64_t num_cmp_pages;    /* pages in kc_cache and vc_cache (>= 0) */
    int64_t max_cmp_pages;    /* columns of cmp_block_table (>= 0) */
} nsa_decode_limits;

/* Makes a decode plan: cfg as for nsa_plan_create (NSA_CONFIG_TRAINING is refused:
 * a step has no gradient), lim the capacities. Every size the plan derives
 * (caches, tables, workspace) is checked in 64 bits before anything is
 * allocated (NSA_ERR_INVALID_SHAPE when one overflows). A backend without a
 * decode step gives NSA_ERR_UNSUPPORTED naming it. The plan serves nsa_decode
 * only: nsa_forward and nsa_backward refuse it (NSA_ERR_INVALID_VALUE), as
 * nsa_decode refuses a plan of nsa_plan_create. nsa_plan_get_info reports
 * batch = B, total_tokens = max_total_tokens, max_cmp_blocks and max_slc_blocks
 * of a max_context-token sequence, the workspace nsa_decode needs and its stages;
 * nsa_plan_destroy frees it. */
NSA_API nsa_status nsa_decode_plan_create_sized(nsa_context *ctx, const nsa_config *cfg, size_t cfg_size,
                                                const nsa_decode_limits *lim, size_t lim_size, nsa_plan **out);
#define nsa_decode_plan_create(ctx, cfg, lim, out) \
    nsa_decode_plan_create_sized((ctx), (cfg), sizeof(nsa_config), (lim), sizeof(nsa_decode_limits), (out))

/* One step's tensors. Views follow nsa_forward's rules (nsa_tensor, dtypes, the
 * float type of gates and LSEs), with T = lim.max_total_tokens rows. */
typedef struct nsa_decode_args {
    /* The step's new tokens, packed: sequence b's TQ_b = cu_seqlens_q[b+1] -
     * cu_seqlens_q[b] tokens are rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1, at
     * positions TK0_b .. TK0_b + TQ_b - 1. */
    nsa_tensor q;            /* [max_total_tokens, Hq, Dqk], cfg.dtype */
    nsa_tensor k[3], v[3];   /* [max_total_tokens, Hkv, D]: the new tokens' keys and values
                              * per branch (may alias, as in nsa_forward; EXTERNAL: k[cmp],
                              * v[cmp] are not read) */
    nsa_tensor gate[3];      /* float type [max_total_tokens, Hq] */
    nsa_tensor w_k, w_v, pe_k, pe_v; /* LINEAR, as for nsa_forward */
    /* Step lengths, int32, contiguous (strides ignored), in the context's memory: a
     * GPU backend reads them on the device, never on the host. */
    nsa_tensor cu_seqlens_q; /* [B + 1]: 0, non-decreasing, the last <= max_total_tokens,
                              * each TQ <= max_step_tokens */
    nsa_tensor cache_seqlens;/* [B]: TK0 of each sequence (tokens already cached); the
                              * library never changes it: the caller advances it by TQ
                              * after the step */
    /* Caller-owned paged caches of cfg.dtype, [num_pages, page_size, Hkv, D]: pool
     * position x = page * page_size + slot at offset + x * stride_token + h *
     * stride_head. Per branch that reads raw keys (cmp with MEAN or LINEAR, slc
     * when n > 0, win when w > 0); one view given for several branches is one cache,
     * written once (their k, v views must then be one view too). */
    nsa_tensor k_cache[3], v_cache[3];
    nsa_tensor block_table;  /* int32 [B, max_pages] (row stride = stride_token, columns
                              * contiguous): sequence b's position x lies in page
                              * block_table[b][x / page_size], slot x % page_size */
    /* [num_cmp_pages, cmp_page_size, Hkv, D]: compressed row i of sequence b lies in
     * page cmp_block_table[b][i / cmp_page_size], slot i % cmp_page_size. MEAN,
     * LINEAR: the step forms rows Nc(TK0) <= i < Nc(TK) once, from the cached tokens
     * (section 10); EXTERNAL: the caller writes them before the step. Required when
     * a max_context-token sequence has a compressed block. */
    nsa_tensor kc_cache, vc_cache;
    nsa_tensor cmp_block_table; /* int32 [B, max_cmp_pages] */
    /* outputs: the rows of the step's tokens (rows from cu_seqlens_q[B] on are
     * untouched) */
    nsa_tensor o;            /* [max_total_tokens, Hq, Dv], cfg.dtype */
    nsa_tensor lse[3];       /* optional float type [max_total_tokens, Hq] (enabled branches) */
    nsa_tensor selected;     /* optional int32 [max_total_tokens, Hkv, n] */
    nsa_tensor status;       /* optional int32 [2] in the context's memory: every step writes
                              * (its nsa_status, the first bad sequence or -1) */
} nsa_decode_args;

/* Runs one step. Host-side argument checks as nsa_forward's (dtypes, shapes,
 * strides, each view large enough for the plan's capacities; aliasing: outputs
 * share no byte with an input, a cache, a table or the workspace; a cache is
 * in-out: it shares none with the other tensors, and caches may alias each
 * other only as whole identical views). workspace as for nsa_forward
 * (nsa_plan_info.workspace_bytes of the decode plan, or NULL).
 *
 * The step then checks the lengths and page tables it reads in the context's
 * memory: cu_seqlens_q that does not start at 0, decreases, ends past
 * max_total_tokens or has a TQ above max_step_tokens; TK0 < 0; TK above
 * max_context or max_pages * page_size; Nc(TK) above max_cmp_pages *
 * cmp_page_size (NSA_ERR_INVALID_SHAPE); a page-table entry the step reads or
 * writes outside [0, num_pages) (or [0, num_cmp_pages)), or a page the step
 * writes (one holding a position TK0 .. TK - 1, or a new compressed row) that
 * appears twice in the tables of the batch (NSA_ERR_INVALID_VALUE). The message
 * names the sequence and the entry. A step whose data fail a check writes
 * nothing (no cache entry, no output row; only the status tensor). cpu: the
 * step checks before it writes and nsa_decode returns that status; a GPU
 * backend's nsa_decode returns once the step is queued, and nsa_decode_check
 * (or the status tensor) tells. Results are bitwise reproducible. */
NSA_API nsa_status nsa_decode_sized(nsa_plan *plan, const nsa_decode_args *args, size_t args_size,
                                    nsa_buffer *workspace);
#define nsa_decode(plan, args, workspace) nsa_decode_sized((plan), (args), sizeof(nsa_decode_args), (workspace))

/* Waits for the plan's last step and returns the status of its checks of the
 * lengths and page tables it read in the context's memory (NSA_SUCCESS, or the
 * named status with its message; NSA_SUCCESS before the first step). A step
 * refused by the host-side argument checks ran nothing and does not count. */
NSA_API nsa_status nsa_decode_check(nsa_plan *plan);

/* ------------------------------------------------------------------ settings */

/* Process-wide settings. Each has an environment variable as its default: a
 * value set here wins, and NULL (0 for the thread count) goes back to the
 * variable. Safe to call from any thread at any time; a setting takes effect
 * for what is created after the call (a context's CPU threads, an OpenCL
 * program's first build, a backend module's first load: modules already loaded
 * stay loaded). Bad values return NSA_ERR_INVALID_VALUE and change nothing. */

typedef enum nsa_log_level {
    NSA_LOG_ERROR = 0, /* something failed and the library could not carry on as asked */
    NSA_LOG_WARN = 1,  /* it carried on in a lesser way (a module there that would not load,
                        * a listed backend whose context failed, so the next was tried, a
                        * corrupt kernel cache entry rebuilt) */
    NSA_LOG_INFO = 2,  /* what it chose (the backend and device of a context, listed backends
                        * not used and why, a plan's stages and workspace, kernels built or
                        * taken from the cache) */
    NSA_LOG_DEBUG = 3  /* details (where modules were searched, each stage's kernel) */
} nsa_log_level;
typedef void (*nsa_log_fn)(nsa_log_level level, const char *message, void *user);

/* Sends the library's messages up to max_level to fn(level, message, user), from
 * whichever thread the library is working in (fn must be thread-safe; it may call
 * libnsa). fn NULL: no callback; the environment variable NSA_LOG =
 * error|warn|info|debug then prints messages up to that level to stderr (unset:
 * nothing is printed). Messages never replace nsa_last_error(). */
NSA_API nsa_status nsa_set_log(nsa_log_fn fn, nsa_log_level max_level, void *user);
NSA_API const char *nsa_log_level_name(nsa_log_level level); /* "error" .. "debug" */

/* The folder of run-time compiled kernels (OpenCL program binaries); "off"
 * disables the cache. Default: NSA_CACHE_DIR, else $XDG_CACHE_HOME/libnsa, else
 * ~/.cache/libnsa. At most 4095 characters; "" is refused. */
NSA_API nsa_status nsa_set_cache_dir(const char *dir);

/* Threads of the cpu backend's contexts, 1 .. 1024. Default (0): NSA_CPU_THREADS,
 * else every online CPU. */
NSA_API nsa_status nsa_set_cpu_threads(int threads);

/* Colon list of folders searched for backend modules before the install folder
 * and the folder nsa/ beside libnsa. Default: NSA_BACKEND_PATH. */
NSA_API nsa_status nsa_set_backend_path(const char *dirs);

/* ------------------------------------------------------------------ utilities */

/* Converts n elements between f32, f16, bf16 and (added in 0.4) f64 on the host
 * (round to nearest even, once; f64 to f16 or bf16 is one rounding, not two).
 * n * 4 bytes (n * 8 when either dtype is f64) must fit in int64 and size_t
 * (NSA_ERR_INVALID_VALUE otherwise). */
NSA_API nsa_status nsa_convert(const void *src, nsa_dtype src_dtype, void *dst, nsa_dtype dst_dtype,
                               int64_t n);

/* Portable counter-based random numbers: element i of stream (seed, stream) is
 * the same on every machine and compiler. Uniform in [lo, hi), as f32.
 * out[i] is element first + i; first + n must not exceed 2^63 - 1. */
NSA_API nsa_status nsa_random_uniform(uint64_t seed, uint64_t stream, int64_t first, int64_t n,
                                      float lo, float hi, float *out);

/* 64-bit raw draw: element `index` of stream (seed, stream). */
NSA_API uint64_t nsa_random_u64(uint64_t seed, uint64_t stream, uint64_t index);

#ifdef __cplusplus
}
#endif

#endif /* NSA_H */
