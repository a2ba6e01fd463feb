/*
 * Types and functions shared by the files of the OpenCL backend module (hidden
 * symbols; only nsa_backend_entry and nsa_backend_api_version are exported).
 */
#ifndef NSA_OPENCL_INTERNAL_H
#define NSA_OPENCL_INTERNAL_H

#define CL_TARGET_OPENCL_VERSION 120
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>

#include "backend.h"

/* The core's services (set once by nsa_backend_entry). */
extern const nsa_host_api *ocl_host;

#define OCL_ERR(status, ...) ocl_host->set_error((status), __VA_ARGS__)

/* "CL_OUT_OF_RESOURCES" for -5, or "unknown OpenCL error" (cl_errors.c). */
const char *ocl_error_name(cl_int err);

/* Reports a failed OpenCL call `what` as NSA_ERR_DEVICE, or NSA_ERR_OUT_OF_MEMORY for
 * the allocation failures. */
nsa_status ocl_fail(cl_int err, const char *what);

/* A backend buffer: a cl_mem plus a byte offset into it (wrapped memory may start
 * inside the caller's cl_mem; no sub-buffers are made) and the usable size. */
typedef struct ocl_buffer {
    cl_mem mem;
    size_t offset;
    size_t size;
    int owned; /* 0: wrapped (retained while wrapped, released on free) */
} ocl_buffer;

/* The kernels of one program (kernels/opencl/<idea>.cl, built for one dtype). */
enum ocl_kernel_id {
    OCL_K_COMPRESS_MEAN,
    OCL_K_CONVERT_ROWS,
    OCL_K_STAGE_HEADS,
    OCL_K_CONVERT_DENSE,
    OCL_K_FILL_ROWS,
    OCL_K_ROUND_ROWS,
    OCL_K_COMPRESS_LINEAR,
    OCL_K_CMP_ATTN,
    OCL_K_BLOCK_SCORES,
    OCL_K_SELECT_TOPN,
    OCL_K_SLC_ATTN,
    OCL_K_WIN_ATTN,
    OCL_K_COMBINE,
    OCL_K_CMP_ATTN_V2,
    OCL_K_SLC_ATTN_V2,
    OCL_K_WIN_ATTN_V2,
    OCL_K_BLOCK_SCORES_V2,
    OCL_K_SCORES_TOPN,
    OCL_K_CMP_ATTN_V3, /* tile_attn.cl */
    OCL_K_WIN_ATTN_V3,
    OCL_K_SLC_ATTN_V3, /* slc_tile.cl */
    OCL_K_BWD_ROWS_CMP, /* backward.cl: rows and keys kernels per branch (cmp, slc, win) */
    OCL_K_BWD_ROWS_SLC,
    OCL_K_BWD_ROWS_WIN,
    OCL_K_BWD_KEYS_CMP,
    OCL_K_BWD_KEYS_SLC,
    OCL_K_BWD_KEYS_WIN,
    OCL_K_BWD_COMPRESS_ROWS,
    OCL_K_BWD_COMPRESS_W,
    OCL_K_BWD_STORE,
    OCL_K_BWD_STORE_F32,
    OCL_K_DECODE_CHECK, /* decode.cl: DECODE_APPEND */
    OCL_K_DECODE_STORE,
    OCL_K_DECODE_COMPRESS,
    OCL_K_DECODE_CMP_ATTN, /* DECODE_ATTN */
    OCL_K_DECODE_SCORES_TOPN,
    OCL_K_DECODE_SLC_ATTN,
    OCL_K_DECODE_WIN_ATTN,
    OCL_K_DECODE_COMBINE,
    OCL_K_COMBINE_PARTIAL, /* combine.cl: SLC_COMBINE's end */
    OCL_K_COUNT
};

typedef struct ocl_program {
    cl_program program; /* NULL until built */
    cl_kernel kernel[OCL_K_COUNT];
    size_t kernel_wg[OCL_K_COUNT]; /* CL_KERNEL_WORK_GROUP_SIZE */
    int from_cache;                /* 1: loaded from the on-disk binary cache */
} ocl_program;

