/*
 * nsa bench: a sweep over T (and with --groups over head counts) on one
 * backend -- total time, TFLOP/s, GB/s,
 * per-branch times estimated by difference, and the speedup over dense causal
 * attention run by the same backend in the same process.
 *
 * Per-stage times: the public API has no per-stage timer, so the forward is
 * timed whole for four configurations of the same shapes and inputs:
 *   full          the configuration given
 *   no-slc        n = 0 (drops block scores, top-n and selected attention)
 *   no-win        w = 0 (drops window attention)
 *   cmp-only      n = 0, w = 0 (compression, compressed attention, gating)
 * and the branches are reported as differences: slc = full - no-slc,
 * win = full - no-win, cmp = cmp-only. Such differences are estimates (stages
 * overlap on a GPU, caches differ); a backend profiler gives exact stage times.
 *
 * Dense: the semantics cannot switch the compression branch off, so dense
 * causal attention is run as the same shapes with w = T and n = 0 (window
 * branch = exact causal attention) and the measured cmp-only time is
 * subtracted: dense = t(w = T, n = 0) - t(cmp-only). Both numbers are printed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "baseline_file.h"
#include "bench_decode.h"
#include "cmds.h"
#include "config_flags.h"
#include "decode_run.h"
#include "nsa.h"
#include "peaks.h"
#include "plot_svg.h"
#include "problem.h"
#include "testkit.h"
#include "tool.h"

#define CMD "nsa bench"
#define MAX_T 32
#define MAX_GROUPS 16

enum { V_FULL, V_NO_SLC, V_NO_WIN, V_CMP_ONLY, V_DENSE, V_COUNT };
static const char *const variant_name[V_COUNT] = {"full", "no-slc", "no-win", "cmp-only", "dense"};

typedef struct measure {
    int ran;
    double time_s, min_s, pairs, flops, bytes;
    int bwd_ran;                     /* --backward */
    double bwd_time_s, bwd_min_s, bwd_flops;
    char note[TOOL_ERR_MAX];
} measure;

static void usage(FILE *f, const args_opt *opts, int n)
{
    fprintf(f,
            "usage: nsa bench [--T N,N,...] [--backend NAME] [flags]\n\n"
            "Times the NSA forward on one backend over a sweep of sequence lengths (default:\n"
            "8192,16384,32768,65536 on GPUs, 256,512 on CPU devices), with the\n"
            "paper's configuration unless flags change it.\n\n"
            "time: median of --iters forwards after --warmup, each bracketed by\n"
            "  nsa_context_synchronize, wall clock, caller workspace.\n"
            "TFLOP/s: 2 * (Dqk + Dv) per visible (query head, key) pair of the three\n"
            "  branches, counted from the actual selection (see nsa run --help).\n"
            "GB/s: compulsory bytes (every input tensor read once, every output written\n"
            "  once) / time. %%peak: against --peak-tflops / --peak-gbps, else the\n"
            "  device's published dense peak for the dtype from a built-in table of\n"
            "  common GPUs (tools/peaks.c; n/a for other devices).\n"
            "branches: there is no per-stage timer in the API, so the forward is also timed\n"
            "  with n = 0 (no selection), w = 0 (no window) and both (cmp only), and\n"
            "  slc = full - (n=0), win = full - (w=0), cmp = (n=0,w=0) are estimates by\n"
            "  difference (a backend profiler gives exact stage times). --no-stages skips.\n"
            "dense: causal attention by the same backend: the same shapes with w = T, n = 0\n"
            "  (the window branch is then exact dense causal attention); the compression\n"
            "  branch cannot be switched off, so its measured cmp-only time is subtracted:\n"
            "  dense = t(w=T, n=0) - t(cmp only); speedup = dense / full. The raw\n"
            "  t(w=T, n=0) is printed too. --no-dense skips it.\n"
            "--groups HQ/HKV,..: the sweep over T for each pair of query / key-value head\n"
            "  counts in turn (the GQA group sizes models use: 64/4,28/4,32/8,16/4,4/4), in\n"
            "  place of --hq / --hkv; a line 'heads' starts each pair's rows (JSON: every\n"
            "  result and baseline has hq, hkv). Not with --plot.\n"
            "--backward: also times nsa_backward for every configuration above (training\n"
            "  plans; dO drawn from the seed) and prints a 'bwd' line under each T: total,\n"
            "  TFLOP/s (2 * (3 Dqk + 2 Dv) per visible pair: S again, dP, dV, dQ, dK),\n"
            "  branches and dense by the same differences.\n"
            "first: the context's first plan is made and timed before the sweep: kernels\n"
            "  compiled at run time (OpenCL programs) are built, or loaded from the kernel\n"
            "  cache, there; the library's messages while it is made say which and how long\n"
            "  (JSON: first_plan_s, first_plan_log). The sweep's times exclude it.\n"
            "--baseline FILE: JSON lines of other implementations' times (what\n"
            "  tools/dense_baseline.py prints: PyTorch's cuDNN and FlashAttention-2 on the same\n"
            "  GPU, measured in the same session); records for the swept T and this shape are\n"
            "  listed after the table with the speedup over each.\n"
            "--plot FILE.svg: a figure of time and speedup against T for this run, the\n"
            "  backend's dense attention and the baselines.\n"
            "--decode: times one decode step (nsa_decode, docs/nsa-semantics.md section 10)\n"
            "  instead, for every --batch B, --context C and --tq TQ of the lists (defaults:\n"
            "  B 1,8,64 (1,4,8 with --fill steps), C 8192,32768 on GPUs; B 1, C 128,256 on\n"
            "  CPU devices; TQ 1): B sequences over paged caches (--page-size,\n"
            "  --cmp-page-size; page tables shuffled by --seed) hold C cached tokens each,\n"
            "  then the step of TQ new tokens per sequence is run --warmup times and timed\n"
            "  --iters times (default 2 and 10 on every device; median; each from nsa_decode\n"
            "  to the end of nsa_decode_check; the step is repeated as it is, cache_seqlens\n"
            "  staying C), then --iters times queued back to back with one nsa_decode_check\n"
            "  at the end (\"queued ms\": per step, as a serving loop that does not wait on\n"
            "  each step sees it). B x TQ and C + TQ must be below 2^31 (the int32 step\n"
            "  lengths).\n"
            "  --fill random (default): the caches are written directly with seeded random\n"
            "  values (the raw K/V pages and the compressed rows; keys in [-2, 2), values in\n"
            "  [-1, 1)) and only the step's own inputs are drawn: no prefill step, any B,\n"
            "  host memory for the step alone (a point whose caches cannot fit is reported\n"
            "  with their size). A step's reads and cost do not depend on the values.\n"
            "  --fill steps: the whole problem is drawn (B <= 8) and prefilled to C by decode\n"
            "  steps of up to --chunk tokens (default 256), as nsa run --decode does; the\n"
            "  caches then hold the problem's own rows, and the JSON has the prefill's steps\n"
            "  and time.\n"
            "  GB/s: the bytes the step must read, per sequence: the new tokens' q, gates,\n"
            "  k, v; the compressed rows of the context (k and v); per KV head the distinct\n"
            "  cached tokens of its queries' selected blocks (from the step's selection) and\n"
            "  windows; %%peak against --peak-gbps or the table above. Dense decode by the\n"
            "  same backend: the step with n = 0, w = C + TQ (the window branch is then\n"
            "  causal attention over the whole context); the compression branch cannot be\n"
            "  switched off, so the step with n = 0, w = 0 is timed too (cmp ms) and dense =\n"
            "  t(n=0, w=C+TQ) - t(cmp only), the raw time printed beside it; speedup = dense /\n"
            "  step. --no-dense skips both. The step plan's stages and kernels are printed\n"
            "  above the rows wherever they change (\"kernels\" per point in --json).\n"
            "  Not with --T, --backward, --no-stages,\n"
            "  --baseline or --plot.\n\n"
            "%s\nflags:\n",
            config_flags_help);
    args_print_options(f, opts, n);
}

