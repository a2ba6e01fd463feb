/*
 * nsa info: what libnsa sees on this machine -- the library version, every
 * known backend (available or the reason it is not, device names), the
 * environment variables that steer backend, module and kernel selection, and
 * with --kernels the kernel each stage runs for a sample plan on every
 * available backend.
 */
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "cmds.h"
#include "nsa.h"
#include "tool.h"

#define CMD "nsa info"

static const char *const env_vars[] = {"NSA_BACKEND",      "NSA_DEVICE",      "NSA_BACKEND_PATH",
                                       "NSA_CACHE_DIR",    "NSA_CPU_THREADS", "NSA_LOG",
                                       "NSA_CUDA_TARGET",  "NSA_CUDA_FORCE",  "NSA_CUDA_PROFILE",
                                       "NSA_CUDA_SCORE_ROWS_MAX", "NSA_CUDA_SLC_PASS_MAX"};
#define NUM_ENV ((int)(sizeof env_vars / sizeof env_vars[0]))
#define MAX_DEVICES 64

static void usage(FILE *f, const args_opt *opts, int n)
{
    fprintf(f,
            "usage: nsa info [--json] [--kernels [--backward] [--T N] [--dqk N] [--dv N] [--hq N] [--hkv N]]\n\n"
            "Prints the library version, each backend libnsa knows of (available, or why\n"
            "not; where it was loaded from; its devices) and the environment variables\n"
            "NSA_BACKEND, NSA_DEVICE, NSA_BACKEND_PATH, NSA_CACHE_DIR, NSA_CPU_THREADS, NSA_LOG, NSA_CUDA_TARGET,\n"
            "NSA_CUDA_FORCE, NSA_CUDA_PROFILE, NSA_CUDA_SCORE_ROWS_MAX, NSA_CUDA_SLC_PASS_MAX as currently set.\n\n"
            "--kernels: on device 0 of every available backend, plans one sequence of T\n"
            "tokens (default 65536) of the paper's configuration in bf16 (Hq 64, Hkv 4,\n"
            "Dqk 192, Dv 128 unless given) and prints the kernel each stage would run, as\n"
            "the backend chose it for that device and shape (no data is allocated).\n"
            "--backward makes it a training plan and lists the backward's stages and\n"
            "kernels after the forward's (JSON: {\"forward\": ..., \"backward\": ...}).\n\n"
            "flags:\n");
    args_print_options(f, opts, n);
}

/* --kernels: a plan of the sample shape on device 0 of each available backend */
static int print_kernels(const nsa_backend_info *infos, int count, int json, int64_t T, int64_t dqk, int64_t dv,
                         int64_t hq, int64_t hkv, int backward)
{
    nsa_config cfg;
    nsa_config_init(&cfg);
    if (backward) cfg.flags |= NSA_CONFIG_TRAINING;
    cfg.head_dim_qk = dqk;
    cfg.head_dim_v = dv;
    cfg.num_q_heads = hq;
    cfg.num_kv_heads = hkv;
    const int64_t cu[2] = {0, T};
    int rc = TOOL_EXIT_OK, first = 1;
    if (json)
        printf(", \"kernels\": {\"T\": %lld, \"dqk\": %lld, \"dv\": %lld, \"hq\": %lld, \"hkv\": %lld, "
               "\"dtype\": \"bf16\", \"backends\": {",
               (long long)T, (long long)dqk, (long long)dv, (long long)hq, (long long)hkv);
    else
        printf("\nkernels (one sequence of %lld tokens, Hq %lld, Hkv %lld, Dqk %lld, Dv %lld, bf16, device 0):\n",
               (long long)T, (long long)hq, (long long)hkv, (long long)dqk, (long long)dv);
    for (int i = 0; i < count; i++) {
        if (!infos[i].available)
            continue;
        nsa_context *ctx = NULL;
        nsa_plan *plan = NULL;
        nsa_status s = nsa_context_create(infos[i].name, 0, &ctx);
        if (s == NSA_SUCCESS)
            s = nsa_plan_create(ctx, &cfg, cu, 1, &plan);
        if (json) {
            printf("%s", first ? "" : ", ");
            json_str(stdout, infos[i].name);
            printf(": ");
        } else {
            printf("  %s (%s):\n", infos[i].name, ctx ? nsa_context_device(ctx) : "no context");
        }
        first = 0;
        if (s != NSA_SUCCESS) {
            char err[TOOL_ERR_MAX];
            tool_format_error(err, sizeof err, plan ? "nsa_plan_create" : "nsa_context_create", s);
            if (json) {
                printf("{\"error\": ");
                json_str(stdout, err);
                printf("}");
            } else {
                printf("           %s\n", err);
            }
            rc = TOOL_EXIT_FAIL;
        } else if (!backward) {
            tool_print_kernels(stdout, plan, json);
        } else {
            static char text[TOOL_KERNELS_MAX];
            tool_format_stage_kernels(text, sizeof text, plan, json, 0);
            printf(json ? "{\"forward\": %s" : "%s", text);
            tool_format_stage_kernels(text, sizeof text, plan, json, 1);
            printf(json ? ", \"backward\": %s}" : "         backward (training plan):\n%s", text);
        }
        nsa_plan_destroy(plan);
        nsa_context_destroy(ctx);
    }
    if (json)
        printf("}}");
    return rc;
}

