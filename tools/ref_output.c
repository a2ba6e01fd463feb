/* A backend's outputs as the reference of tk_compare (see ref_output.h). */
#include "ref_output.h"

#include <stdlib.h>
#include <string.h>

int ref_from_output(const tk_case *c, const tk_output *out, const tk_oracle *orc, tk_oracle *ref)
{
    const nsa_config *g = &c->cfg;
    const int64_t T = out->tokens, Hq = g->num_q_heads, no = T * Hq * g->head_dim_v;
    memset(ref, 0, sizeof *ref);
    ref->tokens = T;
    ref->max_ns = orc ? orc->max_ns : 0;
    ref->o = malloc(sizeof(double) * (size_t)(no + 1));
    if (!ref->o)
        return -1;
    for (int64_t i = 0; i < no; i++)
        ref->o[i] = out->o[i];
    for (int b = 0; b < 3; b++) {
        if (!out->lse[b])
            continue;
        ref->lse[b] = malloc(sizeof(double) * (size_t)(T * Hq + 1));
        if (!ref->lse[b]) {
            ref_output_free(ref);
            return -1;
        }
        for (int64_t i = 0; i < T * Hq; i++)
            ref->lse[b][i] = out->lse[b][i];
    }
    ref->sel = out->sel;       /* borrowed */
    ref->scores = orc ? orc->scores : NULL; /* borrowed */
    return 0;
}

void ref_output_free(tk_oracle *ref)
{
    free(ref->o);
    for (int b = 0; b < 3; b++)
        free(ref->lse[b]);
    memset(ref, 0, sizeof *ref);
}
