/*
 * nsa info: what libnsa sees on this machine -- the library version, every
 * known backend (available or the reason it is not, device names) and the
 * environment variables that steer backend and module selection.
 */
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "cmds.h"
#include "nsa.h"
#include "tool.h"

#define CMD "nsa info"

static const char *const env_vars[] = {"NSA_BACKEND", "NSA_DEVICE", "NSA_BACKEND_PATH",
                                       "NSA_CACHE_DIR"};
#define NUM_ENV ((int)(sizeof env_vars / sizeof env_vars[0]))
#define MAX_DEVICES 64

static void usage(FILE *f, const args_opt *opts, int n)
{
    fprintf(f,
            "usage: nsa info [--json]\n\n"
            "Prints the library version, each backend libnsa knows of (available, or why\n"
            "not; where it was loaded from; its devices) and the environment variables\n"
            "NSA_BACKEND, NSA_DEVICE, NSA_BACKEND_PATH, NSA_CACHE_DIR as currently set.\n\n"
            "flags:\n");
    args_print_options(f, opts, n);
}

int cmd_info(int argc, char **argv)
{
    int json = 0;
    args_opt opts[] = {
        {"--json", ARGS_FLAG, &json, NULL, NULL, "print one JSON object", 0},
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
            printf("  %-17s %s\n", env_vars[i], v ? v : "(unset)");
        }
    }
    if (json)
        printf("}}\n");
    free(infos);
    return TOOL_EXIT_OK;
}