/* Sets up variant v of case base on ctx with inputs in, times it. */
static void run_variant(nsa_context *ctx, const tk_case *base, const tk_inputs *in, int v,
                        int warmup, int iters, int backward, measure *m)
{
    tk_case c = *base;
    if (backward)
        c.cfg.flags |= NSA_CONFIG_TRAINING;
    problem p;
    tk_output out;
    nsa_status s;
    char label[96];
    memset(m, 0, sizeof *m);
    if (v == V_NO_SLC || v == V_CMP_ONLY || v == V_DENSE) {
        c.cfg.num_selected = 0;
        c.cfg.num_init = 0;
        c.cfg.num_local = 0;
    }
    if (v == V_NO_WIN || v == V_CMP_ONLY)
        c.cfg.window = 0;
    if (v == V_DENSE) {
        int64_t longest = 0;
        for (int64_t b = 0; b < c.batch; b++) {
            int64_t len = c.cu_seqlens[b + 1] - c.cu_seqlens[b];
            longest = len > longest ? len : longest;
        }
        c.cfg.window = longest > 0 ? longest : 1;
    }
    s = nsa_config_validate(&c.cfg);
    if (s != NSA_SUCCESS) {
        tool_format_error(m->note, sizeof m->note, "nsa_config_validate", s);
        return;
    }
    s = problem_setup(ctx, &c, in, NULL, &p, m->note, sizeof m->note);
    if (s != NSA_SUCCESS)
        return;
    snprintf(label, sizeof label, CMD " T=%lld %s", (long long)tk_case_tokens(&c), variant_name[v]);
    s = problem_time(&p, warmup, iters, label, &m->time_s, &m->min_s, m->note, sizeof m->note);
    if (s == NSA_SUCCESS)
        s = problem_download(&p, &out, m->note, sizeof m->note);
    if (s == NSA_SUCCESS) {
        /* dense: only the causal attention pairs (its cmp branch is subtracted) */
        m->pairs = v == V_DENSE ? problem_dense_pairs(&c) : problem_pairs(&c, out.sel);
        m->flops = 2.0 * (double)(c.cfg.head_dim_qk + c.cfg.head_dim_v) * m->pairs;
        m->bytes = (double)(p.input_bytes + p.output_bytes);
        m->ran = 1;
        problem_output_free(&out);
    }
    if (s == NSA_SUCCESS && backward) {
        /* backward: per visible pair, S again (Dqk), dP (Dv), dV (Dv), dQ and dK (Dqk each) */
        snprintf(label, sizeof label, CMD " T=%lld %s backward", (long long)tk_case_tokens(&c), variant_name[v]);
        s = problem_backward_setup(&p, m->note, sizeof m->note);
        if (s == NSA_SUCCESS)
            s = problem_time_backward(&p, warmup, iters, label, &m->bwd_time_s, &m->bwd_min_s, m->note,
                                      sizeof m->note);
        if (s == NSA_SUCCESS) {
            m->bwd_flops = 2.0 * (double)(3 * c.cfg.head_dim_qk + 2 * c.cfg.head_dim_v) * m->pairs;
            m->bwd_ran = 1;
        }
    }
    problem_free(&p);
}

