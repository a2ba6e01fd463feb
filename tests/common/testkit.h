/*
 * testkit: the reusable parity machinery of the libnsa test suite.
 *
 * Used by tests/test_oracle.c (Check) and by the `nsa parity` tool. It sees the
 * library only through include/nsa.h and has no Check dependency.
 *
 * Pieces, one file each:
 *   corpus.c   a deterministic list of configurations (tk_case): "full" (>= 120
 *              cases), "small" (~20 tiny cases for sanitizers / oclgrind) and
 *              "gpu" (model sizes, whose oracle checks a sample of rows: tk_case.rows)
 *   inputs.c   the inputs of a case, drawn with nsa_random_uniform (the library's
 *              portable generator: every machine draws the same numbers) and
 *              rounded to the case dtype; host master copies are floats that are
 *              already rounded, so the oracle and the backend see identical values
 *   oracle.c   an fp64 brute-force implementation of docs/nsa-semantics.md,
 *              written independently of backends/cpu: explicit visible-key lists,
 *              block scores by explicit token-overlap counting, selection by a full
 *              sort of (forced, score, index), dense softmax over the visible set;
 *              every row, or only the case's sampled tokens (tk_case_sample)
 *   runner.c   uploads a case through the public API (strided / packed / aliased
 *              layouts), poisons every output, runs nsa_forward, reads back
 *   shard.c    a case computed in shards (nsa_plan_create_varlen, semantics 11):
 *              forward rows and backward gradients put back together
 *   compare.c  backend vs oracle: dtype-aware tolerances, NaN never passes, every
 *              element of every row the oracle computed checked, the near-tie rule
 *              of semantics section 7
 *
 * Typical use:
 *   tk_case *cases; int n = tk_corpus("full", &cases);
 *   for (i...) { tk_case c = cases[i]; tk_case_set_dtype(&c, NSA_DTYPE_BF16);
 *                tk_verdict v; tk_check_case(ctx, &c, &v); tk_stats_add(&st, &c, &v); }
 *   tk_stats_print(stdout, "bf16", &st); free(cases);
 *
 * All functions are thread-compatible (no global state).
 */
#ifndef NSA_TESTKIT_H
#define NSA_TESTKIT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "nsa.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TK_MAX_BATCH 8
#define TK_LABEL_MAX 48
#define TK_MSG_MAX 1024

/* ------------------------------------------------------------------ cases */

/* How the runner lays the tensors out in device buffers. The oracle never cares. */
typedef enum tk_layout {
    /* one dense buffer per tensor; k[0..2] (and v[0..2]) are one and the same
     * tensor; the library allocates the workspace (workspace = NULL) */
    TK_LAYOUT_DENSE = 0,
    /* non-contiguous: q and o have stride_head = D + pad and stride_token larger
     * than H * stride_head, non-zero element offsets; k and v share one packed kv
     * buffer [T][k heads | v heads]; the three gates share one buffer [T][3][Hq],
     * the three LSEs likewise; selected indices have padded rows; k[0..2] alias one
     * view; a caller workspace (poisoned) is passed. Padding is poisoned and must
     * stay untouched. */
    TK_LAYOUT_STRIDED = 1,
    /* dense, but k[b] and v[b] are three distinct buffers holding distinct values
     * (the oracle uses each branch's own K/V); caller workspace (poisoned) */
    TK_LAYOUT_DISTINCT = 2
} tk_layout;

/* One configuration of the corpus. cfg.dtype is set by the caller
 * (tk_case_set_dtype); the corpus hands cases out as F32. */