int cmd_info(int argc, char **argv)
{
    int json = 0, kernels = 0, backward = 0;
    int64_t T = 65536, dqk = 192, dv = 128, hq = 64, hkv = 4;
    args_opt opts[] = {
        {"--json", ARGS_FLAG, &json, NULL, NULL, "print one JSON object", 0},
        {"--kernels", ARGS_FLAG, &kernels, NULL, NULL, "the kernel of every stage for a sample plan", 0},
        {"--backward", ARGS_FLAG, &backward, NULL, NULL, "a training plan: the backward's kernels too (--kernels)", 0},
        {"--T", ARGS_INT64, &T, "N", NULL, "tokens of the sample plan (--kernels)", 0},
        {"--dqk", ARGS_INT64, &dqk, "N", NULL, "its head dim of q and k", 0},
        {"--dv", ARGS_INT64, &dv, "N", NULL, "its head dim of v", 0},
        {"--hq", ARGS_INT64, &hq, "N", NULL, "its query heads", 0},
        {"--hkv", ARGS_INT64, &hkv, "N", NULL, "its key/value heads", 0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    int rc = args_parse(CMD, opts, nopts, argc, argv, 1);
    int count = 0;
    nsa_backend_info *infos;
    nsa_status s;

    if (rc == ARGS_HELP) {
        usage(stdout, opts, nopts);
        return TOOL_EXIT_OK;
    }
    if (rc != ARGS_OK)
        return TOOL_EXIT_USAGE;

    s = nsa_backend_list(NULL, 0, &count);
    if (s != NSA_SUCCESS)
        return tool_report(CMD, "nsa_backend_list", s);
    infos = calloc((size_t)(count > 0 ? count : 1), sizeof *infos);
    if (!infos) {
        fprintf(stderr, CMD ": out of memory\n");
        return TOOL_EXIT_FAIL;
    }
    s = nsa_backend_list(infos, count, &count);
    if (s != NSA_SUCCESS) {
        free(infos);
        return tool_report(CMD, "nsa_backend_list", s);
    }

    if (json) {
        printf("{\"version\": ");
        json_str(stdout, nsa_version_string());
        printf(", \"backends\": [");
    } else {
        printf("libnsa %s\n\nbackends:\n", nsa_version_string());
    }
    for (int i = 0; i < count; i++) {
        const nsa_backend_info *b = &infos[i];
        int ndev = b->available ? b->device_count : 0;
        if (ndev > MAX_DEVICES)
            ndev = MAX_DEVICES;
        if (json) {
            printf("%s{\"name\": ", i ? ", " : "");
            json_str(stdout, b->name);
            printf(", \"available\": %s, \"device_count\": %d, \"reason\": ",
                   b->available ? "true" : "false", b->device_count);
            json_str(stdout, b->reason);
            printf(", \"devices\": [");
        } else {
            printf("  %-8s %s", b->name, b->available ? "available" : "unavailable");
            if (b->available)
                printf(", %d device%s", b->device_count, b->device_count == 1 ? "" : "s");
            if (b->reason[0])
                printf(" (%s)", b->reason);
            printf("\n");
        }
        for (int d = 0; d < ndev; d++) {
            char name[NSA_NAME_MAX];
            nsa_status ds = nsa_device_name(b->name, d, name, sizeof name);
            if (ds != NSA_SUCCESS)
                snprintf(name, sizeof name, "(name unknown: %s: %s)", nsa_status_string(ds),
                         nsa_last_error());
            if (json) {
                printf("%s", d ? ", " : "");
                json_str(stdout, name);
            } else {
                printf("           device %d: %s\n", d, name);
            }
        }
        if (json)
            printf("]}");
    }
    if (json)
        printf("], \"environment\": {");
    else
        printf("\nenvironment:\n");
    for (int i = 0; i < NUM_ENV; i++) {
        const char *v = getenv(env_vars[i]);
        if (json) {
            printf("%s", i ? ", " : "");
            json_str(stdout, env_vars[i]);
            printf(": ");
            if (v)
                json_str(stdout, v);
            else
                printf("null");
        } else {
            printf("  %-23s %s\n", env_vars[i], v ? v : "(unset)");
        }
    }
    int rc_k = TOOL_EXIT_OK;
    if (json)
        printf("}");
    if (kernels)
        rc_k = print_kernels(infos, count, json, T, dqk, dv, hq, hkv, backward);
    if (json)
        printf("}\n");
    free(infos);
    return rc_k;
}
