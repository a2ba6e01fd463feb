/*
 * A decode run of the tool's problem (docs/nsa-semantics.md section 10, include/nsa.h
 * "decoding"), shared by `nsa run --decode` and `nsa bench --decode`.
 *
 * The sequences are served by one decode plan over caller-owned paged caches:
 * every cache and the compressed rows' cache live in pools of pages whose page
 * tables are shuffled by a seed (a sequence's pages lie anywhere in the pool; a
 * spare column and spare pages are left over), so the paging is really
 * exercised. A step takes, per sequence b, tq[b] >= 0 new tokens at positions
 * done[b] .. done[b] + tq[b] - 1 from the host inputs (q, the raw k, v of the
 * branches that read them, the gates), writes the step lengths (cu_seqlens_q,
 * and cache_seqlens = done[], the host advancing them after the step) and, with
 * EXTERNAL compression, the compressed rows the step completes into their pages
 * before the step, as the caller of nsa_decode must.
 *
 * Two ways to bring the caches to a context:
 *   decode_run_setup + decode_run_prefill / decode_run_all: a testkit case (at
 *     most TK_MAX_BATCH sequences) whose inputs hold every token; its tokens are
 *     cached by decode steps, and each step's rows of o, the LSEs and the
 *     selected blocks can be read back into a tk_output of the whole problem at
 *     their packed positions: each is the row of nsa_forward of the whole batch
 *     (bitwise on cpu). `nsa run --decode`, and `nsa bench --decode --fill steps`.
 *   decode_run_setup_step + decode_run_fill: B sequences (any count) whose
 *     context is written straight into the caches as seeded values, with host
 *     inputs for the one step after it only; no prefill step runs, and the host
 *     holds the step's rows, not the context's. `nsa bench --decode`.
 *
 * Every size is computed in checked 64-bit arithmetic before anything is
 * allocated; every call returns a status with "<call>: <status>: <message>" in
 * err on failure, and decode_run_free releases whatever was made (also after a
 * failed setup).
 */
#ifndef NSA_TOOLS_DECODE_RUN_H
#define NSA_TOOLS_DECODE_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "nsa.h"
#include "testkit.h"

#define DECODE_RUN_MAX_BUFS 48

typedef struct decode_run {
    nsa_context *ctx;
    nsa_config cfg;
    const tk_inputs *in; /* borrowed: the host inputs, already rounded to the dtype */
    nsa_dtype dt, fdt;
    size_t es, fes;
    int64_t B, Hq, Hkv, Dqk, Dv, n;
    int on[3];          /* the branch is enabled */
    int raw[3];         /* the branch reads raw keys (a cache of its own or shared) */
    int shared_with[3]; /* first branch whose k, v (and so cache) it shares */
    nsa_decode_limits lim;
    nsa_plan *plan;
    nsa_plan_info info;
    nsa_buffer *bufs[DECODE_RUN_MAX_BUFS];
    int nbufs;
    nsa_buffer *q, *k[3], *v[3], *gate[3], *cuq, *csl, *bt, *cbt, *kcc, *vcc, *o, *lse[3], *sel, *workspace;
    int32_t *table, *ctable; /* host copies of the page tables */
    /* per sequence, [B] each (cu: [B + 1]), one allocation */
    int64_t *len, *done;
    int64_t *in_row;   /* the row of the host inputs that holds the sequence's position 0 (a
                        * row they need not hold: decode_run_setup_step's inputs begin at the
                        * context, so there it is b * TQ - context) */
    int64_t *cmp_base; /* EXTERNAL: the inputs' kc / vc row of its compressed row 0 */
    int64_t *tq;       /* the staged step */
    int32_t *cu, *tk0; /* the staged step's cu_seqlens_q and cache_seqlens */
    int64_t fill_context; /* decode_run_setup_step: the tokens decode_run_fill caches */
    int filled;           /* decode_run_fill wrote every row of the caches */
    float *hstage;                 /* host staging: max_total_tokens rows of the widest tensor */
    void *bstage;                  /* the same rows converted to the dtype */
    nsa_decode_args args;
} decode_run;

/* Page sizes when the flags do not give them. */
#define DECODE_RUN_PAGE_SIZE 64
#define DECODE_RUN_CMP_PAGE_SIZE 16

/* The decode plan, the caches and the step buffers for case c (its sequences at
 * their full lengths: max_context is the longest) and host inputs in (borrowed;
 * c->fixed_indices is refused: a decode step has no block_indices). max_step: the
 * plan's max_step_tokens (>= 1); max_total_tokens is B * max_step. seed shuffles
 * the page tables. A backend without a decode step gives NSA_ERR_UNSUPPORTED
 * with the library's message (it names the backend). */
nsa_status decode_run_setup(nsa_context *ctx, const tk_case *c, const tk_inputs *in, int64_t max_step,
                            int64_t page_size, int64_t cmp_page_size, uint64_t seed, decode_run *d, char *err,
                            size_t err_size);

/* The same for B >= 1 sequences of context + tq tokens each (cfg; B is not
 * bound by TK_MAX_BATCH) that take one step of tq tokens after decode_run_fill
 * has cached their first context tokens: max_step = tq, and in holds only the
 * step's inputs, sequence b's tq tokens at rows b * tq .. b * tq + tq - 1
 * (in->tokens = B * tq; a testkit case of one sequence of B * tq tokens draws
 * them). Context + tq and B * tq must fit the int32 step lengths. */
