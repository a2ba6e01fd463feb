/*
 * nsa: the command-line tool of libnsa.
 *
 *   nsa info     backends, devices, environment
 *   nsa run      one NSA forward on a backend: plan, time, TFLOP/s, error vs the reference
 *   nsa parity   the seeded test corpus on several backends, compared with a reference
 *   nsa bench    a sweep over T: time, TFLOP/s, GB/s, ratio against dense attention
 *
 * The tool sees libnsa only through include/nsa.h (and the tests' testkit for
 * the corpus, the fp64 oracle and the near-tie-aware comparison).
 */
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "nsa.h"
#include "tool.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: nsa <command> [flags]\n"
            "\n"
            "Native Sparse Attention (libnsa %s) from the command line.\n"
            "\n"
            "commands:\n"
            "  info     library version, backends (available or why not), devices, environment\n"
            "  run      one NSA forward on a backend: plan, time, TFLOP/s, error vs the cpu reference\n"
            "  parity   the seeded test corpus on several backends, compared with a reference\n"
            "  bench    sweep over T: time, TFLOP/s, GB/s, ratio against dense causal attention\n"
            "\n"
            "  nsa <command> --help   flags of one command\n"
            "  nsa --version          the library version\n"
            "\n"
            "environment: NSA_BACKEND (backend or comma list), NSA_DEVICE (index),\n"
            "             NSA_BACKEND_PATH (where backend modules are looked for first),\n"
            "             NSA_CACHE_DIR (kernel caches), NSA_LOG (error|warn|info|debug: messages on stderr)\n"
            "exit codes: 0 ok, 1 failure (check or libnsa error), 2 bad usage,\n"
            "            77 nothing could run (no listed backend available)\n",
            nsa_version_string());
}

int main(int argc, char **argv)
{
    const char *sub;
    if (argc < 2) {
        usage(stderr);
        return TOOL_EXIT_USAGE;
    }
    sub = argv[1];
    tool_use_build_tree_modules();
    if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0 || strcmp(sub, "help") == 0) {
        usage(stdout);
        return TOOL_EXIT_OK;
    }
    if (strcmp(sub, "--version") == 0 || strcmp(sub, "version") == 0) {
        printf("nsa (libnsa) %s\n", nsa_version_string());
        return TOOL_EXIT_OK;
    }
    if (strcmp(sub, "info") == 0)
        return cmd_info(argc - 1, argv + 1);
    if (strcmp(sub, "run") == 0)
        return cmd_run(argc - 1, argv + 1);
    if (strcmp(sub, "parity") == 0)
        return cmd_parity(argc - 1, argv + 1);
    if (strcmp(sub, "bench") == 0)
        return cmd_bench(argc - 1, argv + 1);
    fprintf(stderr, "nsa: unknown command '%s' (commands: info run parity bench; see nsa --help)\n",
            sub);
    return TOOL_EXIT_USAGE;
}
