/*
 * peaks.h -- published peak throughput of common GPUs, so that `nsa bench`
 * can print its figures as a fraction of the device's peak without flags.
 */
#ifndef NSA_TOOLS_PEAKS_H
#define NSA_TOOLS_PEAKS_H

#include <nsa.h>

/* Looks the device name up (substring match, most specific entry first). On a
 * match sets *tflops (dense, for the dtype: 16-bit matrix units for f16/bf16,
 * plain fp32 for f32), *gbps (memory bandwidth) and *label (the entry's name)
 * and returns 1; else returns 0 and leaves them alone. */
int tool_known_peak(const char *device, nsa_dtype dtype, double *tflops, double *gbps, const char **label);

#endif
