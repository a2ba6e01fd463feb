/*
 * peaks.c -- vendor spec-sheet peaks (dense, no structured sparsity, boost
 * clock) of the GPUs libnsa is measured on or most often asked about. They are
 * the ceiling `nsa bench` reports against; --peak-tflops / --peak-gbps override.
 */
#include "peaks.h"

#include <string.h>

typedef struct peak_entry {
    const char *match;  /* substring of the device name */
    double tf16, tf32;  /* TFLOP/s: f16/bf16 matrix, fp32 */
    double gbps;
} peak_entry;

/* Most specific first: "H100 PCIe" must win over "H100". */
static const peak_entry table[] = {
    {"H200", 989.4, 66.9, 4800.0},
    {"H100 NVL", 835.0, 60.0, 3900.0},
    {"H100 PCIe", 756.0, 51.2, 2000.0},
    {"H100", 989.4, 66.9, 3350.0},
    {"A100-SXM4-80GB", 312.0, 19.5, 2039.0},
    {"A100 80GB PCIe", 312.0, 19.5, 1935.0},
    {"A100", 312.0, 19.5, 1555.0},
    {"L40S", 362.1, 91.6, 864.0},
    {"MI300X", 1307.4, 163.4, 5300.0},
    {"MI250X", 383.0, 47.9, 3276.8},
};

int tool_known_peak(const char *device, nsa_dtype dtype, double *tflops, double *gbps, const char **label)
{
    if (!device) return 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strstr(device, table[i].match)) {
            *tflops = dtype == NSA_DTYPE_F32 ? table[i].tf32 : table[i].tf16;
            *gbps = table[i].gbps;
            *label = table[i].match;
            return 1;
        }
    return 0;
}