nsa_status decode_run_setup_step(nsa_context *ctx, const nsa_config *cfg, int64_t B, int64_t context, int64_t tq,
                                 const tk_inputs *in, int64_t page_size, int64_t cmp_page_size, uint64_t seed,
                                 decode_run *d, char *err, size_t err_size);

/* After decode_run_setup_step: every position of every cache pool (the raw K/V
 * caches and the compressed one, spare pages included) gets a seeded value --
 * keys in [-2, 2), values in [-1, 1), as the testkit draws k and v -- and each
 * sequence counts its first context tokens as cached (done[b] = context). The
 * rows are copied from a table of drawn rows (at most 2^22 values), each page
 * starting at a row drawn for it, and written in bounded chunks, so the host
 * holds tens of MiB and the fill costs a copy per byte rather than a draw. The
 * compressed rows are drawn too, not the MEAN / LINEAR of the raw rows: the
 * step reads all Nc(TK) of them and selects n blocks of any values (see
 * tools/bench_decode.c). */
nsa_status decode_run_fill(decode_run *d, uint64_t seed, char *err, size_t err_size);

/* What decode_run_setup_step and decode_run_fill take for these shapes, k and v
 * of the branches shared as the testkit's inputs share them: *cache_bytes, the
 * paged caches in the context's memory (what grows with B x context); *host_bytes,
 * the step's inputs as the testkit draws them (f32) and the run's host staging.
 * Returns 1 when a size overflows 64 bits, else 0. */
int decode_run_step_memory(const nsa_config *cfg, int64_t B, int64_t context, int64_t tq, int64_t page_size,
                           int64_t cmp_page_size, int64_t *cache_bytes, int64_t *host_bytes);

/* Writes step tq[0 .. B-1] (each 0 .. the sequence's remaining tokens, at most
 * max_step): the new tokens' inputs, the lengths, the EXTERNAL compressed rows. */
nsa_status decode_run_stage(decode_run *d, const int64_t *tq, char *err, size_t err_size);

/* Runs the staged step: nsa_decode, then nsa_decode_check (which waits for it and
 * returns the status of its checks of the lengths and tables). */
nsa_status decode_run_step(decode_run *d, char *err, size_t err_size);

/* Runs the staged step count >= 1 times back to back (nsa_decode each time; the
 * step rewrites the same cache positions with the same bits), then one
 * nsa_decode_check: a serving loop's steps queued without waiting on each. */
nsa_status decode_run_steps(decode_run *d, int count, char *err, size_t err_size);

/* Reads the step's rows back into out (a tk_output of the whole problem from
 * decode_run_output_alloc) at their packed positions. */
nsa_status decode_run_gather(decode_run *d, tk_output *out, char *err, size_t err_size);

/* The host advances cache_seqlens: done[b] += tq[b]. */
void decode_run_advance(decode_run *d);

/* A tk_output for the whole problem (o, o_d, o_raw, the enabled branches' LSEs,
 * sel when n > 0), every value NaN / -1 until gathered. Free with
 * problem_output_free. */
nsa_status decode_run_output_alloc(const decode_run *d, tk_output *out, char *err, size_t err_size);

/* The statistics of decode_run_all. */
typedef struct decode_stats {
    int64_t prefill_steps, decode_steps, rows;
    double prefill_s;       /* sum of the prefill steps' times */
    double decode_s;        /* sum of the decode steps' times */
    double step_median_s;   /* median decode step (NaN without decode steps) */
    double step_min_s;
} decode_stats;

/* The whole problem: each sequence prefilled to min(prefill, its length) tokens
 * (prefill < 0: half its length, rounded down) in
 * steps of up to chunk tokens, then decoded tq tokens a step (the last step of a
 * sequence shorter) until every sequence is complete; every row gathered into out
 * (allocated here; free with problem_output_free, also on failure). Each step is
 * timed from nsa_decode to the end of nsa_decode_check (staging and read-back
 * excluded). label: the terminal progress line. */
nsa_status decode_run_all(decode_run *d, int64_t prefill, int64_t chunk, int64_t tq, const char *label,
                          tk_output *out, decode_stats *st, char *err, size_t err_size);

/* Only the prefill of decode_run_all (rows not read back): each sequence brought
 * to min(prefill, its length) cached tokens in steps of up to chunk tokens.
 * *steps and *seconds (the steps' summed time) are set. */
nsa_status decode_run_prefill(decode_run *d, int64_t prefill, int64_t chunk, const char *label, int64_t *steps,
                              double *seconds, char *err, size_t err_size);

void decode_run_free(decode_run *d);

/* The bytes a step must read (semantics 10), from its selection (sel: the step's
 * packed rows [rows, Hkv, n], NULL when n = 0): per sequence with TQ > 0, the new
 * tokens' q, k, v; the compressed rows nc(TK) of every KV head (k and v); per KV
 * head the distinct cached tokens the step's queries read through the selected
 * blocks and the window (a token read by both branches from one shared cache
 * counts once; separate caches count separately). */
double decode_run_step_bytes(const decode_run *d, const int32_t *sel);

#endif /* NSA_TOOLS_DECODE_RUN_H */