/* The branch times and dense attention of one T by difference (see the file
 * header), of the forward (backward = 0) or the backward measurements; NAN where
 * a configuration was not run. */
typedef struct estimate {
    double cmp, slc, win, dense, speedup;
} estimate;

static estimate estimate_of(const measure m[V_COUNT], const nsa_config *cfg, int backward)
{
    double t[V_COUNT];
    for (int v = 0; v < V_COUNT; v++)
        t[v] = (backward ? m[v].bwd_ran : m[v].ran) ? (backward ? m[v].bwd_time_s : m[v].time_s) : NAN;
    estimate e = {t[V_CMP_ONLY], NAN, NAN, t[V_DENSE] - t[V_CMP_ONLY], NAN};
    if (cfg->num_selected > 0)
        e.slc = t[V_FULL] - t[V_NO_SLC];
    if (cfg->window > 0)
        e.win = t[V_FULL] - t[V_NO_WIN];
    if (e.dense > 0)
        e.speedup = e.dense / t[V_FULL];
    return e;
}

/* The context's first plan is where kernels compiled at run time are built, or
 * loaded from the cache (the OpenCL backend's programs, per dtype): it is made
 * once before the sweep, timed, and the library's messages while it is made
 * (level info: which kernels were built from source in how long, or taken from
 * the cache) are reported with it. Later plans of the context reuse those
 * kernels, so the sweep's times do not include them. */
#define FIRST_LOG_LINES 8
typedef struct {
    char line[FIRST_LOG_LINES][320];
    int n, dropped;
} first_log;

static void first_log_fn(nsa_log_level level, const char *message, void *user)
{
    first_log *f = user;
    (void)level;
    if (f->n < FIRST_LOG_LINES)
        snprintf(f->line[f->n++], sizeof f->line[0], "%s", message);
    else
        f->dropped++;
}

/* seconds to make (and destroy) the first plan; < 0 with a message in err on failure */
static double first_plan(nsa_context *ctx, const tk_case *c, first_log *log, char *err, size_t err_size)
{
    memset(log, 0, sizeof *log);
    nsa_plan *plan = NULL;
    nsa_set_log(first_log_fn, NSA_LOG_INFO, log);
    const double t0 = tool_now();
    nsa_status s = nsa_plan_create(ctx, &c->cfg, c->cu_seqlens, c->batch, &plan);
    const double t = tool_now() - t0;
    nsa_set_log(NULL, NSA_LOG_ERROR, NULL); /* back to NSA_LOG */
    if (s != NSA_SUCCESS) {
        tool_format_error(err, err_size, "nsa_plan_create", s);
        return -1.0;
    }
    nsa_plan_destroy(plan);
    return t;
}

static void print_pct(double value, double peak)
{
    if (peak > 0)
        printf(" %5.1f%%", 100.0 * value / peak);
    else
        printf(" %6s", "n/a");
}

/* " %*.4g" of a time in seconds as milliseconds, or "-" where it was not
 * measured (--no-stages, --no-dense, a branch that is off) */
static void print_ms(int width, double seconds)
{
    if (isnan(seconds))
        printf(" %*s", width, "-");
    else
        printf(" %*.4g", width, seconds * 1e3);
}

/* The head of the report: the JSON object's first fields (left open), or the
 * lines backend, config (the first case of the sweep; swept: what varies) and peak. */
static void print_head(int json, nsa_context *ctx, const tk_case *c0, const char *swept, int64_t iters,
                       int64_t warmup, double peak_tflops, double peak_gbps, const char *peak_src)
{
    if (json) {
        printf("{\"command\": \"bench\", \"version\": ");
        json_str(stdout, nsa_version_string());
        printf(", \"backend\": ");
        json_str(stdout, nsa_context_backend(ctx));
        printf(", \"device\": ");
        json_str(stdout, nsa_context_device(ctx));
        printf(", \"iters\": %lld, \"warmup\": %lld", (long long)iters, (long long)warmup);
        json_field(stdout, "peak_tflops", peak_tflops > 0 ? peak_tflops : NAN);
        json_field(stdout, "peak_gbps", peak_gbps > 0 ? peak_gbps : NAN);
        printf(", \"peak_table_entry\": ");
        if (peak_src)
            json_str(stdout, peak_src);
        else
            printf("null");
        return;
    }
    char desc[512];
    printf("backend: %s, device: %s (libnsa %s); median of %lld after %lld warm-up\n", nsa_context_backend(ctx),
           nsa_context_device(ctx), nsa_version_string(), (long long)iters, (long long)warmup);
    printf("config:  %s (%s)\n", tk_case_describe(c0, desc, sizeof desc), swept);
    if (peak_tflops > 0 || peak_gbps > 0)
        printf("peak:    %.4g TFLOP/s, %.4g GB/s (%s)\n", peak_tflops, peak_gbps,
               peak_src ? "published dense figures for this GPU, tools/peaks.c; --peak-* override"
                        : "--peak-tflops / --peak-gbps");
    else
        printf("peak:    unknown for this device (--peak-tflops / --peak-gbps give %%peak)\n");
}

/* --groups "HQ/HKV,HQ/HKV,..": up to MAX_GROUPS pairs, HQ a multiple of HKV >= 1. Returns the
 * count, or -1 with a message naming the entry. */
