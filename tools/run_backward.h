/*
 * `nsa run --backward`: the backward pass of the run's problem on its backend,
 * from the forward's LSEs and selection and dO (DIR/do.npy [T, Hq, Dv] with
 * --inputs, else drawn from the seed), the gradients written with --outputs
 * and checked against a reference.
 *
 * The check compares every gradient of the whole problem (gradients have no
 * causal prefix: dk of a token depends on every later query), so it runs only
 * when the reference's estimated cost fits the fp64 FLOP budget:
 *   backend != cpu: the cpu backend's backward on the same LSEs and selection;
 *   backend == cpu: the tests' fp64 gradient reference (tests/common/grad.c).
 * The comparison is the testkit's (tk_compare_grads).
 */
#ifndef NSA_TOOLS_RUN_BACKWARD_H
#define NSA_TOOLS_RUN_BACKWARD_H

#include "testkit.h"

typedef struct run_bwd {
    double seconds;          /* the backward call (plan, uploads, nsa_backward, read-back) */
    tk_grads g;              /* the gradients */
    const char *dout_from;   /* "do.npy" or "seed" */
    int checked;
    const char *reference;
    double ref_seconds;
    tk_grad_verdict v;
    char note[256];          /* why not checked */
} run_bwd;

/* Runs the backward (and its check when check != 0 and the cost fits
 * budget_flops): shards > 0 computes it in that many even shards per sequence
 * (tk_run_shards), the key-side gradients' fp64 sums rounded once to the dtype.
 * Returns 0, or an exit code with a message printed. */
int run_backward_do(const char *cmd, nsa_context *ctx, const char *backend, const tk_case *c, const tk_inputs *in,
                    const tk_output *fwd, const char *inputs_dir, int check, double budget_flops, int shards,
                    run_bwd *r);
/* Writes the gradients as '<f4' .npy into dir: dq; dk, dv (one tensor served
 * every branch) or dk_cmp, dk_slc, dk_win, dv_*; dg_cmp, dg_slc, dg_win; dw_k,
 * dw_v, dpe_k, dpe_v (LINEAR); dkc, dvc (EXTERNAL). Returns 0 or 1. */
int run_backward_write(const char *cmd, const char *dir, const tk_case *c, const tk_inputs *in, const run_bwd *r);
void run_backward_free(run_bwd *r);

#endif
