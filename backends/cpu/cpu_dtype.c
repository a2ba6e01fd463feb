/*
 * Row loads, dot products, axpys and stores over f32 / f16 / bf16 / f64 rows, with
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
    case NSA_DTYPE_F64:
        memcpy(out, (const double *)base + off, (size_t)n * sizeof(double));
        break;
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
    case NSA_DTYPE_F64: {
        const double *p = (const double *)base + off;
        for (int64_t i = 0; i < n; i++)
            acc[i] += a * p[i];
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
    case NSA_DTYPE_F64:
        memcpy((double *)base + off, x, (size_t)n * sizeof(double));
        break;
    default:
        break;
    }
}

nsa_status nsa_cpu_need_float(const nsa_bk_args *a, const nsa_bk_tensor *t, const char *stage, const char *name,
                              int optional, nsa_status wrong)
{
    const nsa_dtype want = nsa_bk_float_dtype(a->plan->cfg.dtype);
    if (optional && !t->buf)
        return NSA_SUCCESS;
    if (!t->buf)
        return nsa_cpu_host()->set_error(NSA_ERR_MISSING_TENSOR, "cpu backend: stage %s needs tensor %s", stage,
                                         name);
    if (t->dtype != want)
        return nsa_cpu_host()->set_error(wrong, "cpu backend: stage %s: tensor %s is %s, a %s call's must be %s",
                                         stage, name, nsa_dtype_name(t->dtype), nsa_dtype_name(a->plan->cfg.dtype),
                                         nsa_dtype_name(want));
    return NSA_SUCCESS;
}
