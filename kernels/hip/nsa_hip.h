/*
 * nsa_hip.h -- what the HIP backend (backends/hip) and the HIP kernels
 * (kernels/hip/<stage>.hip) share: the kernel argument structs and the host-side
 * launchers, one per stage of core/backend.h.
 *
 * Kernels never see core/ types: the backend turns an nsa_bk_args into the
 * plain structs below. Every launcher queues its kernel(s) on `stream`, never
 * synchronizes or allocates, and returns hipGetLastError() of the launch.
 *
 * Work decomposition (all kernels use NSA_HIP_THREADS threads per block and
 * never assume a wave size: reductions go through LDS, so the same code is
 * right for wave32 (gfx10/gfx11) and wave64 (gfx9/CDNA)):
 *   compress      MEAN/EXTERNAL: one thread per output element; LINEAR: a
 *                 32 x 64 output tile per block (an LDS-tiled GEMM per KV head)
 *   attention     one block per (token, KV group, head chunk, Dv chunk): the
 *                 rows are the G query heads of the group, which share every
 *                 K/V fetch (group-centric; the selected blocks of a token are
 *                 the same for all G heads). Online softmax over key chunks.
 *   scores        one block per (token, KV group): recomputes p_cmp from the
 *                 LSE and sums it into selection blocks by token overlap
 *   topn          one block per (token, KV group): exact radix select
 *   combine       one thread per output element
 *   decode        (semantics section 10, decode.hip) the step's device checks,
 *                 the append to the paged caches, the compressed rows it
 *                 completes, and the three branches split across blocks over
 *                 the keys (flash decoding), merged in split order
 * Every reduction has a fixed order: results are bitwise reproducible.
 */
#ifndef NSA_KERNELS_HIP_NSA_HIP_H
#define NSA_KERNELS_HIP_NSA_HIP_H

#include <hip/hip_runtime.h>
#include <stddef.h>
#include <stdint.h>

#define NSA_HIP_THREADS 256
/* Output elements one thread of the attention kernel accumulates in registers
 * (rows * Dv chunk <= NSA_HIP_THREADS * NSA_HIP_ACC). */
#define NSA_HIP_ACC 16
/* Most query heads one attention block handles (head chunk). */
#define NSA_HIP_MAX_ROWS 32

/* A tensor as kernels see it: ptr points at element (0, 0, 0) (the element
 * offset already applied); strides in elements; the last dimension is
 * contiguous. ptr == NULL: absent. */
struct nsa_hip_tensor {
    void *ptr;
    int64_t st; /* token (or row) stride */
    int64_t sh; /* head stride */
};

/* The problem: config, shape and the device copies of the plan's tables. */
struct nsa_hip_dims {
    int64_t T, B, Hq, Hkv, G, Dqk, Dv;
    int64_t l, d, ls, n, n_init, n_local, w;
    int64_t total_cmp, max_ns;
    float scale_log2;            /* softmax scale * log2(e): kernels use exp2 */
    float scale;                 /* the softmax scale itself (the backward uses exp) */
    int dtype;                   /* NSA_DT_* (nsa_dtype.h) of q, k, v, W, pe, kc_in, o */
    const int64_t *cu_seqlens;   /* [B + 1] token offsets */
    const int64_t *cu_cmp;       /* [B + 1] compressed-row offsets */
    const int64_t *tok_seq;      /* [T] sequence of each token */
};

/* Which key set an attention block walks. */
enum nsa_hip_kind { NSA_HIP_CMP = 0, NSA_HIP_SLC = 1, NSA_HIP_WIN = 2 };

/* LDS tiling of the attention and block-score kernels, chosen on the host for
 * the head dims and the device's LDS size (nsa_hip_attn_tile). */
struct nsa_hip_tile {
    int rows;        /* query heads per block (<= G, <= NSA_HIP_MAX_ROWS) */
    int keys;        /* keys per LDS chunk */
    int dv_chunk;    /* output columns per block */
    int head_chunks; /* ceil(G / rows) */
    int dv_chunks;   /* ceil(Dv / dv_chunk) */
    int sel_chunk;   /* scores only: selection blocks per pass */
    int psum_len;    /* scores only: compressed blocks per pass */
    int dpad;        /* Dqk rounded up for the tile (MFMA: a multiple of 4) */
    int ldq;         /* LDS row stride of the query and key tiles */
    int ldv;         /* LDS row stride of the value tile (>= dv_chunk, MFMA: multiple of 16) */
    int mfma;        /* 1: the matrix-core kernels (mfma.h), 0: the portable ones */
    size_t lds_bytes;
};

/* Tile choice; returns 0, or -1 when even the smallest tile does not fit in
 * lds_budget bytes (head dims too large). mfma = 1 asks for the matrix-core
 * tiling (16 heads x 16 keys, CDNA only) and returns -1 where it does not fit;
 * the caller then uses the portable tiling (mfma = 0). */