typedef struct ocl_context {
    cl_platform_id platform;
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    int out_of_order; /* the caller's queue is out of order: barrier after each command */
    cl_device_type type;
    size_t max_wg;       /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
    cl_ulong local_mem;  /* CL_DEVICE_LOCAL_MEM_SIZE */
    char device_name[256];
    char driver_version[128];
    char platform_version[256];
    int used_clblast;
    ocl_program programs[3]; /* by nsa_dtype (f32, f16, bf16), built on first use */
} ocl_context;

/* Per-plan state (nsa_bk_plan.backend_plan). */
typedef struct ocl_plan {
    ocl_program *prog;
    size_t bytes;     /* device memory of the buffers below (nsa_plan_info.backend_bytes) */
    size_t wg_attn;   /* cmp / slc / win attention work-group size (version 1) */
    int attn_v2;      /* 1: the group-shared version 2 of the attention kernels */
    size_t wg_v2;     /* its work-group size */
    int64_t kt_v2;    /* its key tile */
    int attn_v3;      /* 1: version 3 (tile_attn.cl) for CMP_ATTN and WIN_ATTN */
    int slc_v3;       /* 1: version 3 (slc_tile.cl) for SLC_ATTN */
    cl_mem win_scratch; /* WIN_COMBINE, SLC_COMBINE: f32 [win_chunk, Hq, Dv], a branch's rows of a run of tokens */
    int64_t win_chunk;  /* its tokens (a multiple of the window kernel's tile tokens) */
    size_t wg_scores; /* block_scores */
    size_t wg_topn;   /* select_topn */
    size_t wg_elem;   /* element-wise kernels */
    size_t wg_bwd;    /* the backward's rows and keys kernels */
    int scores_q_local;
    int scores_v2;       /* 1: block_scores_v2 (rows scored once, tiles in local memory) */
    size_t wg_scores_v2;
    int64_t kt_scores, jc_scores; /* its row tile and chunk of selection blocks */
    size_t wg_fused;              /* scores_topn (the fused SCORES_TOPN) */
    int64_t kt_fused, jc_fused;
    /* LINEAR compression scratch (NULL otherwise), f32 */
    cl_mem stage_x;   /* [Hkv, T, maxD] head-major copy of k or v */
    cl_mem stage_w;   /* [Hkv, l, maxD, maxD] */
    cl_mem stage_pe;  /* [Hkv, l, maxD] */
    cl_mem bias;      /* [Hkv, maxD]: pe @ W */
    cl_mem gemm_tmp;  /* CLBlast's temporary buffer (NULL: none needed) */
    size_t gemm_tmp_bytes;
    /* decode plans (decode.c; NULL otherwise) */
    cl_mem dec_verdict; /* int32 [16]: the last step's checks (decode.cl's DV_* layout) */
    cl_mem dec_count;   /* int32 [num_pages + num_cmp_pages]: decode_check's page counts */
    size_t wg_dec_attn; /* decode_cmp / slc / win_attn work-group size (softmax.cl chunks) */
    size_t wg_dec_scores; /* decode_scores_topn */
    int64_t kt_dec, jc_dec; /* its row tile and chunk of selection blocks */
} ocl_plan;

/* program.c: the program of `dtype` for this context, built (or loaded from the
 * binary cache) on first use. */
nsa_status ocl_program_get(ocl_context *c, nsa_dtype dtype, ocl_program **out);
void ocl_program_release(ocl_program *p);

/* stages.c */
int ocl_supports(void *bctx, nsa_stage stage, const nsa_config *cfg);
nsa_status ocl_plan_prepare(void *bctx, nsa_bk_plan *plan);
nsa_status ocl_stage_kernel(void *bctx, const nsa_bk_plan *plan, nsa_stage stage, char *name, size_t size);
void ocl_plan_release(void *bctx, nsa_bk_plan *plan);
nsa_status ocl_run(void *bctx, nsa_stage stage, const nsa_bk_args *args);

/* stages.c: the scores_topn tile (row tile kt, chunk jc) that fits the device's local
 * memory, whatever NSA_OPENCL_KERNELS says (0: none fits), and its local bytes. */
