/*
 * Core-private definitions: the objects behind the public handles and the
 * functions the core's files share. Nothing here is visible to backends
 * (they see core/backend.h) or to users (include/nsa.h).
 */
#ifndef NSA_CORE_INTERNAL_H
#define NSA_CORE_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "nsa.h"

#define NSA_INTERNAL __attribute__((visibility("hidden")))

/* ---- errors (error.c) */
NSA_INTERNAL nsa_status nsa_set_error(nsa_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
NSA_INTERNAL void nsa_clear_error(void);
/* After a backend call failed: keeps the backend's own message, or, when it
 * left none, supplies one naming the backend and what it was doing ("creating
 * a context on device 0"). Returns status; NSA_SUCCESS passes through. */
NSA_INTERNAL nsa_status nsa_backend_error(nsa_status status, const char *backend, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
NSA_INTERNAL extern const nsa_host_api nsa_host;

/* ---- growing structs (struct.c; the rule is in nsa.h)
 * The first layouts, as version 0.1 defined them: a caller's struct smaller
 * than these is refused. While no field has been added since, they are the
 * structs' sizes; the first added field freezes them at today's values. */
#define NSA_CONFIG_SIZE_FIRST offsetof(nsa_config, flags) /* flags: added in 0.3 */
#define NSA_FORWARD_ARGS_SIZE_FIRST sizeof(nsa_forward_args)
#define NSA_PLAN_INFO_SIZE_FIRST offsetof(nsa_plan_info, backend_bytes) /* backend_bytes: added in 0.3 */
#define NSA_BACKEND_INFO_SIZE_FIRST sizeof(nsa_backend_info)
#define NSA_BACKWARD_ARGS_SIZE_FIRST sizeof(nsa_backward_args) /* added in 0.3 */
#define NSA_DECODE_LIMITS_SIZE_FIRST sizeof(nsa_decode_limits) /* added in 0.5 */
#define NSA_DECODE_ARGS_SIZE_FIRST sizeof(nsa_decode_args)     /* added in 0.5 */
/* A struct the caller passes in: size bytes at src (size >= first; any bytes
 * past the library's known size must be zero) over dst, which holds the
 * defaults of the fields the caller may not know. fn and arg name the call and
 * argument for the message. */
NSA_INTERNAL nsa_status nsa_struct_in(void *dst, size_t known, size_t first, const void *src, size_t size,
                                      const char *fn, const char *arg);
/* A struct the library fills: the first min(size, known) bytes of src into dst,
 * zero past known (size >= first). */
NSA_INTERNAL nsa_status nsa_struct_out(void *dst, size_t size, size_t first, const void *src, size_t known,
                                       const char *fn, const char *arg);
/* The caller's config (cfg_size bytes) as this library's full nsa_config. */
NSA_INTERNAL nsa_status nsa_config_take(const nsa_config *cfg, size_t cfg_size, nsa_config *out, const char *fn);

/* ---- registry (registry.c) */
typedef struct nsa_registered {
    char name[32];
    const nsa_backend *be;     /* NULL if the module could not be loaded */
    nsa_status load_status;    /* why be is NULL */
    int device_count;          /* 0 when unavailable */
    char reason[NSA_REASON_MAX]; /* why unavailable, or where it came from */
} nsa_registered;

/* Finds (loading on first use) backend `name`; never NULL for a well-formed
 * name, may have be == NULL or device_count == 0 with a reason. A name that is
 * neither a known backend nor a module file found on the search path is
 * answered in *scratch and not kept. Returns NULL and sets an error (saying
 * what is wrong with it) for a malformed name. */
NSA_INTERNAL const nsa_registered *nsa_registry_get(const char *name, nsa_registered *scratch);

/* Tries use() on each available backend of the preference list `request` (see
 * nsa_context_create) in order until one returns NSA_SUCCESS. */
NSA_INTERNAL nsa_status nsa_registry_choose(const char *request,
                                            nsa_status (*use)(const nsa_registered *r, void *arg), void *arg);

/* ---- objects */
struct nsa_context {
    const nsa_backend *be;
    void *bctx;
    int device;
    nsa_device_kind kind;
    long live_buffers;
    long live_plans;
    char backend_name[32];
    char device_name[NSA_NAME_MAX];
};

struct nsa_buffer {
    nsa_context *ctx;
    void *bbuf;
    size_t size;
    int internal;  /* owned by a plan (tables, workspace): not counted as the user's */
    const void *root; /* the allocation it lies in: itself, or the handle it wraps */
    int64_t base;     /* its first byte's offset in root (nsa_buffer_wrap's offset) */
};

/* Settings and logging (core/settings.c); the host API hands both to backends. */
NSA_INTERNAL void nsa_log(int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
NSA_INTERNAL int nsa_setting(const char *name, char *buf, size_t size);
/* Would a message at level reach anyone? (to skip building one that would not) */
NSA_INTERNAL int nsa_log_enabled(int level);

/* Aliasing checks of nsa_forward (core/alias.c): the views of one call. */
#define NSA_ALIAS_MAX 64
typedef struct nsa_alias_view {
    char name[32];
    const void *root;
    int64_t b0, b1;      /* first byte, one past the last */
    int64_t st, sh, w;   /* strides and row width in bytes */
    int64_t rows, heads;
    int output;
} nsa_alias_view;
typedef struct nsa_alias_set {
    int n;
    nsa_alias_view v[NSA_ALIAS_MAX];
} nsa_alias_set;
/* Adds a checked, present tensor (t its caller view, bk its converted strides). */
NSA_INTERNAL void nsa_alias_add(nsa_alias_set *set, const char *name, const nsa_tensor *t, const nsa_bk_tensor *bk,
                                int64_t rows, int64_t heads, int64_t dim, int output);
/* NSA_ERR_INVALID_VALUE naming the pair when an output overlaps another view or
 * any view overlaps the first ws_bytes of ws (ws NULL: none). */
NSA_INTERNAL nsa_status nsa_alias_check(const nsa_alias_set *set, const nsa_buffer *ws, int64_t ws_bytes,
                                        const char *fn);

/* Marks a buffer as a plan's own, so that nsa_context_destroy's count of live
 * buffers names only the caller's. */
NSA_INTERNAL void nsa_buffer_mark_internal(nsa_buffer *buf);
/* Frees a buffer without touching the last-error message (cleanup on error
 * paths must not erase the message that explains the error). */
NSA_INTERNAL void nsa_buffer_release(nsa_buffer *buf);

/* Workspace layout: byte offsets into the workspace buffer (-1: not used). */
typedef struct nsa_ws_layout {
    int64_t kc, vc, lse_cmp, scores, indices, o_b[3];
    /* training plans: the backward's float accumulators (f32; f64 in an f64 call) lie in [acc_begin, acc_end) */
    int64_t acc_begin, acc_end;
    int64_t dq_acc, dk_acc[3], dv_acc[3], dkc_acc, dvc_acc, dw_k_acc, dw_v_acc, dpe_k_acc, dpe_v_acc, delta;
    size_t bytes;
} nsa_ws_layout;

#define NSA_MAX_STAGES 8

struct nsa_plan {
    nsa_context *ctx;
    nsa_bk_plan bk;            /* what backends see; points into the arrays below */
    int64_t *cu_seqlens;       /* [B + 1] the queries' offsets */
    int64_t *cu_seqlens_k;     /* [B + 1] the keys' offsets where they differ (nsa_plan_create_varlen), else NULL */
    int64_t *cu_cmp;           /* [B + 1] */
    int64_t *tok_seq;          /* [T] */
    int64_t *tiles;            /* [num_tiles * 2] */
    nsa_buffer *tables;        /* device copy, or NULL */
    nsa_buffer *own_ws;        /* allocated on the first forward without a workspace */
    nsa_ws_layout ws;
    int num_stages;
    nsa_stage stages[NSA_MAX_STAGES];
    int num_bwd_stages;        /* training plans; 0 otherwise */
    nsa_stage bwd_stages[NSA_MAX_STAGES];
    int prepared;              /* backend plan_prepare succeeded */
    /* decode plans (nsa_decode_plan_create): bk.decode = 1; the last step's
     * status and message, for nsa_decode_check */
    nsa_status dec_status;
    char dec_msg[1024];
};

/* ---- tensor checks (tensor.c), shared by nsa_forward and nsa_backward */
NSA_INTERNAL extern const char *const nsa_branch_name[3]; /* "cmp", "slc", "win" */
/* A [rows, heads, dim] view (dim contiguous) as a call expects it. */
typedef struct nsa_tspec {
    const char *name;  /* "args->q" */
    int64_t rows, heads, dim;
    nsa_dtype dtype;
    int required;
    int output;        /* outputs must not overlap themselves */
    int contiguous;    /* strides ignored: rows*heads*dim dense elements */
} nsa_tspec;
/* Checks a caller's tensor t against sp and converts it to *out (zeroed and
 * absent when t has no buffer and is not required); fn names the call. */
NSA_INTERNAL nsa_status nsa_check_tensor(const nsa_plan *p, const char *fn, const nsa_tensor *t,
                                         const nsa_tspec *sp, nsa_bk_tensor *out);
/* Caller-given indices: ascending, -1 only as trailing padding, each eligible
 * (reads them back: blocking). name: "args->block_indices". */
NSA_INTERNAL nsa_status nsa_check_indices(const nsa_plan *p, const nsa_tensor *t, const char *fn, const char *name);
/* A dense view of the workspace at byte_off (absent when byte_off < 0), elements of dt. */
NSA_INTERNAL nsa_bk_tensor nsa_ws_view(nsa_buffer *ws, int64_t byte_off, int64_t heads, int64_t dim, nsa_dtype dt);

/* A caller's workspace (NULL: none) fits the plan; then the one to use: the
 * caller's, else the plan's own (allocated on first use). */
NSA_INTERNAL nsa_status nsa_workspace_check(const nsa_plan *plan, const nsa_buffer *ws, const char *fn);
NSA_INTERNAL nsa_status nsa_workspace_get(nsa_plan *plan, nsa_buffer **ws);

/* ---- shared helpers */
NSA_INTERNAL nsa_status nsa_config_check(const nsa_config *cfg, const char *what);

/* Block arithmetic of the semantics page: the host side's only copy. */
NSA_INTERNAL int64_t nsa_num_cmp_blocks(int64_t len, int64_t l, int64_t d);
NSA_INTERNAL int64_t nsa_num_slc_blocks(int64_t len, int64_t ls);

#endif
