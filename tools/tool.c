/* Helpers shared by the nsa subcommands (see tool.h). */
#include "tool.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int tool_report(const char *cmd, const char *what, nsa_status s)
{
    const char *msg = nsa_last_error();
    fprintf(stderr, "%s: %s failed: %s%s%s\n", cmd, what, nsa_status_string(s),
            (msg && *msg) ? ": " : "", msg ? msg : "");
    return TOOL_EXIT_FAIL;
}

nsa_status tool_format_error(char *buf, size_t size, const char *what, nsa_status s)
{
    const char *msg = nsa_last_error();
    if (buf && size)
        snprintf(buf, size, "%s: %s%s%s", what, nsa_status_string(s), (msg && *msg) ? ": " : "",
                 msg ? msg : "");
    return s;
}

double tool_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tool_tty(void)
{
    static int cached = -1;
    if (cached < 0)
        cached = isatty(fileno(stderr)) ? 1 : 0;
    return cached;
}

void tool_progress(const char *fmt, ...)
{
    va_list ap;
    if (!tool_tty())
        return;
    fputs("\r\033[K", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}

void tool_progress_end(void)
{
    if (!tool_tty())
        return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
}

void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

void json_num(FILE *f, double v)
{
    if (isnan(v) || isinf(v))
        fputs("null", f);
    else if (v == floor(v) && fabs(v) < 9e15)
        fprintf(f, "%.0f", v);
    else
        fprintf(f, "%.6g", v);
}

void json_field(FILE *f, const char *key, double v)
{
    fprintf(f, ", \"%s\": ", key);
    json_num(f, v);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tool_median(double *v, int n)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char *tool_bytes(double bytes, char *buf, size_t size)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    snprintf(buf, size, u ? "%.2f %s" : "%.0f %s", bytes, unit[u]);
    return buf;
}

int tool_on_cpu(const nsa_context *ctx)
{
    nsa_device_kind kind = NSA_DEVICE_KIND_GPU;
    return nsa_context_device_kind(ctx, &kind) == NSA_SUCCESS && kind == NSA_DEVICE_KIND_CPU;
}

/* appends to buf[*len .. size) (truncating; buf stays terminated) */
static void append(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= size) return;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(buf + *len, size - *len, fmt, ap);
    va_end(ap);
    if (n > 0) *len += (size_t)n < size - *len ? (size_t)n : size - *len - 1;
}

/* a JSON string's escaped characters (json_str's rules) */
static void append_json(char *buf, size_t size, size_t *len, const char *s)
{
    append(buf, size, len, "\"");
    for (; *s; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') append(buf, size, len, "\\%c", ch);
        else if (ch < 0x20) append(buf, size, len, "\\u%04x", ch);
        else append(buf, size, len, "%c", ch);
    }
    append(buf, size, len, "\"");
}

void tool_format_kernels(char *buf, size_t size, const nsa_plan *plan, int json)
{
    tool_format_stage_kernels(buf, size, plan, json, 0);
}

void tool_format_stage_kernels(char *buf, size_t size, const nsa_plan *plan, int json, int backward)
{
    size_t len = 0;
    if (size == 0) return;
    buf[0] = 0;
    nsa_plan_info info;
    if (nsa_plan_get_info(plan, &info) != NSA_SUCCESS) {
        if (json) append(buf, size, &len, "{}");
        return;
    }
    const char *p = backward ? info.bwd_stages : info.stages;
    const int first = backward ? info.num_stages : 0, count = backward ? info.num_bwd_stages : info.num_stages;
    if (json) append(buf, size, &len, "{");
    for (int i = 0; i < count; i++) {
        while (*p == ' ') p++;
        size_t n = strcspn(p, " ");
        char stage[64], kernel[NSA_NAME_MAX];
        snprintf(stage, sizeof stage, "%.*s", (int)(n < sizeof stage ? n : sizeof stage - 1), p);
        p += n;
        nsa_status s = nsa_plan_stage_kernel(plan, first + i, kernel, sizeof kernel);
        if (s != NSA_SUCCESS) snprintf(kernel, sizeof kernel, "(%s)", nsa_status_string(s));
        if (json) {
            append(buf, size, &len, "%s", i ? ", " : "");
            append_json(buf, size, &len, stage);
            append(buf, size, &len, ": ");
            append_json(buf, size, &len, kernel);
        } else {
            append(buf, size, &len, "           %-13s %s\n", stage, kernel);
        }
    }
    if (json) append(buf, size, &len, "}");
}

void tool_print_kernels(FILE *f, const nsa_plan *plan, int json)
{
    char buf[TOOL_KERNELS_MAX];
    tool_format_kernels(buf, sizeof buf, plan, json);
    fputs(buf, f);
}
