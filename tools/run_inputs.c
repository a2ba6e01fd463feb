/* .npy inputs and outputs of nsa run (see run_inputs.h for names and shapes). */
#include "run_inputs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "npy.h"
#include "tool.h"

static const char *const branch_name[3] = {"cmp", "slc", "win"};

/* 1 when dir has an entry of that name, whatever it is: a dangling symlink or
 * an unreadable file is there (and reading it then fails with a message), not
 * absent, so that a broken input is never silently replaced by a drawn one. */
static int file_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 || errno != ENOENT;
}

static void path_of(char *buf, size_t size, const char *dir, const char *name)
{
    snprintf(buf, size, "%s/%s.npy", dir, name);
}

static void append(char *list, size_t size, const char *name)
{
    size_t used = strlen(list);
    if (used + strlen(name) + 2 < size)
        snprintf(list + used, size - used, "%s%s", used ? "," : "", name);
}

int run_inputs_shape(const char *cmd, const char *dir, int64_t *T, int64_t *hq, int64_t *dqk,
                     int64_t *hkv, int64_t *dv)
{
    char path[4096], err[1024];
    npy_array a;
    const char *kname[] = {"k", "k_cmp", "k_slc", "k_win"};
    const char *vname[] = {"v", "v_cmp", "v_slc", "v_win"};
    struct stat st;
    *T = *hq = *dqk = *hkv = *dv = -1;
    if (stat(dir, &st) != 0) {
        fprintf(stderr, "%s: --inputs %s: %s\n", cmd, dir, strerror(errno));
        return TOOL_EXIT_USAGE;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: --inputs %s: not a directory\n", cmd, dir);
        return TOOL_EXIT_USAGE;
    }
    path_of(path, sizeof path, dir, "q");
    if (file_exists(path)) {
        if (npy_read_header(path, &a, err, sizeof err) != 0) {
            fprintf(stderr, "%s: %s\n", cmd, err);
            return TOOL_EXIT_USAGE;
        }
        if (a.ndim != 3) {
            fprintf(stderr, "%s: %s: expected 3 dimensions [T, Hq, Dqk], got %d\n", cmd, path, a.ndim);
            return TOOL_EXIT_USAGE;
        }
        *T = a.shape[0];
        *hq = a.shape[1];
        *dqk = a.shape[2];
    }
    for (int i = 0; i < 4; i++) {
        path_of(path, sizeof path, dir, kname[i]);
        if (file_exists(path) && npy_read_header(path, &a, err, sizeof err) == 0 && a.ndim == 3) {
            *hkv = a.shape[1];
            break;
        }
    }
    for (int i = 0; i < 4; i++) {
        path_of(path, sizeof path, dir, vname[i]);
        if (file_exists(path) && npy_read_header(path, &a, err, sizeof err) == 0 && a.ndim == 3) {
            *dv = a.shape[2];
            break;
        }
    }
    return 0;
}

/* Reads path (which exists) after checking its header: the shape the flags
 * need and, floats != 0, a float type, else an integer type. Returns 0 with *a
 * read, or an exit code with a message. */
