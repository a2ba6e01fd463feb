/* The config: paper defaults and validation (every rule an input can break). */
#include <math.h>

#include "internal.h"

/* Upper bounds keep every product of sizes far from int64 overflow; they are
 * well beyond any model (a backend may still say NSA_ERR_UNSUPPORTED). */
#define MAX_HEADS (1 << 16)
#define MAX_DIM (1 << 14)
#define MAX_BLOCK (1 << 20)

static const nsa_config paper_defaults = {
    .num_q_heads = 64, .num_kv_heads = 4, .head_dim_qk = 192, .head_dim_v = 128,
    .cmp_block = 32, .cmp_stride = 16, .slc_block = 64, .num_selected = 16,
    .num_init = 1, .num_local = 2, .window = 512, .scale = 0.0f,
    .compress = NSA_COMPRESS_MEAN, .dtype = NSA_DTYPE_BF16,
};

nsa_status nsa_config_init_sized(nsa_config *cfg, size_t cfg_size)
{
    nsa_clear_error();
    if (!cfg)
        return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_config_init: cfg is NULL");
    /* the caller's whole struct: defaults for what this library knows, zero past it */
    return nsa_struct_out(cfg, cfg_size, NSA_CONFIG_SIZE_FIRST, &paper_defaults, sizeof paper_defaults,
                          "nsa_config_init", "cfg");
}

nsa_status (nsa_config_init)(nsa_config *cfg) { return nsa_config_init_sized(cfg, NSA_CONFIG_SIZE_FIRST); }

nsa_status nsa_config_take(const nsa_config *cfg, size_t cfg_size, nsa_config *out, const char *fn)
{
    *out = paper_defaults;
    return nsa_struct_in(out, sizeof *out, NSA_CONFIG_SIZE_FIRST, cfg, cfg_size, fn, "cfg");
}

static nsa_status check_range(const char *what, const char *field, int64_t v, int64_t lo, int64_t hi)
{
    if (v < lo || v > hi)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "%s: cfg->%s = %lld is out of range: it must be in [%lld, %lld]",
                             what, field, (long long)v, (long long)lo, (long long)hi);
    return NSA_SUCCESS;
}

nsa_status nsa_config_check(const nsa_config *c, const char *what)
{
    nsa_status s;
#define RANGE(f, lo, hi) \
    if ((s = check_range(what, #f, c->f, lo, hi)) != NSA_SUCCESS) return s
    RANGE(num_q_heads, 1, MAX_HEADS);
    RANGE(num_kv_heads, 1, MAX_HEADS);
    RANGE(head_dim_qk, 1, MAX_DIM);
    RANGE(head_dim_v, 1, MAX_DIM);
    RANGE(cmp_block, 1, MAX_BLOCK);
    RANGE(cmp_stride, 1, MAX_BLOCK);
    RANGE(slc_block, 1, MAX_BLOCK);
    RANGE(num_selected, 0, MAX_BLOCK);
    RANGE(num_init, 0, MAX_BLOCK);
    RANGE(num_local, 0, MAX_BLOCK);
    RANGE(window, 0, INT64_C(1) << 40);
#undef RANGE
    if (!isfinite(c->scale) || c->scale < 0.0f)
        return nsa_set_error(NSA_ERR_INVALID_VALUE,
                             "%s: cfg->scale = %g must be finite and >= 0 (0 selects 1/sqrt(head_dim_qk))",
                             what, (double)c->scale);
    if ((int)c->compress < NSA_COMPRESS_MEAN || (int)c->compress > NSA_COMPRESS_EXTERNAL)
        return nsa_set_error(NSA_ERR_INVALID_VALUE,
                             "%s: cfg->compress = %d is not a compression mode (MEAN=0, LINEAR=1, EXTERNAL=2)",
                             what, (int)c->compress);
    if (c->dtype != NSA_DTYPE_F32 && c->dtype != NSA_DTYPE_F16 && c->dtype != NSA_DTYPE_BF16 &&
        c->dtype != NSA_DTYPE_F64)
        return nsa_set_error(NSA_ERR_INVALID_DTYPE,
                             "%s: cfg->dtype = %d must be NSA_DTYPE_F32, NSA_DTYPE_F16, NSA_DTYPE_BF16 or "
                             "NSA_DTYPE_F64 (NSA_DTYPE_I32 is for block indices only)",
                             what, (int)c->dtype);
    if (c->num_q_heads % c->num_kv_heads != 0)
        return nsa_set_error(NSA_ERR_INVALID_CONFIG,
                             "%s: cfg->num_q_heads = %lld is not a multiple of cfg->num_kv_heads = %lld "
                             "(each KV head serves G = Hq / Hkv query heads)",
                             what, (long long)c->num_q_heads, (long long)c->num_kv_heads);
    if (c->cmp_block % c->cmp_stride != 0)
        return nsa_set_error(NSA_ERR_INVALID_CONFIG,
                             "%s: cfg->cmp_stride = %lld does not divide cfg->cmp_block = %lld (d must divide l)",
                             what, (long long)c->cmp_stride, (long long)c->cmp_block);
    if (c->slc_block % c->cmp_stride != 0)
        return nsa_set_error(NSA_ERR_INVALID_CONFIG,
                             "%s: cfg->cmp_stride = %lld does not divide cfg->slc_block = %lld (d must divide l_s)",
                             what, (long long)c->cmp_stride, (long long)c->slc_block);
    if (c->cmp_block > c->slc_block)
        return nsa_set_error(NSA_ERR_INVALID_CONFIG,
                             "%s: cfg->cmp_block = %lld exceeds cfg->slc_block = %lld (l <= l_s is required)",
                             what, (long long)c->cmp_block, (long long)c->slc_block);
    if (c->flags & ~NSA_CONFIG_TRAINING)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "%s: cfg->flags = 0x%llx has unknown bits (known: "
                             "NSA_CONFIG_TRAINING = 0x1)", what, (unsigned long long)c->flags);
    if (c->num_selected > 0 && c->num_selected < c->num_init + c->num_local)
        return nsa_set_error(NSA_ERR_INVALID_CONFIG,
                             "%s: cfg->num_selected = %lld is less than cfg->num_init + cfg->num_local = %lld + %lld "
                             "(forced blocks count inside n; use n = 0 to turn the selected branch off)",
                             what, (long long)c->num_selected, (long long)c->num_init, (long long)c->num_local);
    return NSA_SUCCESS;
}

nsa_status (nsa_config_validate)(const nsa_config *cfg)
{
    return nsa_config_validate_sized(cfg, NSA_CONFIG_SIZE_FIRST);
}

nsa_status nsa_config_validate_sized(const nsa_config *cfg, size_t cfg_size)
{
    nsa_clear_error();
    if (!cfg)
        return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_config_validate: cfg is NULL");
    nsa_config c;
    nsa_status s = nsa_config_take(cfg, cfg_size, &c, "nsa_config_validate");
    return s != NSA_SUCCESS ? s : nsa_config_check(&c, "nsa_config_validate");
}
