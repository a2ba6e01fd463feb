/*
 * The flags that describe one NSA problem (every nsa_config field, the batch
 * shape and the seed), shared by `nsa run` and `nsa bench`, and their
 * translation into a testkit case (tk_case) whose inputs the testkit draws with
 * the library's portable generator.
 */
#ifndef NSA_TOOLS_CONFIG_FLAGS_H
#define NSA_TOOLS_CONFIG_FLAGS_H

#include <stdint.h>

#include "args.h"
#include "nsa.h"
#include "testkit.h"

typedef struct config_flags {
    int64_t T;          /* tokens per sequence (run; bench sweeps its own list) */
    int64_t batch;      /* sequences of T tokens each */
    const char *seqlens;/* "a,b,c": overrides --T/--batch */
    int64_t hq, hkv, dqk, dv, l, d, ls, n, n_init, n_local, w;
    double scale;
    int compress;       /* index into "mean|linear|external" */
    int dtype;          /* index into "f32|f16|bf16" */
    int64_t seed;
} config_flags;

#define CONFIG_FLAGS_COUNT 18

/* Paper defaults (nsa_config_init), T = 0 (meaning "chosen for the backend"),
 * batch 1, seed 1. */
void config_flags_defaults(config_flags *f);

/* Writes the CONFIG_FLAGS_COUNT options into opts (which the caller sized).
 * with_T: 0 leaves --T/--batch/--seqlens out (bench has its own --T list). */
int config_flags_options(config_flags *f, args_opt *opts, int with_T);

/* Help text of the config flags' meaning (printed by run and bench). */
extern const char config_flags_help[];

/* Builds case c (label, cfg, batch, cu_seqlens, seed; dense layout, LINEAR
 * with position encodings) for sequences of the given lengths. Prints a message
 * and returns 2 on a bad value (config invalid, too many sequences), else 0. */
int config_flags_case(const char *cmd, const config_flags *f, const int64_t *lens, int64_t batch,
                      tk_case *c);

/* Sequence lengths from --seqlens, or batch x T. Returns the count (<= cap) or
 * -1 with a message. */
int config_flags_lengths(const char *cmd, const config_flags *f, int64_t T, int64_t *lens, int cap);

extern const char *const compress_choices; /* "mean|linear|external" */
extern const char *const dtype_choices;    /* "f32|f16|bf16" */
nsa_dtype config_flags_dtype(int index);

#endif /* NSA_TOOLS_CONFIG_FLAGS_H */