typedef struct tk_case {
    char label[TK_LABEL_MAX];  /* short, unique within its corpus */
    nsa_config cfg;
    int64_t batch;                          /* 1 .. TK_MAX_BATCH */
    int64_t cu_seqlens[TK_MAX_BATCH + 1];   /* cu_seqlens[0] = 0, non-decreasing */
    uint64_t seed;                          /* inputs are drawn from this seed */
    int fixed_indices;  /* 1: pass caller-chosen block indices (args.block_indices);
                           only meaningful when cfg.num_selected > 0 */
    int use_pe;         /* LINEAR only: pass pe_k / pe_v */
    tk_layout layout;
    int64_t rows;       /* 0: the oracle computes and the comparison checks every
                           token's rows; N > 0: only a deterministic sample of about
                           N tokens per sequence (tk_case_sample), for sizes whose
                           fp64 oracle of every row is too slow (the gpu corpus) */
} tk_case;

/* Fills *cases with a malloc'ed array (free() it) of the named corpus, "full",
 * "small" or "gpu", and returns its length; -1 for an unknown name.
 * Deterministic: the same list on every machine. Every case passes
 * nsa_config_validate. */
int tk_corpus(const char *name, tk_case **cases);

/* The tokens whose rows the oracle computes and the comparison checks:
 * mask[t] = 1 for the sampled tokens t of [0, T), 0 for the others; returns
 * their count. c->rows == 0: every token. Otherwise, in each sequence, the
 * first and the last 48 tokens (T < l, T < w, the first selection blocks and
 * the causal end) and, spread evenly over the rest, (c->rows - 96) / 5 groups
 * of five: a token a, the first token after a of a selection block and the
 * token before it (the eligible and forced blocks change there), the first
 * token after a that sees one more compressed block (i*d + l - 1) and the
 * token before it. So at most c->rows a sequence (fewer where a group's
 * tokens coincide), and every token of a sequence up to 96 long. */
int64_t tk_case_sample(const tk_case *c, uint8_t *mask);

/* The next value of a splitmix64 stream (the corpus's generator; also the decode
 * tests' page shuffles and step lengths). */
uint64_t tk_splitmix64(uint64_t *state);

/* p[0 .. n-1] = a shuffled list of the numbers 0 .. n-1 (Fisher-Yates over the
 * splitmix64 stream s): the decode tests' and the nsa tool's page tables. */
void tk_shuffle(int32_t *p, int64_t n, uint64_t *s);

/* Sets cfg.dtype (F32, F16, BF16 or F64). */
void tk_case_set_dtype(tk_case *c, nsa_dtype dtype);

/* The float type of a call of dtype dt (gates, LSEs, dgate): F64 for F64, else F32. */
nsa_dtype tk_float_dtype(nsa_dtype dt);

/* Total tokens cu_seqlens[batch]. */
int64_t tk_case_tokens(const tk_case *c);

/* Nc of a sequence of length len (semantics section 1), Ns = ceil(len / l_s). */
int64_t tk_num_cmp_blocks(const nsa_config *cfg, int64_t len);
int64_t tk_num_slc_blocks(const nsa_config *cfg, int64_t len);

/* Sum of Nc over the batch (rows of EXTERNAL kc/vc; INT64_MAX if the sum
 * overflows); max Ns over the batch. A sequence whose cu_seqlens difference is
 * negative or overflows counts as empty. */
int64_t tk_case_total_cmp(const tk_case *c);
int64_t tk_case_max_slc(const tk_case *c);

/* Sequence and local position of global token t. */
void tk_case_token(const tk_case *c, int64_t t, int64_t *seq, int64_t *local);

/* The softmax scale actually used: cfg.scale, or (float)(1/sqrt(Dqk)) when 0. */
double tk_case_scale(const tk_case *c);

/* One-line description: "label f16 B=2 T=[0,37] H=4/2 D=17/5 l=8 d=4 ls=16 n=3
 * init=1 local=1 w=9 mean scale=0 strided fixed rows=256" (rows= where the case
 * samples). Returns buf. */
const char *tk_case_describe(const tk_case *c, char *buf, size_t size);

/* Is selection block j forced for a query at local position t (semantics 3)? */
int tk_block_forced(const nsa_config *cfg, int64_t t_local, int64_t j);

/* ------------------------------------------------------------------ inputs */