static int read_checked(const char *cmd, const char *path, int ndim, const int64_t *shape, int floats,
                        npy_array *a)
{
    char err[1024], want[256], got[256];
    if (npy_read_header(path, a, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        return TOOL_EXIT_FAIL;
    }
    if (a->ndim != ndim || memcmp(a->shape, shape, sizeof(int64_t) * (size_t)ndim) != 0) {
        fprintf(stderr, "%s: %s: shape %s does not match the flags, which need %s\n", cmd, path,
                npy_shape_string(a->ndim, a->shape, got, sizeof got),
                npy_shape_string(ndim, shape, want, sizeof want));
        return TOOL_EXIT_USAGE;
    }
    if (floats && a->type != NPY_F32 && a->type != NPY_F16 && a->type != NPY_BF16 && a->type != NPY_F64) {
        fprintf(stderr, "%s: %s: dtype %s; a float tensor must be <f4, <f2, <f8 or <u2 (bf16 bits)\n",
                cmd, path, npy_type_descr(a->type));
        return TOOL_EXIT_USAGE;
    }
    if (!floats && a->type != NPY_I32 && a->type != NPY_I64) {
        fprintf(stderr, "%s: %s: dtype %s; block indices must be <i4 or <i8\n", cmd, path,
                npy_type_descr(a->type));
        return TOOL_EXIT_USAGE;
    }
    if (npy_read(path, a, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        return TOOL_EXIT_FAIL;
    }
    return 0;
}

/* Reads dir/name.npy as floats rounded to dtype, checking its shape. Returns 0
 * (file absent: *out untouched, *found 0), or an exit code with a message.
 * Values are rounded once to dtype (from '<f8' too). The tool keeps its inputs as
 * f32 values, so an f64 run takes only values that are exact in f32 (every
 * '<f4', '<f2', '<u2' file; a '<f8' file whose values are): a '<f8' value that is
 * not is refused, never rounded behind the caller's back. */
static int load_floats(const char *cmd, const char *dir, const char *name, int ndim,
                       const int64_t *shape, nsa_dtype dtype, float **out, int *found)
{
    char path[4096];
    npy_array a;
    float *f;
    void *tmp;
    nsa_status s = NSA_SUCCESS;
    int rc;
    *found = 0;
    path_of(path, sizeof path, dir, name);
    if (!file_exists(path))
        return 0;
    if ((rc = read_checked(cmd, path, ndim, shape, 1, &a)) != 0)
        return rc;
    f = malloc(sizeof(float) * (size_t)(a.count ? a.count : 1));
    tmp = malloc(8 * (size_t)(a.count ? a.count : 1)); /* room for any dtype, f64 included */
    if (!f || !tmp) {
        free(f);
        free(tmp);
        npy_free(&a);
        fprintf(stderr, "%s: %s: out of memory\n", cmd, path);
        return TOOL_EXIT_FAIL;
    }
    if (a.count) {
        nsa_dtype src = a.type == NPY_F32   ? NSA_DTYPE_F32
                        : a.type == NPY_F16 ? NSA_DTYPE_F16
                        : a.type == NPY_F64 ? NSA_DTYPE_F64
                                            : NSA_DTYPE_BF16;
        if (dtype == NSA_DTYPE_F32 || dtype == NSA_DTYPE_F64) {
            s = nsa_convert(a.data, src, f, NSA_DTYPE_F32, a.count);
        } else { /* f16, bf16: one rounding from the file's values, then exact in f32 */
            s = nsa_convert(a.data, src, tmp, dtype, a.count);
            if (s == NSA_SUCCESS)
                s = nsa_convert(tmp, dtype, f, NSA_DTYPE_F32, a.count);
        }
        if (s == NSA_SUCCESS && dtype == NSA_DTYPE_F64 && src == NSA_DTYPE_F64) {
            const double *d = a.data;
            for (int64_t i = 0; i < a.count; i++)
                if ((double)f[i] != d[i] && !(d[i] != d[i])) {
                    fprintf(stderr,
                            "%s: %s: element %lld = %.17g is not exact in f32; the nsa tool keeps its inputs as "
                            "f32 values, so an f64 run takes <f8 files of f32 values (the Python package takes "
                            "any float64)\n",
                            cmd, path, (long long)i, d[i]);
                    free(f);
                    free(tmp);
                    npy_free(&a);
                    return TOOL_EXIT_USAGE;
                }
        }
    }
    free(tmp);
    npy_free(&a);
    if (s != NSA_SUCCESS) {
        free(f);
        tool_report(cmd, path, s);
        return TOOL_EXIT_FAIL;
    }
    *out = f;
    *found = 1;
    return 0;
}

static int load_indices(const char *cmd, const char *dir, const int64_t *shape, int32_t **out,
                        int *found)
{
    char path[4096];
    npy_array a;
    int32_t *idx;
    int rc;
    *found = 0;
    path_of(path, sizeof path, dir, "block_indices");
    if (!file_exists(path))
        return 0;
    if ((rc = read_checked(cmd, path, 3, shape, 0, &a)) != 0)
        return rc;
    idx = malloc(sizeof(int32_t) * (size_t)(a.count ? a.count : 1));
    if (!idx) {
        npy_free(&a);
        fprintf(stderr, "%s: %s: out of memory\n", cmd, path);
        return TOOL_EXIT_FAIL;
    }
    for (int64_t i = 0; i < a.count; i++) {
        int64_t v = a.type == NPY_I32 ? ((const int32_t *)a.data)[i] : ((const int64_t *)a.data)[i];
        if (v < -1 || v > INT32_MAX) {
            fprintf(stderr, "%s: %s: element %lld is %lld (block indices are -1 or >= 0)\n", cmd,
                    path, (long long)i, (long long)v);
            free(idx);
            npy_free(&a);
            return TOOL_EXIT_USAGE;
        }
        idx[i] = (int32_t)v;
    }
    npy_free(&a);
    *out = idx;
    *found = 1;
    return 0;
}

/* Gives k[1], k[2] (and v) their own copies so one branch can be replaced alone. */
static int unalias(float **x, int64_t n)
{
    for (int b = 1; b < 3; b++) {
        if (x[b] == x[0]) {
            float *copy = malloc(sizeof(float) * (size_t)(n ? n : 1));
            if (!copy)
                return -1;
            memcpy(copy, x[0], sizeof(float) * (size_t)n);
            x[b] = copy;
        }
    }
    return 0;
}

int run_inputs_load(const char *cmd, const char *dir, tk_case *c, tk_inputs *in, char *read,
                    size_t read_size, char *generated, size_t generated_size)
{
    const nsa_config *g = &c->cfg;
    const nsa_dtype dt = g->dtype;
    const int64_t T = in->tokens, Hq = g->num_q_heads, Hkv = g->num_kv_heads;
    const int64_t Dqk = g->head_dim_qk, Dv = g->head_dim_v, l = g->cmp_block, n = g->num_selected;
    const int on[3] = {1, n > 0, g->window > 0};
    float *f = NULL;
    int found, rc;
    read[0] = generated[0] = '\0';

#define LOAD(name, nd, ...)                                                                        \
    do {                                                                                           \
        const int64_t shp_[] = {__VA_ARGS__};                                                     \
        f = NULL;                                                                                  \
        rc = load_floats(cmd, dir, name, nd, shp_, dt_, &f, &found);                              \
        if (rc)                                                                                    \
            return rc;                                                                             \
    } while (0)
    nsa_dtype dt_ = dt;

    LOAD("q", 3, T, Hq, Dqk);
    if (found) {
        free(in->q);
        in->q = f;
        append(read, read_size, "q");
    } else {
        append(generated, generated_size, "q");
    }

    /* k, v: all branches, then per-branch overrides */
    for (int kv = 0; kv < 2; kv++) {
        float **x = kv == 0 ? in->k : in->v;
        const int64_t D = kv == 0 ? Dqk : Dv;
        const char *base = kv == 0 ? "k" : "v";
        int any_branch = 0, base_found, branch_found[3] = {0, 0, 0};
        LOAD(base, 3, T, Hkv, D);
        base_found = found;
        if (found) {
            for (int b = 0; b < 3; b++)
                if (b == 0 || x[b] != x[0])
                    free(x[b]);
            x[0] = x[1] = x[2] = f;
            append(read, read_size, base);
        }
        for (int b = 0; b < 3; b++) {
            char name[16];
            snprintf(name, sizeof name, "%s_%s", base, branch_name[b]);
            LOAD(name, 3, T, Hkv, D);
            if (!found)
                continue;
            if (unalias(x, T * Hkv * D) != 0) {
                free(f);
                fprintf(stderr, "%s: out of memory\n", cmd);
                return TOOL_EXIT_FAIL;
            }
            free(x[b]);
            x[b] = f;
            any_branch = branch_found[b] = 1;
            append(read, read_size, name);
        }
        if (!base_found && !any_branch) {
            append(generated, generated_size, base);
        } else if (!base_found) {
            for (int b = 0; b < 3; b++) {
                char name[16];
                snprintf(name, sizeof name, "%s_%s", base, branch_name[b]);
                if (!branch_found[b])
                    append(generated, generated_size, name);
            }
        }
    }

    dt_ = NSA_DTYPE_F32; /* gates are f32 */
    for (int b = 0; b < 3; b++) {
        char name[16];
        snprintf(name, sizeof name, "g_%s", branch_name[b]);
        LOAD(name, 2, T, Hq);
        if (found && !on[b]) {
            free(f);
            fprintf(stderr, "%s: note: %s/%s.npy ignored: the %s branch is off\n", cmd, dir, name,
                    branch_name[b]);
            continue;
        }
        if (found) {
            free(in->gate[b]);
            in->gate[b] = f;
            append(read, read_size, name);
        } else if (on[b]) {
            append(generated, generated_size, name);
        }
    }
    dt_ = dt;

    if (g->compress == NSA_COMPRESS_LINEAR) {
        int w_found = 0, pe_found = 0;
        LOAD("w_k", 4, Hkv, l, Dqk, Dqk);
        if (found) { free(in->w_k); in->w_k = f; w_found = 1; append(read, read_size, "w_k"); }
        else append(generated, generated_size, "w_k");
        LOAD("w_v", 4, Hkv, l, Dv, Dv);
        if (found) { free(in->w_v); in->w_v = f; w_found = 1; append(read, read_size, "w_v"); }
        else append(generated, generated_size, "w_v");
        LOAD("pe_k", 3, Hkv, l, Dqk);
        if (found) { free(in->pe_k); in->pe_k = f; pe_found = 1; append(read, read_size, "pe_k"); }
        LOAD("pe_v", 3, Hkv, l, Dv);
        if (found) { free(in->pe_v); in->pe_v = f; pe_found = 1; append(read, read_size, "pe_v"); }
        if (w_found && !pe_found) {
            /* weights from the user and no position encoding: use none */
            free(in->pe_k);
            free(in->pe_v);
            in->pe_k = in->pe_v = NULL;
            c->use_pe = 0;
        } else if (!pe_found && in->pe_k) {
            append(generated, generated_size, "pe_k,pe_v");
        }
    } else if (g->compress == NSA_COMPRESS_EXTERNAL) {
        LOAD("kc", 3, in->total_cmp, Hkv, Dqk);
        if (found) { free(in->kc); in->kc = f; append(read, read_size, "kc"); }
        else append(generated, generated_size, "kc");
        LOAD("vc", 3, in->total_cmp, Hkv, Dv);
        if (found) { free(in->vc); in->vc = f; append(read, read_size, "vc"); }
        else append(generated, generated_size, "vc");
    }
#undef LOAD

    if (n > 0) {
        const int64_t shp[3] = {T, Hkv, n};
        int32_t *idx = NULL;
        rc = load_indices(cmd, dir, shp, &idx, &found);
        if (rc)
            return rc;
        if (found) {
            free(in->given);
            in->given = idx;
            c->fixed_indices = 1;
            append(read, read_size, "block_indices");
        }
    }
    return 0;
}

static int write_one(const char *cmd, const char *dir, const char *name, npy_type type, int ndim,
                     const int64_t *shape, const void *data)
{
    char path[4096], err[1024];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    if (npy_write(path, type, ndim, shape, data, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        return TOOL_EXIT_FAIL;
    }
    return 0;
}

static int make_dir(const char *cmd, const char *dir)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "%s: cannot create %s: %s\n", cmd, dir, strerror(errno));
        return TOOL_EXIT_FAIL;
    }
    return 0;
}

