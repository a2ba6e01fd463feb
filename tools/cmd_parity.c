/*
 * nsa parity: the seeded testkit corpus on several backends, each compared with
 * a reference (the cpu backend by default) under the testkit's dtype tolerances
 * and near-tie rule; optionally saved to a file, or compared with a file saved on
 * another machine.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cmds.h"
#include "nsa.h"
#include "parity_file.h"
#include "ref_output.h"
#include "testkit.h"
#include "tool.h"

#define CMD "nsa parity"
#define MAX_BACKENDS 16

/* One row of the table: a backend, a dtype, and what it was compared with. */
typedef struct row {
    char backend[64];
    char device[NSA_NAME_MAX];
    char reference[NSA_NAME_MAX + 64];
    nsa_dtype dtype;
    int available;
    int first_of_backend; /* first row of this backend (unavailable rows print once) */
    int own;              /* the reference backend's own row */
    char reason[NSA_NAME_MAX + 64];
    int cases, passed, failed, skipped;
    double max_o_err, max_o_ratio, max_lse_err;
    int64_t tie_swaps;
    char worst[TK_LABEL_MAX];
    char first_failure[TK_MSG_MAX];
    char first_skip[TK_MSG_MAX];
} row;

static void row_skip(row *r, const char *why)
{
    r->cases++;
    r->skipped++;
    if (!r->first_skip[0])
        snprintf(r->first_skip, sizeof r->first_skip, "%.1000s", why);
}

static void row_add(row *r, const tk_case *c, const tk_verdict *v)
{
    r->cases++;
    if (v->pass) {
        r->passed++;
    } else {
        r->failed++;
        if (!r->first_failure[0])
            snprintf(r->first_failure, sizeof r->first_failure, "%s", v->msg);
    }
    if (v->status == NSA_SUCCESS) {
        if (v->o_ratio > r->max_o_ratio || !r->worst[0]) {
            r->max_o_ratio = v->o_ratio > r->max_o_ratio ? v->o_ratio : r->max_o_ratio;
            snprintf(r->worst, sizeof r->worst, "%s", c->label);
        }
        if (v->o_err > r->max_o_err)
            r->max_o_err = v->o_err;
        if (v->lse_err > r->max_lse_err)
            r->max_lse_err = v->lse_err;
        r->tie_swaps += v->tie_swaps;
    }
}

static void usage(FILE *f, const args_opt *opts, int n)
{
    fprintf(f,
            "usage: nsa parity [--backends A,B,...] [--reference cpu|oracle|NAME] [--corpus full|small]\n"
            "                  [--dtypes f32,f16,bf16] [--save FILE] [--compare FILE] [--json]\n\n"
            "Runs the tests' seeded corpus of configurations (tests/common: inputs drawn with\n"
            "libnsa's portable generator, so every machine sees the same numbers) on each\n"
            "listed backend and compares every output element with the reference: the cpu\n"
            "backend by default, `oracle` for the tests' fp64 oracle, or another backend.\n"
            "A backend listed as its own reference is compared with the oracle instead; the\n"
            "reference backend itself is also checked against the oracle (its own row).\n"
            "Tolerances are the testkit's per dtype; selections that differ only where two\n"
            "block scores are within rounding (near-ties, semantics section 7) count as\n"
            "equal, and o is then judged against the oracle re-run with the backend's own\n"
            "indices. A case the backend reports NSA_ERR_UNSUPPORTED for is skipped.\n\n"
            "columns: max err = max |got - ref| / RMS(ref o); /tol = the largest error as a\n"
            "  fraction of its tolerance (pass <= 1); worst = the case of the largest /tol.\n"
            "--save FILE writes every run's outputs (o as f32, LSEs, selected indices, the\n"
            "  case, backend, device, libnsa version; format in tools/parity_file.h).\n"
            "--compare FILE compares this run's outputs with such a file (made on another\n"
            "  machine) with the same tolerance and near-tie rule: extra rows `vs FILE`.\n\n"
            "exit: 0 all ran cases passed; 1 any failure; 2 bad usage; 77 no listed backend\n"
            "  was available (unavailable backends are rows `unavailable: <reason>`).\n\n"
            "flags:\n");
    args_print_options(f, opts, n);
}

