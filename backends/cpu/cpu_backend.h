/*
 * The CPU reference backend: what its files share.
 *
 * The cpu backend is built into libnsa. It defines the function every GPU
 * backend is held to (docs/nsa-semantics.md), so it is written to be read:
 * one file per idea, every product and sum accumulated in double, softmax with
 * max-subtraction in double, f32 workspace values rounded once from double.
 *
 *   cpu_backend.c    the vtable: probe, contexts, host-memory buffers, dispatch
 *   cpu_parallel.c   a tiny pthreads parallel-for over tokens
 *   cpu_dtype.c/h    f32 / f16 / bf16 loads and stores (round to nearest even)
 *   cpu_compress.c   semantics section 1: MEAN, LINEAR, EXTERNAL
 *   cpu_attention.c  sections 2, 4, 5: compressed, selected, window attention
 *   cpu_select.c     section 3: block scores and top-n selection
 *   cpu_combine.c    section 6: the gated sum
 *   cpu_backward.c   section 9: the gradients (backward stages)
 *   cpu_decode.c     section 10: the decode step over paged caches (decode stages)
 */
#ifndef NSA_CPU_BACKEND_H
#define NSA_CPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "nsa.h"

#if defined(__GNUC__)
#define NSA_CPU_INTERNAL __attribute__((visibility("hidden")))
#else
#define NSA_CPU_INTERNAL
#endif

/* A context is only the thread-pool setting: how many threads a stage uses. */
typedef struct nsa_cpu_context {
    int threads;
} nsa_cpu_context;

/* A buffer is host memory: owned (allocated here) or the caller's (wrapped). */
typedef struct nsa_cpu_buffer {
    unsigned char *ptr; /* first usable byte */
    size_t bytes;       /* usable bytes from ptr */
    void *owned;        /* what to free(), or NULL for wrapped memory */
} nsa_cpu_buffer;

/* The core's services (set_error); set by nsa_cpu_backend(). */
NSA_CPU_INTERNAL const nsa_host_api *nsa_cpu_host(void);

/* First element of a tensor's buffer (element offsets are added by callers). */
static inline void *nsa_cpu_base(const nsa_bk_tensor *t)
{
    return ((const nsa_cpu_buffer *)t->buf)->ptr;
}

/* Element offset of row (token t, head h) of a [T, H, D] or [T, H] tensor. */
static inline int64_t nsa_cpu_at(const nsa_bk_tensor *t, int64_t token, int64_t head)
{
    return t->offset + token * t->stride_token + head * t->stride_head;
}

/* Address of element (token, head, 0) of an f32 tensor. */
static inline float *nsa_cpu_f32_at(const nsa_bk_tensor *t, int64_t token, int64_t head)
{
    return (float *)nsa_cpu_base(t) + nsa_cpu_at(t, token, head);
}

/* Address of element (token, head, 0) of an i32 tensor. */
static inline int32_t *nsa_cpu_i32_at(const nsa_bk_tensor *t, int64_t token, int64_t head)
{
    return (int32_t *)nsa_cpu_base(t) + nsa_cpu_at(t, token, head);
}

/* Sequence b's queries are the last positions of its keys (nsa_bk_plan): query
 * row cu_seqlens[b] + i is position shift + i, with shift = Tk_b - Tq_b (0 but
 * for the plans of nsa_plan_create_varlen); position x is key row
 * cu_seqlens_k[b] + x. */
static inline int64_t nsa_cpu_shift(const nsa_bk_plan *p, int64_t b)
{
    return (p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b]) - (p->cu_seqlens[b + 1] - p->cu_seqlens[b]);
}

/* Position of query row t within its sequence, and that sequence. */
static inline int64_t nsa_cpu_local(const nsa_bk_plan *p, int64_t t, int64_t *seq)
{
    int64_t b = p->tok_seq[t];
    *seq = b;
    return t - p->cu_seqlens[b] + nsa_cpu_shift(p, b);
}

/* The query row at position x of sequence b, for x >= nsa_cpu_shift(p, b). */
static inline int64_t nsa_cpu_query_row(const nsa_bk_plan *p, int64_t b, int64_t x)
{
    return p->cu_seqlens[b] + x - nsa_cpu_shift(p, b);
}

/* The last b in [0, B) with offs[b] <= r: the sequence that owns row r of a
 * table of B + 1 offsets (a sequence with no rows shares its offset with the
 * next one, which then owns the row). */
