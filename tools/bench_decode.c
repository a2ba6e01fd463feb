/*
 * nsa bench --decode: per-step time of nsa_decode for sweeps of B, context and TQ.
 *
 * A point (B, C, TQ): B sequences of C + TQ tokens of the tool's problem (inputs
 * drawn from --seed) are served by a decode plan over shuffled paged caches
 * (tools/decode_run.c, the code `nsa run --decode` drives); each sequence is
 * prefilled to C cached tokens in steps of up to --chunk tokens, then the step
 * of the point -- TQ new tokens of every sequence at positions C .. C + TQ - 1 --
 * is run --warmup times untimed and --iters times timed, each from nsa_decode to
 * the end of nsa_decode_check (which waits for it). The step can be repeated
 * as it is: the caches' new positions and compressed rows are rewritten with
 * the same bits and cache_seqlens stays C.
 *
 * GB/s: the bytes the step must read (decode_run_step_bytes, semantics section
 * 10), per sequence: the new tokens' q, gates, k and v; the compressed rows of
 * the whole context (k and v); per KV head the distinct cached tokens the step's
 * queries read through their selected blocks (from the step's `selected` output)
 * and their windows -- over the time of the step.
 *
 * Dense decode: the same step with n = 0 and w = C + TQ, whose window branch is
 * then exact causal attention over the whole context. The compression branch
 * cannot be switched off, so the step is also timed with n = 0, w = 0 (the
 * compressed branch alone) and dense = t(n = 0, w = C + TQ) - t(cmp only), as
 * the forward's dense baseline of nsa bench does; both the difference and the
 * raw time are reported, and speedup = dense / the step's time.
 */
#include "bench_decode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "decode_run.h"
#include "testkit.h"
#include "tool.h"

#define CMD "nsa bench"

enum { D_FULL, D_DENSE, D_CMP_ONLY, D_COUNT };
static const char *const dname[D_COUNT] = {"full", "dense", "cmp_only"};

typedef struct dmeasure {
    int ran;
    double time_s, min_s, bytes, prefill_s;
    int64_t prefill_steps;
    nsa_status status; /* the first failure's */
    char note[TOOL_ERR_MAX];
} dmeasure;

void bench_decode_defaults(bench_decode_opts *o, int on_cpu)
{
    if (o->nbatch == 0) {
        o->batch[0] = 1;
        if (!on_cpu) { /* the tool's problems hold at most TK_MAX_BATCH sequences */
            o->batch[1] = TK_MAX_BATCH / 2;
            o->batch[2] = TK_MAX_BATCH;
        }
        o->nbatch = on_cpu ? 1 : 3;
    }
    if (o->ncontext == 0) {
        o->context[0] = on_cpu ? 128 : 8192;
        o->context[1] = on_cpu ? 256 : 32768;
        o->ncontext = 2;
    }
    if (o->ntq == 0) {
        o->tq[0] = 1;
        o->ntq = 1;
    }
}

/* Sets up variant v of point (B, C, TQ), prefills, times the step. Returns 2 for
 * a bad case (message printed), else 0 (m->ran says whether it ran; m->note why not). */
