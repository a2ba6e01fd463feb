/*
 * nsa run: one NSA forward on the selected backend for a sample problem --
 * plan facts, time, TFLOP/s, and the error against the reference on a sample.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cmds.h"
#include "config_flags.h"
#include "decode_run.h"
#include "nsa.h"
#include "problem.h"
#include "run_backward.h"
#include "run_check.h"
#include "run_inputs.h"
#include "testkit.h"
#include "tool.h"

#define CMD "nsa run"

/* Default T when --T is not given. cpu: a size the fp64 reference backend
 * finishes in a few seconds with the paper's heads and dims (measured on a
 * 2-core machine: T=512 1.7 s, T=1024 6.8 s per forward); GPUs: 8192. */
#define RUN_T_CPU 512
#define RUN_T_GPU 8192
/* fp64 FLOPs the check may spend per reference implementation by default. */
#define RUN_CHECK_BUDGET 4e9
/* --decode: prefill chunk when --chunk is not given */
#define RUN_DECODE_CHUNK 64

static void usage(FILE *f, const args_opt *opts, int n)
{
    fprintf(f,
            "usage: nsa run [flags]\n\n"
            "Runs one NSA forward on a backend (--backend, else NSA_BACKEND, else the best\n"
            "available) for a sample problem: by default the paper's configuration (Hq=64\n"
            "Hkv=4 Dqk=192 Dv=128 l=32 d=16 l_s=64 n=16 n_init=1 n_local=2 w=512, bf16,\n"
            "MEAN) with T=%d on CPU devices (cpu, OpenCL on a CPU) and T=%d on GPUs. Prints the plan\n"
            "(stages, workspace, the kernel each stage runs), the time, TFLOP/s and the error\n"
            "against the reference.\n\n"
            "time: the median of --iters forwards after --warmup untimed ones; each forward\n"
            "  is bracketed by nsa_context_synchronize and timed with a monotonic wall clock\n"
            "  (caller workspace, so nsa_forward allocates nothing).\n"
            "TFLOP/s: FLOPs = 2 * (Dqk + Dv) * P, where P counts the visible (query head,\n"
            "  key) pairs of the three attention branches: for every query t and head h,\n"
            "  nc(t) compressed blocks + the tokens s <= t of the blocks actually selected\n"
            "  for its group (from the `selected` output) + min(w, t+1) window keys.\n"
            "  Compression, block scores, top-n and gating are not counted.\n"
            "check: causality makes the first P tokens of a sequence an exact sub-problem;\n"
            "  those rows (of up to --check-seqs sequences) are re-solved by the cpu backend\n"
            "  (or, when the run is on cpu, by the tests' fp64 oracle; the oracle also runs\n"
            "  when the selections differ, for the block scores of the near-tie rule) and\n"
            "  compared with the testkit's rule: dtype tolerance on o and the LSEs,\n"
            "  near-tied selections count as equal. P defaults to what fits a %.0g fp64 FLOP budget (--check-gflop);\n"
            "  on a non-cpu backend at least (n + 2) * l_s tokens (when the sequence is that\n"
            "  long) so that top-n really drops blocks. --check-tokens P sets it.\n"
            "  Reported: max |err| / RMS(reference o), max err / tolerance, max LSE error,\n"
            "  the fraction of (token, kv head) selections that differ within the near-tie\n"
            "  rule. Exit 1 when the error exceeds the dtype tolerance.\n\n"
            "--inputs DIR reads tensors from .npy files (a missing file is drawn from --seed;\n"
            "  DIR must exist, and a name there that cannot be read, a dangling symlink\n"
            "  included, is an error; each file's data must be exactly what its header's\n"
            "  shape says, with no bytes after it):\n"
            "  q [T,Hq,Dqk]; k [T,Hkv,Dqk], v [T,Hkv,Dv] for all branches, or per branch\n"
            "  k_cmp k_slc k_win / v_cmp v_slc v_win; gates g_cmp g_slc g_win [T,Hq];\n"
            "  LINEAR: w_k [Hkv,l,Dqk,Dqk], w_v [Hkv,l,Dv,Dv], optional pe_k [Hkv,l,Dqk],\n"
            "  pe_v [Hkv,l,Dv]; EXTERNAL: kc [Nc,Hkv,Dqk], vc [Nc,Hkv,Dv] (Nc: all sequences'\n"
            "  compressed blocks, in order); optional block_indices [T,Hkv,n] (<i4/<i8).\n"
            "  T is the packed token count. Float files: <f4, <f2, <f8, or <u2 = raw bf16 bits;\n"
            "  values are rounded to --dtype with nsa_convert (the tool keeps f32 values: with\n"
            "  --dtype f64 a <f8 value that is not exact in f32 is refused). When\n"
            "  --T/--hq/--dqk/--hkv/--dv are not given they are taken from q/k/v; every shape\n"
            "  is checked.\n"
            "--outputs DIR writes o.npy [T,Hq,Dv] (<f4, exact for f16/bf16; <f8 for f64),\n"
            "  lse_cmp.npy, lse_slc.npy, lse_win.npy [T,Hq] (<f4 or <f8, enabled branches) and\n"
            "  selected.npy [T,Hkv,n] (<i4, n > 0); with --backward also the gradients (<f4,\n"
            "  <f8 for f64): dq, dk and dv\n"
            "  (one k/v for every branch) or dk_cmp dk_slc dk_win / dv_*, dg_cmp dg_slc dg_win,\n"
            "  dw_k dw_v dpe_k dpe_v (LINEAR), dkc dvc (EXTERNAL).\n"
            "--backward runs the backward pass too (a training plan, made after the forward's\n"
            "  is freed; its workspace, plan memory and backward kernels are printed) from the\n"
            "  forward's LSEs and selection and dO: --inputs DIR/do.npy [T,Hq,Dv], else drawn\n"
            "  from the seed.\n"
            "  Its check compares every gradient of the whole problem (no causal prefix\n"
            "  exists for gradients) with the cpu backend, or on cpu with the tests' fp64\n"
            "  gradient reference, when that fits the --check-gflop budget.\n"
            "--decode TQ computes the same problem with a decode plan (nsa_decode_plan_create,\n"
            "  nsa_decode; docs/nsa-semantics.md section 10) instead of nsa_forward: the\n"
            "  caches are paged (--page-size positions, --cmp-page-size compressed rows per\n"
            "  page) and the page tables shuffled by --seed; each sequence is prefilled to its\n"
            "  first --prefill P tokens (default: half its length) in steps of up to --chunk\n"
            "  tokens (default %d), then decoded TQ tokens a step, every sequence of the\n"
            "  batch in each step, until it is complete (EXTERNAL: the tool writes the\n"
            "  compressed rows a step\n"
            "  completes before it, as a caller must). The rows are assembled into o, the\n"
            "  LSEs and selected, which --outputs writes as above and the check judges as\n"
            "  above. Time: each step timed once (nsa_decode to the end of nsa_decode_check);\n"
            "  reported: the prefill steps' sum, the median and fastest decode step, and the\n"
            "  sum of all steps (used for TFLOP/s; --iters and --warmup do not apply; nsa\n"
            "  bench --decode times a step repeatedly). The check also runs the same\n"
            "  backend's nsa_forward of the whole problem and compares every row: on cpu they\n"
            "  must be bitwise equal (exit 1 otherwise), elsewhere the differing rows and the\n"
            "  largest difference are reported. Not with --backward or block_indices.npy (a\n"
            "  decode step selects its blocks itself). A backend without a decode step is an\n"
            "  error that names it.\n"
            "--shards P computes the same problem in P shards per sequence (plans of\n"
            "  nsa_plan_create_varlen; docs/nsa-semantics.md section 11), as context-parallel\n"
            "  ranks would: shard p holds the rows [len p / P, len (p + 1) / P) of each\n"
            "  sequence as queries and the rows below their end as keys. The rows are put\n"
            "  back together, so --outputs and the check apply as above; with --backward each\n"
            "  shard's backward runs too (NSA_BACKWARD_FLOAT_KEY_GRADS), its dq and dgate rows\n"
            "  kept and its parts of the key-side gradients summed in fp64 in shard order,\n"
            "  then rounded once to the dtype, and the check is the one above. Each shard\n"
            "  runs once (--iters and --warmup do not apply); the time is all shards' plans,\n"
            "  uploads, calls and read-backs. 1 <= P <= 64; not with --decode. A backend\n"
            "  without shard plans is an error that names it.\n\n"
            "%s\nflags:\n",
            RUN_T_CPU, RUN_T_GPU, RUN_CHECK_BUDGET, RUN_DECODE_CHUNK, config_flags_help);
    args_print_options(f, opts, n);
}