/* Host master copies, logical dense row-major layouts, values already rounded to
 * `dtype` (so converting them to dtype is exact). Arrays a case does not use are
 * NULL. When the layout is not DISTINCT, k[1] == k[2] == k[0] (same pointer) and
 * likewise v. */
typedef struct tk_inputs {
    nsa_dtype dtype;
    int64_t tokens;      /* T */
    int64_t total_cmp;   /* rows of kc / vc */
    float *q;            /* [T, Hq, Dqk], uniform [-2, 2) */
    float *k[3];         /* [T, Hkv, Dqk], uniform [-2, 2) */
    float *v[3];         /* [T, Hkv, Dv], uniform [-1, 1) */
    float *gate[3];      /* [T, Hq], uniform [0.05, 0.95) (f32 values, passed in the
                            call's float type); NULL when the branch is off (n = 0 or w = 0) */
    float *w_k, *w_v;    /* LINEAR: [Hkv, l, D, D], uniform +-1.7/sqrt(l*D) */
    float *pe_k, *pe_v;  /* LINEAR with use_pe: [Hkv, l, D], uniform [-0.5, 0.5) */
    float *kc, *vc;      /* EXTERNAL: [total_cmp, Hkv, Dqk|Dv], uniform [-2,2) / [-1,1) */
    int32_t *given;      /* fixed_indices: [T, Hkv, n] ascending, eligible, -1 padded */
} tk_inputs;

/* Draws the inputs of case c for c->cfg.dtype. On failure returns the status
 * (NSA_ERR_OUT_OF_MEMORY; NSA_ERR_INVALID_SHAPE when a tensor's byte count
 * overflows 64 bits, found before anything is allocated) with *in zeroed. */
nsa_status tk_inputs_make(const tk_case *c, tk_inputs *in);
void tk_inputs_free(tk_inputs *in);

/* ------------------------------------------------------------------ oracle */

/* What sel holds in the rows of a token the oracle did not compute. */
#define TK_SEL_UNSAMPLED (-2)

typedef struct tk_oracle {
    int64_t tokens;      /* T */
    int64_t max_ns;      /* row length of scores */
    double *o;           /* [T, Hq, Dv] */
    double *lse[3];      /* [T, Hq]; -INFINITY where the branch sees nothing; NULL
                            when the branch is off */
    int32_t *sel;        /* [T, Hkv, n], ascending, -1 padded; NULL when n = 0 */
    double *scores;      /* [T, Hkv, max_ns]: s(t, g, j) for eligible j, NAN for
                            ineligible j; NULL when n = 0 */
    uint8_t *sampled;    /* [T]: 1 where the token's rows were computed
                            (tk_case_sample); NULL: every token's were. The rows
                            of the others are NAN (o, lse, scores) and
                            TK_SEL_UNSAMPLED (sel) */
} tk_oracle;

/* x rounded once to the nearest value of dtype (ties to even; overflow to inf),
 * as a double: how the oracle stores MEAN/LINEAR kc/vc (semantics 7). Written
 * from the formats' parameters, independent of the library's conversions. */
double tk_round_to_dtype(double x, nsa_dtype dtype);

/* One compressed row (semantics 1 and 7) of head h for kv = 0 (keys, Dqk) or 1
 * (values, Dv): rows[j] points at token i*d + j of the block, [Hkv][D] floats;
 * MEAN or LINEAR (the inputs' W and pe), in fp64, rounded once to the dtype. The
 * oracle and the paged decode cache (decode.c) both form their rows with it. */
void tk_compress_row(const tk_case *c, const tk_inputs *in, int kv, int64_t h, const float *const *rows,
                     double *out);

/* ------------------------------------------------------------------ decoding (decode.c)
 * A paged KV cache (semantics section 10) on the host: pools of pages
 * [num_pages * page_size][Hkv][D] of each branch's raw k, v (one pool where the
 * inputs share a tensor) and of the compressed rows [num_cpages * cpage_size][Hkv]
 * [D]; per sequence a page table (table[b * max_pages + p], ctable likewise) into
 * a shuffled order of the pools' pages, len[b] cached tokens and nc[b] compressed
 * rows formed. Pools start as NaN, so a read of anything not yet written shows. */