int run_inputs_write(const char *cmd, const char *dir, const tk_case *c, const tk_inputs *in)
{
    const nsa_config *g = &c->cfg;
    const int64_t T = in->tokens, Hq = g->num_q_heads, Hkv = g->num_kv_heads;
    const int64_t Dqk = g->head_dim_qk, Dv = g->head_dim_v, l = g->cmp_block, n = g->num_selected;
    const int64_t sq[3] = {T, Hq, Dqk}, sk[3] = {T, Hkv, Dqk}, sv[3] = {T, Hkv, Dv};
    const int64_t sg[2] = {T, Hq}, swk[4] = {Hkv, l, Dqk, Dqk}, swv[4] = {Hkv, l, Dv, Dv};
    const int64_t spk[3] = {Hkv, l, Dqk}, spv[3] = {Hkv, l, Dv};
    const int64_t skc[3] = {in->total_cmp, Hkv, Dqk}, svc[3] = {in->total_cmp, Hkv, Dv};
    const int64_t si[3] = {T, Hkv, n};
    int shared_k = in->k[1] == in->k[0] && in->k[2] == in->k[0];
    int shared_v = in->v[1] == in->v[0] && in->v[2] == in->v[0];
    if (make_dir(cmd, dir))
        return TOOL_EXIT_FAIL;
    if (write_one(cmd, dir, "q", NPY_F32, 3, sq, in->q))
        return TOOL_EXIT_FAIL;
    for (int b = 0; b < 3; b++) {
        char name[16];
        if (shared_k) {
            if (b == 0 && write_one(cmd, dir, "k", NPY_F32, 3, sk, in->k[0]))
                return TOOL_EXIT_FAIL;
        } else {
            snprintf(name, sizeof name, "k_%s", branch_name[b]);
            if (write_one(cmd, dir, name, NPY_F32, 3, sk, in->k[b]))
                return TOOL_EXIT_FAIL;
        }
        if (shared_v) {
            if (b == 0 && write_one(cmd, dir, "v", NPY_F32, 3, sv, in->v[0]))
                return TOOL_EXIT_FAIL;
        } else {
            snprintf(name, sizeof name, "v_%s", branch_name[b]);
            if (write_one(cmd, dir, name, NPY_F32, 3, sv, in->v[b]))
                return TOOL_EXIT_FAIL;
        }
        snprintf(name, sizeof name, "g_%s", branch_name[b]);
        if (in->gate[b] && write_one(cmd, dir, name, NPY_F32, 2, sg, in->gate[b]))
            return TOOL_EXIT_FAIL;
    }
    if ((in->w_k && write_one(cmd, dir, "w_k", NPY_F32, 4, swk, in->w_k)) ||
        (in->w_v && write_one(cmd, dir, "w_v", NPY_F32, 4, swv, in->w_v)) ||
        (in->pe_k && write_one(cmd, dir, "pe_k", NPY_F32, 3, spk, in->pe_k)) ||
        (in->pe_v && write_one(cmd, dir, "pe_v", NPY_F32, 3, spv, in->pe_v)) ||
        (in->kc && write_one(cmd, dir, "kc", NPY_F32, 3, skc, in->kc)) ||
        (in->vc && write_one(cmd, dir, "vc", NPY_F32, 3, svc, in->vc)) ||
        (c->fixed_indices && in->given && n > 0 &&
         write_one(cmd, dir, "block_indices", NPY_I32, 3, si, in->given)))
        return TOOL_EXIT_FAIL;
    return 0;
}

