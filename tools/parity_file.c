/* The saved-outputs file of nsa parity (format in parity_file.h). */
#include "parity_file.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checked.h"

#define FILE_MAGIC "NSAPRTY1"
#define RECORD_MAGIC 0x31524352u

static int fail(char *err, size_t err_size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- little-endian primitives (the hosts we build for are little-endian; the
 * bytes are still assembled explicitly so the format never depends on it) */

static int put_bytes(FILE *f, const void *p, size_t n)
{
    return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int put_u(FILE *f, uint64_t v, int bytes)
{
    unsigned char b[8];
    for (int i = 0; i < bytes; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    return put_bytes(f, b, (size_t)bytes);
}

static int put_i64(FILE *f, int64_t v) { return put_u(f, (uint64_t)v, 8); }
static int put_i32(FILE *f, int32_t v) { return put_u(f, (uint32_t)v, 4); }

static int put_f32(FILE *f, float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return put_u(f, u, 4);
}

static int put_str(FILE *f, const char *s)
{
    size_t n = strlen(s);
    if (n > 65535)
        n = 65535;
    return put_u(f, n, 2) || put_bytes(f, s, n);
}

static int put_f32s(FILE *f, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (put_f32(f, x[i]))
            return -1;
    return 0;
}

/* Reading: every count the file declares is checked against the bytes that
 * are really left in it before anything is allocated for it (the file is
 * untrusted input: it may come from another machine, or be crafted). */
typedef struct reader {
    FILE *f;
    int64_t left; /* bytes not yet read */
} reader;

static int get_bytes(reader *r, void *p, size_t n)
{
    if ((uint64_t)n > (uint64_t)r->left || (n && fread(p, 1, n, r->f) != n))
        return -1;
    r->left -= (int64_t)n;
    return 0;
}

static int get_u(reader *r, uint64_t *v, int bytes)
{
    unsigned char b[8];
    if (get_bytes(r, b, (size_t)bytes))
        return -1;
    *v = 0;
    for (int i = 0; i < bytes; i++)
        *v |= (uint64_t)b[i] << (8 * i);
    return 0;
}

static int get_i64(reader *r, int64_t *v)
{
    uint64_t u;
    if (get_u(r, &u, 8))
        return -1;
    *v = (int64_t)u;
    return 0;
}

static int get_i32(reader *r, int32_t *v)
{
    uint64_t u;
    if (get_u(r, &u, 4))
        return -1;
    *v = (int32_t)(uint32_t)u;
    return 0;
}

static int get_f32(reader *r, float *x)
{
    uint64_t u;
    uint32_t w;
    if (get_u(r, &u, 4))
        return -1;
    w = (uint32_t)u;
    memcpy(x, &w, 4);
    return 0;
}

/* A string of up to 65535 bytes, kept up to size - 1 of them. */
static int get_str(reader *r, char *s, size_t size)
{
    uint64_t n;
    size_t keep;
    char skip[256];
    if (get_u(r, &n, 2))
        return -1;
    keep = (size_t)n < size - 1 ? (size_t)n : size - 1;
    if (get_bytes(r, s, keep))
        return -1;
    s[keep] = '\0';
    for (n -= keep; n > 0;) {
        size_t k = n < sizeof skip ? (size_t)n : sizeof skip;
        if (get_bytes(r, skip, k))
            return -1;
        n -= k;
    }
    return 0;
}

/* n 4-byte elements (i32: int32, else float) into a new array, after checking
 * that the file holds them. NULL with why set on failure. */
static void *get_array(reader *r, int64_t n, int i32, char *why, size_t why_size, const char *what)
{
    size_t bytes;
    void *p;
    if (nsa_ck_bytes(n, 4, &bytes) || (uint64_t)bytes > (uint64_t)r->left) {
        snprintf(why, why_size, "%s needs %lld elements, but only %lld bytes are left in the file", what,
                 (long long)n, (long long)r->left);
        return NULL;
    }
    p = malloc(bytes ? bytes : 1);
    if (!p) {
        snprintf(why, why_size, "out of memory for %s (%zu bytes)", what, bytes);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        if (i32 ? get_i32(r, &((int32_t *)p)[i]) : get_f32(r, &((float *)p)[i])) {
            snprintf(why, why_size, "%s is truncated", what);
            free(p);
            return NULL;
        }
    return p;
}

/* ---- writing */

FILE *parity_file_create(const char *path, char *err, size_t err_size)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fail(err, err_size, "%s: cannot create: %s", path, strerror(errno));
        return NULL;
    }
    if (put_bytes(f, FILE_MAGIC, 8)) {
        fclose(f);
        fail(err, err_size, "%s: write failed", path);
        return NULL;
    }
    return f;
}

int parity_file_write(FILE *f, const char *backend, const char *device, const tk_case *c,
                      nsa_status status, const tk_output *out, char *err, size_t err_size)
{
    const nsa_config *g = &c->cfg;
    const int64_t T = tk_case_tokens(c), Hq = g->num_q_heads;
    int bad = 0;
    uint32_t present = 0;
    if (status == NSA_SUCCESS) {
        present |= out->o ? 1u : 0u;
        for (int b = 0; b < 3; b++)
            present |= out->lse[b] ? (2u << b) : 0u;
        present |= (out->sel && g->num_selected > 0) ? 16u : 0u;
    }
    bad |= put_u(f, RECORD_MAGIC, 4);
    bad |= put_str(f, c->label) | put_str(f, backend) | put_str(f, device) |
           put_str(f, nsa_version_string());
    bad |= put_i64(f, g->num_q_heads) | put_i64(f, g->num_kv_heads) | put_i64(f, g->head_dim_qk) |
           put_i64(f, g->head_dim_v) | put_i64(f, g->cmp_block) | put_i64(f, g->cmp_stride) |
           put_i64(f, g->slc_block) | put_i64(f, g->num_selected) | put_i64(f, g->num_init) |
           put_i64(f, g->num_local) | put_i64(f, g->window);
    bad |= put_f32(f, g->scale) | put_i32(f, (int32_t)g->compress) | put_i32(f, (int32_t)g->dtype);
    bad |= put_i64(f, c->batch);
    for (int64_t b = 0; b <= c->batch; b++)
        bad |= put_i64(f, c->cu_seqlens[b]);
    bad |= put_u(f, c->seed, 8);
    bad |= put_i32(f, c->fixed_indices) | put_i32(f, c->use_pe) | put_i32(f, (int32_t)c->layout);
    bad |= put_i32(f, (int32_t)status) | put_i64(f, T) | put_u(f, present, 4);
    if (present & 1u)
        bad |= put_f32s(f, out->o, T * Hq * g->head_dim_v);
    for (int b = 0; b < 3; b++)
        if (present & (2u << b))
            bad |= put_f32s(f, out->lse[b], T * Hq);
    if (present & 16u)
        for (int64_t i = 0; i < T * g->num_kv_heads * g->num_selected; i++)
            bad |= put_i32(f, out->sel[i]);
    if (bad)
        return fail(err, err_size, "write failed: %s", strerror(errno));
    return 0;
}

/* ---- reading */

/* Reads one record after its magic. Returns 0, or -1 with why set. */
static int read_record(reader *f, parity_record *r, char *why, size_t why_size)
{
    nsa_config *g = &r->c.cfg;
    int64_t v[11], T, n_o, n_lse, n_sel;
    int32_t compress, dtype, layout, status;
    uint64_t present, seed;
    char label[TK_LABEL_MAX];
    memset(r, 0, sizeof *r);
    snprintf(why, why_size, "truncated");
    if (get_str(f, label, sizeof label) || get_str(f, r->backend, sizeof r->backend) ||
        get_str(f, r->device, sizeof r->device) || get_str(f, r->version, sizeof r->version))
        return -1;
    memcpy(r->c.label, label, sizeof label);
    for (int i = 0; i < 11; i++)
        if (get_i64(f, &v[i]))
            return -1;
    nsa_config_init(g);
    g->num_q_heads = v[0];
    g->num_kv_heads = v[1];
    g->head_dim_qk = v[2];
    g->head_dim_v = v[3];
    g->cmp_block = v[4];
    g->cmp_stride = v[5];
    g->slc_block = v[6];
    g->num_selected = v[7];
    g->num_init = v[8];
    g->num_local = v[9];
    g->window = v[10];
    if (get_f32(f, &g->scale) || get_i32(f, &compress) || get_i32(f, &dtype) ||
        get_i64(f, &r->c.batch))
        return -1;
    g->compress = (nsa_compress_mode)compress;
    g->dtype = (nsa_dtype)dtype;
    if (r->c.batch < 0 || r->c.batch > TK_MAX_BATCH) {
        snprintf(why, why_size, "batch = %lld is not in [0, %d]", (long long)r->c.batch, TK_MAX_BATCH);
        return -1;
    }
    for (int64_t b = 0; b <= r->c.batch; b++)
        if (get_i64(f, &r->c.cu_seqlens[b]))
            return -1;
    if (get_u(f, &seed, 8) || get_i32(f, &r->c.fixed_indices) || get_i32(f, &r->c.use_pe) ||
        get_i32(f, &layout) || get_i32(f, &status) || get_i64(f, &T) || get_u(f, &present, 4))
        return -1;
    r->c.seed = seed;
    r->c.layout = (tk_layout)layout;
    r->status = (nsa_status)status;
    if (T < 0 || T != tk_case_tokens(&r->c) || g->num_q_heads < 0 || g->head_dim_v < 0 ||
        g->num_kv_heads < 0 || g->num_selected < 0) {
        snprintf(why, why_size, "T = %lld, Hq = %lld, Hkv = %lld, Dv = %lld, n = %lld do not describe a case",
                 (long long)T, (long long)g->num_q_heads, (long long)g->num_kv_heads, (long long)g->head_dim_v,
                 (long long)g->num_selected);
        return -1;
    }
    {
        const int64_t fo[3] = {T, g->num_q_heads, g->head_dim_v}, fs[3] = {T, g->num_kv_heads, g->num_selected};
        if (nsa_ck_prod(fo, 3, &n_o) || nsa_ck_prod(fo, 2, &n_lse) || nsa_ck_prod(fs, 3, &n_sel)) {
            snprintf(why, why_size, "the tensor sizes of T = %lld overflow 64 bits", (long long)T);
            return -1;
        }
    }
    r->out.tokens = T;
    if ((present & 1u) && !(r->out.o = get_array(f, n_o, 0, why, why_size, "o [T, Hq, Dv]")))
        return -1;
    for (int b = 0; b < 3; b++)
        if ((present & (2u << b)) && !(r->out.lse[b] = get_array(f, n_lse, 0, why, why_size, "lse [T, Hq]")))
            return -1;
    if ((present & 16u) && !(r->out.sel = get_array(f, n_sel, 1, why, why_size, "selected [T, Hkv, n]")))
        return -1;
    return 0;
}

static void record_free(parity_record *r)
{
    free(r->out.o);
    for (int b = 0; b < 3; b++)
        free(r->out.lse[b]);
    free(r->out.sel);
    memset(&r->out, 0, sizeof r->out);
}

int parity_file_read_stream(FILE *f, int64_t size, const char *name, parity_record **recs, char *err,
                            size_t err_size)
{
    reader rd = {f, size};
    char magic[8], why[256];
    parity_record *list = NULL;
    int count = 0, cap = 0;
    *recs = NULL;
    if (size < 0)
        return fail(err, err_size, "%s: the size of the file is unknown", name);
    if (get_bytes(&rd, magic, 8) || memcmp(magic, FILE_MAGIC, 8) != 0)
        return fail(err, err_size, "%s: not an nsa parity file (bad magic)", name);
    while (rd.left > 0) {
        uint64_t m;
        if (get_u(&rd, &m, 4) || m != RECORD_MAGIC) {
            parity_records_free(list, count);
            return fail(err, err_size, "%s: record %d: bad record magic", name, count);
        }
        if (count == cap) {
            parity_record *grown;
            if (cap > (1 << 24)) { /* a record is >= 120 bytes: a 2 GiB file at least */
                parity_records_free(list, count);
                return fail(err, err_size, "%s: more than %d records", name, cap);
            }
            cap = cap ? 2 * cap : 64;
            grown = realloc(list, sizeof *list * (size_t)cap);
            if (!grown) {
                parity_records_free(list, count);
                return fail(err, err_size, "%s: out of memory", name);
            }
            list = grown;
        }
        if (read_record(&rd, &list[count], why, sizeof why) != 0) {
            record_free(&list[count]);
            parity_records_free(list, count);
            return fail(err, err_size, "%s: record %d is corrupt: %s", name, count, why);
        }
        count++;
    }
    *recs = list;
    return count;
}

int parity_file_read(const char *path, parity_record **recs, char *err, size_t err_size)
{
    struct stat st;
    FILE *f = fopen(path, "rb");
    int n;
    *recs = NULL;
    if (!f)
        return fail(err, err_size, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return fail(err, err_size, "%s: not a regular file", path);
    }
    n = parity_file_read_stream(f, (int64_t)st.st_size, path, recs, err, err_size);
    fclose(f);
    return n;
}

void parity_records_free(parity_record *recs, int count)
{
    for (int i = 0; i < count; i++)
        record_free(&recs[i]);
    free(recs);
}

static int same_case(const tk_case *a, const tk_case *b)
{
    const nsa_config *x = &a->cfg, *y = &b->cfg;
    if (x->num_q_heads != y->num_q_heads || x->num_kv_heads != y->num_kv_heads ||
        x->head_dim_qk != y->head_dim_qk || x->head_dim_v != y->head_dim_v ||
        x->cmp_block != y->cmp_block || x->cmp_stride != y->cmp_stride ||
        x->slc_block != y->slc_block || x->num_selected != y->num_selected ||
        x->num_init != y->num_init || x->num_local != y->num_local || x->window != y->window ||
        x->scale != y->scale || x->compress != y->compress || x->dtype != y->dtype)
        return 0;
    if (a->batch != b->batch || a->seed != b->seed || a->fixed_indices != b->fixed_indices ||
        a->use_pe != b->use_pe)
        return 0;
    for (int64_t i = 0; i <= a->batch; i++)
        if (a->cu_seqlens[i] != b->cu_seqlens[i])
            return 0;
    return 1;
}

const parity_record *parity_file_find(const parity_record *recs, int count, const tk_case *c,
                                      const char *backend, const char *avoid, int *mismatch)
{
    const parity_record *fallback = NULL;
    *mismatch = 0;
    for (int i = 0; i < count; i++) {
        const parity_record *r = &recs[i];
        if (strcmp(r->c.label, c->label) != 0 || r->c.cfg.dtype != c->cfg.dtype)
            continue;
        if (backend && strcmp(r->backend, backend) != 0)
            continue;
        if (!same_case(&r->c, c)) {
            *mismatch = 1;
            continue;
        }
        if (!backend && avoid && strcmp(r->backend, avoid) == 0) {
            if (!fallback)
                fallback = r;
            continue;
        }
        return r;
    }
    return fallback;
}