typedef struct tk_paged {
    int64_t page_size, max_pages, num_pages;
    int64_t cpage_size, max_cpages, num_cpages;
    int32_t *table, *ctable;
    int64_t *len, *nc;
    float *k[3], *v[3]; /* k[b] == k[0] where the inputs share the tensor */
    float *kc, *vc;     /* values of the dtype */
} tk_paged;
/* An empty cache for the case's batch, pages shuffled by seed. */
nsa_status tk_paged_make(const tk_case *c, const tk_inputs *in, int64_t page_size, int64_t cpage_size,
                         uint64_t seed, tk_paged *pc);
void tk_paged_free(tk_paged *pc);
/* Appends the next tq tokens of sequence b (their k, v from the inputs) and forms
 * the compressed blocks their arrival completes, once each, from the cached
 * tokens (EXTERNAL: the inputs' rows). */
nsa_status tk_paged_append(const tk_case *c, const tk_inputs *in, tk_paged *pc, int64_t b, int64_t tq);
/* Rows [t0, t1) of sequence b (local positions, t1 <= len[b]) as the forward of
 * its cached prefix computes them: the oracle on the prefix read back through the
 * page tables, compressed rows from the compressed cache. rows->o, lse, sel hold
 * t1 - t0 rows (free with tk_oracle_free; scores are not kept). */
nsa_status tk_paged_rows(const tk_case *c, const tk_inputs *in, const tk_paged *pc, int64_t b, int64_t t0,
                         int64_t t1, tk_oracle *rows);

/* Computes the reference in fp64 from the (rounded) inputs. indices: NULL for
 * the top-n selection, or [T, Hkv, n] block indices to use instead (fixed-indices
 * mode; they are copied to sel). When c->fixed_indices is set the caller passes
 * in->given. When c->rows > 0 only the sampled tokens' rows are computed (each
 * bitwise as the full run computes it; the compressed keys and values are
 * formed whole) and out->sampled says which. */
nsa_status tk_oracle_run(const tk_case *c, const tk_inputs *in, const int32_t *indices,
                         tk_oracle *out);
void tk_oracle_free(tk_oracle *r);

/* ------------------------------------------------------------------ gradients (grad.c) */

/* Every tensor of a case in fp64, dense in the oracle's layouts: the forward's
 * inputs, or their gradients. t[i] is NULL (n[i] = 0) where the case has no
 * such tensor (a branch that is off; k_cmp / v_cmp for EXTERNAL; LINEAR's
 * weights for other modes; kc / vc unless EXTERNAL). */
enum {
    TK_G_Q = 0,
    TK_G_K = 1,    /* + branch */
    TK_G_V = 4,    /* + branch */
    TK_G_GATE = 7, /* + branch */
    TK_G_WK = 10,
    TK_G_WV,
    TK_G_PEK,
    TK_G_PEV,
    TK_G_KC,
    TK_G_VC,
    TK_G_COUNT
};
typedef struct tk_ref64 {
    double *t[TK_G_COUNT];
    int64_t n[TK_G_COUNT];
} tk_ref64;

/* Zeroed tensors of case c's shapes. */
nsa_status tk_ref64_alloc(const tk_case *c, tk_ref64 *x);
/* The inputs as doubles. */
nsa_status tk_ref64_from_inputs(const tk_case *c, const tk_inputs *in, tk_ref64 *x);
void tk_ref64_free(tk_ref64 *x);
const char *tk_ref64_name(int i);

/* The forward of semantics sections 1-6 in fp64 over x with the selection sel
 * [T, Hkv, n] given; o [T, Hq, Dv] and lse[b] [T, Hq] (lse[b] may be NULL).
 * round: round MEAN / LINEAR kc, vc to the case dtype (semantics 7, as the
 * oracle does); 0 for finite differences. */