int ocl_scores_topn_tile(const ocl_context *c, const nsa_config *cfg, size_t *kt, size_t *jc);
size_t ocl_scores_topn_bytes(const nsa_config *cfg, size_t kt, size_t jc);

/* decode.c: the decode stages (semantics section 10) */
int ocl_decode_supports(ocl_context *c, const nsa_config *cfg);
nsa_status ocl_decode_prepare(ocl_context *c, const nsa_bk_plan *plan, ocl_plan *op);
void ocl_decode_release(ocl_plan *op);
nsa_status ocl_decode_append(ocl_context *c, ocl_plan *op, const nsa_bk_args *args);
nsa_status ocl_decode_attn(ocl_context *c, ocl_plan *op, const nsa_bk_args *args);
nsa_status ocl_decode_status(void *bctx, const nsa_bk_plan *plan);

/* Kernel argument helper: appends arguments in order and remembers the first error. */
typedef struct ocl_args {
    cl_kernel kernel;
    cl_uint next;
    cl_int err;
    nsa_status status;  /* an argument the backend refused (misaligned tensor) */
    const char *kname;
} ocl_args;

void ocl_args_begin(ocl_args *a, cl_kernel k, const char *kname);
void ocl_arg_mem(ocl_args *a, cl_mem m);
void ocl_arg_long(ocl_args *a, int64_t v);
void ocl_arg_int(ocl_args *a, int v);
void ocl_arg_float(ocl_args *a, float v);
void ocl_arg_local(ocl_args *a, size_t bytes);
/* A tensor as (mem, element offset, stride_token, stride_head) or, with strides = 0,
 * just (mem, element offset). An absent tensor passes NULL and zeros. */
void ocl_arg_tensor(ocl_args *a, const nsa_bk_tensor *t, size_t elem_size, int strides);
nsa_status ocl_args_end(ocl_args *a);

/* Element offset of a tensor (its buffer's byte offset folded in); -1 when the
 * buffer offset is not a multiple of elem_size. */
int64_t ocl_tensor_elem_offset(const nsa_bk_tensor *t, size_t elem_size);

/* Queues `groups` work-groups of `wg` lanes, split into launches of at most
 * OCL_MAX_GROUPS_PER_LAUNCH groups; argument `first_arg` (a long) gets the first
 * group of each launch, times `first_scale` (1 for per-(t, h) kernels, wg for
 * element-wise kernels whose `first` counts elements). */
#define OCL_MAX_GROUPS_PER_LAUNCH ((int64_t)1 << 20)
nsa_status ocl_launch(ocl_context *c, cl_kernel k, const char *kname, cl_uint first_arg,
                      int64_t groups, size_t wg, int64_t first_scale);
/* The same for work-groups base / first_scale .. of a longer range: `first` starts at base. */
nsa_status ocl_launch_at(ocl_context *c, cl_kernel k, const char *kname, cl_uint first_arg, int64_t base,
                         int64_t groups, size_t wg, int64_t first_scale);
/* After a command on an out-of-order queue: a barrier; otherwise nothing. */
nsa_status ocl_order(ocl_context *c);

/* compress_linear.c: LINEAR compression, with CLBlast GEMMs where the module was
 * built with CLBlast (NSA_OPENCL_CLBLAST), else with the compress_linear kernel.
 * ocl_linear_engine(): "CLBlast" or "built-in kernel", for the probe's reason. */
const char *ocl_linear_engine(void);
nsa_status ocl_linear_prepare(ocl_context *c, const nsa_bk_plan *plan, ocl_plan *op);
nsa_status ocl_linear_run(ocl_context *c, const nsa_bk_args *args, ocl_plan *op);
/* Drops CLBlast's compiled programs (they pin this context) when it is destroyed. */
void ocl_linear_forget(ocl_context *c);

/* The embedded kernel source (generated by embed_cl.py from kernels/opencl). */
extern const char nsa_opencl_source[];
extern const size_t nsa_opencl_source_size;

#endif /* NSA_OPENCL_INTERNAL_H */
