/*
 * nsa bench --decode: per-step time of nsa_decode for sweeps of B, context and TQ.
 *
 * A point (B, C, TQ): B sequences of C + TQ tokens are served by a decode plan
 * over shuffled paged caches (tools/decode_run.c, the code `nsa run --decode`
 * drives), the caches are brought to C cached tokens per sequence, and the step
 * of the point -- TQ new tokens of every sequence at positions C .. C + TQ - 1 --
 * is run --warmup times untimed and --iters times timed, each from nsa_decode to
 * the end of nsa_decode_check (which waits for it), then --iters times queued
 * back to back with one nsa_decode_check at the end (a serving loop that does
 * not wait on each step: the launches of a step overlap the device's work on
 * the one before). The step can be repeated as
 * it is: the caches' new positions and compressed rows are rewritten with the
 * same bits and cache_seqlens stays C.
 *
 * How the caches reach C (--fill):
 *   random (the default): written directly (decode_run_fill): every position of
 *     the raw K/V pools and every row of the compressed pool gets a seeded value
 *     (keys in [-2, 2), values in [-1, 1), as the testkit draws k and v),
 *     cache_seqlens = C, and only the step's own inputs are drawn (each sequence's
 *     TQ tokens of q, k, v and gates: a testkit case of one sequence of B x TQ
 *     tokens). No prefill step runs and the host holds the step's rows, not the
 *     context's, so B is bound by the int32 step lengths (B x TQ, C + TQ < 2^31)
 *     and by the device's memory alone: the caches of B = 64 at C = 131072 with
 *     Hkv 4, Dqk 192, Dv 128 in bf16 take 21 GB; the host, tens of MiB.
 *   steps: the tool's whole problem is drawn (every token's inputs; at most
 *     TK_MAX_BATCH = 8 sequences) and each sequence is prefilled to C by decode
 *     steps of up to --chunk tokens, as `nsa run --decode` does, so the caches
 *     hold that problem's own rows and the prefill's steps and time are
 *     reported. At long contexts that is thousands of steps, and the host holds
 *     q of every token.
 * A timing tool wants the first: what a step reads and its cost do not depend on
 * the values in the caches. The step reads every compressed row of its context
 * (Nc(C + TQ), whatever they hold), forms the rows its new tokens complete from
 * the cached raw rows itself (MEAN, LINEAR) or takes the caller's (EXTERNAL:
 * the fill wrote them), selects min(n, eligible blocks) blocks for each query
 * and KV head whatever the scores, and reads its window. The compressed rows
 * are drawn like the keys and values rather than formed as the MEAN of the raw
 * rows (which would need a block's raw rows together on the host, across pages
 * and the table the fill copies from): values decide only which blocks are
 * selected, so how far selected blocks overlap each other and the window, and
 * the GB/s below counts that from the step's own selection. Finite values of the
 * inputs' range keep the scores and softmaxes of the usual kind.
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
 * raw time are reported, and speedup = dense / the step's time. Each variant is
 * set up (and filled) on its own, so that one point holds one set of caches.
 */
#include "bench_decode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checked.h"
#include "decode_run.h"
#include "testkit.h"
#include "tool.h"

#define CMD "nsa bench"

const char *const bench_decode_fill_choices = "random|steps";

enum { D_FULL, D_DENSE, D_CMP_ONLY, D_COUNT };
static const char *const dname[D_COUNT] = {"full", "dense", "cmp_only"};

typedef struct dmeasure {
    int ran;
    double time_s, min_s, bytes;
    double queued_s; /* per step, --iters steps queued back to back and one check */
    double prefill_s, fill_s; /* the caches brought to the context: by steps (summed), by decode_run_fill */
    int64_t prefill_steps;
    nsa_status status; /* the first failure's */
    char note[TOOL_ERR_MAX];
    char kernels[TOOL_KERNELS_MAX], kernels_json[TOOL_KERNELS_MAX]; /* the step plan's stages and kernels */
} dmeasure;

