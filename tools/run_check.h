/*
 * The error check of `nsa run`: compares a run's outputs with a reference on
 * a sample, honestly described.
 *
 * Causality makes prefixes exact sub-problems: the outputs of the first P tokens
 * of a sequence depend only on those P tokens (and, for EXTERNAL, on the
 * compressed rows they cover). So the check re-solves the first P tokens of a
 * few sequences with the reference and compares those rows of the run:
 *   backend != cpu: the reference is the cpu backend (run through the testkit's
 *                   runner); where the two selections differ, the testkit's fp64
 *                   oracle is run too and supplies the block scores for the
 *                   near-tie rule (it is slow, so only then);
 *   backend == cpu: the reference is the testkit's fp64 oracle itself.
 * The comparison is the testkit's (tk_compare): dtype tolerances, NaN never
 * passes, near-tied selections count as equal and are judged against the
 * oracle re-run with the backend's own indices.
 */
#ifndef NSA_TOOLS_RUN_CHECK_H
#define NSA_TOOLS_RUN_CHECK_H

#include <stdint.h>

#include "testkit.h"

typedef struct run_check {
    int done;                        /* 1 when a comparison ran */
    const char *reference;           /* what the rows were compared with */
    int nseq;
    int64_t seq[TK_MAX_BATCH];       /* sequences sampled */
    int64_t prefix[TK_MAX_BATCH];    /* tokens checked of each */
    int64_t rows;                    /* query tokens checked */
    int64_t total_rows;              /* query tokens of the run */
    int selection_exercised;         /* a checked query had more eligible blocks than n */
    int64_t sel_rows;                /* (token, kv head) selections compared */
    double tie_fraction;             /* tie_swaps / sel_rows */
    double seconds;                  /* time the reference took */
    int oracle_used;                 /* the fp64 oracle ran (cpu runs; or selections differed) */
    tk_verdict v;
    char note[256];                  /* why not checked, or what was restricted */
} run_check;

/* Estimated fp64 FLOPs of the reference for the first P tokens of one sequence. */
double run_check_cost(const nsa_config *cfg, int64_t P);

/* Largest prefix length (<= len) whose estimated reference cost fits budget_flops
 * (at least min(len, l_s)). */
int64_t run_check_auto_prefix(const nsa_config *cfg, int64_t len, double budget_flops);

/* Runs the check: prefix tokens (<= 0: auto from budget_flops) of up to max_seqs
 * sequences spread over the batch. backend is the name of the run's backend.
 * Returns 0, or 1 when the reference itself could not run (message printed). */
int run_check_do(const char *cmd, const char *backend, const tk_case *c, const tk_inputs *in,
                 const tk_output *got, int64_t prefix, int max_seqs, double budget_flops,
                 run_check *r);

#endif /* NSA_TOOLS_RUN_CHECK_H */