static nsa_dtype dtype_of(const char *s, int *ok)
{
    *ok = 1;
    if (strcmp(s, "f32") == 0) return NSA_DTYPE_F32;
    if (strcmp(s, "f16") == 0) return NSA_DTYPE_F16;
    if (strcmp(s, "bf16") == 0) return NSA_DTYPE_BF16;
    *ok = 0;
    return NSA_DTYPE_F32;
}

static int is_unavailable(nsa_status s)
{
    return s == NSA_ERR_BACKEND_UNAVAILABLE || s == NSA_ERR_DEVICE_NOT_FOUND ||
           s == NSA_ERR_VERSION_MISMATCH;
}

/* The backend list's one-line reason for an unavailable backend (the context
 * error also lists every other backend); keeps the context's when unknown. */
static void short_reason(const char *name, nsa_status s, char *reason, size_t size)
{
    nsa_backend_info infos[MAX_BACKENDS];
    int count = 0;
    if (s != NSA_ERR_BACKEND_UNAVAILABLE || nsa_backend_list(infos, MAX_BACKENDS, &count) != NSA_SUCCESS)
        return;
    for (int i = 0; i < count && i < MAX_BACKENDS; i++)
        if (strcmp(infos[i].name, name) == 0 && !infos[i].available && infos[i].reason[0])
            snprintf(reason, size, "%s", infos[i].reason);
}

typedef struct target {
    char name[64];
    nsa_context *ctx;    /* NULL: unavailable */
    char reason[NSA_NAME_MAX + 64];
    int self_ref;        /* this backend is the reference: compare with the oracle */
} target;

static void print_table(FILE *f, const row *rows, int nrows)
{
    fprintf(f, "%-8s %-5s %-22s %6s %6s %6s %7s %10s %8s  %s\n", "backend", "dtype", "reference",
            "cases", "passed", "failed", "skipped", "max err", "/tol", "worst case");
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        if (!r->available) {
            if (r->first_of_backend) /* once, not per dtype */
                fprintf(f, "%-8s %-5s %-22.22s unavailable: %s\n", r->backend, "-", r->reference,
                        r->reason);
            continue;
        }
        if (r->cases == 0 && r->own)
            continue; /* the reference's own rows when nothing ran */
        fprintf(f, "%-8s %-5s %-22.22s %6d %6d %6d %7d %10.3g %8.3g  %s\n", r->backend,
                nsa_dtype_name(r->dtype), r->reference, r->cases, r->passed, r->failed, r->skipped,
                r->max_o_err, r->max_o_ratio, r->worst[0] ? r->worst : "-");
    }
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        if (r->failed)
            fprintf(f, "%s %s vs %s: first failure: %s\n", r->backend, nsa_dtype_name(r->dtype),
                    r->reference, r->first_failure);
        if (r->skipped)
            fprintf(f, "%s %s vs %s: %d skipped, first: %s\n", r->backend, nsa_dtype_name(r->dtype),
                    r->reference, r->skipped, r->first_skip);
    }
}

static void print_json(FILE *f, const char *corpus, const char *reference, const row *rows,
                       int nrows, int exit_code)
{
    fprintf(f, "{\"command\": \"parity\", \"version\": ");
    json_str(f, nsa_version_string());
    fprintf(f, ", \"corpus\": ");
    json_str(f, corpus);
    fprintf(f, ", \"reference\": ");
    json_str(f, reference);
    fprintf(f, ", \"rows\": [");
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        fprintf(f, "%s{\"backend\": ", i ? ", " : "");
        json_str(f, r->backend);
        fprintf(f, ", \"device\": ");
        json_str(f, r->device);
        fprintf(f, ", \"dtype\": \"%s\", \"reference\": ", nsa_dtype_name(r->dtype));
        json_str(f, r->reference);
        fprintf(f, ", \"available\": %s", r->available ? "true" : "false");
        if (!r->available) {
            fprintf(f, ", \"reason\": ");
            json_str(f, r->reason);
            fprintf(f, "}");
            continue;
        }
        fprintf(f, ", \"cases\": %d, \"passed\": %d, \"failed\": %d, \"skipped\": %d, \"max_o_err\": ",
                r->cases, r->passed, r->failed, r->skipped);
        json_num(f, r->max_o_err);
        fprintf(f, ", \"max_o_err_over_tol\": ");
        json_num(f, r->max_o_ratio);
        fprintf(f, ", \"max_lse_err\": ");
        json_num(f, r->max_lse_err);
        fprintf(f, ", \"tie_swaps\": %lld, \"worst\": ", (long long)r->tie_swaps);
        json_str(f, r->worst);
        fprintf(f, ", \"first_failure\": ");
        json_str(f, r->first_failure);
        fprintf(f, ", \"first_skip\": ");
        json_str(f, r->first_skip);
        fprintf(f, "}");
    }
    fprintf(f, "], \"exit_code\": %d}\n", exit_code);
}