nsa_status tk_ref64_forward(const tk_case *c, const tk_ref64 *x, const int32_t *sel, int round, double *o,
                            double *lse[3]);
/* Section 9: the gradients of L = sum dO . o with respect to every tensor of x,
 * the selection sel held fixed and the rounding of kc, vc passed straight
 * through, into grad (allocated here; tk_ref64_free it). round: the forward
 * values the gradients are taken at use kc, vc rounded to the case dtype (as
 * the library computes them); 0 for finite differences. */
nsa_status tk_ref64_backward(const tk_case *c, const tk_ref64 *x, const int32_t *sel, int round, const double *dO,
                             tk_ref64 *grad);
/* The backward as a GPU kernel computes it with 16-bit products, for
 * dev/precision/bwd_rounding.c: mode 0 (the default) is the reference; the bits
 * round to dt, before their products, scale ds for dq (TK_EMU_DQ), for dk
 * (TK_EMU_DK) and g p for dv (TK_EMU_DV); TK_EMU_CENTER multiplies dq's ds by
 * k - mean k (the mean of the branch's keys of the sequence and KV head, the
 * difference rounded too), which sum_r ds_r = 0 allows; TK_EMU_ONE forms dq as
 * scale (sum (p dp) k - D sum p k) with p dp and p rounded once (the one-sweep
 * rows kernels without their hi + lo split). Process-wide; not thread-safe. */
enum { TK_EMU_DQ = 1, TK_EMU_DK = 2, TK_EMU_DV = 4, TK_EMU_CENTER = 8, TK_EMU_ONE = 16 };
void tk_ref64_emulate(int mode, nsa_dtype dt);

/* Section 11: the backward of the shard of packed rows [r0, r1) alone, added into
 * grad (tk_ref64_alloc'd by the caller): dq and dg of those rows (nothing elsewhere)
 * and the partial key-side gradients of their sums. */
nsa_status tk_ref64_backward_rows(const tk_case *c, const tk_ref64 *x, const int32_t *sel, int round,
                                  const double *dO, int64_t r0, int64_t r1, tk_ref64 *grad);

/* ------------------------------------------------------------------ backward (backward.c) */

/* A backend's gradients, as doubles in tk_ref64's layout (n[i] = 0 where not
 * returned), with the raw bytes as read back (determinism). shared: one k (v)
 * tensor served every branch, so t[TK_G_K + first branch] holds their sum. */
typedef struct tk_grads {
    double *t[TK_G_COUNT];
    int64_t n[TK_G_COUNT];
    void *raw[TK_G_COUNT];
    size_t raw_bytes[TK_G_COUNT];
    int shared;
    size_t workspace_bytes, backend_bytes; /* the training plan's (nsa_plan_info) */
    int num_bwd;                       /* its backward stages (nsa_plan_info.bwd_stages) */
    char bwd_stage[8][24];             /* their names */
    char bwd_kernel[8][NSA_NAME_MAX];  /* and kernels (nsa_plan_stage_kernel) */
} tk_grads;

/* 1 when the branches that read k / v (EXTERNAL: not cmp) share one tensor
 * (in->k[b] the same pointer): the runner then passes one view and one
 * gradient view for them all. */
int tk_inputs_shared_kv(const tk_case *c, const tk_inputs *in);

/* nsa_backward of case c on ctx (a training plan), from the inputs, dO [T, Hq,
 * Dv] (floats, already of the dtype), the forward's lse[b] [T, Hq] (enabled
 * branches) and its selection sel [T, Hkv, n] (n > 0), every gradient buffer
 * poisoned first; fills out (tk_grads_free it). On failure: the status, with
 * "<call>: <status>: <message>" in msg, and nothing to free. */
nsa_status tk_run_backward(nsa_context *ctx, const tk_case *c, const tk_inputs *in, const float *dO,
                           double *const lse[3], const int32_t *sel, tk_grads *out, char *msg, size_t msg_size);
void tk_grads_free(tk_grads *g);

