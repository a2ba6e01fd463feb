/*
 * test_decode_ref -- docs/nsa-semantics.md section 10 on the host, before any
 * backend decodes: every case of the corpus is prefilled to a random length, then
 * decoded in steps of a random 1..16 tokens, over a paged cache whose pages are
 * shuffled (tests/common/decode.c: compressed blocks formed once, when their last
 * token is cached, from the cached tokens); every row each step returns (and the
 * prefill's) must equal, bitwise, the same row of the fp64 oracle run on the whole
 * batch: o, the three LSEs and the selected blocks. The cache starts as NaN, so a
 * step that read a position not yet written fails.
 *
 *   test_decode_ref [corpus]      (default "full"; f32 and bf16, two page layouts)
 * Exit status 0 pass, 1 fail.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

static int failures = 0;

/* rows of a step against the oracle's rows at global tokens g0 .. g0 + m - 1 */
static int same_rows(const tk_case *c, const tk_oracle *full, const tk_oracle *got, int64_t g0, int64_t m,
                     char *why, size_t size)
{
    const nsa_config *g = &c->cfg;
    const int64_t Hq = g->num_q_heads, Hkv = g->num_kv_heads, Dv = g->head_dim_v, n = g->num_selected;
    for (int64_t e = 0; e < m * Hq * Dv; e++)
        if (memcmp(&got->o[e], &full->o[g0 * Hq * Dv + e], sizeof(double)) != 0) {
            snprintf(why, size, "o[%lld] = %.17g, the forward's %.17g", (long long)(g0 * Hq * Dv + e), got->o[e],
                     full->o[g0 * Hq * Dv + e]);
            return 0;
        }
    for (int b = 0; b < 3; b++) {
        if (!full->lse[b]) continue;
        for (int64_t e = 0; e < m * Hq; e++)
            if (memcmp(&got->lse[b][e], &full->lse[b][g0 * Hq + e], sizeof(double)) != 0) {
                snprintf(why, size, "lse[%d][%lld] = %.17g, the forward's %.17g", b, (long long)(g0 * Hq + e),
                         got->lse[b][e], full->lse[b][g0 * Hq + e]);
                return 0;
            }
    }
    if (full->sel && memcmp(got->sel, full->sel + g0 * Hkv * n, (size_t)(m * Hkv * n) * sizeof(int32_t)) != 0) {
        snprintf(why, size, "a selected block differs in tokens %lld .. %lld", (long long)g0, (long long)(g0 + m - 1));
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    const char *corpus = argc > 1 ? argv[1] : "full";
    tk_case *cases = NULL;
    const int ncases = tk_corpus(corpus, &cases);
    if (ncases < 0) {
        fprintf(stderr, "test_decode_ref: unknown corpus %s\n", corpus);
        return 1;
    }
    const nsa_dtype dtypes[] = {NSA_DTYPE_F32, NSA_DTYPE_BF16};
    const int64_t pages[2][2] = {{3, 2}, {16, 1}}; /* (page_size, compressed rows per page) */
    long steps = 0, rows = 0, runs = 0, skipped = 0;
    uint64_t rng = 2026;
    for (int ci = 0; ci < ncases; ci++) {
        int64_t max_len = 0;
        for (int64_t b = 0; b < cases[ci].batch; b++)
            if (cases[ci].cu_seqlens[b + 1] - cases[ci].cu_seqlens[b] > max_len)
                max_len = cases[ci].cu_seqlens[b + 1] - cases[ci].cu_seqlens[b];
        if (max_len > 700) { /* the prefix oracle per step is O(len^2): the long cases are the forward's */
            skipped++;
            continue;
        }
        for (int di = 0; di < 2; di++)
            for (int pl = 0; pl < 2; pl++) {
                tk_case c = cases[ci];
                tk_case_set_dtype(&c, dtypes[di]);
                tk_inputs in;
                tk_oracle full;
                tk_paged pc;
                char desc[256], why[256] = "";
                tk_case_describe(&c, desc, sizeof desc);
                if (tk_inputs_make(&c, &in) != NSA_SUCCESS ||
                    tk_oracle_run(&c, &in, c.fixed_indices ? in.given : NULL, &full) != NSA_SUCCESS) {
                    printf("FAIL %s: inputs or oracle\n", desc);
                    failures++;
                    continue;
                }
                int ok = tk_paged_make(&c, &in, pages[pl][0], pages[pl][1], rng + (uint64_t)ci, &pc) == NSA_SUCCESS;
                if (!ok) snprintf(why, sizeof why, "the cache could not be made");
                for (int64_t b = 0; b < c.batch && ok; b++) {
                    const int64_t len = c.cu_seqlens[b + 1] - c.cu_seqlens[b];
                    int64_t done = 0, tq = (int64_t)(tk_splitmix64(&rng) % (uint64_t)(len + 1)); /* the prefill */
                    while (ok) {
                        tk_oracle got;
                        if (tk_paged_append(&c, &in, &pc, b, tq) != NSA_SUCCESS ||
                            tk_paged_rows(&c, &in, &pc, b, done, done + tq, &got) != NSA_SUCCESS) {
                            snprintf(why, sizeof why, "sequence %lld: a step failed", (long long)b);
                            ok = 0;
                            break;
                        }
                        if (tq > 0 && !same_rows(&c, &full, &got, c.cu_seqlens[b] + done, tq, why, sizeof why))
                            ok = 0;
                        tk_oracle_free(&got);
                        steps++;
                        rows += (long)tq;
                        done += tq;
                        if (done == len) break;
                        const int64_t left = len - done;
                        tq = 1 + (int64_t)(tk_splitmix64(&rng) % (uint64_t)(left < 16 ? left : 16));
                    }
                }
                if (!ok) {
                    printf("FAIL %s (pages of %lld, %lld compressed rows): %s\n", desc, (long long)pages[pl][0],
                           (long long)pages[pl][1], why);
                    failures++;
                }
                runs++;
                tk_paged_free(&pc);
                tk_oracle_free(&full);
                tk_inputs_free(&in);
            }
    }
    free(cases);
    printf("decode-reference: %ld runs (%ld cases longer than 700 tokens left to the forward's tests), %ld steps, "
           "%ld rows equal to the forward's: %s\n",
           runs, skipped, steps, rows, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
