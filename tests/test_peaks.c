/*
 * test_peaks.c -- the built-in peak table of `nsa bench` (tools/peaks.c):
 * the most specific entry wins, the dtype picks the matrix or fp32 figure,
 * and an unknown device leaves the caller's values alone.
 */
#include <stdio.h>
#include <string.h>

#include "peaks.h"

static int failures;

static void expect(const char *device, nsa_dtype dt, int found, double tf, double gb, const char *label)
{
    double t = -1, g = -1;
    const char *l = NULL;
    int r = tool_known_peak(device, dt, &t, &g, &l);
    if (r != found || (found && (t != tf || g != gb || strcmp(l, label) != 0)) || (!found && (t != -1 || g != -1))) {
        printf("FAIL %s (dtype %d): got found=%d %g TFLOP/s %g GB/s (%s), want found=%d %g %g (%s)\n", device,
               (int)dt, r, t, g, l ? l : "-", found, tf, gb, label ? label : "-");
        failures++;
    }
}

int main(void)
{
    expect("NVIDIA H200", NSA_DTYPE_BF16, 1, 989.4, 4800.0, "H200");
    expect("NVIDIA H200", NSA_DTYPE_F32, 1, 66.9, 4800.0, "H200");
    expect("NVIDIA H100 PCIe", NSA_DTYPE_F16, 1, 756.0, 2000.0, "H100 PCIe");
    expect("NVIDIA H100 80GB HBM3", NSA_DTYPE_BF16, 1, 989.4, 3350.0, "H100");
    expect("NVIDIA A100-SXM4-80GB", NSA_DTYPE_BF16, 1, 312.0, 2039.0, "A100-SXM4-80GB");
    expect("NVIDIA A100-SXM4-40GB", NSA_DTYPE_BF16, 1, 312.0, 1555.0, "A100");
    expect("AMD Instinct MI300X", NSA_DTYPE_BF16, 1, 1307.4, 5300.0, "MI300X");
    expect("pthreads x2", NSA_DTYPE_BF16, 0, 0, 0, NULL);
    expect("Portable Computing Language", NSA_DTYPE_F32, 0, 0, 0, NULL);
    expect(NULL, NSA_DTYPE_F32, 0, 0, 0, NULL);
    if (failures) return 1;
    printf("peaks: 10 lookups as expected\n");
    return 0;
}