int nsa_hip_attn_tile(const nsa_hip_dims *dm, size_t lds_budget, int mfma, nsa_hip_tile *out);
int nsa_hip_scores_tile(const nsa_hip_dims *dm, size_t lds_budget, int mfma, nsa_hip_tile *out);

/* COMPRESS. src: k or v [T, Hkv, D] (dtype); dst: f32 [total_cmp, Hkv, D]. */
hipError_t nsa_hip_compress_mean(const nsa_hip_dims *dm, nsa_hip_tensor src, nsa_hip_tensor dst, int64_t D,
                                 hipStream_t stream);
/* LINEAR: w [Hkv, l, D, D] and pe [Hkv, l, D] (pe.ptr may be NULL), contiguous. */
hipError_t nsa_hip_compress_linear(const nsa_hip_dims *dm, nsa_hip_tensor src, nsa_hip_tensor w, nsa_hip_tensor pe,
                                   nsa_hip_tensor dst, int64_t D, hipStream_t stream);
/* EXTERNAL: src [total_cmp, Hkv, D] (dtype) -> dst f32. */
hipError_t nsa_hip_compress_copy(const nsa_hip_dims *dm, nsa_hip_tensor src, nsa_hip_tensor dst, int64_t D,
                                 hipStream_t stream);

/* CMP_ATTN / SLC_ATTN / WIN_ATTN. k, v: f32 kc/vc for CMP, else dtype.
 * idx: int32 [T, Hkv, n] (SLC only). o: f32 [T, Hq, Dv]. lse: f32 [T, Hq] or
 * absent. tile->mfma selects the matrix-core kernel. */
hipError_t nsa_hip_attention(const nsa_hip_dims *dm, int kind, const nsa_hip_tile *tile, nsa_hip_tensor q,
                             nsa_hip_tensor k, nsa_hip_tensor v, nsa_hip_tensor idx, nsa_hip_tensor o,
                             nsa_hip_tensor lse, hipStream_t stream);

/* BLOCK_SCORES: scores f32 [T, Hkv, max_ns] from q, kc (f32) and lse[CMP]. */
hipError_t nsa_hip_block_scores(const nsa_hip_dims *dm, const nsa_hip_tile *tile, nsa_hip_tensor q,
                                nsa_hip_tensor kc, nsa_hip_tensor lse, nsa_hip_tensor scores, hipStream_t stream);

/* SELECT_TOPN: indices int32 [T, Hkv, n], ascending, -1 padded. */
hipError_t nsa_hip_select_topn(const nsa_hip_dims *dm, nsa_hip_tensor scores, nsa_hip_tensor idx,
                               hipStream_t stream);

/* COMBINE: o = sum over branches with o_b[b].ptr != NULL of gate[b] * o_b[b]. */
hipError_t nsa_hip_combine(const nsa_hip_dims *dm, const nsa_hip_tensor gate[3], const nsa_hip_tensor o_b[3],
                           nsa_hip_tensor o, hipStream_t stream);

/* The backward stages (backward.hip). One branch's inputs: q, dO (dtype), the
 * forward's lse and the gate (f32 [T, Hq]), idx (SLC only); outputs dgate
 * (optional) and delta (f32 [T, Hq], from the rows kernel to the keys kernel). */
struct nsa_hip_bwd_in {
    nsa_hip_tensor q, dout, lse, gate, idx, dgate, delta;
};
/* BWD_*_ATTN: adds to dq (optional), dk, dv (f32 accumulators; for CMP the dkc,
 * dvc ones; each optional). k, v: f32 kc/vc for CMP, else dtype. */
hipError_t nsa_hip_bwd_attention(const nsa_hip_dims *dm, int kind, const nsa_hip_bwd_in *in, nsa_hip_tensor k,
                                 nsa_hip_tensor v, nsa_hip_tensor dq, nsa_hip_tensor dk, nsa_hip_tensor dv,
                                 hipStream_t stream);
/* BWD_COMPRESS: dc (f32 [total_cmp, Hkv, D]) back through MEAN or LINEAR: adds to
 * dx (f32 [T, Hkv, D]), and LINEAR to dw [Hkv, l, D, D], dpe [Hkv, l, D] (f32;
 * each optional); x, w, pe of the dtype (pe optional). */
hipError_t nsa_hip_bwd_compress(const nsa_hip_dims *dm, int linear, int64_t D, nsa_hip_tensor dc, nsa_hip_tensor x,
                                nsa_hip_tensor w, nsa_hip_tensor pe, nsa_hip_tensor dx, nsa_hip_tensor dw,
                                nsa_hip_tensor dpe, hipStream_t stream);
/* BWD_STORE: out (dtype) = acc (f32), rows x heads x dim elements. */
hipError_t nsa_hip_bwd_store(int dtype, nsa_hip_tensor acc, nsa_hip_tensor out, int64_t rows, int64_t heads,
                             int64_t dim, hipStream_t stream);