void bench_decode_defaults(bench_decode_opts *o, int on_cpu)
{
    if (o->nbatch == 0) {
        o->batch[0] = 1;
        o->nbatch = 1;
        if (!on_cpu) { /* the batches; the drawn problems of --fill steps hold at most TK_MAX_BATCH */
            o->batch[1] = o->fill == BENCH_FILL_STEPS ? TK_MAX_BATCH / 2 : 8;
            o->batch[2] = o->fill == BENCH_FILL_STEPS ? TK_MAX_BATCH : 64;
            o->nbatch = 3;
        }
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

int bench_decode_check(const bench_decode_opts *o)
{
    const int steps = o->fill == BENCH_FILL_STEPS;
    if (o->chunk < 1 || o->page_size < 1 || o->cmp_page_size < 1) {
        fprintf(stderr, CMD ": --decode needs --chunk, --page-size and --cmp-page-size >= 1\n");
        return TOOL_EXIT_USAGE;
    }
    for (int i = 0; i < o->nbatch; i++)
        if (o->batch[i] < 1 || (steps && o->batch[i] > TK_MAX_BATCH)) {
            fprintf(stderr,
                    steps ? CMD ": --batch %lld: --fill steps draws the whole problem, of 1 .. %d sequences (the "
                                "default --fill random takes any B)\n"
                          : CMD ": --batch %lld: a decode point needs B >= 1 sequences\n",
                    (long long)o->batch[i], TK_MAX_BATCH);
            return TOOL_EXIT_USAGE;
        }
    for (int i = 0; i < o->ncontext; i++)
        if (o->context[i] < 0) {
            fprintf(stderr, CMD ": --context %lld: the cached tokens must be >= 0\n", (long long)o->context[i]);
            return TOOL_EXIT_USAGE;
        }
    for (int i = 0; i < o->ntq; i++)
        if (o->tq[i] < 1) {
            fprintf(stderr, CMD ": --tq %lld: a step takes TQ >= 1 new tokens per sequence\n", (long long)o->tq[i]);
            return TOOL_EXIT_USAGE;
        }
    /* the step lengths are int32 tensors (cu_seqlens_q, cache_seqlens) */
    for (int q = 0; q < o->ntq; q++) {
        int64_t n;
        for (int i = 0; i < o->ncontext; i++)
            if (nsa_ck_add(o->context[i], o->tq[q], &n) || n > INT32_MAX) {
                fprintf(stderr,
                        CMD ": --context %lld + --tq %lld: a sequence's length must fit the int32 cache_seqlens "
                            "(at most 2147483647 tokens)\n",
                        (long long)o->context[i], (long long)o->tq[q]);
                return TOOL_EXIT_USAGE;
            }
        for (int i = 0; i < o->nbatch; i++)
            if (nsa_ck_mul(o->batch[i], o->tq[q], &n) || n > INT32_MAX) {
                fprintf(stderr,
                        CMD ": --batch %lld x --tq %lld: a step's rows must fit the int32 cu_seqlens_q (at most "
                            "2147483647)\n",
                        (long long)o->batch[i], (long long)o->tq[q]);
                return TOOL_EXIT_USAGE;
            }
    }
    return 0;
}

/* The configuration of variant v for sequences of len tokens (see the file header). */
static nsa_status variant_config(nsa_config *cfg, int v, int64_t len, dmeasure *m)
{
    if (v == D_FULL) return NSA_SUCCESS;
    cfg->num_selected = 0;
    cfg->num_init = 0;
    cfg->num_local = 0;
    cfg->window = v == D_DENSE ? len : 0;
    nsa_status s = nsa_config_validate(cfg);
    if (s != NSA_SUCCESS) tool_format_error(m->note, sizeof m->note, "nsa_config_validate", s);
    return s;
}

/* Bytes of this machine's memory (0 when unknown). */
static double host_memory(void)
{
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (double)pages * (double)page : 0;
}

/* Draws the inputs of case c into *in (what: which, for the messages). */
static void draw_inputs(const tk_case *c, tk_inputs *in, const char *label, const char *what, dmeasure *m)
{
    tool_progress("%s: drawing %s", label, what);
    m->status = tk_inputs_make(c, in);
    tool_progress_end();
    if (m->status != NSA_SUCCESS)
        snprintf(m->note, sizeof m->note, "drawing %s failed: %s", what, nsa_status_string(m->status));
}

/* --fill steps: the whole problem drawn into *in, set up and prefilled to C. */
static int setup_steps(nsa_context *ctx, const bench_decode_opts *o, int64_t B, int64_t C, int64_t TQ, int v,
                       const char *label, tk_inputs *in, decode_run *d, dmeasure *m)
{
    int64_t lens[TK_MAX_BATCH];
    tk_case c;
    const int64_t len = C + TQ; /* checked: bench_decode_check */
    for (int64_t b = 0; b < B; b++) lens[b] = len;
    if (config_flags_case(CMD, o->cf, lens, B, &c) != 0) return TOOL_EXIT_USAGE;
    if ((m->status = variant_config(&c.cfg, v, len, m)) != NSA_SUCCESS) return 0;
    draw_inputs(&c, in, label, "the inputs", m);
    if (m->status != NSA_SUCCESS) return 0;
    const int64_t most = o->chunk > TQ ? o->chunk : TQ, chunk = o->chunk < len ? o->chunk : len;
    m->status = decode_run_setup(ctx, &c, in, most < len ? most : len, o->page_size, o->cmp_page_size,
                                 (uint64_t)o->cf->seed, d, m->note, sizeof m->note);
    if (m->status == NSA_SUCCESS)
        m->status = decode_run_prefill(d, C, chunk, label, &m->prefill_steps, &m->prefill_s, m->note,
                                       sizeof m->note);
    return 0;
}

/* --fill random: the step's inputs drawn into *in, the caches filled to C. */
static int setup_fill(nsa_context *ctx, const bench_decode_opts *o, int64_t B, int64_t C, int64_t TQ, int v,
                      const char *label, tk_inputs *in, decode_run *d, dmeasure *m)
{
    tk_case c;
    char cb[32], hb[32], mb[32];
    int64_t cache_bytes, host_bytes;
    const int64_t rows = B * TQ; /* checked: bench_decode_check */
    /* the step's B x TQ new tokens, drawn as one sequence of a testkit case */
    if (config_flags_case(CMD, o->cf, &rows, 1, &c) != 0) return TOOL_EXIT_USAGE;
    if ((m->status = variant_config(&c.cfg, v, C + TQ, m)) != NSA_SUCCESS) return 0;
    if (decode_run_step_memory(&c.cfg, B, C, TQ, o->page_size, o->cmp_page_size, &cache_bytes, &host_bytes)) {
        fprintf(stderr,
                CMD ": --decode B=%lld context=%lld TQ=%lld: the caches would need more than 2^63 bytes: make "
                    "--batch, --context, the heads or the page sizes smaller\n",
                (long long)B, (long long)C, (long long)TQ);
        return TOOL_EXIT_USAGE;
    }
    /* before anything is drawn or allocated: a CPU device's buffers are this
     * machine's memory too (a GPU's refuses the allocation, which names its size) */
    const int on_cpu = tool_on_cpu(ctx);
    const double mem = host_memory(), need = (double)host_bytes + (on_cpu ? (double)cache_bytes : 0.0);
    if (mem > 0 && need > mem) {
        if (on_cpu)
            snprintf(m->note, sizeof m->note,
                     "the caches (%s) and the step's host buffers (%s) would not fit this machine's %s of memory "
                     "(a CPU device's buffers are host memory)",
                     tool_bytes((double)cache_bytes, cb, sizeof cb), tool_bytes((double)host_bytes, hb, sizeof hb),
                     tool_bytes(mem, mb, sizeof mb));
        else
            snprintf(m->note, sizeof m->note, "the step's host buffers (%s) would not fit this machine's %s of memory",
                     tool_bytes((double)host_bytes, hb, sizeof hb), tool_bytes(mem, mb, sizeof mb));
        m->status = NSA_ERR_OUT_OF_MEMORY;
        return 0;
    }
    draw_inputs(&c, in, label, "the step's inputs", m);
    if (m->status != NSA_SUCCESS) return 0;
    m->status = decode_run_setup_step(ctx, &c.cfg, B, C, TQ, in, o->page_size, o->cmp_page_size,
                                      (uint64_t)o->cf->seed, d, m->note, sizeof m->note);
    if (m->status == NSA_SUCCESS) {
        tool_progress("%s: filling %s of caches", label, tool_bytes((double)cache_bytes, cb, sizeof cb));
        const double t0 = tool_now();
        m->status = decode_run_fill(d, (uint64_t)o->cf->seed, m->note, sizeof m->note);
        m->fill_s = tool_now() - t0;
        tool_progress_end();
    }
    return 0;
}

/* Sets up variant v of point (B, C, TQ), brings the caches to C, times the step.
 * Returns 2 for a bad case (message printed), else 0 (m->ran says whether it
 * ran; m->note why not). */
static int run_point(nsa_context *ctx, const bench_decode_opts *o, int64_t B, int64_t C, int64_t TQ, int v,
                     dmeasure *m)
{
    tk_inputs in;
    decode_run d;
    char label[128];
    memset(m, 0, sizeof *m);
    memset(&in, 0, sizeof in);
    memset(&d, 0, sizeof d);
    snprintf(label, sizeof label, CMD " --decode B=%lld context=%lld TQ=%lld %s", (long long)B, (long long)C,
             (long long)TQ, dname[v]);
    const int rc = o->fill == BENCH_FILL_STEPS ? setup_steps(ctx, o, B, C, TQ, v, label, &in, &d, m)
                                               : setup_fill(ctx, o, B, C, TQ, v, label, &in, &d, m);
    if (rc != 0 || m->status != NSA_SUCCESS) {
        decode_run_free(&d);
        tk_inputs_free(&in);
        return rc;
    }
    /* B step sizes, and the selection of the step's B x TQ rows (within the plan's selected buffer) */
    const size_t sel_bytes = (size_t)(B * TQ * d.Hkv * d.n) * sizeof(int32_t);
    int64_t *tq = malloc((size_t)B * sizeof *tq);
    int32_t *sel = d.sel ? malloc(sel_bytes) : NULL;
    double *t = malloc(sizeof *t * (size_t)o->iters);
    nsa_status s = NSA_SUCCESS;
    if (!tq || !t || (d.sel && !sel)) {
        snprintf(m->note, sizeof m->note, "out of host memory");
        s = NSA_ERR_OUT_OF_MEMORY;
    }
    for (int64_t b = 0; b < B && s == NSA_SUCCESS; b++) tq[b] = TQ;
    if (v == D_FULL) { /* the sweep names the full step's kernels */
        tool_format_stage_kernels(m->kernels, sizeof m->kernels, d.plan, 0, 0);
        tool_format_stage_kernels(m->kernels_json, sizeof m->kernels_json, d.plan, 1, 0);
    }
    if (s == NSA_SUCCESS) s = decode_run_stage(&d, tq, m->note, sizeof m->note);
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
    if (s == NSA_SUCCESS) {
        tool_progress("%s: %d steps queued", label, o->iters);
        const double t0 = tool_now();
        s = decode_run_steps(&d, o->iters, m->note, sizeof m->note);
        m->queued_s = (tool_now() - t0) / o->iters;
    }
    tool_progress_end();
    /* the step's selection: what the selected branch read */
    if (s == NSA_SUCCESS && sel && (s = nsa_buffer_read(d.sel, 0, sel, sel_bytes)) != NSA_SUCCESS)
        tool_format_error(m->note, sizeof m->note, "nsa_buffer_read (selected)", s);
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
    free(tq);
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
    json_field(stdout, "fill_s", m->fill_s);
    json_field(stdout, "time_s", m->time_s);
    json_field(stdout, "time_min_s", m->min_s);
    json_field(stdout, "time_queued_s", m->queued_s);
    json_field(stdout, "bytes", m->bytes);
    json_field(stdout, "gbps", m->bytes / m->time_s / 1e9);
    printf("}");
}

int bench_decode(nsa_context *ctx, const bench_decode_opts *o)
{
    int exit_code = TOOL_EXIT_OK, first = 1;
    const double peak = o->peak_gbps;
    const int steps = o->fill == BENCH_FILL_STEPS;
    if (o->json) {
        printf(", \"mode\": \"decode\", \"fill\": \"%s\", \"chunk\": %lld, \"page_size\": %lld, "
               "\"cmp_page_size\": %lld, \"results\": [",
               steps ? "steps" : "random", (long long)o->chunk, (long long)o->page_size, (long long)o->cmp_page_size);
    } else {
        char how[96];
        if (steps)
            snprintf(how, sizeof how, "prefilled in steps of up to %lld", (long long)o->chunk);
        else
            snprintf(how, sizeof how, "written into the caches as seeded random values");
        printf("decode:  one nsa_decode step of TQ new tokens per sequence after a context of cached tokens (%s); "
               "pages of %lld positions, %lld compressed rows\n",
               how, (long long)o->page_size, (long long)o->cmp_page_size);
        printf("%6s %9s %5s %10s %10s %10s %9s %7s %9s %10s %10s %8s\n", "B", "context", "TQ", "step ms", "min ms",
               "queued ms", "GB/s", "%peak", "cmp ms", "dense ms", "dense raw", "speedup");
    }
    int stop = 0; /* a bad case, or a backend without a decode step: the other points would fail alike */
    char shown[TOOL_KERNELS_MAX] = ""; /* the kernels last printed above the table's rows */
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
                    printf(", \"kernels\": %s", m[D_FULL].kernels_json[0] ? m[D_FULL].kernels_json : "{}");
                    printf(", \"error\": ");
                    json_str(stdout, m[D_FULL].ran ? "" : m[D_FULL].note);
                    printf("}");
                } else if (m[D_FULL].ran) {
                    if (strcmp(shown, m[D_FULL].kernels) != 0) { /* the plan's kernels, where they change */
                        printf("kernels (from B=%lld context=%lld TQ=%lld on):\n%s", (long long)B, (long long)C,
                               (long long)TQ, m[D_FULL].kernels);
                        snprintf(shown, sizeof shown, "%s", m[D_FULL].kernels);
                    }
                    printf("%6lld %9lld %5lld", (long long)B, (long long)C, (long long)TQ);
                    print_ms(10, m[D_FULL].time_s);
                    print_ms(10, m[D_FULL].min_s);
                    print_ms(10, m[D_FULL].queued_s);
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
        printf("step: median of %d after %d warm-up, nsa_decode to the end of nsa_decode_check; queued: %d steps "
               "queued back to back, one nsa_decode_check at the end, per step. GB/s: the bytes the "
               "step must read (new tokens' q, gates, k, v; the context's compressed rows; the cached tokens of the "
               "selected blocks and the windows, distinct per KV head) / step time\n",
               o->iters, o->warmup, o->iters);
        printf("dense: the step with n=0, w=context+TQ (window = causal attention over the whole context) minus "
               "the step with n=0, w=0 (cmp ms: the compressed branch, which cannot be switched off); dense raw "
               "includes it; speedup = dense / step\n");
    }
    return exit_code;
}
