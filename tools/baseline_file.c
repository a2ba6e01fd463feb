/* The baselines file of nsa bench (baseline_file.h). */
#include "baseline_file.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINE_MAX_BYTES 4096

/* The value after "key": in line: a pointer to its first character, or NULL. */
static const char *find_key(const char *line, const char *key)
{
    char pat[40];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    for (const char *p = strstr(line, pat); p; p = strstr(p + 1, pat)) {
        const char *q = p + strlen(pat);
        while (*q == ' ' || *q == '\t') q++;
        if (*q == ':') {
            q++;
            while (*q == ' ' || *q == '\t') q++;
            return q;
        }
    }
    return NULL;
}

/* a string value without escapes, at most size - 1 bytes; 0 when absent or not a plain string */
static int get_str(const char *line, const char *key, char *out, size_t size)
{
    const char *v = find_key(line, key);
    if (!v || *v != '"') return 0;
    const char *end = strchr(v + 1, '"');
    if (!end || (size_t)(end - v - 1) >= size || memchr(v + 1, '\\', (size_t)(end - v - 1))) return 0;
    memcpy(out, v + 1, (size_t)(end - v - 1));
    out[end - v - 1] = '\0';
    return 1;
}

/* a finite number; 0 when absent or not a number */
static int get_num(const char *line, const char *key, double *out)
{
    const char *v = find_key(line, key);
    if (!v) return 0;
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    if (end == v || errno != 0 || !isfinite(x)) return 0;
    *out = x;
    return 1;
}

static int64_t get_int(const char *line, const char *key)
{
    double x;
    if (!get_num(line, key, &x) || x < 0 || x > 1e15 || x != floor(x)) return -1;
    return (int64_t)x;
}

int baseline_read(const char *path, baseline_rec *recs, int *n, char *err, size_t err_size)
{
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, err_size, "--baseline %s: %s", path, strerror(errno));
        return -1;
    }
    char line[LINE_MAX_BYTES + 2];
    long lineno = 0;
    int rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        const size_t len = strlen(line);
        if (len > LINE_MAX_BYTES && line[len - 1] != '\n') {
            snprintf(err, err_size, "--baseline %s: line %ld is longer than %d bytes", path, lineno, LINE_MAX_BYTES);
            rc = -1;
            break;
        }
        baseline_rec r;
        memset(&r, 0, sizeof r);
        double ms;
        if (!get_str(line, "baseline", r.name, sizeof r.name) || !get_num(line, "fwd_ms", &ms) || !(ms > 0))
            continue; /* not a timing record (an error line, another tool's output) */
        r.ms = ms;
        r.T = get_int(line, "T");
        if (r.T < 1) continue;
        r.hq = get_int(line, "hq");
        r.hkv = get_int(line, "hkv");
        r.dqk = get_int(line, "dqk");
        r.dv = get_int(line, "dv");
        if (*n >= BASELINE_MAX) {
            snprintf(err, err_size, "--baseline %s: more than %d timing records", path, BASELINE_MAX);
            rc = -1;
            break;
        }
        recs[(*n)++] = r;
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, err_size, "--baseline %s: read error", path);
        rc = -1;
    }
    fclose(f);
    return rc;
}