static int run_point(nsa_context *ctx, const bench_decode_opts *o, int64_t B, int64_t C, int64_t TQ, int v,
                     dmeasure *m)
{
    int64_t lens[TK_MAX_BATCH], len;
    tk_case c;
    tk_inputs in;
    decode_run d;
    nsa_status s;
    char label[128];
    memset(m, 0, sizeof *m);
    if (B < 1 || B > TK_MAX_BATCH) {
        fprintf(stderr, CMD ": --batch %lld: the tool's problems have 1 to %d sequences\n", (long long)B,
                TK_MAX_BATCH);
        return TOOL_EXIT_USAGE;
    }
    if (nsa_ck_add(C, TQ, &len)) {
        fprintf(stderr, CMD ": --context %lld + --tq %lld overflows 64 bits\n", (long long)C, (long long)TQ);
        return TOOL_EXIT_USAGE;
    }
    for (int64_t b = 0; b < B; b++) lens[b] = len;
    if (config_flags_case(CMD, o->cf, lens, B, &c) != 0) return TOOL_EXIT_USAGE;
    if (v != D_FULL) {
        c.cfg.num_selected = 0;
        c.cfg.num_init = 0;
        c.cfg.num_local = 0;
        c.cfg.window = v == D_DENSE ? len : 0;
        if ((s = nsa_config_validate(&c.cfg)) != NSA_SUCCESS) {
            tool_format_error(m->note, sizeof m->note, "nsa_config_validate", s);
            return 0;
        }
    }
    snprintf(label, sizeof label, CMD " --decode B=%lld context=%lld TQ=%lld %s", (long long)B, (long long)C,
             (long long)TQ, dname[v]);
    tool_progress("%s: drawing inputs", label);
    s = tk_inputs_make(&c, &in);
    tool_progress_end();
    if (s != NSA_SUCCESS) {
        snprintf(m->note, sizeof m->note, "drawing the inputs failed: %s", nsa_status_string(s));
        return 0;
    }
    const int64_t most = o->chunk > TQ ? o->chunk : TQ, chunk = o->chunk < len ? o->chunk : len;
    s = decode_run_setup(ctx, &c, &in, most < len ? most : len, o->page_size, o->cmp_page_size,
                         (uint64_t)o->cf->seed, &d, m->note, sizeof m->note);
    if (s == NSA_SUCCESS)
        s = decode_run_prefill(&d, C, chunk, label, &m->prefill_steps, &m->prefill_s, m->note, sizeof m->note);
    int64_t tq[TK_MAX_BATCH];
    for (int64_t b = 0; b < B; b++) tq[b] = TQ;
    if (s == NSA_SUCCESS) s = decode_run_stage(&d, tq, m->note, sizeof m->note);
    double *t = s == NSA_SUCCESS ? malloc(sizeof *t * (size_t)o->iters) : NULL;
    if (s == NSA_SUCCESS && !t) {
        snprintf(m->note, sizeof m->note, "out of host memory");
        s = NSA_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < o->warmup && s == NSA_SUCCESS; i++) {
        tool_progress("%s: warm-up %d/%d", label, i + 1, o->warmup);
        s = decode_run_step(&d, m->note, sizeof m->note);
    }
    for (int i = 0; i < o->iters && s == NSA_SUCCESS; i++) {
        tool_progress("%s: iteration %d/%d", label, i + 1, o->iters);
        const double t0 = tool_now();
        s = decode_run_step(&d, m->note, sizeof m->note);
        t[i] = tool_now() - t0;
    }
    tool_progress_end();
    int32_t *sel = NULL;
    if (s == NSA_SUCCESS && d.sel) { /* the step's selection: what the selected branch read */
        const size_t bytes = (size_t)(B * TQ * d.Hkv * d.n) * sizeof(int32_t);
        sel = malloc(bytes + 4);
        if (!sel) {
            snprintf(m->note, sizeof m->note, "out of host memory");
            s = NSA_ERR_OUT_OF_MEMORY;
        } else if ((s = nsa_buffer_read(d.sel, 0, sel, bytes)) != NSA_SUCCESS) {
            tool_format_error(m->note, sizeof m->note, "nsa_buffer_read (selected)", s);
        }
    }
    if (s == NSA_SUCCESS) {
        m->min_s = t[0];
        for (int i = 1; i < o->iters; i++) m->min_s = t[i] < m->min_s ? t[i] : m->min_s;
        m->time_s = tool_median(t, o->iters);
        m->bytes = decode_run_step_bytes(&d, sel);
        m->ran = 1;
    }
    m->status = s;
    free(sel);
    free(t);
    decode_run_free(&d);
    tk_inputs_free(&in);
    return 0;
}

static void print_ms(int width, double seconds)
{
    if (isnan(seconds))
        printf(" %*s", width, "-");
    else
        printf(" %*.4g", width, seconds * 1e3);
}

static void print_measure_json(const dmeasure *m)
{
    if (!m->ran) {
        printf("null");
        return;
    }
    printf("{\"prefill_steps\": %lld", (long long)m->prefill_steps);
    json_field(stdout, "prefill_s", m->prefill_s);
    json_field(stdout, "time_s", m->time_s);
    json_field(stdout, "time_min_s", m->min_s);
    json_field(stdout, "bytes", m->bytes);
    json_field(stdout, "gbps", m->bytes / m->time_s / 1e9);
    printf("}");
}

