/*
 * libFuzzer target: the reader of `nsa parity --compare FILE` (tools/
 * parity_file.c) on arbitrary bytes. A success must give records whose
 * arrays hold every element their counts say (each is read here, so ASan
 * sees a short one), and looking a corpus case up in them must be safe; a
 * failure must carry a message. Any crash, sanitizer report, leak, or an
 * allocation beyond -malloc_limit_mb is a finding.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "parity_file.h"
#include "testkit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tk_case *cases;
static int ncases;

static float touch_f(const float *x, int64_t n)
{
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!cases) ncases = tk_corpus("small", &cases);
    FILE *f = fmemopen((void *)data, size ? size : 1, "rb");
    parity_record *recs = NULL;
    char err[1024] = "";
    if (!f) return 0;
    int n = parity_file_read_stream(f, (int64_t)size, "fuzz.bin", &recs, err, sizeof err);
    fclose(f);
    if (n < 0) {
        if (!err[0] || recs) abort();
        return 0;
    }
    volatile float sink = 0;
    for (int i = 0; i < n; i++) {
        const parity_record *r = &recs[i];
        const nsa_config *g = &r->c.cfg;
        const int64_t T = r->out.tokens;
        if (r->out.o) sink += touch_f(r->out.o, T * g->num_q_heads * g->head_dim_v);
        for (int b = 0; b < 3; b++)
            if (r->out.lse[b]) sink += touch_f(r->out.lse[b], T * g->num_q_heads);
        if (r->out.sel)
            for (int64_t k = 0; k < T * g->num_kv_heads * g->num_selected; k++) sink += (float)r->out.sel[k];
    }
    for (int i = 0; i < ncases && i < 4; i++) {
        int mismatch = 0;
        (void)parity_file_find(recs, n, &cases[i], NULL, "cpu", &mismatch);
    }
    (void)sink;
    parity_records_free(recs, n);
    return 0;
}
