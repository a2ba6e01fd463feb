/*
 * Small helpers every nsa subcommand uses: reporting a failed libnsa call
 * (status name + the library's last-error message), a monotonic wall clock,
 * progress lines that appear only on a terminal, and JSON value printing.
 */
#ifndef NSA_TOOLS_TOOL_H
#define NSA_TOOLS_TOOL_H

#include <stdint.h>
#include <stdio.h>

#include "nsa.h"

/* Exit codes of the nsa command. */
enum {
    TOOL_EXIT_OK = 0,
    TOOL_EXIT_FAIL = 1,    /* a check failed or a libnsa call failed */
    TOOL_EXIT_USAGE = 2,   /* bad flags or values */
    TOOL_EXIT_SKIPPED = 77 /* nothing could run (no listed backend available) */
};

/* Prints "cmd: what: NSA_ERR_...: <nsa_last_error()>" to stderr and returns
 * TOOL_EXIT_FAIL. Call it right after the failing libnsa call. */
int tool_report(const char *cmd, const char *what, nsa_status s);

/* Writes "what: NSA_ERR_...: <nsa_last_error()>" into buf and returns s. Use it
 * right after the failing call, before any cleanup calls reset the message. */
#define TOOL_ERR_MAX 1536
nsa_status tool_format_error(char *buf, size_t size, const char *what, nsa_status s);

/* Seconds from a monotonic clock. */
double tool_now(void);

/* 1 when the context's device is a CPU (the cpu backend or an OpenCL CPU device). */
int tool_on_cpu(const nsa_context *ctx);

/* Run from the build tree with NSA_BACKEND_PATH unset: use the modules built there. */
void tool_use_build_tree_modules(void);

/* 1 when stderr is a terminal: progress lines are shown only then. */
int tool_tty(void);

/* On a terminal: rewrites the current stderr line with the message. */
void tool_progress(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* On a terminal: clears the progress line. */
void tool_progress_end(void);

/* JSON values: a quoted, escaped string; a number (null for NaN/inf). */
void json_str(FILE *f, const char *s);
void json_num(FILE *f, double v);
/* ", \"key\": " and the number: a field after the first of an object */
void json_field(FILE *f, const char *key, double v);

/* The kernel of every stage of a plan (nsa_plan_stage_kernel): text, one
 * "  stage  kernel" line each after the prefix line; or json != 0: one object
 * {"stage": "kernel", ...} (no newline). Stages whose kernel cannot be read
 * show the status name. */
void tool_print_kernels(FILE *f, const nsa_plan *plan, int json);
/* The same text into buf (truncated to size; TOOL_KERNELS_MAX holds 16
 * stages' names at NSA_NAME_MAX), for a caller that frees the plan first. */
#define TOOL_KERNELS_MAX (16 * (NSA_NAME_MAX + 96) + 8)
void tool_format_kernels(char *buf, size_t size, const nsa_plan *plan, int json);
/* backward != 0: the backward's stages of a training plan instead (bwd_stages) */
void tool_format_stage_kernels(char *buf, size_t size, const nsa_plan *plan, int json, int backward);

/* Median of n values (sorts v in place); NaN for n = 0. */
double tool_median(double *v, int n);

/* Human bytes: "1.50 GiB". */
const char *tool_bytes(double bytes, char *buf, size_t size);

#endif /* NSA_TOOLS_TOOL_H */