int bench_decode(nsa_context *ctx, const bench_decode_opts *o)
{
    int exit_code = TOOL_EXIT_OK, first = 1;
    const double peak = o->peak_gbps;
    if (o->json) {
        printf(", \"mode\": \"decode\", \"chunk\": %lld, \"page_size\": %lld, \"cmp_page_size\": %lld, \"results\": [",
               (long long)o->chunk, (long long)o->page_size, (long long)o->cmp_page_size);
    } else {
        printf("decode:  one nsa_decode step of TQ new tokens per sequence after a context of cached tokens "
               "(prefilled in steps of up to %lld); pages of %lld positions, %lld compressed rows\n",
               (long long)o->chunk, (long long)o->page_size, (long long)o->cmp_page_size);
        printf("%6s %9s %5s %10s %10s %9s %7s %9s %10s %10s %8s\n", "B", "context", "TQ", "step ms", "min ms",
               "GB/s", "%peak", "cmp ms", "dense ms", "dense raw", "speedup");
    }
    int stop = 0; /* a bad case, or a backend without a decode step: the other points would fail alike */
    for (int ib = 0; ib < o->nbatch && !stop; ib++)
        for (int ic = 0; ic < o->ncontext && !stop; ic++)
            for (int iq = 0; iq < o->ntq && !stop; iq++) {
                const int64_t B = o->batch[ib], C = o->context[ic], TQ = o->tq[iq];
                dmeasure m[D_COUNT];
                memset(m, 0, sizeof m);
                for (int v = 0; v < D_COUNT; v++) {
                    if (v != D_FULL && (o->no_dense || !m[D_FULL].ran)) continue;
                    if (run_point(ctx, o, B, C, TQ, v, &m[v]) != 0) {
                        exit_code = TOOL_EXIT_USAGE;
                        stop = 1;
                        break;
                    }
                    if (v == D_FULL && m[v].status == NSA_ERR_UNSUPPORTED) stop = 1;
                    if (!m[v].ran && m[v].note[0]) {
                        fprintf(stderr, CMD ": --decode B=%lld context=%lld TQ=%lld %s: %s\n", (long long)B,
                                (long long)C, (long long)TQ, dname[v], m[v].note);
                        if (v == D_FULL) exit_code = TOOL_EXIT_FAIL;
                    }
                }
                if (exit_code == TOOL_EXIT_USAGE) break;
                const double dense = m[D_DENSE].ran && m[D_CMP_ONLY].ran
                                         ? m[D_DENSE].time_s - m[D_CMP_ONLY].time_s : NAN;
                const double speedup = dense > 0 && m[D_FULL].ran ? dense / m[D_FULL].time_s : NAN;
                const double gbps = m[D_FULL].ran ? m[D_FULL].bytes / m[D_FULL].time_s / 1e9 : NAN;
                if (o->json) {
                    printf("%s{\"batch\": %lld, \"context\": %lld, \"tq\": %lld, \"ok\": %s", first ? "" : ", ",
                           (long long)B, (long long)C, (long long)TQ, m[D_FULL].ran ? "true" : "false");
                    first = 0;
                    for (int v = 0; v < D_COUNT; v++) {
                        printf(", \"%s\": ", dname[v]);
                        print_measure_json(&m[v]);
                    }
                    json_field(stdout, "pct_peak_gbps", peak > 0 ? 100.0 * gbps / peak : NAN);
                    json_field(stdout, "dense_s", dense);
                    json_field(stdout, "speedup_vs_dense", speedup);
                    printf(", \"error\": ");
                    json_str(stdout, m[D_FULL].ran ? "" : m[D_FULL].note);
                    printf("}");
                } else if (m[D_FULL].ran) {
                    printf("%6lld %9lld %5lld", (long long)B, (long long)C, (long long)TQ);
                    print_ms(10, m[D_FULL].time_s);
                    print_ms(10, m[D_FULL].min_s);
                    printf(" %9.4g", gbps);
                    if (peak > 0)
                        printf(" %6.1f%%", 100.0 * gbps / peak);
                    else
                        printf(" %7s", "n/a");
                    print_ms(9, m[D_CMP_ONLY].ran ? m[D_CMP_ONLY].time_s : NAN);
                    print_ms(10, dense);
                    print_ms(10, m[D_DENSE].ran ? m[D_DENSE].time_s : NAN);
                    if (isnan(speedup))
                        printf(" %8s\n", "-");
                    else
                        printf(" %7.3gx\n", speedup);
                } else {
                    printf("%6lld %9lld %5lld failed: %s\n", (long long)B, (long long)C, (long long)TQ,
                           m[D_FULL].note);
                }
                fflush(stdout);
            }
    if (o->json) {
        printf("], \"exit_code\": %d}\n", exit_code);
    } else {
        printf("step: median of %d after %d warm-up, nsa_decode to the end of nsa_decode_check. GB/s: the bytes the "
               "step must read (new tokens' q, gates, k, v; the context's compressed rows; the cached tokens of the "
               "selected blocks and the windows, distinct per KV head) / step time\n",
               o->iters, o->warmup);
        printf("dense: the step with n=0, w=context+TQ (window = causal attention over the whole context) minus "
               "the step with n=0, w=0 (cmp ms: the compressed branch, which cannot be switched off); dense raw "
               "includes it; speedup = dense / step\n");
    }
    return exit_code;
}