/* Reads the gradients of an nsa_backward call back into out (zeroed by the
 * caller; tk_grads_free it, also after a failure): every view is dense from
 * element 0 of its buffer, as tk's runners make them; T query rows, TK key rows,
 * Nc compressed rows; the key-side gradients (dk, dv, dW, dpe, dkc, dvc) of
 * key_dt (cfg.dtype, or the float type under NSA_BACKWARD_FLOAT_KEY_GRADS). A
 * view given for several branches is read once, under its first branch. */
nsa_status tk_grads_read(const tk_case *c, const nsa_backward_args *a, int64_t T, int64_t TK, int64_t Nc,
                         nsa_dtype key_dt, tk_grads *out);

/* dO [T, Hq, Dv] for case c: uniform [-1, 1) from (seed, stream), rounded to the
 * case dtype (as floats); *out malloc'ed. */
nsa_status tk_dout_make(const tk_case *c, uint64_t seed, uint64_t stream, float **out);

/* Folds the reference's per-branch k (v) gradients into the first branch's,
 * as a shared tensor receives them. */
void tk_ref64_sum_shared(tk_ref64 *ref);

/* Gradient tolerances: an element passes when
 *     |got - ref| <= rms_tol * max(rms(ref tensor), floor) + rel_tol * |ref|
 * floor = 0.1 rms(dO) (dpe: times sqrt(compressed rows), as it sums them and the
 * keys' sum is 0), (rms_tol, rel_tol) = (3e-4, 3e-4) f32, (1e-2, 4e-3) f16,
 * (1e-2, 1.6e-2) bf16, (1e-10, 1e-10) f64 (fp64 end to end, LSE included: only
 * accumulation order differs from the reference; the corpus's worst is far
 * below). Otherwise gradients are rounded once to the dtype (2^-11, 2^-8
 * relative) and accumulated in f32 between stages; and the backward recomputes
 * p from the backend's own forward LSE, which the forward's tolerance lets be
 * 1e-4 off (absolute), so every p may carry a 1e-4 relative error (HIP's
 * exp2-based LSE, for one, is 1e-5 off and gave f32 gradients 1.1e-4 of rms
 * off against 1e-4 allowed). */
void tk_grad_tolerance(nsa_dtype dt, double *rms_tol, double *rel_tol);
typedef struct tk_grad_verdict {
    int pass;
    double worst;        /* max |got - ref| / tolerance */
    int64_t elements;
    char msg[TK_MSG_MAX];/* first failure: case, tensor, element, values */
} tk_grad_verdict;
int tk_compare_grads(const tk_case *c, const tk_grads *got, const tk_ref64 *ref, double rms_do, int64_t total_cmp,
                     tk_grad_verdict *v);

/* ------------------------------------------------------------------ runner */

/* What a backend returned, converted to host floats, dense logical layouts. */
typedef struct tk_output {
    int64_t tokens;
    float *o;            /* [T, Hq, Dv] */
    float *lse[3];       /* [T, Hq]; NULL when the branch is off (not requested) */
    double *o_d;         /* o and the LSEs again as doubles (exact: an f64 call's */
    double *lse_d[3];    /* values keep their precision); tk_compare uses these when set */
    int32_t *sel;        /* [T, Hkv, n]; NULL when n = 0 or with caller-given indices */
    void *o_raw;         /* the o tensor's buffer bytes as read back (determinism) */
    size_t o_raw_bytes;
    int64_t stray_writes;/* poisoned padding bytes the backend overwrote (must be 0) */
    char stray_where[128];
    char stages[256];    /* nsa_plan_info.stages */
} tk_output;

/* Runs case c on ctx: allocates and fills buffers per c->layout, poisons every
 * output (0xFF: NaN for f32/f16/bf16 outputs and LSEs; 0x7F: 0x7f7f7f7f for
 * indices) and padding, plans, runs nsa_forward (with in->given as
 * block_indices when c->fixed_indices; with NSA_FORWARD_TRUST_INDICES too when
 * the layout is STRIDED), synchronizes and reads back. Requests
 * lse[b] for every enabled branch and `selected` when n > 0 and the indices are
 * not caller-given (the core refuses both together); passes gates only
 * for enabled branches. Returns the first failing status with a message in msg
 * ("nsa_forward: <status>: <nsa_last_error()>"). Frees every object it made on
 * every path. */
