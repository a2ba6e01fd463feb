/*
 * One NSA problem living on one context, for timing: the testkit's host inputs
 * (floats already rounded to the dtype) uploaded once into dense buffers, a plan,
 * a caller workspace, and output buffers. Unlike the testkit's runner (which
 * re-plans, poisons and allocates per call, for checking), the forward here can
 * be repeated cheaply: nsa_forward with a caller workspace allocates nothing.
 */
#ifndef NSA_TOOLS_PROBLEM_H
#define NSA_TOOLS_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "nsa.h"
#include "testkit.h"

#define PROBLEM_MAX_BUFS 64

typedef struct problem {
    nsa_context *ctx;
    nsa_plan *plan;
    nsa_plan_info info;
    nsa_forward_args args;
    nsa_backward_args bargs; /* problem_backward_setup (a plan made with NSA_CONFIG_TRAINING) */
    nsa_buffer *workspace;
    nsa_buffer *bufs[PROBLEM_MAX_BUFS];
    int nbufs;
    tk_case c;
    const int32_t *given; /* block indices passed in (borrowed), or NULL */
    int64_t tokens;
    size_t input_bytes;  /* bytes of every input tensor (each distinct tensor once) */
    size_t output_bytes; /* o, the LSEs and selected */
} problem;

/* Uploads in (for case c) to ctx and plans. indices: optional [T, Hkv, n] block
 * indices passed as args.block_indices (borrowed: keep them alive). Requests
 * lse[b] of every enabled branch and, when n > 0 and no indices are given,
 * `selected` (the library refuses both at once; with given indices the download
 * reports them as the selection). On failure: the status, err holds "<call>: <status>: <the
 * library's message>", and *p is freed. The same holds for the calls below. */
nsa_status problem_setup(nsa_context *ctx, const tk_case *c, const tk_inputs *in,
                         const int32_t *indices, problem *p, char *err, size_t err_size);

/* One forward followed by nsa_context_synchronize. */
nsa_status problem_forward(problem *p, char *err, size_t err_size);

/* warmup untimed forwards, then iters timed ones (each bracketed by
 * nsa_context_synchronize, wall clock); *median_s and *min_s receive the median
 * and the fastest. label: shown in the terminal progress line. */
nsa_status problem_time(problem *p, int warmup, int iters, const char *label, double *median_s,
                        double *min_s, char *err, size_t err_size);

/* The backward of a training problem (c->cfg.flags has NSA_CONFIG_TRAINING), after
 * at least one forward (its LSEs and selection are the backward's inputs): dO
 * drawn from the case's seed and uploaded, every gradient buffer allocated
 * (one dk / dv per distinct k / v tensor, so a shared one gets the summed
 * gradient), NSA_BACKWARD_TRUST_INDICES set (the indices come from the forward). */
nsa_status problem_backward_setup(problem *p, char *err, size_t err_size);
/* As problem_time, for nsa_backward. */
nsa_status problem_time_backward(problem *p, int warmup, int iters, const char *label, double *median_s,
                                 double *min_s, char *err, size_t err_size);
/* Reads the outputs back: o as f32, lse[b] (NULL when the branch is off), sel
 * (NULL when n = 0). The caller frees with problem_output_free. */
nsa_status problem_download(problem *p, tk_output *out, char *err, size_t err_size);
void problem_output_free(tk_output *out);

void problem_free(problem *p);

/* Query-key pairs the three branches attend, counted from the actual selection
 * (sel may be NULL when n = 0): sum over queries t and query heads h of
 * nc(t) + |selected tokens <= t| + min(w, t + 1). FLOPs = 2 (Dqk + Dv) pairs. */
double problem_pairs(const tk_case *c, const int32_t *sel);

/* Pairs of dense causal attention over the same batch: Hq * sum_b L_b (L_b + 1) / 2. */
double problem_dense_pairs(const tk_case *c);

#endif /* NSA_TOOLS_PROBLEM_H */
