/*
 * Dense-attention baselines for nsa bench --baseline: the JSON lines that
 * tools/dense_baseline.py prints, one object per line, e.g.
 *   {"baseline": "torch-sdpa-cudnn", "T": 65536, "hq": 64, "hkv": 4, "dqk": 128, "dv": 128, "fwd_ms": 115.2}
 * Read as untrusted input: lines are bounded, unknown keys ignored, a line
 * without a name, T and a positive fwd_ms (an "error" record) is skipped.
 */
#ifndef NSA_TOOLS_BASELINE_FILE_H
#define NSA_TOOLS_BASELINE_FILE_H

#include <stddef.h>
#include <stdint.h>

#define BASELINE_MAX 256

typedef struct baseline_rec {
    char name[64];
    int64_t T, hq, hkv, dqk, dv; /* -1 where the line does not say */
    double ms;
} baseline_rec;

/* Reads up to BASELINE_MAX records from path into recs (*n of them). Returns 0,
 * or -1 with a message (file unreadable, a line longer than 4096 bytes, a
 * value out of range). */
int baseline_read(const char *path, baseline_rec *recs, int *n, char *err, size_t err_size);

#endif