nsa_status tk_run(nsa_context *ctx, const tk_case *c, const tk_inputs *in, tk_output *out,
                  char *msg, size_t msg_size);
void tk_output_free(tk_output *out);

/* ------------------------------------------------------------------ shards (shard.c) */

#define TK_MAX_SHARDS 64

/* Cuts of every sequence of c into P shards: cut[b][0] = 0 <= cut[b][1] <= ... <=
 * cut[b][P] = its length. rng NULL: even cuts (len * p / P); else drawn from the
 * splitmix64 stream *rng (empty shards possible). 1 <= P <= TK_MAX_SHARDS. */
void tk_shard_cuts(const tk_case *c, int P, uint64_t *rng, int64_t (*cut)[TK_MAX_SHARDS + 1]);

/* Case c computed in P shards on ctx (docs/nsa-semantics.md section 11): shard p is
 * one nsa_plan_create_varlen plan over the batch whose sequence b has the rows
 * [cut[b][p], cut[b][p+1]) as queries and its rows [0, cut[b][p+1]) as keys
 * (their k, v, gates and, for EXTERNAL, the compressed rows of that prefix);
 * every output poisoned first. P = 1 with tk_shard_cuts is the whole problem as
 * one varlen plan.
 *   dO NULL: the forward. Fills fwd as tk_run does (o, o_d; lse, lse_d of the
 *   enabled branches; sel when n > 0 and the indices are not the case's own), each
 *   row from the shard that owns it.
 *   dO [T, Hq, Dv] given: the backward, from the whole forward's LSEs lse[b]
 *   [T, Hq] and selection sel [T, Hkv, n] (n > 0), each shard with
 *   NSA_BACKWARD_FLOAT_KEY_GRADS. Fills grads->t, n (raw left NULL): dq and dgate
 *   rows from the shard that owns them; the key-side gradients (dk, dv, dW, dpe,
 *   dkc, dvc) the sums in fp64, in shard order, of the shards' float parts, not
 *   rounded; grads->shared as tk_run_backward.
 * On failure: the status, "shard p of P: <call>: <status>: <message>" in msg,
 * nothing to free. */
nsa_status tk_run_shards(nsa_context *ctx, const tk_case *c, const tk_inputs *in, int P,
                         const int64_t (*cut)[TK_MAX_SHARDS + 1], const float *dO, double *const lse[3],
                         const int32_t *sel, tk_output *fwd, tk_grads *grads, char *msg, size_t msg_size);

/* ------------------------------------------------------------------ compare */

/* Tolerances, per output dtype. An element of o passes when
 *     |got - ref| <= o_rms * scale + o_rel * |ref| + o_abs
 * where scale = max(RMS of the whole reference o, RMS of the value inputs of
 * the case's enabled branches). An LSE passes
 * when both are -inf, or |got - ref| <= lse_abs + lse_rel * |ref|. Two selections
 * for one (t, g) may differ only in blocks whose oracle score is within
 *     score_tol * max(1, |boundary|)
 * of the selection boundary (near-tie rule, semantics 7); the backend's o and
 * lse[SLC] are then judged against the oracle re-run with the backend's indices.
 *
 *            o_rms   o_rel    o_abs   lse_abs lse_rel score_tol
 *   f32      1e-4    1e-4     1e-6    1e-4    1e-5    1e-5
 *   f16      1e-2    2e-3     1e-4    2e-3    2e-4    1e-4
 *   bf16     1e-2    1e-2     1e-4    2e-3    2e-4    1e-4
 *   f64      1e-12   1e-12    1e-14   1e-12   1e-13   1e-5
 * Why: f32 backends accumulate in fp32 (GPU) or fp64 (cpu), so 1e-4 of the
 * output scale is two orders above accumulation error over thousands of
 * tokens. f16/bf16 outputs are rounded once at the end (2^-11 and 2^-8
 * relative: o_rel) and GPU kernels may round P to the half type before P@V
 * (up to 2^-9 of |V| for bf16: o_rms). The V term matters for long sequences,
 * whose o is an average of many random rows and so much smaller than V, while
 * the first tokens attend to a few rows with the full |V|. LSEs and scores are
 * fp32 from the same rounded inputs (compressed keys included: they are
 * tensors of the call's dtype, semantics 7); only accumulation order and exp()
 * differ. f64 is fp64 end to end (semantics 7), so only summation order
 * separates it from the oracle; its scores are fp32 as in every dtype, hence
 * the f32 score tolerance. */
