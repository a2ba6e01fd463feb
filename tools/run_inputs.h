/*
 * `nsa run --inputs DIR` and `--outputs DIR`: tensors as .npy files.
 *
 * Inputs (every file optional; a tensor without a file is drawn from --seed; DIR
 * itself must exist, and a name that is there but unreadable, a dangling
 * symlink included, is an error, never "absent"):
 *   q.npy                      [T, Hq, Dqk]
 *   k.npy, v.npy               [T, Hkv, Dqk], [T, Hkv, Dv]   (all three branches)
 *   k_cmp.npy k_slc.npy k_win.npy, v_cmp.npy v_slc.npy v_win.npy
 *                              per-branch K/V; they override k.npy / v.npy
 *   g_cmp.npy g_slc.npy g_win.npy  [T, Hq] gates (already activated)
 *   w_k.npy [Hkv, l, Dqk, Dqk], w_v.npy [Hkv, l, Dv, Dv]       (--compress linear)
 *   pe_k.npy [Hkv, l, Dqk], pe_v.npy [Hkv, l, Dv]              (optional; when w_k.npy
 *                              is given without pe_k.npy, no position encoding is used)
 *   kc.npy [Nc_total, Hkv, Dqk], vc.npy [Nc_total, Hkv, Dv]    (--compress external)
 *   block_indices.npy [T, Hkv, n] '<i4' or '<i8': replaces the top-n selection
 * T is the total (packed) token count. Float files may be '<f4', '<f2' or '<u2'
 * (raw bf16 bits); values are rounded to the run dtype with nsa_convert.
 *
 * Outputs (all '<f4' except selected.npy, '<i4'):
 *   o.npy [T, Hq, Dv]; lse_cmp.npy, lse_slc.npy, lse_win.npy [T, Hq] (enabled
 *   branches only); selected.npy [T, Hkv, n] (n > 0).
 */
#ifndef NSA_TOOLS_RUN_INPUTS_H
#define NSA_TOOLS_RUN_INPUTS_H

#include <stddef.h>
#include <stdint.h>

#include "testkit.h"

/* Shape hints from DIR/q.npy (T, Hq, Dqk), DIR/k*.npy (Hkv) and DIR/v*.npy (Dv);
 * a value stays -1 when no file tells it. Returns 0, or 2 with a message (DIR
 * is not a directory, q.npy cannot be read or its header lies about its size). */
int run_inputs_shape(const char *cmd, const char *dir, int64_t *T, int64_t *hq, int64_t *dqk,
                     int64_t *hkv, int64_t *dv);

/* Replaces the tensors of in (drawn by tk_inputs_make for case c) with the files
 * found in dir, checking each shape against c. Sets c->fixed_indices when
 * block_indices.npy is given, c->use_pe = 0 when W is given without pe.
 * read/generated receive comma lists of tensor names. Returns 0, 1 (I/O or
 * memory) or 2 (shape or type mismatch), with a message naming the file. */
int run_inputs_load(const char *cmd, const char *dir, tk_case *c, tk_inputs *in, char *read,
                    size_t read_size, char *generated, size_t generated_size);

/* Writes the inputs actually used (as '<f4', exact: they are already rounded
 * to the dtype; block_indices as '<i4') into dir under the names above, so
 * `--inputs dir` reproduces the run. Returns 0 or 1. */
int run_inputs_write(const char *cmd, const char *dir, const tk_case *c, const tk_inputs *in);

/* dir/name.npy (if there) as floats rounded to dtype, its shape checked against
 * shape[0 .. ndim-1]: 0 with *found = 0 when absent, 0 with *out (malloc'ed) and
 * *found = 1, or an exit code with a message naming the file. */
int run_inputs_load_floats(const char *cmd, const char *dir, const char *name, int ndim, const int64_t *shape,
                           nsa_dtype dtype, float **out, int *found);
/* Writes dir/name.npy ('<f4'), creating dir if missing. Returns 0 or 1. */
/* The same as '<f8' (an f64 run's gradients). */
int run_outputs_write_f64(const char *cmd, const char *dir, const char *name, int ndim, const int64_t *shape,
                          const double *data);
int run_outputs_write_f32(const char *cmd, const char *dir, const char *name, int ndim, const int64_t *shape,
                          const float *data);
/* Writes out's tensors into dir (created if missing). Returns 0 or 1. */
int run_outputs_write(const char *cmd, const char *dir, const tk_case *c, const tk_output *out);

#endif /* NSA_TOOLS_RUN_INPUTS_H */