static void print_config_json(FILE *f, const tk_case *c)
{
    const nsa_config *g = &c->cfg;
    static const char *const cmp[] = {"mean", "linear", "external"};
    fprintf(f,
            "{\"hq\": %lld, \"hkv\": %lld, \"dqk\": %lld, \"dv\": %lld, \"l\": %lld, \"d\": %lld, "
            "\"ls\": %lld, \"n\": %lld, \"n_init\": %lld, \"n_local\": %lld, \"w\": %lld, "
            "\"scale\": ",
            (long long)g->num_q_heads, (long long)g->num_kv_heads, (long long)g->head_dim_qk,
            (long long)g->head_dim_v, (long long)g->cmp_block, (long long)g->cmp_stride,
            (long long)g->slc_block, (long long)g->num_selected, (long long)g->num_init,
            (long long)g->num_local, (long long)g->window);
    json_num(f, g->scale);
    fprintf(f, ", \"compress\": \"%s\", \"dtype\": \"%s\", \"seed\": %llu, \"seqlens\": [",
            cmp[g->compress], nsa_dtype_name(g->dtype), (unsigned long long)c->seed);
    for (int64_t b = 0; b < c->batch; b++)
        fprintf(f, "%s%lld", b ? ", " : "", (long long)(c->cu_seqlens[b + 1] - c->cu_seqlens[b]));
    fprintf(f, "]}");
}

/* --decode: the decode rows against the same backend's nsa_forward of the whole problem */
typedef struct decode_cmp {
    int done, bitwise_required, pass;
    int64_t rows, rows_equal;  /* tokens whose o, LSE and selected rows are bitwise the forward's */
    int64_t first_differ;      /* first such token that is not, or -1 */
    double max_o_diff;         /* max |o - forward's o| */
    double seconds;            /* the forward's setup, call and read-back */
} decode_cmp;

/* Returns 0, or 1 when the forward could not run (message printed) or, on cpu,
 * when a row differs (the decode step is bitwise the cpu forward's there). */
/* element i of a result's o: the doubles where they were kept (an f64 call), else the floats (exact) */
static double o_at(const tk_output *r, int64_t i) { return r->o_d ? r->o_d[i] : (double)r->o[i]; }

