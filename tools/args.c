/* The flag parser of the nsa command (see args.h). */
#include "args.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int args_choice_index(const char *choices, const char *name)
{
    size_t len = strlen(name);
    int index = 0;
    const char *p = choices;
    if (len == 0)
        return -1;
    while (p && *p) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && strncmp(p, name, n) == 0)
            return index;
        index++;
        p = bar ? bar + 1 : NULL;
    }
    return -1;
}

int args_parse_i64(const char *s, int64_t *out)
{
    char *end = NULL;
    long long v;
    if (!s || !*s)
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || end == s)
        return -1;
    if (*end == 'k' || *end == 'K') {
        if (v > INT64_MAX / 1024 || v < INT64_MIN / 1024)
            return -1;
        v *= 1024;
        end++;
    } else if (*end == 'm' || *end == 'M') {
        if (v > INT64_MAX / 1048576 || v < INT64_MIN / 1048576)
            return -1;
        v *= 1048576;
        end++;
    }
    if (*end)
        return -1;
    *out = (int64_t)v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end = NULL;
    double v;
    if (!s || !*s)
        return -1;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end)
        return -1;
    *out = v;
    return 0;
}

static args_opt *find_opt(args_opt *opts, int nopts, const char *name, size_t len)
{
    for (int i = 0; i < nopts; i++)
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0)
            return &opts[i];
    return NULL;
}

static int store_value(const char *cmd, args_opt *o, const char *value)
{
    switch (o->kind) {
    case ARGS_INT64:
        if (args_parse_i64(value, (int64_t *)o->dest) != 0) {
            fprintf(stderr, "%s: %s expects an integer (e.g. 4096 or 4k), got '%s'\n", cmd, o->name,
                    value);
            return ARGS_ERROR;
        }
        return ARGS_OK;
    case ARGS_DOUBLE:
        if (parse_double(value, (double *)o->dest) != 0) {
            fprintf(stderr, "%s: %s expects a number, got '%s'\n", cmd, o->name, value);
            return ARGS_ERROR;
        }
        return ARGS_OK;
    case ARGS_STRING:
        *(const char **)o->dest = value;
        return ARGS_OK;
    case ARGS_CHOICE: {
        int idx = args_choice_index(o->choices, value);
        if (idx < 0) {
            fprintf(stderr, "%s: %s expects one of %s, got '%s'\n", cmd, o->name, o->choices, value);
            return ARGS_ERROR;
        }
        *(int *)o->dest = idx;
        return ARGS_OK;
    }
    case ARGS_FLAG:
        break;
    }
    return ARGS_ERROR;
}

int args_parse(const char *cmd, args_opt *opts, int nopts, int argc, char **argv, int first)
{
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        const char *eq;
        size_t len;
        args_opt *o;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
            return ARGS_HELP;
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            fprintf(stderr, "%s: unexpected argument '%s' (flags are --name value; see %s --help)\n",
                    cmd, a, cmd);
            return ARGS_ERROR;
        }
        eq = strchr(a, '=');
        len = eq ? (size_t)(eq - a) : strlen(a);
        o = find_opt(opts, nopts, a, len);
        if (!o) {
            fprintf(stderr, "%s: unknown flag '%.*s' (see %s --help)\n", cmd, (int)len, a, cmd);
            return ARGS_ERROR;
        }
        if (o->kind == ARGS_FLAG) {
            if (eq) {
                fprintf(stderr, "%s: %s takes no value\n", cmd, o->name);
                return ARGS_ERROR;
            }
            *(int *)o->dest = 1;
        } else {
            const char *value;
            if (eq) {
                value = eq + 1;
            } else {
                if (i + 1 >= argc) {
                    fprintf(stderr, "%s: %s needs a value (%s)\n", cmd, o->name,
                            o->metavar ? o->metavar : "VALUE");
                    return ARGS_ERROR;
                }
                value = argv[++i];
            }
            if (store_value(cmd, o, value) != ARGS_OK)
                return ARGS_ERROR;
        }
        o->seen = 1;
    }
    return ARGS_OK;
}

int args_seen(const args_opt *opts, int nopts, const char *name)
{
    for (int i = 0; i < nopts; i++)
        if (strcmp(opts[i].name, name) == 0)
            return opts[i].seen;
    return 0;
}

void args_print_options(FILE *f, const args_opt *opts, int nopts)
{
    for (int i = 0; i < nopts; i++) {
        const args_opt *o = &opts[i];
        char left[64];
        const char *mv = o->kind == ARGS_FLAG ? "" : (o->metavar ? o->metavar : "VALUE");
        if (o->kind == ARGS_CHOICE && !o->metavar)
            mv = o->choices;
        snprintf(left, sizeof left, "%s%s%s", o->name, *mv ? " " : "", mv);
        if (strlen(left) > 24)
            fprintf(f, "  %s\n  %-24s %s\n", left, "", o->help);
        else
            fprintf(f, "  %-24s %s\n", left, o->help);
    }
    fprintf(f, "  %-24s %s\n", "-h, --help", "this help");
}

int args_parse_i64_list(const char *cmd, const char *flag, const char *s, int64_t *out, int cap)
{
    int count = 0;
    const char *p = s;
    if (!s || !*s) {
        fprintf(stderr, "%s: %s: empty list\n", cmd, flag);
        return -1;
    }
    while (*p) {
        char item[64];
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n == 0 || n >= sizeof item) {
            fprintf(stderr, "%s: %s: bad element in '%s'\n", cmd, flag, s);
            return -1;
        }
        if (count >= cap) {
            fprintf(stderr, "%s: %s: at most %d values\n", cmd, flag, cap);
            return -1;
        }
        memcpy(item, p, n);
        item[n] = '\0';
        if (args_parse_i64(item, &out[count]) != 0) {
            fprintf(stderr, "%s: %s: '%s' is not an integer\n", cmd, flag, item);
            return -1;
        }
        count++;
        if (!comma)
            break;
        p = comma + 1;
        if (!*p) {
            fprintf(stderr, "%s: %s: trailing comma in '%s'\n", cmd, flag, s);
            return -1;
        }
    }
    return count;
}

int args_split_names(const char *cmd, const char *flag, const char *s, char (*out)[64], int cap)
{
    int count = 0;
    const char *p = s;
    if (!s || !*s) {
        fprintf(stderr, "%s: %s: empty list\n", cmd, flag);
        return -1;
    }
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n == 0 || n >= 64) {
            fprintf(stderr, "%s: %s: bad element in '%s'\n", cmd, flag, s);
            return -1;
        }
        if (count >= cap) {
            fprintf(stderr, "%s: %s: at most %d names\n", cmd, flag, cap);
            return -1;
        }
        memcpy(out[count], p, n);
        out[count][n] = '\0';
        count++;
        if (!comma)
            break;
        p = comma + 1;
    }
    return count;
}