typedef struct tk_tolerance {
    double o_rms, o_rel, o_abs;
    double lse_abs, lse_rel;
    double score_tol;
} tk_tolerance;

tk_tolerance tk_tolerance_for(nsa_dtype dtype);

typedef struct tk_verdict {
    int pass;            /* 1 when every element passed */
    nsa_status status;   /* of the run (NSA_SUCCESS when it ran) */
    double o_err;        /* max |got - ref| / rms(ref) over o */
    double o_ratio;      /* max |got - ref| / tolerance over o (pass <=> <= 1) */
    double lse_err;      /* max |got - ref| over finite LSEs */
    int64_t tie_swaps;   /* (t, g) rows whose selection differed within the near-tie rule */
    int64_t elements;    /* elements compared */
    int64_t rows_checked;/* tokens whose rows were compared with the oracle's */
    char msg[TK_MSG_MAX];/* first failure: label, what, token, head, dim, got, ref */
} tk_verdict;

/* Compares got with ref (which must come from tk_oracle_run with the case's own
 * selection rule: in->given when c->fixed_indices, else top-n). Re-runs the
 * oracle with the backend's indices when a near-tie swap is found. Where ref
 * holds a sample of rows (ref->sampled) only those are compared (and the o
 * scale takes the RMS of their o); the other rows must still be written: o
 * finite, LSEs not NaN, selected entries -1 or an eligible block. Returns
 * v->pass. */
int tk_compare(const tk_case *c, const tk_inputs *in, const tk_oracle *ref, const tk_output *got,
               tk_verdict *v);

/* Everything for one case: inputs, oracle, run, compare. Returns v->pass. A run
 * that fails (status != NSA_SUCCESS) does not pass; v->status says why. */
int tk_check_case(nsa_context *ctx, const tk_case *c, tk_verdict *v);

/* Runs case c twice on ctx and compares the o, lse and selected bytes
 * (bitwise). Returns 1 when identical; msg says where they differ. */
int tk_check_determinism(nsa_context *ctx, const tk_case *c, char *msg, size_t msg_size);

/* ------------------------------------------------------------------ stats */

typedef struct tk_stats {
    int run, passed, failed, unsupported;
    double max_o_err;          /* worst tk_verdict.o_err */
    double max_o_ratio;
    double max_lse_err;
    int64_t tie_swaps;
    int sampled;               /* some case checked a sample of its rows (tk_case.rows) */
    int64_t rows_checked, rows_total; /* tokens compared, tokens of the cases run */
    char worst[TK_LABEL_MAX];  /* label of the case with the largest o_ratio */
    char first_failure[TK_MSG_MAX];
} tk_stats;

void tk_stats_add(tk_stats *s, const tk_case *c, const tk_verdict *v);
/* "f32: 128 run, 128 passed, 0 failed; max o err 3.1e-07 rms (0.003 of tol, case
 * x), max lse err 2e-07, 4 near-tie swaps", and where s->sampled "; rows
 * checked: 2560 of 48000" */
void tk_stats_print(FILE *f, const char *title, const tk_stats *s);

#ifdef __cplusplus
}
#endif

#endif /* NSA_TESTKIT_H */
