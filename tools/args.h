/*
 * A small command-line flag parser shared by the nsa subcommands.
 *
 * Each subcommand describes its flags in a table of args_opt and calls
 * args_parse(). Flags are long options only: "--name value" or "--name=value";
 * "-h" and "--help" ask for help. A flag of kind ARGS_FLAG takes no value.
 * Positional arguments are refused. Every error prints one line naming the flag
 * and what was wrong to stderr; the caller then exits with code 2.
 */
#ifndef NSA_TOOLS_ARGS_H
#define NSA_TOOLS_ARGS_H

#include <stdint.h>
#include <stdio.h>

typedef enum args_kind {
    ARGS_FLAG = 0,   /* dest: int*, set to 1 */
    ARGS_INT64 = 1,  /* dest: int64_t*; accepts 4096, 4k (x1024), 1m (x1048576) */
    ARGS_DOUBLE = 2, /* dest: double* */
    ARGS_STRING = 3, /* dest: const char ** (points into argv) */
    ARGS_CHOICE = 4  /* dest: int*, index into the '|'-separated `choices` */
} args_kind;

typedef struct args_opt {
    const char *name;    /* "--hq" */
    args_kind kind;
    void *dest;
    const char *choices; /* ARGS_CHOICE only: "f32|f16|bf16" */
    const char *metavar; /* shown in help: "N", "LIST", "DIR" */
    const char *help;
    int seen;            /* set to 1 by args_parse when the flag was given */
} args_opt;

enum { ARGS_OK = 0, ARGS_HELP = 1, ARGS_ERROR = 2 };

/* Parses argv[first .. argc-1]. cmd names the subcommand in messages
 * ("nsa run"). Returns ARGS_OK, ARGS_HELP (-h/--help seen) or ARGS_ERROR. */
int args_parse(const char *cmd, args_opt *opts, int nopts, int argc, char **argv, int first);

/* Prints the option table (name, metavar, help; choices for ARGS_CHOICE). */
void args_print_options(FILE *f, const args_opt *opts, int nopts);

/* 1 if the flag called name was given on the command line. */
int args_seen(const args_opt *opts, int nopts, const char *name);

/* Parses one integer with the same rules as ARGS_INT64 (k/m suffixes).
 * Returns 0 on success. */
int args_parse_i64(const char *s, int64_t *out);

/* Parses "a,b,c" into at most cap integers; returns the count, or -1 on a bad
 * element or too many (a message naming flag is printed). */
int args_parse_i64_list(const char *cmd, const char *flag, const char *s, int64_t *out, int cap);

/* Splits "a,b,c" into at most cap names of at most 63 characters; returns the
 * count or -1 (message printed). Empty elements are refused. */
int args_split_names(const char *cmd, const char *flag, const char *s, char (*out)[64], int cap);

/* Index of name in a '|'-separated list of choices, or -1. */
int args_choice_index(const char *choices, const char *name);

#endif /* NSA_TOOLS_ARGS_H */
