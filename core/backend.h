/*
 * The backend interface: the one contract between the core and every backend
 * (cpu built in; cuda, hip, opencl loaded as modules with dlopen).
 *
 * A backend implements *stages*. The core validates, plans (all block
 * arithmetic of the semantics lives in core/plan.c) and walks the plan's stage
 * list, calling run() once per stage. A backend never re-derives counts or
 * offsets on the host: it gets them in nsa_bk_plan. Device code computes the
 * per-query visibility rules (nc(t), eligible blocks, window start) itself.
 *
 * This header includes nothing vendor-specific, and no backend includes another
 * backend.
 */
#ifndef NSA_CORE_BACKEND_H
#define NSA_CORE_BACKEND_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "nsa.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever any struct or function below changes. The loader refuses a
 * module whose nsa_backend_api_version differs (NSA_ERR_VERSION_MISMATCH).
 * 7: NSA_DTYPE_F64 and nsa_bk_float_dtype (a module of version 6 could not know
 * the dtype, and its supports() might have said yes to it).
 * 8: the decode stages (NSA_STAGE_DECODE_APPEND, NSA_STAGE_DECODE_ATTN), the
 * decode fields of nsa_bk_plan and nsa_bk_args (a module of version 7 reads
 * shorter structs, and a supports() that answers by range might take the new
 * stage values).
 * 9: nsa_backend.decode_status (a backend that runs a decode step
 * asynchronously reports its device-side checks through it; a module of
 * version 8 has a shorter vtable).
 * 10: NSA_STAGE_WIN_COMBINE (a module of version 9 whose supports() answers by
 * range might take it without running it).
 * 11: the keys' side of a plan (nsa_bk_plan.cu_seqlens_k, total_keys,
 * dev_cu_seqlens_k) and nsa_backend.shards (a module of version 10 reads a
 * shorter plan and would run a shard's queries at the wrong positions).
 * 12: NSA_STAGE_SLC_COMBINE and nsa_bk_plan.slc_combined (a module of version 11
 * reads a shorter plan, and its COMBINE would take o_b[CMP] as the compressed
 * branch's output alone). */
#define NSA_BACKEND_API_VERSION 12

/* Every module exports these two symbols. */
#define NSA_BACKEND_ENTRY_SYMBOL "nsa_backend_entry"
#define NSA_BACKEND_VERSION_SYMBOL "nsa_backend_api_version"

/* The float type of a call of dtype dt: f64 for an F64 call, f32 otherwise. The
 * tensors the comments below call "float" have it: gates, LSEs, dgate, and the
 * workspace's compressed rows (kc, vc), per-branch outputs (o_b), backward
 * accumulators (*_acc) and delta. Block scores stay f32 in every call (they
 * only rank blocks; section 7's near-tie rule covers their rounding). */
static inline nsa_dtype nsa_bk_float_dtype(nsa_dtype dt)
{
    return dt == NSA_DTYPE_F64 ? NSA_DTYPE_F64 : NSA_DTYPE_F32;
}

/* The stages. Values are fixed. Fused stages are optional: the planner uses
 * one only when supports() says yes, and falls back to the plain stages. */
typedef enum nsa_stage {
    /* reads k[CMP], v[CMP] and (MEAN) nothing else, (LINEAR) w_k, w_v, pe_k, pe_v
     * (pe may be absent), (EXTERNAL) kc_in, vc_in; writes kc, vc (float). Rows of
     * sequence b are plan->cu_cmp[b] .. plan->cu_cmp[b+1]-1. */
    NSA_STAGE_COMPRESS = 0,
    /* reads q, kc, vc; writes o_b[CMP] (float) and lse[CMP] (always given). A query
     * with nc(t) = 0 gets o = 0 and lse = -inf. */
    NSA_STAGE_CMP_ATTN = 1,
    /* reads q, kc, lse[CMP]; writes scores[t, g, j] = s(t, g, j) for every
     * eligible j (0 <= j <= floor(t_local / l_s)); other entries are unspecified. */
    NSA_STAGE_BLOCK_SCORES = 2,
    /* reads scores; writes indices (int32 [T, Hkv, n], ascending, -1 padded). */
    NSA_STAGE_SELECT_TOPN = 3,
    /* reads q, k[SLC], v[SLC], indices; writes o_b[SLC] and lse[SLC] if given. */
    NSA_STAGE_SLC_ATTN = 4,
    /* reads q, k[WIN], v[WIN]; writes o_b[WIN] and lse[WIN] if given. It runs
     * after CMP_ATTN and SLC_ATTN and just before COMBINE, so a backend may
     * instead do COMBINE's work here (read o_b[CMP], o_b[SLC] and the gates,
     * write o) and make its COMBINE a no-op for the same arguments; o_b[WIN]
     * is then left unwritten (the CUDA backend does this). */
    NSA_STAGE_WIN_ATTN = 5,
    /* reads gate[b] and o_b[b] for each branch whose o_b[b].buf is not NULL (a
     * disabled branch has NULL and its gate is not read); writes o (cfg dtype). */
    NSA_STAGE_COMBINE = 6,
    /* fused BLOCK_SCORES + SELECT_TOPN: reads q, kc, lse[CMP]; writes indices;
     * no scores buffer exists. */
    NSA_STAGE_SCORES_TOPN = 7,
    /* Backward stages (section 9), run in this order after COMPRESS (which
     * recomputes kc, vc as the forward did). Every *_acc tensor is float workspace
     * that the core zero-fills before the first of them; each stage ADDS its
     * part, so branches that share an accumulator (one dk for several branches)
     * sum in stage order. delta is scratch of the stage that uses it. */
    /* reads q, kc, vc, lse[CMP], gate[CMP], dout; adds to dq_acc, dkc_acc,
     * dvc_acc; writes dgate[CMP] if given (uses delta) */
    NSA_STAGE_BWD_CMP_ATTN = 8,
    /* reads dkc_acc, dvc_acc, (LINEAR) k[CMP], v[CMP], w_k, w_v, pe_k, pe_v;
     * adds to dk_acc[CMP], dv_acc[CMP] and (LINEAR) dw_k_acc ... dpe_v_acc, each
     * only if given. EXTERNAL: nothing to do (dkc_acc is the result). */
    NSA_STAGE_BWD_COMPRESS = 9,
    /* reads q, k[SLC], v[SLC], indices, lse[SLC], gate[SLC], dout; adds to
     * dq_acc, dk_acc[SLC], dv_acc[SLC]; writes dgate[SLC] if given */
    NSA_STAGE_BWD_SLC_ATTN = 10,
    /* the same for the window branch */
    NSA_STAGE_BWD_WIN_ATTN = 11,
    /* converts each store[i].acc (float) to store[i].out (cfg dtype) */
    NSA_STAGE_BWD_STORE = 12,
    /* Decode stages (section 10), the only stages of a decode plan, in this
     * order. The packed step tensors (q, k, v, gate, o, lse, indices, o_b) have
     * plan->total_tokens = lim.max_total_tokens rows; the step lengths
     * (dec_cu_seqlens_q, dec_cache_seqlens) and page tables are read in the
     * context's memory, never on the host by the core. */
    /* Checks the step's lengths and tables (semantics 10, nsa.h's nsa_decode):
     * a step that fails writes nothing but dec_status (when given) and, on a
     * synchronous backend, returns the named status with its message; then
     * appends k[b], v[b] of the new tokens to each distinct dec_k_cache[b] /
     * dec_v_cache[b] and (MEAN, LINEAR) forms the compressed rows Nc(TK0) <= i <
     * Nc(TK) into dec_kc_cache / dec_vc_cache from the cached tokens; writes
     * dec_status = (NSA_SUCCESS, -1) when given. */
    NSA_STAGE_DECODE_APPEND = 13,
    /* reads q, gate, the caches and tables; writes the step's rows of o,
     * lse[b] (if given; lse[CMP] always given, workspace when not the caller's),
     * indices (n > 0: the caller's selected, else workspace) and o_b (workspace
     * scratch). Runs only after a DECODE_APPEND whose checks passed (an
     * asynchronous backend reads dec_status and does nothing when it is not 0). */
    NSA_STAGE_DECODE_ATTN = 14,
    /* fused WIN_ATTN + COMBINE, for a forward plan with the window branch on:
     * reads what both read, but o_b[WIN] is NULL (no workspace holds the window
     * branch's output: T * Hq * Dv floats less); writes lse[WIN] if given and o,
     * bitwise as WIN_ATTN then COMBINE would. The planner puts it last, in place
     * of both. */
    NSA_STAGE_WIN_COMBINE = 15,
    /* fused SLC_ATTN + COMBINE's first two terms, for a forward plan with the
     * selected branch on: reads what SLC_ATTN reads, o_b[CMP] (CMP_ATTN's
     * output), gate[CMP] and gate[SLC]; o_b[SLC] is NULL (no workspace holds
     * the selected branch's output: T * Hq * Dv floats less). Writes lse[SLC] if
     * given, and overwrites o_b[CMP] with gate[CMP] o_cmp + gate[SLC] o_slc,
     * summed as COMBINE sums its first two terms (in the float type; a backend
     * offers it only where its COMBINE accumulates in that type, so that the
     * result stays bitwise that of the plain stages). The planner puts it in
     * place of SLC_ATTN and sets plan->slc_combined: COMBINE and WIN_COMBINE
     * then take o_b[CMP] as that partial sum (weight 1, gate[CMP] not read) and
     * add the window's term to it. */
    NSA_STAGE_SLC_COMBINE = 16,
    NSA_STAGE_COUNT = 17
} nsa_stage;

/* Stage name for messages and plan info ("cmp_attn"). Inline, so that modules
 * (which do not link libnsa) can use it too. */
static inline const char *nsa_stage_name(nsa_stage stage)
{
    switch (stage) {
    case NSA_STAGE_COMPRESS: return "compress";
    case NSA_STAGE_CMP_ATTN: return "cmp_attn";
    case NSA_STAGE_BLOCK_SCORES: return "block_scores";
    case NSA_STAGE_SELECT_TOPN: return "select_topn";
    case NSA_STAGE_SLC_ATTN: return "slc_attn";
    case NSA_STAGE_WIN_ATTN: return "win_attn";
    case NSA_STAGE_COMBINE: return "combine";
    case NSA_STAGE_SCORES_TOPN: return "scores_topn";
    case NSA_STAGE_BWD_CMP_ATTN: return "bwd_cmp_attn";
    case NSA_STAGE_BWD_COMPRESS: return "bwd_compress";
    case NSA_STAGE_BWD_SLC_ATTN: return "bwd_slc_attn";
    case NSA_STAGE_BWD_WIN_ATTN: return "bwd_win_attn";
    case NSA_STAGE_BWD_STORE: return "bwd_store";
    case NSA_STAGE_DECODE_APPEND: return "decode_append";
    case NSA_STAGE_DECODE_ATTN: return "decode_attn";
    case NSA_STAGE_WIN_COMBINE: return "win_combine";
    case NSA_STAGE_SLC_COMBINE: return "slc_combine";
    case NSA_STAGE_COUNT: break;
    }
    return "unknown";
}

/* A tensor as a backend sees it: its own buffer object, element offset and
 * strides (last dimension contiguous), and the element type. buf == NULL: absent. */
typedef struct nsa_bk_tensor {
    void *buf;
    int64_t offset;
    int64_t stride_token;
    int64_t stride_head;
    nsa_dtype dtype;
} nsa_bk_tensor;

/* What the planner hands every backend. All counts are computed by the core.
 *
 * Queries and keys. Sequence b has Tq_b = cu_seqlens[b+1] - cu_seqlens[b] query
 * rows and Tk_b = cu_seqlens_k[b+1] - cu_seqlens_k[b] >= Tq_b key rows; query row
 * t (cu_seqlens[b] <= t < cu_seqlens[b+1]) sits at position
 *   pos(t) = t - cu_seqlens[b] + Tk_b - Tq_b
 * of its sequence, whose position x is key row cu_seqlens_k[b] + x of k, v and
 * their gradients (semantics section 11: the queries are the last Tq_b positions
 * of the keys, a shard or a chunked prefill). Every visibility rule of the
 * semantics is taken at pos(t). A plan of nsa_plan_create has Tq_b = Tk_b
 * (cu_seqlens_k == cu_seqlens, the same array, and total_keys == total_tokens),
 * so pos(t) = t - cu_seqlens[b]; only a backend with nsa_backend.shards = 1 is
 * given any other. The counts max_len, max_nc, max_ns, total_cmp and cu_cmp are
 * the keys' (Nc and Ns of Tk_b). Rows of q, o, gates, LSEs, indices, scores,
 * o_b, dout, dq and dgate are query rows; rows of k, v, dk, dv are key rows. */
typedef struct nsa_bk_plan {
    nsa_config cfg;          /* validated; cfg.scale resolved (never 0) */
    int64_t batch;           /* B */
    int64_t total_tokens;    /* T = cu_seqlens[B] */
    int64_t total_cmp;       /* cu_cmp[B] */
    int64_t max_len;         /* longest sequence */
    int64_t max_nc;          /* most compressed blocks in one sequence */
    int64_t max_ns;          /* most selection blocks in one sequence (row length of scores) */

    /* host tables, valid for the plan's lifetime */
    const int64_t *cu_seqlens; /* [B + 1] token offsets */
    const int64_t *cu_cmp;     /* [B + 1] compressed-row offsets (prefix sums of Nc) */
    const int64_t *tok_seq;    /* [T] sequence index of each token */
    int64_t query_tile;        /* = backend->query_tile (0: no tile list) */
    int64_t num_tiles;         /* query tiles: runs of <= query_tile tokens of one sequence */
    const int64_t *tiles;      /* [num_tiles][2]: (sequence, first local token) */

    /* the same tables in one backend buffer of int64 elements (NULL for cpu-like
     * backends that set wants_device_tables = 0) */
    void *dev_tables;
    int64_t dev_cu_seqlens;    /* element offset of cu_seqlens in dev_tables */
    int64_t dev_cu_cmp;
    int64_t dev_tok_seq;
    int64_t dev_tiles;

    void *backend_plan;        /* set by plan_prepare, released by plan_release */
    size_t backend_bytes;      /* device memory plan_prepare allocated for the plan (nsa_plan_info) */

    /* (API version 8) decode plans (nsa_decode_plan_create): decode = 1 and the
     * validated capacities; batch = lim.batch, total_tokens = lim.max_total_tokens,
     * max_len = lim.max_context, max_nc / max_ns those of a max_context-token
     * sequence; the host tables above are absent (NULL, no tiles) */
    int decode;
    nsa_decode_limits lim;

    /* (API version 11) the keys' side (see above). total_tokens counts query rows.
     * Decode plans: cu_seqlens_k NULL, total_keys = total_tokens. */
    const int64_t *cu_seqlens_k; /* [B + 1] key-row offsets */
    int64_t total_keys;          /* cu_seqlens_k[B] */
    int64_t dev_cu_seqlens_k;    /* element offset of cu_seqlens_k in dev_tables (-1: none) */

    /* (API version 12) the plan runs SLC_COMBINE: after it, o_b[CMP] holds the
     * compressed and selected branches' gated sum, and COMBINE / WIN_COMBINE add
     * the window's term to it (o_b[SLC] is NULL) */
    int slc_combined;
} nsa_bk_plan;

/* One gradient BWD_STORE rounds to the dtype: rows x heads x dim elements of
 * the float accumulator acc into out. */
typedef struct nsa_bk_store {
    nsa_bk_tensor acc, out;
    int64_t rows, heads, dim;
} nsa_bk_store;

/* Every tensor any stage reads or writes; run() uses those its stage names.
 * The core fills user tensors and workspace views; dtypes are set. "float" is
 * nsa_bk_float_dtype(cfg.dtype): f32, or f64 in an F64 call. */
typedef struct nsa_bk_args {
    const nsa_bk_plan *plan;
    nsa_bk_tensor q;           /* [T, Hq, Dqk] cfg dtype */
    nsa_bk_tensor k[3], v[3];  /* [T, Hkv, D] cfg dtype */
    nsa_bk_tensor gate[3];     /* [T, Hq] float */
    nsa_bk_tensor w_k, w_v;    /* LINEAR weights, contiguous */
    nsa_bk_tensor pe_k, pe_v;  /* LINEAR position encodings, contiguous, may be absent */
    nsa_bk_tensor kc_in, vc_in;/* EXTERNAL compressed K/V, cfg dtype */
    nsa_bk_tensor kc, vc;      /* float [total_cmp, Hkv, D], dense (workspace) */
    nsa_bk_tensor o_b[3];      /* float [T, Hq, Dv], dense (workspace); NULL buf: branch off */
    nsa_bk_tensor lse[3];      /* float [T, Hq]; lse[CMP] always given to CMP_ATTN */
    nsa_bk_tensor scores;      /* f32 [T, Hkv, max_ns], dense (workspace) */
    nsa_bk_tensor indices;     /* i32 [T, Hkv, n] */
    nsa_bk_tensor o;           /* [T, Hq, Dv] cfg dtype */

    /* backward stages only (NULL buf: not wanted) */
    nsa_bk_tensor dout;        /* [T, Hq, Dv] cfg dtype */
    nsa_bk_tensor dq_acc;      /* float [T, Hq, Dqk] */
    nsa_bk_tensor dk_acc[3], dv_acc[3]; /* float [T, Hkv, D]; two branches may share one
                                * (same buf and offset): the sum is wanted */
    nsa_bk_tensor dkc_acc, dvc_acc; /* float [total_cmp, Hkv, D] (always given with cmp) */
    nsa_bk_tensor dw_k_acc, dw_v_acc;   /* float [Hkv, l, D * D], dense */
    nsa_bk_tensor dpe_k_acc, dpe_v_acc; /* float [Hkv, l, D], dense */
    nsa_bk_tensor delta;       /* float [T, Hq] scratch */
    nsa_bk_tensor dgate[3];    /* float [T, Hq] outputs */
    int num_store;             /* BWD_STORE: store[i].out = store[i].acc */
    nsa_bk_store store[12];

    /* (API version 8) decode stages only; k[b], v[b] are then the new tokens */
    nsa_bk_tensor dec_cu_seqlens_q;  /* i32 [B + 1], contiguous */
    nsa_bk_tensor dec_cache_seqlens; /* i32 [B], contiguous */
    nsa_bk_tensor dec_k_cache[3], dec_v_cache[3]; /* cfg dtype [num_pages * page_size, Hkv, D]
                                      * by pool position; given for each branch that reads raw
                                      * keys; the same buf, offset and strides: one cache */
    nsa_bk_tensor dec_block_table;   /* i32 [B, max_pages] (stride_token: row stride) */
    nsa_bk_tensor dec_kc_cache, dec_vc_cache; /* cfg dtype [num_cmp_pages * cmp_page_size, Hkv, D];
                                      * absent when no max_context sequence has a block */
    nsa_bk_tensor dec_cmp_block_table; /* i32 [B, max_cmp_pages] */
    nsa_bk_tensor dec_status;        /* i32 [2], may be absent */
} nsa_bk_args;

/* Services the core offers a backend (passed to the module's entry). */
typedef struct nsa_host_api {
    int api_version;
    /* Records the calling thread's last-error message and returns status, so a
     * backend writes: return host->set_error(NSA_ERR_DEVICE, "cudaMalloc: %s", s); */
    nsa_status (*set_error)(nsa_status status, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 2, 3)))
#endif
        ;
    /* (added in API version 4) A log message at an nsa_log_level (include/nsa.h):
     * delivered to the caller's callback or, without one, as NSA_LOG asks. */
    void (*log)(int level, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 2, 3)))
