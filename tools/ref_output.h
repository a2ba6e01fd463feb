/*
 * A backend's outputs used as the reference of a comparison.
 *
 * The testkit's comparison (tk_compare) takes its reference as a tk_oracle:
 * o, the LSEs and the selection, plus the fp64 block scores that decide whether
 * two selections differ only by a near-tie. To compare backend B with backend R
 * (or with outputs saved on another machine), R's o/lse/selection are wrapped
 * here together with the oracle's scores of the same inputs. Where B's
 * selection differs from R's within the near-tie rule, tk_compare judges B
 * against the oracle re-run with B's own indices.
 */
#ifndef NSA_TOOLS_REF_OUTPUT_H
#define NSA_TOOLS_REF_OUTPUT_H

#include "testkit.h"

/* ref.o and ref.lse are fresh fp64 copies of out's; ref.sel (out's) and
 * ref.scores (orc's) are borrowed and must outlive ref. orc may be NULL when
 * the compared selection is known to equal out's (tk_compare reads the scores
 * only for rows whose selections differ). Returns 0 or -1 (out of
 * memory; ref is then freed). */
int ref_from_output(const tk_case *c, const tk_output *out, const tk_oracle *orc, tk_oracle *ref);

/* Frees what ref_from_output allocated (not the borrowed arrays). */
void ref_output_free(tk_oracle *ref);

#endif /* NSA_TOOLS_REF_OUTPUT_H */
