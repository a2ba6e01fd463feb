/* Problem-description flags shared by nsa run and nsa bench (see config_flags.h). */
#include "config_flags.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "checked.h"
#include "tool.h"

const char *const compress_choices = "mean|linear|external";
const char *const dtype_choices = "f32|f16|bf16|f64";

const char config_flags_help[] =
    "problem (defaults: the paper's configuration, nsa_config_init):\n"
    "  Hq query heads, Hkv key/value heads (Hq % Hkv == 0), Dqk/Dv head dims,\n"
    "  l/d compression block length/stride, l_s selection block, n selected blocks\n"
    "  (0: branch off), n_init/n_local forced blocks, w window (0: branch off),\n"
    "  scale 0 = 1/sqrt(Dqk). Inputs are drawn by the testkit from --seed with\n"
    "  libnsa's portable generator (the same numbers on every machine).\n";

nsa_dtype config_flags_dtype(int index)
{
    return index == 0 ? NSA_DTYPE_F32 : index == 1 ? NSA_DTYPE_F16 : index == 3 ? NSA_DTYPE_F64 : NSA_DTYPE_BF16;
}

void config_flags_defaults(config_flags *f)
{
    nsa_config cfg;
    memset(f, 0, sizeof *f);
    nsa_config_init(&cfg);
    f->T = 0;
    f->batch = 1;
    f->seqlens = NULL;
    f->hq = cfg.num_q_heads;
    f->hkv = cfg.num_kv_heads;
    f->dqk = cfg.head_dim_qk;
    f->dv = cfg.head_dim_v;
    f->l = cfg.cmp_block;
    f->d = cfg.cmp_stride;
    f->ls = cfg.slc_block;
    f->n = cfg.num_selected;
    f->n_init = cfg.num_init;
    f->n_local = cfg.num_local;
    f->w = cfg.window;
    f->scale = cfg.scale;
    f->compress = (int)cfg.compress;
    f->dtype = cfg.dtype == NSA_DTYPE_F32 ? 0 : cfg.dtype == NSA_DTYPE_F16 ? 1 : cfg.dtype == NSA_DTYPE_F64 ? 3 : 2;
    f->seed = 1;
}

int config_flags_options(config_flags *f, args_opt *o, int with_T)
{
    int k = 0;
#define OPT(name, kind, dest, ch, mv, help) o[k++] = (args_opt){name, kind, dest, ch, mv, help, 0}
    if (with_T) {
        OPT("--T", ARGS_INT64, &f->T, NULL, "N", "tokens per sequence (default: sized for the backend)");
        OPT("--batch", ARGS_INT64, &f->batch, NULL, "B", "sequences of T tokens each (default 1)");
        OPT("--seqlens", ARGS_STRING, &f->seqlens, NULL, "A,B,..",
            "explicit sequence lengths (at most 8; overrides --T/--batch)");
    }
    OPT("--hq", ARGS_INT64, &f->hq, NULL, "N", "query heads Hq (64)");
    OPT("--hkv", ARGS_INT64, &f->hkv, NULL, "N", "key/value heads Hkv (4)");
    OPT("--dqk", ARGS_INT64, &f->dqk, NULL, "N", "query/key head dim Dqk (192)");
    OPT("--dv", ARGS_INT64, &f->dv, NULL, "N", "value head dim Dv (128)");
    OPT("--l", ARGS_INT64, &f->l, NULL, "N", "compression block length l (32)");
    OPT("--d", ARGS_INT64, &f->d, NULL, "N", "compression stride d (16)");
    OPT("--ls", ARGS_INT64, &f->ls, NULL, "N", "selection block length l_s (64)");
    OPT("--n", ARGS_INT64, &f->n, NULL, "N", "selected blocks n (16; 0 = branch off)");
    OPT("--n-init", ARGS_INT64, &f->n_init, NULL, "N", "forced initial blocks (1)");
    OPT("--n-local", ARGS_INT64, &f->n_local, NULL, "N", "forced local blocks (2)");
    OPT("--w", ARGS_INT64, &f->w, NULL, "N", "sliding window w (512; 0 = branch off)");
    OPT("--scale", ARGS_DOUBLE, &f->scale, NULL, "X", "softmax scale (0 = 1/sqrt(Dqk); else a normal float)");
    OPT("--compress", ARGS_CHOICE, &f->compress, compress_choices, NULL,
        "compression: mean | linear (random W, pe) | external (random kc, vc)");
    OPT("--dtype", ARGS_CHOICE, &f->dtype, dtype_choices, NULL, "q/k/v/o dtype (bf16)");
    OPT("--seed", ARGS_INT64, &f->seed, NULL, "S", "input seed (1)");
#undef OPT
    return k;
}

int config_flags_lengths(const char *cmd, const config_flags *f, int64_t T, int64_t *lens, int cap)
{
    int count;
    if (f->seqlens) {
        count = args_parse_i64_list(cmd, "--seqlens", f->seqlens, lens, cap);
        if (count < 0)
            return -1;
    } else {
        if (f->batch < 1 || f->batch > cap) {
            fprintf(stderr, "%s: --batch must be 1 .. %d, got %lld\n", cmd, cap, (long long)f->batch);
            return -1;
        }
        count = (int)f->batch;
        for (int i = 0; i < count; i++)
            lens[i] = T;
    }
    for (int i = 0; i < count; i++)
        if (lens[i] < 0) {
            fprintf(stderr, "%s: sequence lengths must be >= 0, got %lld\n", cmd, (long long)lens[i]);
            return -1;
        }
    return count;
}