static int decode_vs_forward(nsa_context *ctx, const char *bname, const tk_case *c, const tk_inputs *in,
                             const tk_output *got, decode_cmp *r)
{
    problem fp;
    tk_output f;
    char err[TOOL_ERR_MAX];
    const nsa_config *g = &c->cfg;
    const int64_t T = tk_case_tokens(c), W = g->num_q_heads * g->head_dim_v, Hq = g->num_q_heads;
    const int64_t S = g->num_kv_heads * g->num_selected;
    const size_t es = nsa_dtype_size(g->dtype);
    const double t0 = tool_now();
    nsa_status s = problem_setup(ctx, c, in, NULL, &fp, err, sizeof err);
    if (s == NSA_SUCCESS) s = problem_forward(&fp, err, sizeof err);
    if (s == NSA_SUCCESS) s = problem_download(&fp, &f, err, sizeof err);
    problem_free(&fp);
    if (s != NSA_SUCCESS) {
        fprintf(stderr, CMD ": --decode check: the forward on %s: %s\n", bname, err);
        return 1;
    }
    r->seconds = tool_now() - t0;
    r->done = 1;
    r->rows = T;
    r->first_differ = -1;
    r->bitwise_required = strcmp(bname, "cpu") == 0;
    for (int64_t t = 0; t < T; t++) {
        int same = memcmp((const char *)got->o_raw + (size_t)(t * W) * es, (const char *)f.o_raw + (size_t)(t * W) * es,
                          (size_t)W * es) == 0;
        for (int64_t e = 0; e < W; e++) {
            const double dlt = fabs(o_at(got, t * W + e) - o_at(&f, t * W + e));
            if (!(dlt <= r->max_o_diff)) r->max_o_diff = dlt; /* NaN sticks */
        }
        for (int b = 0; b < 3; b++)
            if (f.lse_d[b])
                same &= got->lse_d[b] && memcmp(got->lse_d[b] + t * Hq, f.lse_d[b] + t * Hq, (size_t)Hq * 8) == 0;
        if (S > 0 && f.sel) same &= got->sel && memcmp(got->sel + t * S, f.sel + t * S, (size_t)S * 4) == 0;
        r->rows_equal += same;
        if (!same && r->first_differ < 0) r->first_differ = t;
    }
    problem_output_free(&f);
    r->pass = !r->bitwise_required || r->rows_equal == r->rows;
    return r->pass ? 0 : 1;
}

/* --shards P: the forward in P even shards per sequence (tk_run_shards), timed once;
 * pinfo and the kernels are those of the last shard's plan (the most keys). */
static nsa_status shards_forward(nsa_context *ctx, const tk_case *c, const tk_inputs *in, int P, tk_output *out,
                                 nsa_plan_info *pinfo, char *kernels, size_t ksize, int json, double *seconds,
                                 char *err, size_t err_size)
{
    int64_t cut[TK_MAX_BATCH][TK_MAX_SHARDS + 1], cuq[TK_MAX_BATCH + 1] = {0}, cuk[TK_MAX_BATCH + 1] = {0};
    tk_shard_cuts(c, P, NULL, cut);
    const double t0 = tool_now();
    nsa_status s = tk_run_shards(ctx, c, in, P, cut, NULL, NULL, NULL, out, NULL, err, err_size);
    *seconds = tool_now() - t0;
    if (s != NSA_SUCCESS) return s;
    for (int64_t b = 0; b < c->batch; b++) {
        cuq[b + 1] = cuq[b] + cut[b][P] - cut[b][P - 1];
        cuk[b + 1] = cuk[b] + cut[b][P];
    }
    nsa_plan *plan = NULL;
    memset(pinfo, 0, sizeof *pinfo);
    s = nsa_plan_create_varlen(ctx, &c->cfg, cuq, cuk, c->batch, &plan);
    if (s == NSA_SUCCESS) s = nsa_plan_get_info(plan, pinfo);
    if (s == NSA_SUCCESS) tool_format_kernels(kernels, ksize, plan, json);
    else snprintf(err, err_size, "the last shard's plan: %s: %s", nsa_status_string(s), nsa_last_error());
    nsa_plan_destroy(plan);
    return s;
}

