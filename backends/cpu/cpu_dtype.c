/*
 * Row loads, dot products, axpys and stores over f32 / f16 / bf16 rows, with
 * the dtype switch hoisted out of the element loop (see cpu_dtype.h for the
 * rounding rules). Sums run in ascending element order, in double.
 */
#include "cpu_dtype.h"

void nsa_cpu_load_row(const void *base, nsa_dtype dt, int64_t off, int64_t n, double *out)
{
    switch (dt) {
    case NSA_DTYPE_F32: {
        const float *p = (const float *)base + off;
        for (int64_t i = 0; i < n; i++)
            out[i] = p[i];
        break;
    }
    case NSA_DTYPE_F16: {
        const uint16_t *p = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            out[i] = nsa_cpu_f16_to_f32(p[i]);
        break;
    }
    case NSA_DTYPE_BF16: {
        const uint16_t *p = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            out[i] = nsa_cpu_bf16_to_f32(p[i]);
        break;
    }
    default: /* unreachable: stages check dtypes first */
        for (int64_t i = 0; i < n; i++)
            out[i] = 0.0;
        break;
    }
}

void nsa_cpu_axpy_row(double a, const void *base, nsa_dtype dt, int64_t off, int64_t n, double *acc)
{
    switch (dt) {
    case NSA_DTYPE_F32: {
        const float *p = (const float *)base + off;
        for (int64_t i = 0; i < n; i++)
            acc[i] += a * (double)p[i];
        break;
    }
    case NSA_DTYPE_F16: {
        const uint16_t *p = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            acc[i] += a * (double)nsa_cpu_f16_to_f32(p[i]);
        break;
    }
    case NSA_DTYPE_BF16: {
        const uint16_t *p = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            acc[i] += a * (double)nsa_cpu_bf16_to_f32(p[i]);
        break;
    }
    default:
        break;
    }
}

void nsa_cpu_store_row(const double *x, void *base, nsa_dtype dt, int64_t off, int64_t n)
{
    switch (dt) {
    case NSA_DTYPE_F32: {
        float *p = (float *)base + off;
        for (int64_t i = 0; i < n; i++)
            p[i] = (float)x[i];
        break;
    }
    case NSA_DTYPE_F16: {
        uint16_t *p = (uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            p[i] = nsa_cpu_f64_to_f16(x[i]);
        break;
    }
    case NSA_DTYPE_BF16: {
        uint16_t *p = (uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            p[i] = nsa_cpu_f64_to_bf16(x[i]);
        break;
    }
    default:
        break;
    }
}