/* Every tensor the tools hold for case c (as f32 on the host, and on the
 * device) must have a byte count that fits 64 bits: checked before anything
 * is drawn or allocated. tflags names the flags that set the token count. */
static int check_sizes(const char *cmd, const tk_case *c, const char *tflags)
{
    const nsa_config *g = &c->cfg;
    const int64_t T = tk_case_tokens(c), hq = g->num_q_heads, hkv = g->num_kv_heads;
    const int64_t dqk = g->head_dim_qk, dv = g->head_dim_v, l = g->cmp_block, n = g->num_selected;
    const int linear = g->compress == NSA_COMPRESS_LINEAR, external = g->compress == NSA_COMPRESS_EXTERNAL;
    const int64_t nc = external ? tk_case_total_cmp(c) : 0;
    const struct {
        const char *tensor, *flags;
        int64_t dims[4];
        int used;
    } t[] = {
        {"q [T, Hq, Dqk]", "--hq, --dqk", {T, hq, dqk, 1}, 1},
        {"k [T, Hkv, Dqk]", "--hkv, --dqk", {T, hkv, dqk, 1}, 1},
        {"v [T, Hkv, Dv]", "--hkv, --dv", {T, hkv, dv, 1}, 1},
        {"o [T, Hq, Dv]", "--hq, --dv", {T, hq, dv, 1}, 1},
        {"selected [T, Hkv, n]", "--hkv, --n", {T, hkv, n, 1}, 1},
        {"w_k [Hkv, l, Dqk, Dqk]", "--hkv, --l, --dqk", {hkv, l, dqk, dqk}, linear},
        {"w_v [Hkv, l, Dv, Dv]", "--hkv, --l, --dv", {hkv, l, dv, dv}, linear},
        {"kc [Nc, Hkv, Dqk]", "--hkv, --dqk, --l, --d", {nc, hkv, dqk, 1}, external},
        {"vc [Nc, Hkv, Dv]", "--hkv, --dv, --l, --d", {nc, hkv, dv, 1}, external},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int64_t count;
        size_t bytes;
        if (t[i].used && (nsa_ck_prod(t[i].dims, 4, &count) || nsa_ck_bytes(count, sizeof(float), &bytes))) {
            fprintf(stderr,
                    "%s: %s would need more than 2^63 bytes with %lld tokens (%s) and %s as given: "
                    "make them smaller\n",
                    cmd, t[i].tensor, (long long)T, tflags, t[i].flags);
            return TOOL_EXIT_USAGE;
        }
    }
    return 0;
}

int config_flags_case(const char *cmd, const config_flags *f, const int64_t *lens, int64_t batch,
                      tk_case *c)
{
    nsa_status s;
    memset(c, 0, sizeof *c);
    snprintf(c->label, sizeof c->label, "%s", "run");
    nsa_config_init(&c->cfg);
    c->cfg.num_q_heads = f->hq;
    c->cfg.num_kv_heads = f->hkv;
    c->cfg.head_dim_qk = f->dqk;
    c->cfg.head_dim_v = f->dv;
    c->cfg.cmp_block = f->l;
    c->cfg.cmp_stride = f->d;
    c->cfg.slc_block = f->ls;
    c->cfg.num_selected = f->n;
    c->cfg.num_init = f->n_init;
    c->cfg.num_local = f->n_local;
    c->cfg.window = f->w;
    c->cfg.scale = (float)f->scale;
    /* a positive (or negative) scale that rounds to 0 or to a subnormal float
     * would silently become the default 1/sqrt(Dqk), or lose its precision */
    if (f->scale != 0.0 && isfinite(c->cfg.scale) && !isnormal(c->cfg.scale)) {
        fprintf(stderr,
                "%s: --scale %g is not a normal float (its magnitude must be at least %g, or 0 for "
                "1/sqrt(Dqk))\n",
                cmd, f->scale, (double)FLT_MIN);
        return TOOL_EXIT_USAGE;
    }
    c->cfg.compress = (nsa_compress_mode)f->compress;
    c->cfg.dtype = config_flags_dtype(f->dtype);
    s = nsa_config_validate(&c->cfg);
    if (s != NSA_SUCCESS) {
        fprintf(stderr, "%s: invalid configuration: %s: %s\n", cmd, nsa_status_string(s),
                nsa_last_error());
        return TOOL_EXIT_USAGE;
    }
    if (batch < 1 || batch > TK_MAX_BATCH) {
        fprintf(stderr, "%s: 1 .. %d sequences are supported, got %lld\n", cmd, TK_MAX_BATCH,
                (long long)batch);
        return TOOL_EXIT_USAGE;
    }
    c->batch = batch;
    c->cu_seqlens[0] = 0;
    for (int64_t b = 0; b < batch; b++)
        if (lens[b] < 0 || nsa_ck_add(c->cu_seqlens[b], lens[b], &c->cu_seqlens[b + 1])) {
            fprintf(stderr, "%s: %s: the sequence lengths must be >= 0 and add up to at most 2^63 - 1\n", cmd,
                    f->seqlens ? "--seqlens" : "--T x --batch");
            return TOOL_EXIT_USAGE;
        }
    if (check_sizes(cmd, c, f->seqlens ? "--seqlens" : "--T x --batch"))
        return TOOL_EXIT_USAGE;
    c->seed = (uint64_t)f->seed;
    c->fixed_indices = 0;
    c->use_pe = f->compress == NSA_COMPRESS_LINEAR;
    c->layout = TK_LAYOUT_DENSE;
    return 0;
}