int cmd_run(int argc, char **argv)
{
    config_flags cf;
    const char *backend = NULL, *inputs_dir = NULL, *outputs_dir = NULL, *save_inputs_dir = NULL;
    int64_t device = -1, iters = -1, warmup = -1, check_tokens = -1, check_seqs = 2;
    double check_gflop = RUN_CHECK_BUDGET / 1e9;
    int json = 0, backward = 0;
    run_bwd bw;
    args_opt opts[CONFIG_FLAGS_COUNT + 19];
    int64_t decode_tq = 0, prefill = -1, chunk = RUN_DECODE_CHUNK, page_size = DECODE_RUN_PAGE_SIZE,
            cmp_page_size = DECODE_RUN_CMP_PAGE_SIZE, nshards = 0;
    decode_run dr;
    decode_stats dst;
    decode_cmp dcmp;
    int nopts, rc;
    nsa_context *ctx = NULL;
    nsa_status s;
    const char *bname;
    int64_t lens[TK_MAX_BATCH];
    int nlens;
    tk_case c;
    tk_inputs in;
    problem p;
    nsa_plan_info pinfo;
    nsa_decode_limits dr_lim = {0};
    static char kernels_text[TOOL_KERNELS_MAX];
    tk_output out;
    run_check chk;
    char read_list[512] = "", gen_list[512] = "", err[TOOL_ERR_MAX];
    double median = 0, fastest = 0, pairs, flops;
    int exit_code = TOOL_EXIT_OK;

    config_flags_defaults(&cf);
    nopts = config_flags_options(&cf, opts, 1);
#define OPT(name, kind, dest, mv, help) opts[nopts++] = (args_opt){name, kind, dest, NULL, mv, help, 0}
    OPT("--backend", ARGS_STRING, &backend, "NAME", "backend or comma list (default: NSA_BACKEND, else the best available)");
    OPT("--device", ARGS_INT64, &device, "N", "device index (default: NSA_DEVICE, else 0)");
    OPT("--iters", ARGS_INT64, &iters, "N", "timed iterations (default 20; 1 on cpu, the fp64 reference)");
    OPT("--warmup", ARGS_INT64, &warmup, "N", "untimed warm-up runs (default 3; 0 on cpu)");
    OPT("--check-tokens", ARGS_INT64, &check_tokens, "P", "check the first P tokens of each sampled sequence (0: no check; default: budget)");
    OPT("--check-seqs", ARGS_INT64, &check_seqs, "N", "sequences sampled for the check (default 2)");
    OPT("--check-gflop", ARGS_DOUBLE, &check_gflop, "X", "fp64 GFLOP budget that sizes the default check (4)");
    OPT("--inputs", ARGS_STRING, &inputs_dir, "DIR", "read tensors from DIR/*.npy (see above)");
    OPT("--outputs", ARGS_STRING, &outputs_dir, "DIR", "write o, lse_*, selected as .npy into DIR");
    OPT("--save-inputs", ARGS_STRING, &save_inputs_dir, "DIR", "write the inputs used as .npy into DIR (for --inputs)");
    OPT("--backward", ARGS_FLAG, &backward, NULL, "also run the backward pass (see above)");
    OPT("--json", ARGS_FLAG, &json, NULL, "print one JSON object");
    OPT("--decode", ARGS_INT64, &decode_tq, "TQ", "compute the problem by decode steps of TQ tokens (see above)");
    OPT("--prefill", ARGS_INT64, &prefill, "P", "--decode: tokens of each sequence prefilled first (default: half)");
    OPT("--chunk", ARGS_INT64, &chunk, "N", "--decode: prefill step size (default 64)");
    OPT("--page-size", ARGS_INT64, &page_size, "N", "--decode: positions per page of the K/V caches (default 64)");
    OPT("--cmp-page-size", ARGS_INT64, &cmp_page_size, "N", "--decode: rows per page of the compressed cache (16)");
    OPT("--shards", ARGS_INT64, &nshards, "P", "compute the problem as P shards per sequence (see above)");
#undef OPT
    rc = args_parse(CMD, opts, nopts, argc, argv, 1);
    if (rc == ARGS_HELP) {
        usage(stdout, opts, nopts);
        return TOOL_EXIT_OK;
    }
    if (rc != ARGS_OK)
        return TOOL_EXIT_USAGE;
    if (device < -1 || device > 1 << 20 || iters == 0 || iters < -1 || warmup < -1 ||
        check_seqs < 0 || check_tokens < -1 || !(check_gflop > 0)) {
        fprintf(stderr, CMD ": --device, --iters, --warmup, --check-* need sensible values "
                        "(--iters >= 1, --warmup >= 0, --check-gflop > 0)\n");
        return TOOL_EXIT_USAGE;
    }
    const int decode = args_seen(opts, nopts, "--decode");
    if (!decode && (args_seen(opts, nopts, "--prefill") || args_seen(opts, nopts, "--chunk") ||
                    args_seen(opts, nopts, "--page-size") || args_seen(opts, nopts, "--cmp-page-size"))) {
        fprintf(stderr, CMD ": --prefill, --chunk, --page-size and --cmp-page-size need --decode TQ\n");
        return TOOL_EXIT_USAGE;
    }
    if (decode && (decode_tq < 1 || (args_seen(opts, nopts, "--prefill") && prefill < 0) || chunk < 1 ||
                   page_size < 1 || cmp_page_size < 1)) {
        fprintf(stderr, CMD ": --decode TQ, --chunk, --page-size and --cmp-page-size must be >= 1, --prefill >= 0\n");
        return TOOL_EXIT_USAGE;
    }
    if (decode && (backward || args_seen(opts, nopts, "--iters") || args_seen(opts, nopts, "--warmup"))) {
        fprintf(stderr, CMD ": --decode does not take %s (each step runs once; nsa bench --decode times steps)\n",
                backward ? "--backward" : "--iters or --warmup");
        return TOOL_EXIT_USAGE;
    }

    const int shards = args_seen(opts, nopts, "--shards");
    if (shards && (nshards < 1 || nshards > TK_MAX_SHARDS)) {
        fprintf(stderr, CMD ": --shards P must be in [1, %d]\n", TK_MAX_SHARDS);
        return TOOL_EXIT_USAGE;
    }
    if (shards && (decode || args_seen(opts, nopts, "--iters") || args_seen(opts, nopts, "--warmup"))) {
        fprintf(stderr, CMD ": --shards does not take %s\n",
                decode ? "--decode" : "--iters or --warmup (each shard runs once)");
        return TOOL_EXIT_USAGE;
    }

    s = nsa_context_create(backend, (int)device, &ctx);
    if (s != NSA_SUCCESS)
        return tool_report(CMD, "nsa_context_create", s);
    bname = nsa_context_backend(ctx);
    /* the sample problem is sized by the device: a CPU (the reference, or an
     * OpenCL CPU device such as PoCL) gets the small one */
    const int on_cpu = tool_on_cpu(ctx);
    if (iters < 0)
        iters = on_cpu || decode || shards ? 1 : 20;
    if (warmup < 0)
        warmup = on_cpu || decode || shards ? 0 : 3;

    /* shapes: explicit flags, else the input files, else the defaults */
    if (inputs_dir) {
        int64_t fT, fhq, fdqk, fhkv, fdv;
        rc = run_inputs_shape(CMD, inputs_dir, &fT, &fhq, &fdqk, &fhkv, &fdv);
        if (rc) {
            nsa_context_destroy(ctx);
            return rc;
        }
        if (!args_seen(opts, nopts, "--hq") && fhq > 0) cf.hq = fhq;
        if (!args_seen(opts, nopts, "--dqk") && fdqk > 0) cf.dqk = fdqk;
        if (!args_seen(opts, nopts, "--hkv") && fhkv > 0) cf.hkv = fhkv;
        if (!args_seen(opts, nopts, "--dv") && fdv > 0) cf.dv = fdv;
        if (!cf.seqlens && cf.T == 0 && fT >= 0) {
            if (cf.batch < 1 || fT % cf.batch != 0) {
                fprintf(stderr, CMD ": %s/q.npy has %lld tokens, not a multiple of --batch %lld\n",
                        inputs_dir, (long long)fT, (long long)cf.batch);
                nsa_context_destroy(ctx);
                return TOOL_EXIT_USAGE;
            }
            cf.T = fT / cf.batch;
        }
    }
    if (cf.T == 0 && !cf.seqlens && !args_seen(opts, nopts, "--T"))
        cf.T = on_cpu ? RUN_T_CPU : RUN_T_GPU;
    nlens = config_flags_lengths(CMD, &cf, cf.T, lens, TK_MAX_BATCH);
    if (nlens < 0 || config_flags_case(CMD, &cf, lens, nlens, &c) != 0) {
        nsa_context_destroy(ctx);
        return TOOL_EXIT_USAGE;
    }

    tool_progress("drawing inputs (seed %lld)", (long long)cf.seed);
    s = tk_inputs_make(&c, &in);
    tool_progress_end();
    if (s != NSA_SUCCESS) {
        nsa_context_destroy(ctx);
        fprintf(stderr, CMD ": drawing the inputs failed: %s\n", nsa_status_string(s));
        return TOOL_EXIT_FAIL;
    }
    if (inputs_dir) {
        rc = run_inputs_load(CMD, inputs_dir, &c, &in, read_list, sizeof read_list, gen_list,
                             sizeof gen_list);
        if (rc) {
            tk_inputs_free(&in);
            nsa_context_destroy(ctx);
            return rc;
        }
    }

    if (save_inputs_dir && run_inputs_write(CMD, save_inputs_dir, &c, &in) != 0) {
        tk_inputs_free(&in);
        nsa_context_destroy(ctx);
        return TOOL_EXIT_FAIL;
    }
    memset(&p, 0, sizeof p);
    memset(&out, 0, sizeof out);
    memset(&dr, 0, sizeof dr);
    memset(&dst, 0, sizeof dst);
    memset(&dcmp, 0, sizeof dcmp);
    if (decode) {
        /* the plan holds a step of the longest of --chunk and TQ, no longer than a sequence */
        int64_t longest = 1, most = chunk > decode_tq ? chunk : decode_tq;
        for (int64_t b = 0; b < c.batch; b++)
            if (c.cu_seqlens[b + 1] - c.cu_seqlens[b] > longest) longest = c.cu_seqlens[b + 1] - c.cu_seqlens[b];
        s = decode_run_setup(ctx, &c, &in, most < longest ? most : longest, page_size, cmp_page_size,
                             (uint64_t)cf.seed, &dr, err, sizeof err);
        if (s == NSA_SUCCESS)
            s = decode_run_all(&dr, prefill, chunk < longest ? chunk : longest, decode_tq < longest ? decode_tq : longest,
                               CMD " --decode", &out, &dst, err, sizeof err);
        if (s != NSA_SUCCESS) {
            fprintf(stderr, CMD ": --decode on backend %s: %s\n", bname, err);
            problem_output_free(&out);
            decode_run_free(&dr);
            tk_inputs_free(&in);
            nsa_context_destroy(ctx);
            return TOOL_EXIT_FAIL;
        }
        median = fastest = dst.prefill_s + dst.decode_s;
        pinfo = dr.info;
        dr_lim = dr.lim;
        tool_format_kernels(kernels_text, sizeof kernels_text, dr.plan, json);
        decode_run_free(&dr);
        goto computed;
    }
    if (shards) {
        s = shards_forward(ctx, &c, &in, (int)nshards, &out, &pinfo, kernels_text, sizeof kernels_text, json, &median,
                           err, sizeof err);
        if (s != NSA_SUCCESS) {
            fprintf(stderr, CMD ": --shards %lld on backend %s: %s\n", (long long)nshards, bname, err);
            problem_output_free(&out);
            tk_inputs_free(&in);
            nsa_context_destroy(ctx);
            return TOOL_EXIT_FAIL;
        }
        fastest = median;
        goto computed;
    }
    s = problem_setup(ctx, &c, &in, c.fixed_indices ? in.given : NULL, &p, err, sizeof err);
    if (s != NSA_SUCCESS) {
        fprintf(stderr, CMD ": %s\n", err);
        tk_inputs_free(&in);
        nsa_context_destroy(ctx);
        return TOOL_EXIT_FAIL;
    }
    s = problem_time(&p, (int)warmup, (int)iters, CMD, &median, &fastest, err, sizeof err);
    if (s == NSA_SUCCESS)
        s = problem_download(&p, &out, err, sizeof err);
    if (s != NSA_SUCCESS) {
        fprintf(stderr, CMD ": %s\n", err);
        problem_free(&p);
        tk_inputs_free(&in);
        nsa_context_destroy(ctx);
        return TOOL_EXIT_FAIL;
    }
    pinfo = p.info;
computed:
    if (outputs_dir && run_outputs_write(CMD, outputs_dir, &c, &out) != 0)
        exit_code = TOOL_EXIT_FAIL;

    pairs = problem_pairs(&c, out.sel);
    flops = 2.0 * (double)(c.cfg.head_dim_qk + c.cfg.head_dim_v) * pairs;

    memset(&chk, 0, sizeof chk);
    if (check_tokens != 0) {
        rc = run_check_do(CMD, bname, &c, &in, &out, check_tokens, (int)check_seqs,
                          check_gflop * 1e9, &chk);
        if (rc)
            exit_code = rc;
        else if (chk.done && !chk.v.pass)
            exit_code = TOOL_EXIT_FAIL;
        if (decode && decode_vs_forward(ctx, bname, &c, &in, &out, &dcmp) != 0)
            exit_code = TOOL_EXIT_FAIL;
    } else {
        snprintf(chk.note, sizeof chk.note, "not checked (--check-tokens 0)");
    }
    /* the forward's plan, workspace and device inputs go before the training
     * plan is made (at T = 524288 the two do not fit on one GPU together); what
     * the report needs of them is kept */
    if (!decode && !shards)
        tool_format_kernels(kernels_text, sizeof kernels_text, p.plan, json);
    problem_free(&p);
    memset(&bw, 0, sizeof bw);
    if (backward) {
        rc = run_backward_do(CMD, ctx, bname, &c, &in, &out, inputs_dir, check_tokens != 0, check_gflop * 1e9,
                             (int)nshards, &bw);
        if (rc) {
            exit_code = rc;
            backward = 0;
        } else {
            if (bw.checked && !bw.v.pass) exit_code = TOOL_EXIT_FAIL;
            if (outputs_dir && run_backward_write(CMD, outputs_dir, &c, &in, &bw) != 0) exit_code = TOOL_EXIT_FAIL;
        }
    }

    if (json) {
        printf("{\"command\": \"run\", \"version\": ");
        json_str(stdout, nsa_version_string());
        printf(", \"backend\": ");
        json_str(stdout, bname);
        printf(", \"device\": ");
        json_str(stdout, nsa_context_device(ctx));
        printf(", \"config\": ");
        print_config_json(stdout, &c);
        printf(", \"tokens\": %lld, \"mode\": \"%s\"", (long long)tk_case_tokens(&c),
               decode ? "decode" : shards ? "shards" : "forward");
        if (shards) printf(", \"shards\": %lld", (long long)nshards);
        if (decode) {
            printf(", \"decode\": {\"tq\": %lld", (long long)decode_tq);
            json_field(stdout, "prefill", prefill >= 0 ? (double)prefill : NAN); /* null: half of each sequence */
            printf(", \"chunk\": %lld, \"page_size\": %lld, "
                   "\"cmp_page_size\": %lld, \"prefill_steps\": %lld, \"decode_steps\": %lld, \"rows\": %lld",
                   (long long)chunk, (long long)page_size,
                   (long long)cmp_page_size, (long long)dst.prefill_steps, (long long)dst.decode_steps,
                   (long long)dst.rows);
            json_field(stdout, "prefill_s", dst.prefill_s);
            json_field(stdout, "decode_s", dst.decode_s);
            json_field(stdout, "step_median_s", dst.step_median_s);
            json_field(stdout, "step_min_s", dst.step_min_s);
            printf(", \"vs_forward\": ");
            if (dcmp.done) {
                printf("{\"rows\": %lld, \"rows_bitwise_equal\": %lld, \"first_differing_row\": %lld",
                       (long long)dcmp.rows, (long long)dcmp.rows_equal, (long long)dcmp.first_differ);
                json_field(stdout, "max_o_diff", dcmp.max_o_diff);
                printf(", \"bitwise_required\": %s, \"pass\": %s", dcmp.bitwise_required ? "true" : "false",
                       dcmp.pass ? "true" : "false");
                json_field(stdout, "seconds", dcmp.seconds);
                printf("}");
            } else {
                printf("null");
            }
            printf("}");
        }
        printf(", \"inputs\": {\"read\": ");
        json_str(stdout, read_list);
        printf(", \"generated\": ");
        json_str(stdout, inputs_dir ? gen_list : "all");
        printf("}, \"plan\": {\"stages\": ");
        json_str(stdout, pinfo.stages);
        printf(", \"num_stages\": %d, \"workspace_bytes\": %llu, \"backend_bytes\": %llu, \"total_cmp_blocks\": %lld, "
               "\"max_slc_blocks\": %lld}, ",
               pinfo.num_stages, (unsigned long long)pinfo.workspace_bytes,
               (unsigned long long)pinfo.backend_bytes, (long long)pinfo.total_cmp_blocks,
               (long long)pinfo.max_slc_blocks);
        printf("\"kernels\": ");
        fputs(kernels_text, stdout);
        printf(", \"time_s\": ");
        json_num(stdout, median);
        printf(", \"time_min_s\": ");
        json_num(stdout, fastest);
        printf(", \"iters\": %lld, \"warmup\": %lld, \"pairs\": ", (long long)iters, (long long)warmup);
        json_num(stdout, pairs);
        printf(", \"flops\": ");
        json_num(stdout, flops);
        printf(", \"tflops\": ");
        json_num(stdout, median > 0 ? flops / median / 1e12 : NAN);
        printf(", \"check\": {\"done\": %s", chk.done ? "true" : "false");
        if (chk.done) {
            printf(", \"reference\": ");
            json_str(stdout, chk.reference);
            printf(", \"sequences\": [");
            for (int i = 0; i < chk.nseq; i++)
                printf("%s{\"seq\": %lld, \"tokens\": %lld}", i ? ", " : "", (long long)chk.seq[i],
                       (long long)chk.prefix[i]);
            printf("], \"rows\": %lld, \"total_rows\": %lld, \"selection_exercised\": %s, "
                   "\"o_err_rms\": ",
                   (long long)chk.rows, (long long)chk.total_rows,
                   chk.selection_exercised ? "true" : "false");
            json_num(stdout, chk.v.o_err);
            printf(", \"o_err_over_tol\": ");
            json_num(stdout, chk.v.o_ratio);
            printf(", \"lse_err\": ");
            json_num(stdout, chk.v.lse_err);
            printf(", \"tie_swaps\": %lld, \"tie_fraction\": ", (long long)chk.v.tie_swaps);
            json_num(stdout, chk.tie_fraction);
            printf(", \"seconds\": ");
            json_num(stdout, chk.seconds);
            printf(", \"pass\": %s, \"message\": ", chk.v.pass ? "true" : "false");
            json_str(stdout, chk.v.pass ? "" : chk.v.msg);
        }
        printf(", \"note\": ");
        json_str(stdout, chk.note);
        printf("}");
        if (backward) {
            printf(", \"backward\": {\"dout\": ");
            json_str(stdout, bw.dout_from);
            printf(", \"seconds\": ");
            json_num(stdout, bw.seconds);
            printf(", \"workspace_bytes\": %llu, \"backend_bytes\": %llu", (unsigned long long)bw.g.workspace_bytes,
                   (unsigned long long)bw.g.backend_bytes);
            printf(", \"kernels\": {");
            for (int i = 0; i < bw.g.num_bwd; i++) {
                printf("%s", i ? ", " : "");
                json_str(stdout, bw.g.bwd_stage[i]);
                printf(": ");
                json_str(stdout, bw.g.bwd_kernel[i]);
            }
            printf("}");
            printf(", \"checked\": %s", bw.checked ? "true" : "false");
            if (bw.checked) {
                printf(", \"reference\": ");
                json_str(stdout, bw.reference);
                printf(", \"elements\": %lld, \"err_over_tol\": ", (long long)bw.v.elements);
                json_num(stdout, bw.v.worst);
                printf(", \"pass\": %s, \"message\": ", bw.v.pass ? "true" : "false");
                json_str(stdout, bw.v.pass ? "" : bw.v.msg);
            }
            printf(", \"note\": ");
            json_str(stdout, bw.note);
            printf("}");
        }
        printf(", \"exit_code\": %d}\n", exit_code);
    } else {
        char desc[512], b1[32];
        printf("backend: %s, device: %s (libnsa %s)\n", bname, nsa_context_device(ctx),
               nsa_version_string());
        printf("problem: %s\n", tk_case_describe(&c, desc, sizeof desc));
        if (inputs_dir)
            printf("inputs:  read from %s: %s; drawn from seed %lld: %s\n", inputs_dir,
                   read_list[0] ? read_list : "(none)", (long long)cf.seed,
                   gen_list[0] ? gen_list : "(none)");
        else
            printf("inputs:  drawn from seed %lld (portable generator)\n", (long long)cf.seed);
        char b2[32];
        if (decode)
            printf("plan:    decode plan, %d stages (%s), workspace %s, plan memory %s; caches of %lld pages x %lld "
                   "positions, compressed %lld pages x %lld rows, tables shuffled by seed %lld\n",
                   pinfo.num_stages, pinfo.stages, tool_bytes((double)pinfo.workspace_bytes, b1, sizeof b1),
                   tool_bytes((double)pinfo.backend_bytes, b2, sizeof b2), (long long)dr_lim.num_pages,
                   (long long)dr_lim.page_size, (long long)dr_lim.num_cmp_pages, (long long)dr_lim.cmp_page_size,
                   (long long)cf.seed);
        else
        printf("plan:    %s%d stages (%s), workspace %s, plan memory %s, %lld compressed blocks, max %lld "
               "selection blocks per sequence\n",
               shards ? "the last shard's (nsa_plan_create_varlen, the most keys): " : "", pinfo.num_stages, pinfo.stages,
               tool_bytes((double)pinfo.workspace_bytes, b1, sizeof b1),
               tool_bytes((double)pinfo.backend_bytes, b2, sizeof b2),
               (long long)pinfo.total_cmp_blocks, (long long)pinfo.max_slc_blocks);
        printf("kernels:\n");
        fputs(kernels_text, stdout);
        if (decode) {
            char pf[64];
            if (prefill < 0) snprintf(pf, sizeof pf, "half its length");
            else snprintf(pf, sizeof pf, "min(%lld, its length) tokens", (long long)prefill);
            printf("decode:  each sequence prefilled to %s in %lld steps of up to %lld tokens (%.4g ms), then "
                   "%lld decode steps of TQ = %lld tokens (a sequence's last one may be shorter): median %.4g ms, min "
                   "%.4g ms; %lld rows\n",
                   pf, (long long)dst.prefill_steps, (long long)chunk, dst.prefill_s * 1e3,
                   (long long)dst.decode_steps, (long long)decode_tq, dst.step_median_s * 1e3,
                   dst.step_min_s * 1e3, (long long)dst.rows);
            printf("time:    %.4g ms, all steps (each timed once, nsa_decode to nsa_decode_check); wall clock\n",
                   median * 1e3);
        } else if (shards) {
            printf("shards:  %lld per sequence, even cuts; every row from the shard that holds it\n",
                   (long long)nshards);
            printf("time:    %.4g ms, all shards once (plans, uploads, nsa_forward, read-back); wall clock\n",
                   median * 1e3);
        } else
        printf("time:    %.4g ms median of %lld (min %.4g ms) after %lld warm-up; wall clock, "
               "synchronized\n",
               median * 1e3, (long long)iters, fastest * 1e3, (long long)warmup);
        printf("work:    %.4g visible (head, key) pairs x 2(Dqk+Dv) = %.4g FLOP -> %.4g TFLOP/s\n",
               pairs, flops, median > 0 ? flops / median / 1e12 : 0.0);
        if (chk.done) {
            tk_tolerance tol = tk_tolerance_for(c.cfg.dtype);
            printf("check:   vs %s%s\n", chk.reference,
                   strcmp(bname, "cpu") != 0 && chk.oracle_used
                       ? "; selections differed, so the fp64 oracle scored the near-ties"
                       : "");
            printf("         rows: ");
            for (int i = 0; i < chk.nseq; i++)
                printf("%sfirst %lld tokens of sequence %lld", i ? ", " : "",
                       (long long)chk.prefix[i], (long long)chk.seq[i]);
            printf(" = %lld of %lld query tokens (%.1f%%), all %lld heads; reference took %.2f s\n",
                   (long long)chk.rows, (long long)chk.total_rows,
                   chk.total_rows ? 100.0 * (double)chk.rows / (double)chk.total_rows : 0.0,
                   (long long)c.cfg.num_q_heads, chk.seconds);
            printf("         max |err| / rms(ref o) = %.3g; max err / tolerance = %.3g; max lse "
                   "err = %.3g\n",
                   chk.v.o_err, chk.v.o_ratio, chk.v.lse_err);
            if (c.cfg.num_selected > 0)
                printf("         near-tie selection differences: %lld of %lld (token, kv head) "
                       "rows = %.3g%%%s\n",
                       (long long)chk.v.tie_swaps, (long long)chk.sel_rows, 100.0 * chk.tie_fraction,
                       c.fixed_indices ? " (block indices given)" : "");
            printf("         %s (%s tolerance: |err| <= %g max(rms(ref o), rms(v)) + %g |ref| + %g; lse %g + %g |ref|)\n",
                   chk.v.pass ? "PASS" : "FAIL", nsa_dtype_name(c.cfg.dtype), tol.o_rms, tol.o_rel,
                   tol.o_abs, tol.lse_abs, tol.lse_rel);
            if (!chk.v.pass)
                printf("         first failure: %s\n", chk.v.msg);
        }
        if (chk.note[0])
            printf("%s %s\n", chk.done ? "note:   " : "check:  ", chk.note);
        if (dcmp.done) {
            printf("decode:  vs %s nsa_forward of the whole problem (%.2f s): %lld of %lld rows bitwise equal (o, "
                   "LSEs, selected); max |o diff| = %.3g",
                   bname, dcmp.seconds, (long long)dcmp.rows_equal, (long long)dcmp.rows, dcmp.max_o_diff);
            if (dcmp.bitwise_required)
                printf(": %s (cpu: must be bitwise equal)", dcmp.pass ? "PASS" : "FAIL");
            else
                printf(" (reported; the check above judges the tolerance)");
            if (dcmp.first_differ >= 0) printf("; first differing row %lld", (long long)dcmp.first_differ);
            printf("\n");
        }
        if (backward) {
            double rt, lt;
            tk_grad_tolerance(c.cfg.dtype, &rt, &lt);
            char w1[32], w2[32];
            printf("backward: %.4g ms for %s (training plan, uploads, nsa_backward, read-back; not a "
                   "kernel timing), dO from %s\n",
                   bw.seconds * 1e3, shards ? "all shards' calls" : "one call", bw.dout_from);
            if (shards)
                printf("         %lld shard backward plans (NSA_BACKWARD_FLOAT_KEY_GRADS): dq, dgate rows from the "
                       "shard that holds them; key-side gradients summed in fp64 in shard order, rounded once\n",
                       (long long)nshards);
            else
            printf("         training plan: workspace %s, plan memory %s\n",
                   tool_bytes((double)bw.g.workspace_bytes, w1, sizeof w1),
                   tool_bytes((double)bw.g.backend_bytes, w2, sizeof w2));
            if (bw.g.num_bwd) printf("         kernels:\n");
            for (int i = 0; i < bw.g.num_bwd; i++) printf("           %-13s %s\n", bw.g.bwd_stage[i], bw.g.bwd_kernel[i]);
            if (bw.checked)
                printf("         vs %s (%.2f s): %lld gradient elements, max err / tolerance = %.3g: %s "
                       "(|err| <= %g max(rms(ref), 0.1 rms(dO)) + %g |ref|)\n",
                       bw.reference, bw.ref_seconds, (long long)bw.v.elements, bw.v.worst,
                       bw.v.pass ? "PASS" : "FAIL", rt, lt);
            if (bw.checked && !bw.v.pass) printf("         first failure: %s\n", bw.v.msg);
            if (bw.note[0]) printf("         %s\n", bw.note);
        }
    }
    run_backward_free(&bw);

    problem_output_free(&out);
    problem_free(&p);
    tk_inputs_free(&in);
    nsa_context_destroy(ctx);
    return exit_code;
}