int run_outputs_write(const char *cmd, const char *dir, const tk_case *c, const tk_output *out)
{
    const nsa_config *g = &c->cfg;
    const int64_t T = out->tokens, Hq = g->num_q_heads, Hkv = g->num_kv_heads;
    const int64_t Dv = g->head_dim_v, n = g->num_selected;
    const int64_t so[3] = {T, Hq, Dv}, sl[2] = {T, Hq}, ss[3] = {T, Hkv, n};
    static const char *const lse_name[3] = {"lse_cmp", "lse_slc", "lse_win"};
    if (make_dir(cmd, dir))
        return TOOL_EXIT_FAIL;
    /* f64: o and the LSEs as '<f8', from the doubles read back (nothing rounded) */
    const int f64 = g->dtype == NSA_DTYPE_F64 && out->o_d;
    if (write_one(cmd, dir, "o", f64 ? NPY_F64 : NPY_F32, 3, so, f64 ? (const void *)out->o_d : (const void *)out->o))
        return TOOL_EXIT_FAIL;
    for (int b = 0; b < 3; b++)
        if (out->lse[b] && write_one(cmd, dir, lse_name[b], f64 && out->lse_d[b] ? NPY_F64 : NPY_F32, 2, sl,
                                     f64 && out->lse_d[b] ? (const void *)out->lse_d[b] : (const void *)out->lse[b]))
            return TOOL_EXIT_FAIL;
    if (n > 0 && out->sel && write_one(cmd, dir, "selected", NPY_I32, 3, ss, out->sel))
        return TOOL_EXIT_FAIL;
    return 0;
}

int run_inputs_load_floats(const char *cmd, const char *dir, const char *name, int ndim, const int64_t *shape,
                           nsa_dtype dtype, float **out, int *found)
{
    return load_floats(cmd, dir, name, ndim, shape, dtype, out, found);
}

int run_outputs_write_f32(const char *cmd, const char *dir, const char *name, int ndim, const int64_t *shape,
                          const float *data)
{
    if (make_dir(cmd, dir))
        return TOOL_EXIT_FAIL;
    return write_one(cmd, dir, name, NPY_F32, ndim, shape, data);
}

int run_outputs_write_f64(const char *cmd, const char *dir, const char *name, int ndim, const int64_t *shape,
                          const double *data)
{
    if (make_dir(cmd, dir))
        return TOOL_EXIT_FAIL;
    return write_one(cmd, dir, name, NPY_F64, ndim, shape, data);
}