int cmd_parity(int argc, char **argv)
{
    const char *backends_arg = NULL, *reference = "cpu", *dtypes_arg = "f32,f16,bf16";
    const char *save_path = NULL, *compare_path = NULL, *compare_backend = NULL, *filter = NULL;
    int corpus_idx = 0, json = 0;
    int64_t device = -1, limit = 0;
    args_opt opts[] = {
        {"--backends", ARGS_STRING, &backends_arg, NULL, "A,B,..", "backends to check (default: every available one)", 0},
        {"--reference", ARGS_STRING, &reference, NULL, "NAME", "cpu (default), oracle (fp64 testkit oracle), or a backend", 0},
        {"--corpus", ARGS_CHOICE, &corpus_idx, "full|small", NULL, "which seeded corpus (full)", 0},
        {"--dtypes", ARGS_STRING, &dtypes_arg, NULL, "LIST", "dtypes to run, from f32,f16,bf16 (all)", 0},
        {"--device", ARGS_INT64, &device, NULL, "N", "device index for every backend (default NSA_DEVICE, else 0)", 0},
        {"--cases", ARGS_STRING, &filter, NULL, "TEXT", "only cases whose label contains TEXT", 0},
        {"--limit", ARGS_INT64, &limit, NULL, "N", "only the first N cases (0: all)", 0},
        {"--save", ARGS_STRING, &save_path, NULL, "FILE", "save every run's outputs to FILE", 0},
        {"--compare", ARGS_STRING, &compare_path, NULL, "FILE", "also compare with outputs saved in FILE", 0},
        {"--compare-backend", ARGS_STRING, &compare_backend, NULL, "NAME", "use FILE's records of this backend (default: the first of another backend)", 0},
        {"--json", ARGS_FLAG, &json, NULL, NULL, "print one JSON object", 0},
    };
    const int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *corpus = corpus_idx == 0 ? "full" : "small";
    char names[MAX_BACKENDS][64], dnames[3][64], err[TOOL_ERR_MAX];
    nsa_dtype dtypes[3];
    int nb = 0, nd, ncases, ref_is_oracle, exit_code = TOOL_EXIT_OK, any_ran = 0;
    target targets[MAX_BACKENDS];
    target ref_target;
    tk_case *cases = NULL;
    row *rows = NULL;
    int nrows = 0, rows_per_dtype;
    parity_record *recs = NULL;
    int nrecs = 0;
    FILE *save = NULL;
    int rc = args_parse(CMD, opts, nopts, argc, argv, 1);

    if (rc == ARGS_HELP) {
        usage(stdout, opts, nopts);
        return TOOL_EXIT_OK;
    }
    if (rc != ARGS_OK)
        return TOOL_EXIT_USAGE;
    corpus = corpus_idx == 0 ? "full" : "small";
    if (limit < 0 || device < -1) {
        fprintf(stderr, CMD ": --limit must be >= 0 and --device >= 0\n");
        return TOOL_EXIT_USAGE;
    }
    nd = args_split_names(CMD, "--dtypes", dtypes_arg, dnames, 3);
    if (nd < 0)
        return TOOL_EXIT_USAGE;
    for (int i = 0; i < nd; i++) {
        int ok;
        dtypes[i] = dtype_of(dnames[i], &ok);
        if (!ok) {
            fprintf(stderr, CMD ": --dtypes: '%s' is not one of f32, f16, bf16\n", dnames[i]);
            return TOOL_EXIT_USAGE;
        }
    }
    if (backends_arg) {
        nb = args_split_names(CMD, "--backends", backends_arg, names, MAX_BACKENDS);
        if (nb < 0)
            return TOOL_EXIT_USAGE;
    } else {
        nsa_backend_info infos[MAX_BACKENDS];
        int count = 0;
        nsa_status s = nsa_backend_list(infos, MAX_BACKENDS, &count);
        if (s != NSA_SUCCESS)
            return tool_report(CMD, "nsa_backend_list", s);
        for (int i = 0; i < count && i < MAX_BACKENDS; i++)
            if (infos[i].available)
                snprintf(names[nb++], sizeof names[0], "%.31s", infos[i].name);
    }
    ref_is_oracle = strcmp(reference, "oracle") == 0;

    if (compare_path) {
        nrecs = parity_file_read(compare_path, &recs, err, sizeof err);
        if (nrecs < 0) {
            fprintf(stderr, CMD ": %s\n", err);
            return TOOL_EXIT_FAIL;
        }
    }

    /* contexts: the reference and every listed backend */
    memset(&ref_target, 0, sizeof ref_target);
    if (!ref_is_oracle) {
        nsa_status s;
        snprintf(ref_target.name, sizeof ref_target.name, "%s", reference);
        s = nsa_context_create(reference, (int)device, &ref_target.ctx);
        if (s != NSA_SUCCESS) {
            parity_records_free(recs, nrecs);
            return tool_report(CMD, "nsa_context_create (reference)", s);
        }
    }
    for (int i = 0; i < nb; i++) {
        target *t = &targets[i];
        nsa_status s;
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%.63s", names[i]);
        t->self_ref = !ref_is_oracle && strcmp(names[i], reference) == 0;
        if (t->self_ref) {
            t->ctx = ref_target.ctx; /* shared, not destroyed twice */
            continue;
        }
        s = nsa_context_create(names[i], (int)device, &t->ctx);
        if (s != NSA_SUCCESS) {
            snprintf(t->reason, sizeof t->reason, "%s: %s", nsa_status_string(s), nsa_last_error());
            short_reason(names[i], s, t->reason, sizeof t->reason);
            t->ctx = NULL;
            if (!is_unavailable(s))
                exit_code = TOOL_EXIT_FAIL;
        }
    }

    ncases = tk_corpus(corpus, &cases);
    if (ncases < 0) {
        fprintf(stderr, CMD ": unknown corpus '%s'\n", corpus);
        exit_code = TOOL_EXIT_USAGE;
        goto done;
    }
    if (save_path && !(save = parity_file_create(save_path, err, sizeof err))) {
        fprintf(stderr, CMD ": %s\n", err);
        exit_code = TOOL_EXIT_FAIL;
        goto done;
    }

    /* rows: per dtype, each target vs the reference (+ vs the file), then the
     * reference backend vs the oracle when it is not listed itself */
    {
        int ref_listed = 0;
        for (int i = 0; i < nb; i++)
            ref_listed |= targets[i].self_ref;
        rows_per_dtype = nb * (compare_path ? 2 : 1) + ((!ref_is_oracle && !ref_listed) ? 1 : 0) +
                         ((compare_path && !ref_is_oracle && !ref_listed) ? 1 : 0);
    }
    rows = calloc((size_t)(rows_per_dtype * nd + 1), sizeof *rows);
    if (!rows) {
        fprintf(stderr, CMD ": out of memory\n");
        exit_code = TOOL_EXIT_FAIL;
        goto done;
    }

    {
        int ran_listed = 0;
        for (int i = 0; i < nb; i++)
            ran_listed |= targets[i].ctx != NULL;
        if (!ran_listed)
            ncases = 0; /* nothing listed can run: do not spend time on the reference */
    }
    for (int di = 0; di < nd; di++) {
        const nsa_dtype dt = dtypes[di];
        row *base = &rows[nrows];
        int k = 0;
        char file_ref[NSA_NAME_MAX + 64];
        {
            const char *base = compare_path ? strrchr(compare_path, '/') : NULL;
            snprintf(file_ref, sizeof file_ref, "file %s",
                     base ? base + 1 : compare_path ? compare_path : "");
        }
        /* row layout of this dtype */
        for (int i = 0; i < nb; i++) {
            for (int pass = 0; pass < (compare_path ? 2 : 1); pass++) {
                row *r = &base[k++];
                snprintf(r->backend, sizeof r->backend, "%.63s", targets[i].name);
                r->dtype = dt;
                r->first_of_backend = di == 0 && pass == 0;
                r->available = targets[i].ctx != NULL;
                snprintf(r->reason, sizeof r->reason, "%s", targets[i].reason);
                if (r->available)
                    snprintf(r->device, sizeof r->device, "%s", nsa_context_device(targets[i].ctx));
                snprintf(r->reference, sizeof r->reference, "%s",
                         pass ? file_ref : (targets[i].self_ref || ref_is_oracle) ? "oracle" : reference);
            }
        }
        while (k < rows_per_dtype) { /* the reference backend's own rows */
            row *r = &base[k];
            snprintf(r->backend, sizeof r->backend, "%s", reference);
            r->dtype = dt;
            r->available = 1;
            r->own = 1;
            snprintf(r->device, sizeof r->device, "%s", nsa_context_device(ref_target.ctx));
            snprintf(r->reference, sizeof r->reference, "%s",
                     k == nb * (compare_path ? 2 : 1) ? "oracle (ref. check)" : file_ref);
            k++;
        }
        nrows += rows_per_dtype;

        for (int ci = 0; ci < ncases && (limit == 0 || ci < limit); ci++) {
            tk_case c = cases[ci];
            tk_inputs in;
            tk_oracle orc;
            tk_output ref_out;
            nsa_status ref_status = NSA_SUCCESS, s;
            char msg[TK_MSG_MAX];
            int have_ref = 0;
            if (filter && !strstr(c.label, filter))
                continue;
            tk_case_set_dtype(&c, dt);
            tool_progress("[%s %d/%d] %s", nsa_dtype_name(dt), ci + 1,
                          limit ? (int)(limit < ncases ? limit : ncases) : ncases, c.label);
            memset(&ref_out, 0, sizeof ref_out);
            s = tk_inputs_make(&c, &in);
            if (s == NSA_SUCCESS) {
                s = tk_oracle_run(&c, &in, c.fixed_indices ? in.given : NULL, &orc);
                if (s != NSA_SUCCESS)
                    tk_inputs_free(&in);
            }
            if (s != NSA_SUCCESS) {
                tool_progress_end();
                fprintf(stderr, CMD ": %s: inputs/oracle failed: %s\n", c.label, nsa_status_string(s));
                exit_code = TOOL_EXIT_FAIL;
                continue;
            }
            if (!ref_is_oracle) {
                ref_status = tk_run(ref_target.ctx, &c, &in, &ref_out, msg, sizeof msg);
                have_ref = ref_status == NSA_SUCCESS;
                if (save && parity_file_write(save, reference, nsa_context_device(ref_target.ctx), &c,
                                              ref_status, &ref_out, err, sizeof err) != 0) {
                    fprintf(stderr, CMD ": --save %s: %s\n", save_path, err);
                    exit_code = TOOL_EXIT_FAIL;
                }
            }
            k = 0;
            for (int i = 0; i < nb + 1; i++) {
                /* i == nb: the reference backend's own rows, if it has any */
                const int own = i == nb;
                target *t = own ? &ref_target : &targets[i];
                tk_output got_local, *got = &got_local;
                nsa_status run_status;
                tk_verdict v;
                int npass = compare_path ? 2 : 1;
                if (own && k >= rows_per_dtype)
                    break;
                if (!own && !t->ctx) {
                    k += npass;
                    continue;
                }
                memset(&got_local, 0, sizeof got_local);
                if (own || t->self_ref) {
                    got = &ref_out;
                    run_status = ref_status;
                    if (run_status != NSA_SUCCESS)
                        snprintf(msg, sizeof msg, "%s", "reference run failed");
                } else {
                    run_status = tk_run(t->ctx, &c, &in, got, msg, sizeof msg);
                    if (save && parity_file_write(save, t->name, nsa_context_device(t->ctx), &c,
                                                  run_status, got, err, sizeof err) != 0) {
                        fprintf(stderr, CMD ": --save %s: %s\n", save_path, err);
                        exit_code = TOOL_EXIT_FAIL;
                    }
                }
                any_ran = 1;
                for (int pass = 0; pass < npass; pass++) {
                    row *r = &base[k++];
                    char why[TK_MSG_MAX + 64];
                    if (run_status == NSA_ERR_UNSUPPORTED) {
                        snprintf(why, sizeof why, "%s: %s", c.label, msg);
                        row_skip(r, why);
                        continue;
                    }
                    if (run_status != NSA_SUCCESS) {
                        memset(&v, 0, sizeof v);
                        v.status = run_status;
                        snprintf(v.msg, sizeof v.msg, "%s: %.900s", c.label, msg);
                        row_add(r, &c, &v);
                        continue;
                    }
                    if (pass == 0) {
                        /* vs the reference backend, or vs the oracle */
                        if (ref_is_oracle || t->self_ref || own) {
                            tk_compare(&c, &in, &orc, got, &v);
                        } else if (!have_ref) {
                            snprintf(why, sizeof why, "%s: the reference %s could not run it (%s)",
                                     c.label, reference, nsa_status_string(ref_status));
                            row_skip(r, why);
                            continue;
                        } else {
                            tk_oracle ref;
                            if (ref_from_output(&c, &ref_out, &orc, &ref) != 0) {
                                row_skip(r, "out of host memory");
                                continue;
                            }
                            tk_compare(&c, &in, &ref, got, &v);
                            ref_output_free(&ref);
                        }
                    } else {
                        /* vs the saved file */
                        int mismatch = 0;
                        const parity_record *rec =
                            parity_file_find(recs, nrecs, &c, compare_backend, t->name, &mismatch);
                        tk_oracle ref;
                        if (!rec || rec->status != NSA_SUCCESS) {
                            snprintf(why, sizeof why, "%s: %s", c.label,
                                     !rec ? (mismatch ? "the file's case differs (another corpus version)"
                                                      : "not in the file")
                                          : "the file's run of it failed");
                            row_skip(r, why);
                            continue;
                        }
                        if (r->reference[0] == 'f' && !strchr(r->reference, ':')) {
                            char more[NSA_NAME_MAX + 64];
                            snprintf(more, sizeof more, "%.200s:%s", r->reference, rec->backend);
                            snprintf(r->reference, sizeof r->reference, "%s", more);
                        }
                        if (ref_from_output(&c, &rec->out, &orc, &ref) != 0) {
                            row_skip(r, "out of host memory");
                            continue;
                        }
                        tk_compare(&c, &in, &ref, got, &v);
                        ref_output_free(&ref);
                    }
                    row_add(r, &c, &v);
                }
                if (got == &got_local)
                    tk_output_free(&got_local);
            }
            tk_output_free(&ref_out);
            tk_oracle_free(&orc);
            tk_inputs_free(&in);
        }
        tool_progress_end();
    }

    for (int i = 0; i < nrows; i++)
        if (rows[i].available && rows[i].failed)
            exit_code = TOOL_EXIT_FAIL;
    {
        int ran_listed = 0;
        for (int i = 0; i < nb; i++)
            ran_listed |= targets[i].ctx != NULL;
        if (!ran_listed && exit_code == TOOL_EXIT_OK)
            exit_code = TOOL_EXIT_SKIPPED;
    }
    (void)any_ran;
    if (json)
        print_json(stdout, corpus, reference, rows, nrows, exit_code);
    else
        print_table(stdout, rows, nrows);
    if (!json && exit_code == TOOL_EXIT_SKIPPED)
        printf("no listed backend is available: nothing ran (exit 77)\n");

done:
    if (save && fclose(save) != 0) {
        fprintf(stderr, CMD ": --save %s: close failed\n", save_path);
        exit_code = TOOL_EXIT_FAIL;
    }
    free(rows);
    free(cases);
    parity_records_free(recs, nrecs);
    for (int i = 0; i < nb; i++)
        if (!targets[i].self_ref)
            nsa_context_destroy(targets[i].ctx);
    nsa_context_destroy(ref_target.ctx);
    return exit_code;
}