static inline int64_t nsa_cpu_owner(const int64_t *offs, int64_t B, int64_t r)
{
    int64_t lo = 0, hi = B - 1; /* answer in [lo, hi] */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (offs[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Position of key row r within its sequence, and that sequence. */
static inline int64_t nsa_cpu_key_local(const nsa_bk_plan *p, int64_t r, int64_t *seq)
{
    const int64_t b = p->cu_seqlens_k == p->cu_seqlens ? p->tok_seq[r] : nsa_cpu_owner(p->cu_seqlens_k, p->batch, r);
    *seq = b;
    return r - p->cu_seqlens_k[b];
}

/* G = Hq / Hkv, and max(Dqk, Dv) (scratch rows hold either). */
static inline int64_t nsa_cpu_group(const nsa_config *cfg) { return cfg->num_q_heads / cfg->num_kv_heads; }
static inline int64_t nsa_cpu_dmax(const nsa_config *cfg)
{
    return cfg->head_dim_qk > cfg->head_dim_v ? cfg->head_dim_qk : cfg->head_dim_v;
}

/* The sequence that owns compressed row r: cu_cmp[b] <= r < cu_cmp[b + 1]. */
static inline int64_t nsa_cpu_cmp_row_sequence(const nsa_bk_plan *p, int64_t r)
{
    return nsa_cpu_owner(p->cu_cmp, p->batch, r);
}

/* Checks that a tensor a stage needs is present and of an allowed dtype;
 * returns NSA_SUCCESS or an error already recorded with set_error. */
NSA_CPU_INTERNAL nsa_status nsa_cpu_need(const nsa_bk_tensor *t, const char *stage, const char *name,
                                         int float_ok, int i32_ok);

/* The stages (one per semantics section); each returns after the work is done. */
NSA_CPU_INTERNAL nsa_status nsa_cpu_compress(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_cmp_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_block_scores(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_select_topn(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_scores_topn(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_slc_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_win_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_combine(const nsa_cpu_context *ctx, const nsa_bk_args *a);
/* The same over tokens [t0, t1) of the plan only (the decode step's rows). */
NSA_CPU_INTERNAL nsa_status nsa_cpu_cmp_attn_rows(const nsa_cpu_context *ctx, const nsa_bk_args *a, int64_t t0,
                                                  int64_t t1);
NSA_CPU_INTERNAL nsa_status nsa_cpu_scores_topn_rows(const nsa_cpu_context *ctx, const nsa_bk_args *a, int64_t t0,
                                                     int64_t t1);
NSA_CPU_INTERNAL nsa_status nsa_cpu_slc_attn_rows(const nsa_cpu_context *ctx, const nsa_bk_args *a, int64_t t0,
                                                  int64_t t1);
NSA_CPU_INTERNAL nsa_status nsa_cpu_win_attn_rows(const nsa_cpu_context *ctx, const nsa_bk_args *a, int64_t t0,
                                                  int64_t t1);
NSA_CPU_INTERNAL nsa_status nsa_cpu_combine_rows(const nsa_cpu_context *ctx, const nsa_bk_args *a, int64_t t0,
                                                 int64_t t1);
/* WIN_COMBINE: the window branch a run of tokens at a time into scratch, then COMBINE of those rows */
NSA_CPU_INTERNAL nsa_status nsa_cpu_win_combine(const nsa_cpu_context *ctx, const nsa_bk_args *a);
/* One MEAN / LINEAR compressed row (cpu_compress.c): row `row` of kc, vc from
 * token rows tok0 .. tok0 + l - 1 of k, v; scratch of 3 * nsa_cpu_doubles(max(Dqk, Dv)). */
NSA_CPU_INTERNAL void nsa_cpu_compress_block(const nsa_bk_args *a, const nsa_bk_tensor *k, const nsa_bk_tensor *v,
                                             int64_t tok0, const nsa_bk_tensor *kc, const nsa_bk_tensor *vc,
                                             int64_t row, double *scratch);
/* The decode stages (section 10, cpu_decode.c) and the decode plan's scratch. */
NSA_CPU_INTERNAL nsa_status nsa_cpu_plan_prepare(void *bctx, nsa_bk_plan *plan);
NSA_CPU_INTERNAL void nsa_cpu_plan_release(void *bctx, nsa_bk_plan *plan);
NSA_CPU_INTERNAL nsa_status nsa_cpu_decode_append(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_decode_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a);
/* The backward stages (section 9, cpu_backward.c). */
NSA_CPU_INTERNAL nsa_status nsa_cpu_bwd_cmp_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_bwd_compress(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_bwd_slc_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_bwd_win_attn(const nsa_cpu_context *ctx, const nsa_bk_args *a);
NSA_CPU_INTERNAL nsa_status nsa_cpu_bwd_store(const nsa_cpu_context *ctx, const nsa_bk_args *a);

#endif