static int parse_groups(const char *arg, int64_t *hq, int64_t *hkv)
{
    int n = 0;
    const char *p = arg;
    for (;;) {
        char *end;
        long long a, b = 0;
        a = strtoll(p, &end, 10);
        int ok = end != p && *end == '/';
        if (ok) {
            const char *q = end + 1;
            b = strtoll(q, &end, 10);
            ok = end != q && (*end == ',' || *end == '\0');
        }
        if (!ok || a < 1 || b < 1 || a > ((int64_t)1 << 20) || b > a || a % b != 0) {
            int len = 0;
            while (p[len] && p[len] != ',') len++;
            fprintf(stderr, CMD ": --groups: '%.*s' is not HQ/HKV with HQ a multiple of HKV, 1 <= HKV <= HQ <= 2^20\n",
                    len, p);
            return -1;
        }
        if (n == MAX_GROUPS) {
            fprintf(stderr, CMD ": --groups: at most %d pairs\n", MAX_GROUPS);
            return -1;
        }
        hq[n] = a;
        hkv[n] = b;
        n++;
        if (*end == '\0') return n;
        p = end + 1;
    }
}

int cmd_bench(int argc, char **argv)
{
    config_flags cf;
    const char *backend = NULL, *T_arg = NULL;
    int64_t device = -1, iters = -1, warmup = -1, batch = 1;
    const char *batch_arg = NULL, *context_arg = NULL, *tq_arg = NULL;
    int decode = 0, fill = BENCH_FILL_RANDOM;
    int64_t chunk = 256, page_size = DECODE_RUN_PAGE_SIZE, cmp_page_size = DECODE_RUN_CMP_PAGE_SIZE;
    double peak_tflops = 0, peak_gbps = 0;
    int json = 0, no_stages = 0, no_dense = 0, backward = 0;
    const char *plot_path = NULL, *baseline_path = NULL, *groups_arg = NULL;
    args_opt opts[CONFIG_FLAGS_COUNT + 24];
    int nopts, rc, nT, exit_code = TOOL_EXIT_OK;
    int64_t Ts[MAX_T];
    nsa_context *ctx = NULL;
    nsa_status s;
    const char *bname;

    config_flags_defaults(&cf);
    nopts = config_flags_options(&cf, opts, 0);
#define OPT(name, kind, dest, mv, help) opts[nopts++] = (args_opt){name, kind, dest, NULL, mv, help, 0}
    OPT("--T", ARGS_STRING, &T_arg, "N,N,..", "tokens per sequence to sweep (default: sized for the backend)");
    OPT("--batch", ARGS_STRING, &batch_arg, "B[,B..]", "sequences of T tokens each (1); --decode: a list to sweep");
    OPT("--backend", ARGS_STRING, &backend, "NAME", "backend (default: NSA_BACKEND, else the best available)");
    OPT("--device", ARGS_INT64, &device, "N", "device index (default: NSA_DEVICE, else 0)");
    OPT("--iters", ARGS_INT64, &iters, "N", "timed iterations (default 10; 1 on cpu)");
    OPT("--warmup", ARGS_INT64, &warmup, "N", "warm-up runs (default 2; 0 on cpu)");
    OPT("--peak-tflops", ARGS_DOUBLE, &peak_tflops, "X", "device peak TFLOP/s for the dtype (for % of peak)");
    OPT("--peak-gbps", ARGS_DOUBLE, &peak_gbps, "X", "device peak memory GB/s (for % of peak)");
    OPT("--no-stages", ARGS_FLAG, &no_stages, NULL, "skip the per-branch estimates (n=0 / w=0 runs)");
    OPT("--no-dense", ARGS_FLAG, &no_dense, NULL, "skip the dense causal attention comparison");
    OPT("--backward", ARGS_FLAG, &backward, NULL, "time the backward pass too (a line 'bwd' under each T)");
    OPT("--groups", ARGS_STRING, &groups_arg, "HQ/HKV,..", "sweep these head counts too (see above)");
    OPT("--json", ARGS_FLAG, &json, NULL, "print one JSON object");
    OPT("--baseline", ARGS_STRING, &baseline_path, "FILE", "other implementations' times (JSON lines) to compare with");
    OPT("--plot", ARGS_STRING, &plot_path, "FILE.svg", "draw time and speedup against T into an SVG file");
    OPT("--decode", ARGS_FLAG, &decode, NULL, "time a decode step instead (see above)");
    OPT("--context", ARGS_STRING, &context_arg, "C,C,..", "--decode: cached tokens per sequence to sweep");
    OPT("--tq", ARGS_STRING, &tq_arg, "TQ,TQ,..", "--decode: new tokens per sequence and step to sweep (1)");
    opts[nopts++] = (args_opt){"--fill", ARGS_CHOICE, &fill, bench_decode_fill_choices, NULL,
                               "--decode: the context written as random values, or prefilled by steps (random)", 0};
    OPT("--chunk", ARGS_INT64, &chunk, "N", "--decode --fill steps: prefill step size (256)");
    OPT("--page-size", ARGS_INT64, &page_size, "N", "--decode: positions per page of the K/V caches (64)");
    OPT("--cmp-page-size", ARGS_INT64, &cmp_page_size, "N", "--decode: rows per page of the compressed cache (16)");
#undef OPT
    rc = args_parse(CMD, opts, nopts, argc, argv, 1);
    if (rc == ARGS_HELP) {
        usage(stdout, opts, nopts);
        return TOOL_EXIT_OK;
    }
    if (rc != ARGS_OK)
        return TOOL_EXIT_USAGE;
    bench_decode_opts dopt;
    memset(&dopt, 0, sizeof dopt);
    if (batch_arg) {
        int nb = args_parse_i64_list(CMD, "--batch", batch_arg, dopt.batch, BENCH_DECODE_MAX_LIST);
        if (nb < 0)
            return TOOL_EXIT_USAGE;
        if (nb != 1 && !decode) {
            fprintf(stderr, CMD ": --batch takes one value (a list with --decode)\n");
            return TOOL_EXIT_USAGE;
        }
        dopt.nbatch = nb;
        batch = dopt.batch[0];
    }
    /* --decode checks its own batches (bench_decode_check) */
    if (device < -1 || iters == 0 || iters < -1 || warmup < -1 ||
        (!decode && (batch < 1 || batch > TK_MAX_BATCH)) || peak_tflops < 0 || peak_gbps < 0) {
        fprintf(stderr, CMD ": bad value: need --iters >= 1, --warmup >= 0, --batch 1..%d (without --decode), "
                        "peaks >= 0\n", TK_MAX_BATCH);
        return TOOL_EXIT_USAGE;
    }
    if (!decode && (context_arg || tq_arg || args_seen(opts, nopts, "--fill") || args_seen(opts, nopts, "--chunk") ||
                    args_seen(opts, nopts, "--page-size") || args_seen(opts, nopts, "--cmp-page-size"))) {
        fprintf(stderr, CMD ": --context, --tq, --fill, --chunk, --page-size and --cmp-page-size need --decode\n");
        return TOOL_EXIT_USAGE;
    }
    if (decode && fill != BENCH_FILL_STEPS && args_seen(opts, nopts, "--chunk")) {
        fprintf(stderr, CMD ": --chunk is the prefill step of --fill steps; the default --fill random runs none\n");
        return TOOL_EXIT_USAGE;
    }
    if (decode && (T_arg || backward || no_stages || baseline_path || plot_path || groups_arg)) {
        fprintf(stderr, CMD ": --decode sweeps --batch, --context and --tq; it does not take --T, --backward, "
                        "--no-stages, --baseline, --plot or --groups\n");
        return TOOL_EXIT_USAGE;
    }
    int64_t ghq[MAX_GROUPS], ghkv[MAX_GROUPS];
    int ngroups = 0; /* 0: the heads of --hq / --hkv */
    if (groups_arg) {
        if (plot_path || args_seen(opts, nopts, "--hq") || args_seen(opts, nopts, "--hkv")) {
            fprintf(stderr, CMD ": --groups sets the heads of each sweep; it does not take --hq, --hkv or --plot\n");
            return TOOL_EXIT_USAGE;
        }
        if ((ngroups = parse_groups(groups_arg, ghq, ghkv)) < 0)
            return TOOL_EXIT_USAGE;
        cf.hq = ghq[0];
        cf.hkv = ghkv[0];
    }
    if (decode) {
        if ((context_arg && (dopt.ncontext = args_parse_i64_list(CMD, "--context", context_arg, dopt.context,
                                                                 BENCH_DECODE_MAX_LIST)) < 0) ||
            (tq_arg && (dopt.ntq = args_parse_i64_list(CMD, "--tq", tq_arg, dopt.tq, BENCH_DECODE_MAX_LIST)) < 0))
            return TOOL_EXIT_USAGE;
        dopt.fill = fill;
        dopt.chunk = chunk;
        dopt.page_size = page_size;
        dopt.cmp_page_size = cmp_page_size;
    }

    static baseline_rec recs[BASELINE_MAX];
    int nrecs = 0;
    if (baseline_path) {
        char err[512];
        if (baseline_read(baseline_path, recs, &nrecs, err, sizeof err) != 0) {
            fprintf(stderr, CMD ": %s\n", err);
            return TOOL_EXIT_USAGE;
        }
    }

    s = nsa_context_create(backend, (int)device, &ctx);
    if (s != NSA_SUCCESS)
        return tool_report(CMD, "nsa_context_create", s);
    bname = nsa_context_backend(ctx);
    if (T_arg) {
        nT = args_parse_i64_list(CMD, "--T", T_arg, Ts, MAX_T);
        if (nT < 0) {
            nsa_context_destroy(ctx);
            return TOOL_EXIT_USAGE;
        }
        for (int i = 0; i < nT; i++)
            if (Ts[i] < 1) {
                fprintf(stderr, CMD ": --T values must be >= 1\n");
                nsa_context_destroy(ctx);
                return TOOL_EXIT_USAGE;
            }
    } else if (tool_on_cpu(ctx)) {
        Ts[0] = 256;
        Ts[1] = 512;
        nT = 2;
    } else {
        for (nT = 0; nT < 4; nT++)
            Ts[nT] = (int64_t)8192 << nT;
    }
    if (iters < 0)
        iters = tool_on_cpu(ctx) && !decode ? 1 : 10; /* a decode step is short, also on cpu */
    if (warmup < 0)
        warmup = tool_on_cpu(ctx) && !decode ? 0 : 2;

    if (decode) { /* the sweep's lists; the header describes one sequence of its first point */
        bench_decode_defaults(&dopt, tool_on_cpu(ctx));
        if (bench_decode_check(&dopt) != 0) {
            nsa_context_destroy(ctx);
            return TOOL_EXIT_USAGE;
        }
        batch = 1;
        Ts[0] = dopt.context[0] + dopt.tq[0]; /* checked: bench_decode_check */
    }
    /* the first case of the sweep: its dtype picks the peak, the header describes it */
    tk_case c0;
    {
        int64_t lens0[TK_MAX_BATCH];
        for (int64_t b = 0; b < batch; b++)
            lens0[b] = Ts[0];
        if (config_flags_case(CMD, &cf, lens0, batch, &c0) != 0) {
            nsa_context_destroy(ctx);
            return TOOL_EXIT_USAGE;
        }
    }
    /* peaks the flags leave unset come from the built-in table (tools/peaks.c) */
    const char *peak_src = NULL;
    {
        double tf = 0, gb = 0;
        if ((peak_tflops <= 0 || peak_gbps <= 0) &&
            tool_known_peak(nsa_context_device(ctx), c0.cfg.dtype, &tf, &gb, &peak_src)) {
            if (peak_tflops <= 0)
                peak_tflops = tf;
            if (peak_gbps <= 0)
                peak_gbps = gb;
        }
    }

    if (decode) {
        dopt.cf = &cf;
        dopt.warmup = (int)warmup;
        dopt.iters = (int)iters;
        dopt.no_dense = no_dense;
        dopt.json = json;
        dopt.peak_gbps = peak_gbps;
        print_head(json, ctx, &c0, "B, context + TQ swept", iters, warmup, peak_tflops, peak_gbps, peak_src);
        exit_code = bench_decode(ctx, &dopt);
        nsa_context_destroy(ctx);
        return exit_code;
    }

    first_log flog;
    char ferr[512] = "";
    const double first_s = first_plan(ctx, &c0, &flog, ferr, sizeof ferr); /* < 0: failed (the sweep says why) */

    print_head(json, ctx, &c0, ngroups ? "heads (--groups) and T swept" : "T swept", iters, warmup, peak_tflops,
               peak_gbps, peak_src);
    if (json) {
        printf(", \"first_plan_s\": ");
        json_num(stdout, first_s >= 0 ? first_s : NAN);
        printf(", \"first_plan_log\": [");
        for (int i = 0; i < flog.n; i++) {
            printf("%s", i ? ", " : "");
            json_str(stdout, flog.line[i]);
        }
        printf("]");
        printf(", \"results\": [");
    } else {
        if (first_s >= 0)
            printf("first:   plan %.1f ms (run-time kernel builds or cache loads happen in the first plan of a "
                   "context; not in the times below)\n", first_s * 1e3);
        else
            printf("first:   plan failed: %s\n", ferr);
        for (int i = 0; i < flog.n; i++)
            printf("         %s\n", flog.line[i]);
        if (flog.dropped)
            printf("         (%d more messages)\n", flog.dropped);
        printf("%8s %10s %9s %7s %9s %7s %9s %9s %9s %10s %10s %8s\n", "T", "nsa ms", "TFLOP/s",
               "%peak", "GB/s", "%peak", "cmp ms", "slc ms", "win ms", "dense ms", "dense raw", "speedup");
    }

    static double full_ms[MAX_GROUPS][MAX_T], dense_ms[MAX_GROUPS][MAX_T];
    const int npass = ngroups ? ngroups : 1;
    for (int gp = 0; gp < npass; gp++)
        for (int i = 0; i < nT; i++) full_ms[gp][i] = dense_ms[gp][i] = NAN;
    int passes = 0; /* groups swept (a bad configuration stops the sweep) */
    for (int gp = 0; gp < npass && exit_code != TOOL_EXIT_USAGE; gp++, passes++) {
        if (ngroups) {
            cf.hq = ghq[gp];
            cf.hkv = ghkv[gp];
            if (!json)
                printf("heads    Hq %lld, Hkv %lld (G = %lld)\n", (long long)cf.hq, (long long)cf.hkv,
                       (long long)(cf.hq / cf.hkv));
        }
        for (int i = 0; i < nT; i++) {
            int64_t lens[TK_MAX_BATCH];
            tk_case c;
            tk_inputs in;
            measure m[V_COUNT];
            for (int64_t b = 0; b < batch; b++)
                lens[b] = Ts[i];
            if (config_flags_case(CMD, &cf, lens, batch, &c) != 0) {
                exit_code = TOOL_EXIT_USAGE;
                break;
            }
            tool_progress(CMD " T=%lld: drawing inputs", (long long)Ts[i]);
            s = tk_inputs_make(&c, &in);
            tool_progress_end();
            if (s != NSA_SUCCESS) {
                fprintf(stderr, CMD ": T=%lld: drawing inputs failed: %s\n", (long long)Ts[i],
                        nsa_status_string(s));
                exit_code = TOOL_EXIT_FAIL;
                break;
            }
            memset(m, 0, sizeof m);
            for (int v = 0; v < V_COUNT; v++) {
                if ((v == V_NO_SLC || v == V_NO_WIN) && no_stages)
                    continue;
                if (v == V_CMP_ONLY && no_stages && no_dense)
                    continue;
                if (v == V_DENSE && no_dense)
                    continue;
                run_variant(ctx, &c, &in, v, (int)warmup, (int)iters, backward, &m[v]);
                if (!m[v].ran && m[v].note[0]) {
                    fprintf(stderr, CMD ": T=%lld %s: %s\n", (long long)Ts[i], variant_name[v], m[v].note);
                    if (v == V_FULL)
                        exit_code = TOOL_EXIT_FAIL;
                }
                if (v == V_FULL && !m[v].ran)
                    break;
            }
            tk_inputs_free(&in);
            const estimate fe = estimate_of(m, &c.cfg, 0), be = estimate_of(m, &c.cfg, 1);
            if (backward && m[V_FULL].ran && !m[V_FULL].bwd_ran) {
                fprintf(stderr, CMD ": T=%lld backward: %s\n", (long long)Ts[i], m[V_FULL].note);
                exit_code = TOOL_EXIT_FAIL;
            }
            if (m[V_FULL].ran)
                full_ms[gp][i] = m[V_FULL].time_s * 1e3;
            if (fe.dense > 0)
                dense_ms[gp][i] = fe.dense * 1e3;

            if (json) {
                printf("%s{\"T\": %lld, \"batch\": %lld, \"hq\": %lld, \"hkv\": %lld, \"ok\": %s", i || gp ? ", " : "",
                       (long long)Ts[i], (long long)batch, (long long)c.cfg.num_q_heads, (long long)c.cfg.num_kv_heads,
                       m[V_FULL].ran ? "true" : "false");
                for (int v = 0; v < V_COUNT; v++) {
                    printf(", \"%s\": ", variant_name[v]);
                    if (!m[v].ran) {
                        printf("null");
                        continue;
                    }
                    printf("{\"time_s\": ");
                    json_num(stdout, m[v].time_s);
                    printf(", \"time_min_s\": ");
                    json_num(stdout, m[v].min_s);
                    printf(", \"pairs\": ");
                    json_num(stdout, m[v].pairs);
                    printf(", \"flops\": ");
                    json_num(stdout, m[v].flops);
                    printf(", \"tflops\": ");
                    json_num(stdout, m[v].flops / m[v].time_s / 1e12);
                    printf(", \"bytes\": ");
                    json_num(stdout, m[v].bytes);
                    printf(", \"gbps\": ");
                    json_num(stdout, m[v].bytes / m[v].time_s / 1e9);
                    if (m[v].bwd_ran) {
                        printf(", \"backward_time_s\": ");
                        json_num(stdout, m[v].bwd_time_s);
                        printf(", \"backward_flops\": ");
                        json_num(stdout, m[v].bwd_flops);
                        printf(", \"backward_tflops\": ");
                        json_num(stdout, m[v].bwd_flops / m[v].bwd_time_s / 1e12);
                    }
                    printf("}");
                }
                printf(", \"est_cmp_s\": ");
                json_num(stdout, fe.cmp);
                printf(", \"est_slc_s\": ");
                json_num(stdout, fe.slc);
                printf(", \"est_win_s\": ");
                json_num(stdout, fe.win);
                printf(", \"dense_s\": ");
                json_num(stdout, fe.dense);
                printf(", \"dense_tflops\": ");
                json_num(stdout, fe.dense > 0 && m[V_DENSE].ran ? m[V_DENSE].flops / fe.dense / 1e12 : NAN);
                printf(", \"speedup_vs_dense\": ");
                json_num(stdout, fe.speedup);
                if (backward) {
                    printf(", \"backward\": {\"est_cmp_s\": ");
                    json_num(stdout, be.cmp);
                    printf(", \"est_slc_s\": ");
                    json_num(stdout, be.slc);
                    printf(", \"est_win_s\": ");
                    json_num(stdout, be.win);
                    printf(", \"dense_s\": ");
                    json_num(stdout, be.dense);
                    printf(", \"speedup_vs_dense\": ");
                    json_num(stdout, be.speedup);
                    printf("}");
                }
                printf("}");
            } else if (m[V_FULL].ran) {
                double tf = m[V_FULL].flops / m[V_FULL].time_s / 1e12;
                double gb = m[V_FULL].bytes / m[V_FULL].time_s / 1e9;
                printf("%8lld %10.4g %9.4g", (long long)Ts[i], m[V_FULL].time_s * 1e3, tf);
                print_pct(tf, peak_tflops);
                printf(" %9.4g", gb);
                print_pct(gb, peak_gbps);
                print_ms(9, fe.cmp);
                print_ms(9, fe.slc);
                print_ms(9, fe.win);
                print_ms(10, fe.dense);
                print_ms(10, m[V_DENSE].ran ? m[V_DENSE].time_s : NAN);
                if (isnan(fe.speedup))
                    printf(" %8s\n", "-");
                else
                    printf(" %7.3gx\n", fe.speedup);
                if (m[V_FULL].bwd_ran) { /* the backward: same columns, no GB/s */
                    double btf = m[V_FULL].bwd_flops / m[V_FULL].bwd_time_s / 1e12;
                    printf("%8s %10.4g %9.4g", "bwd", m[V_FULL].bwd_time_s * 1e3, btf);
                    print_pct(btf, peak_tflops);
                    printf(" %9s %7s", "-", "-");
                    print_ms(9, be.cmp);
                    print_ms(9, be.slc);
                    print_ms(9, be.win);
                    print_ms(10, be.dense);
                    print_ms(10, m[V_DENSE].bwd_ran ? m[V_DENSE].bwd_time_s : NAN);
                    if (isnan(be.speedup))
                        printf(" %8s\n", "-");
                    else
                        printf(" %7.3gx\n", be.speedup);
                }
            } else {
                printf("%8lld failed: %s\n", (long long)Ts[i], m[V_FULL].note);
            }
            fflush(stdout);
        }
    }
    /* the baselines that match the sweep: a point (heads, T) with the record's T, and the same heads and dims
     * where the record says; a record may match a point of several groups */
    const nsa_config *k0 = &c0.cfg;
    plot_series *series = calloc(2 + BASELINE_MAX, sizeof *series);
    typedef struct {
        int r, gp, ti;
    } bl_match;
    bl_match *match = malloc((size_t)(nrecs > 0 ? nrecs : 1) * MAX_GROUPS * sizeof *match);
    int nseries = 2, skipped = 0, nmatch = 0;
    if (!series || !match) {
        fprintf(stderr, CMD ": out of host memory\n");
        free(series);
        free(match);
        nsa_context_destroy(ctx);
        return TOOL_EXIT_FAIL;
    }
    for (int r = 0; r < nrecs; r++) {
        const baseline_rec *b = &recs[r];
        int matched = 0;
        for (int gp = 0; gp < passes; gp++) {
            const int64_t hq = ngroups ? ghq[gp] : k0->num_q_heads, hkv = ngroups ? ghkv[gp] : k0->num_kv_heads;
            if ((b->hq >= 0 && b->hq != hq) || (b->hkv >= 0 && b->hkv != hkv) ||
                (b->dqk >= 0 && b->dqk != k0->head_dim_qk) || (b->dv >= 0 && b->dv != k0->head_dim_v))
                continue;
            for (int i = 0; i < nT; i++)
                if (Ts[i] == b->T) { /* one point per group: match holds nrecs x MAX_GROUPS */
                    match[nmatch++] = (bl_match){r, gp, i};
                    matched = 1;
                    break;
                }
        }
        skipped += !matched;
    }
    if (json) {
        printf("], \"baselines\": [");
        for (int j = 0; j < nmatch; j++) {
            const bl_match *mt = &match[j];
            const baseline_rec *b = &recs[mt->r];
            printf("%s{\"baseline\": ", j ? ", " : "");
            json_str(stdout, b->name);
            printf(", \"T\": %lld, \"hq\": %lld, \"hkv\": %lld, \"ms\": ", (long long)b->T,
                   (long long)(ngroups ? ghq[mt->gp] : k0->num_q_heads),
                   (long long)(ngroups ? ghkv[mt->gp] : k0->num_kv_heads));
            json_num(stdout, b->ms);
            printf(", \"speedup\": ");
            json_num(stdout, b->ms / full_ms[mt->gp][mt->ti]);
            printf("}");
        }
        printf("], \"exit_code\": %d}\n", exit_code);
    } else {
        printf("cmp/slc/win: branch times estimated by difference (cmp = n=0,w=0 run; slc = full - "
               "n=0; win = full - w=0)\n"
               "dense: t(w=T, n=0) - t(cmp only) = causal attention by this backend; dense raw "
               "includes its cmp branch; speedup = dense / nsa\n");
        if (backward)
            printf("bwd: nsa_backward of the same problems (dO from the seed), the same differences; TFLOP/s "
                   "counts 2 (3 Dqk + 2 Dv) per visible pair\n");
        for (int j = 0; j < nmatch; j++) {
            const bl_match *mt = &match[j];
            const baseline_rec *b = &recs[mt->r];
            printf("baseline %s, T=%lld", b->name, (long long)b->T);
            if (ngroups) printf(", Hq/Hkv %lld/%lld", (long long)ghq[mt->gp], (long long)ghkv[mt->gp]);
            printf(": %.4g ms; speedup %.3gx\n", b->ms, b->ms / full_ms[mt->gp][mt->ti]);
        }
    }
    /* after the report, so that the JSON object is not cut by it where both streams go to one file */
    fflush(stdout);
    if (skipped > 0)
        fprintf(stderr, CMD ": %d record(s) of %s are for another T or shape; not compared\n", skipped,
                baseline_path);
    /* the figure (one group: --plot is refused with --groups) */
    snprintf(series[0].name, sizeof series[0].name, "libnsa %.80s", bname);
    snprintf(series[1].name, sizeof series[1].name, "%.70s dense causal", bname);
    for (int i = 0; i < nT; i++) {
        series[0].T[i] = series[1].T[i] = (double)Ts[i];
        series[0].ms[i] = full_ms[0][i];
        series[1].ms[i] = dense_ms[0][i];
    }
    series[0].n = series[1].n = nT;
    for (int j = 0; j < nmatch; j++) {
        const baseline_rec *b = &recs[match[j].r];
        int s2 = 2;
        while (s2 < nseries && strcmp(series[s2].name, b->name) != 0) s2++;
        if (s2 == nseries) {
            snprintf(series[s2].name, sizeof series[s2].name, "%.63s", b->name);
            nseries++;
        }
        plot_series *ps = &series[s2];
        if (ps->n < PLOT_MAX_POINTS) {
            ps->T[ps->n] = (double)b->T;
            ps->ms[ps->n] = b->ms;
            ps->n++;
        }
    }
    if (plot_path) {
        char title[256], err[512];
        snprintf(title, sizeof title, "NSA forward on %.120s, %s, Hq %lld, Hkv %lld, Dqk %lld, Dv %lld", nsa_context_device(ctx),
                 nsa_dtype_name(k0->dtype), (long long)k0->num_q_heads, (long long)k0->num_kv_heads,
                 (long long)k0->head_dim_qk, (long long)k0->head_dim_v);
        if (plot_speed_svg(plot_path, title, series, nseries, err, sizeof err) != 0) {
            fprintf(stderr, CMD ": --plot: %s\n", err);
            exit_code = TOOL_EXIT_FAIL;
        } else if (!json) {
            printf("plot: %s\n", plot_path);
        }
    }
    free(series);
    free(match);
    nsa_context_destroy(ctx);
    return exit_code;
}