#endif
        ;
    /* (added in API version 4) The value of setting `name` (NSA_SETTING_*): the
     * one set through the API, else its environment variable's; returns 1 and
     * fills buf when there is one, 0 when unset (or too long for buf). */
    int (*setting)(const char *name, char *buf, size_t size);
} nsa_host_api;

/* Settings a backend may read through nsa_host_api.setting. */
#define NSA_SETTING_CACHE_DIR "cache_dir"       /* nsa_set_cache_dir, NSA_CACHE_DIR */
#define NSA_SETTING_BACKEND_PATH "backend_path" /* nsa_set_backend_path, NSA_BACKEND_PATH */
#define NSA_SETTING_CPU_THREADS "cpu_threads"   /* nsa_set_cpu_threads, NSA_CPU_THREADS */
#define NSA_CPU_THREADS_MAX 1024

typedef struct nsa_backend {
    int api_version;           /* NSA_BACKEND_API_VERSION */
    const char *name;          /* "cuda" */

    /* Is the runtime present, and how many devices? Must not fail on a machine
     * without the vendor driver: it returns NSA_ERR_BACKEND_UNAVAILABLE with a
     * reason ("libcuda.so.1 not found", "no OpenCL platform"). */
    nsa_status (*probe)(int *device_count, char *reason, size_t reason_size);
    nsa_status (*device_name)(int index, char *name, size_t size);

    /* native_stream: the caller's cudaStream_t / hipStream_t / cl_command_queue,
     * or NULL to create one. */
    nsa_status (*context_create)(int device, void *native_stream, void **bctx);
    void (*context_destroy)(void *bctx);
    nsa_status (*synchronize)(void *bctx);

    nsa_status (*buffer_alloc)(void *bctx, size_t bytes, void **bbuf);
    nsa_status (*buffer_wrap)(void *bctx, void *handle, size_t offset, size_t bytes, void **bbuf);
    void (*buffer_free)(void *bctx, void *bbuf);
    /* blocking copies, ordered after all work already queued on the context's
     * stream/queue; offsets in bytes */
    nsa_status (*buffer_write)(void *bctx, void *bbuf, size_t offset, const void *src, size_t bytes);
    nsa_status (*buffer_read)(void *bctx, void *bbuf, size_t offset, void *dst, size_t bytes);
    nsa_status (*buffer_fill)(void *bctx, void *bbuf, size_t offset, unsigned char value, size_t bytes);

    /* 1 if run(stage) works for this config (its dtype included), else 0.
     * A NULL supports means "every plain stage, no fused stage, and every dtype
     * but F64" (the core refuses an F64 plan on such a backend). */
    int (*supports)(void *bctx, nsa_stage stage, const nsa_config *cfg);

    int64_t query_tile;        /* tile length for plan->tiles; 0: none */
    int wants_device_tables;   /* 1: the core uploads the tables into dev_tables */

    /* optional: called once per plan after the tables are set (and uploaded) */
    nsa_status (*plan_prepare)(void *bctx, nsa_bk_plan *plan);
    void (*plan_release)(void *bctx, nsa_bk_plan *plan);

    /* Queues one stage on the context's stream; must not synchronize or allocate.
     * Kernels must stay memory-safe on any index tensor content: entries of
     * `indices` outside [0, floor(t_local / l_s)] (and -1) are skipped. */
    nsa_status (*run)(void *bctx, nsa_stage stage, const nsa_bk_args *args);

    /* optional (added in API version 2): the kind of device `index` as an
     * nsa_device_kind value (NSA_DEVICE_KIND_CPU for an OpenCL CPU device such as
     * PoCL). NULL: GPU for a module. */
    nsa_status (*device_kind)(int index, int *kind);

    /* optional (added in API version 3): the kernel a prepared plan runs for
     * `stage`, as the backend chose it ("attn_sm90[bn128,1cta,tma]"), into
     * name (NUL-terminated, truncated to size). NULL: the stage's own name. */
    nsa_status (*stage_kernel)(void *bctx, const nsa_bk_plan *plan, nsa_stage stage, char *name, size_t size);

    /* optional (added in API version 9): for a backend whose DECODE_APPEND checks
     * the step's lengths and tables on the device (run() returns once the step is
     * queued): waits for the decode plan's last step (the core has synchronized the
     * context) and returns the status of those checks, NSA_SUCCESS, or the named
     * status after host->set_error with the message (naming the sequence and the
     * entry, as a synchronous backend's run() would); NSA_SUCCESS before the first
     * step. NULL: run() returns a step's checks itself (cpu). */
    nsa_status (*decode_status)(void *bctx, const nsa_bk_plan *plan);

    /* (added in API version 11) 1: every stage the backend runs takes query rows
     * at an offset of their keys (nsa_bk_plan's pos(t) with Tq_b < Tk_b, the plans
     * of nsa_plan_create_varlen), and its BWD_STORE writes outputs of the float
     * type (NSA_BACKWARD_FLOAT_KEY_GRADS). 0: the core refuses both with
     * NSA_ERR_UNSUPPORTED. */
    int shards;
} nsa_backend;

/* A module's entry: returns its vtable, or NULL (after host->set_error) if it
 * cannot initialise at all. Modules define:
 *   NSA_BACKEND_EXPORT const int nsa_backend_api_version = NSA_BACKEND_API_VERSION;
 *   NSA_BACKEND_EXPORT const nsa_backend *nsa_backend_entry(const nsa_host_api *host);
 */
typedef const nsa_backend *(*nsa_backend_entry_fn)(const nsa_host_api *host);

#if defined(__GNUC__)
#define NSA_BACKEND_EXPORT __attribute__((visibility("default")))
#else
#define NSA_BACKEND_EXPORT
#endif

/* The built-in reference backend (backends/cpu). */
const nsa_backend *nsa_cpu_backend(const nsa_host_api *host);

#ifdef __cplusplus
}
#endif

#endif /* NSA_CORE_BACKEND_H */