/* ---------------------------------------------------------------- decode
 * The decode step (docs/nsa-semantics.md section 10; decode.hip). Every kernel
 * reads the step's lengths (cu_seqlens_q, cache_seqlens) and page tables in
 * device memory; the host never reads them, allocates or waits. The check
 * kernels write the step's record (nsa_decode_record.h); every later kernel
 * reads its status first and returns when the step failed, so a failed step
 * writes nothing but the record and the status tensor. */

/* The step's shape, the plan's capacities and the step's tables. */
struct nsa_hip_dec_geom {
    int64_t B, MT, Hq, Hkv, G, Dqk, Dv;
    int64_t l, d, ls, n, n_init, n_local, w;
    int64_t max_step, max_context, ps, num_pages, max_pages, cps, num_cmp_pages, max_cmp_pages;
    int64_t max_nc, max_ns; /* of a max_context-token sequence: rows of pbuf and of the score rows */
    float scale_log2;       /* softmax scale * log2(e) */
    int dtype;              /* NSA_DT_* of q, k, v, the caches, W, pe, o */
    int compress;           /* nsa_compress_mode */
    const int *cu;          /* cu_seqlens_q [B + 1] */
    const int *tk0;         /* cache_seqlens [B] */
    const int *bt;          /* block_table, row stride bt_st */
    int64_t bt_st;
    const int *cbt;         /* cmp_block_table, row stride cbt_st (NULL: no compressed rows) */
    int64_t cbt_st;
    int *rec;               /* the step's record [NSA_DR_FIELDS] (plan memory) */
    int *status;            /* the caller's status tensor [2], or NULL */
};

/* Plan memory of the checks, zeroed (hipMemsetAsync) at the start of a step:
 * two flags (the first bad sequence b as UINT64_MAX - b: length or range
 * failures, shared written pages), then the uses of every page. */
struct nsa_hip_dec_checkmem {
    unsigned long long *flags; /* [2] */
    int *pcount, *ccount;      /* [num_pages], [num_cmp_pages] */
};

/* A branch's split of each row's keys: ns splits of chunk keys (a multiple of 32). */
struct nsa_hip_dec_split {
    int ns;
    int64_t chunk;
};

/* DECODE_APPEND: the checks (record, status tensor); the new tokens src
 * (packed rows [MT, Hkv, D]) into one paged cache; (MEAN, LINEAR) the
 * compressed rows the step completes from the compressed branch's raw cache
 * into cc (w, pe: LINEAR's, pe.ptr may be NULL). */
hipError_t nsa_hip_dec_check(const nsa_hip_dec_geom *g, const nsa_hip_dec_checkmem *m, hipStream_t stream);
hipError_t nsa_hip_dec_append(const nsa_hip_dec_geom *g, nsa_hip_tensor src, nsa_hip_tensor cache, int64_t D,
                              hipStream_t stream);
hipError_t nsa_hip_dec_compress(const nsa_hip_dec_geom *g, nsa_hip_tensor raw, nsa_hip_tensor w, nsa_hip_tensor pe,
                                nsa_hip_tensor cc, int64_t D, hipStream_t stream);

/* DECODE_ATTN, one branch (kind NSA_HIP_CMP: the compressed caches, SLC: the
 * selected blocks idx [MT, Hkv, n], WIN: the window) of every row of the step:
 * blocks (row, KV group x head chunk, split x Dv chunk) of the portable
 * attention tile, their partial states (unnormalised o, max, sum: part f32
 * [MT, Hq, ns, Dv + 2]) merged in split order into o (f32 [MT, Hq, Dv]) and
 * lse (f32 [MT, Hq], or absent). */
hipError_t nsa_hip_dec_attention(const nsa_hip_dec_geom *g, int kind, const nsa_hip_tile *tile,
                                 const nsa_hip_dec_split *sp, nsa_hip_tensor q, nsa_hip_tensor k, nsa_hip_tensor v,
                                 nsa_hip_tensor idx, float *part, nsa_hip_tensor o, nsa_hip_tensor lse,
                                 hipStream_t stream);

/* Block scores and top-n of every row: p_cmp summed over each KV group's heads
 * per visible compressed row (split like the compressed branch, sp; pbuf f32
 * [MT, Hkv, max_nc]), then one block per (row, KV group) sums them onto the
 * eligible selection blocks (rows: f32 [MT, Hkv, max_ns]) and ranks them
 * (topn.h) into idx. tile: the portable block-score tile. */
hipError_t nsa_hip_dec_select(const nsa_hip_dec_geom *g, const nsa_hip_tile *tile, const nsa_hip_dec_split *sp,
                              nsa_hip_tensor q, nsa_hip_tensor kc, nsa_hip_tensor lse_cmp, float *pbuf, float *rows,
                              nsa_hip_tensor idx, hipStream_t stream);

/* o (dtype) = sum over branches with o_b[b].ptr of gate[b] * o_b[b], the step's rows. */
hipError_t nsa_hip_dec_combine(const nsa_hip_dec_geom *g, const nsa_hip_tensor gate[3], const nsa_hip_tensor o_b[3],
                               nsa_hip_tensor o, hipStream_t stream);

#endif /* NSA_KERNELS_HIP_NSA_HIP_H */
