/*
 * program.c: the OpenCL program of one dtype, built on first use per context and
 * kept in an on-disk program-binary cache.
 *
 * The program is the embedded source (kernels/opencl/<idea>.cl, concatenated) built with
 * "-cl-std=CL1.2 -DNSA_DTYPE=<0|1|2>" (plus NSA_OPENCL_BUILD_OPTIONS, if set, for experiments
 * and for testing the failure path, e.g. "-DNSA_DTYPE=9"). Its cache key is a 128-bit hash of (source,
 * build options, device name, driver version, platform version); the binary lives in
 *     $NSA_CACHE_DIR/opencl-<key>.bin
 * with the folder from nsa_set_cache_dir, else NSA_CACHE_DIR, else $XDG_CACHE_HOME/libnsa,
 * else ~/.cache/libnsa.
 * The cache is off when the folder is "off" or NSA_OPENCL_NO_CACHE=1. Writes are atomic
 * (a temporary file in the same folder, then rename), so concurrent processes never
 * read half a file. Each file carries its payload's size and 128-bit hash, and is read
 * only if it is a regular file (opened without blocking) whose size and hash match:
 * a corrupt, truncated or foreign entry never reaches the driver. A cache that cannot
 * be read or written is simply not used, and an entry that fails these checks or that
 * the driver refuses is rebuilt from source and replaced.
 * A failed source build returns NSA_ERR_KERNEL_BUILD with the compiler log.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "opencl_internal.h"

static const char *const kernel_names[OCL_K_COUNT] = {
    [OCL_K_COMPRESS_MEAN] = "compress_mean",
    [OCL_K_CONVERT_ROWS] = "convert_rows",
    [OCL_K_STAGE_HEADS] = "stage_heads",
    [OCL_K_CONVERT_DENSE] = "convert_dense",
    [OCL_K_FILL_ROWS] = "fill_rows",
    [OCL_K_ROUND_ROWS] = "round_rows",
    [OCL_K_COMPRESS_LINEAR] = "compress_linear",
    [OCL_K_CMP_ATTN] = "cmp_attn",
    [OCL_K_BLOCK_SCORES] = "block_scores",
    [OCL_K_SELECT_TOPN] = "select_topn",
    [OCL_K_SLC_ATTN] = "slc_attn",
    [OCL_K_WIN_ATTN] = "win_attn",
    [OCL_K_COMBINE] = "combine",
    [OCL_K_CMP_ATTN_V2] = "cmp_attn_v2",
    [OCL_K_SLC_ATTN_V2] = "slc_attn_v2",
    [OCL_K_WIN_ATTN_V2] = "win_attn_v2",
    [OCL_K_CMP_ATTN_V3] = "cmp_attn_v3",
    [OCL_K_WIN_ATTN_V3] = "win_attn_v3",
    [OCL_K_SLC_ATTN_V3] = "slc_attn_v3",
    [OCL_K_BLOCK_SCORES_V2] = "block_scores_v2",
    [OCL_K_SCORES_TOPN] = "scores_topn",
    [OCL_K_BWD_ROWS_CMP] = "bwd_rows_cmp",
    [OCL_K_BWD_ROWS_SLC] = "bwd_rows_slc",
    [OCL_K_BWD_ROWS_WIN] = "bwd_rows_win",
    [OCL_K_BWD_KEYS_CMP] = "bwd_keys_cmp",
    [OCL_K_BWD_KEYS_SLC] = "bwd_keys_slc",
    [OCL_K_BWD_KEYS_WIN] = "bwd_keys_win",
    [OCL_K_BWD_COMPRESS_ROWS] = "bwd_compress_rows",
    [OCL_K_BWD_COMPRESS_W] = "bwd_compress_w",
    [OCL_K_BWD_STORE] = "bwd_store",
    [OCL_K_BWD_STORE_F32] = "bwd_store_f32",
    [OCL_K_DECODE_CHECK] = "decode_check",
    [OCL_K_DECODE_STORE] = "decode_store",
    [OCL_K_DECODE_COMPRESS] = "decode_compress",
    [OCL_K_DECODE_CMP_ATTN] = "decode_cmp_attn",
    [OCL_K_DECODE_SCORES_TOPN] = "decode_scores_topn",
    [OCL_K_DECODE_SLC_ATTN] = "decode_slc_attn",
    [OCL_K_DECODE_WIN_ATTN] = "decode_win_attn",
    [OCL_K_DECODE_COMBINE] = "decode_combine",
    [OCL_K_COMBINE_PARTIAL] = "combine_partial",
};

/* A cache file: this magic, the payload's size (uint64), its 128-bit hash (two
 * uint64, payload_hash), the payload (the program binary). */
static const char cache_magic[8] = {'N', 'S', 'A', 'C', 'L', 'B', 'I', '2'};

/* ------------------------------------------------------------------ key */

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* Two FNV-1a streams with different seeds over the fields, each field followed by
 * its length so that ("ab", "c") and ("a", "bc") differ. */
static void cache_key(const ocl_context *c, const char *options, char out[33])
{
    const char *fields[] = {nsa_opencl_source, options, c->device_name, c->driver_version,
                            c->platform_version};
    uint64_t h1 = 0xcbf29ce484222325ULL, h2 = 0x84222325cbf29ce4ULL;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; ++i) {
        const uint64_t n = strlen(fields[i]);
        h1 = fnv1a(fnv1a(h1, fields[i], n), &n, sizeof n);
        h2 = fnv1a(fnv1a(h2, &n, sizeof n), fields[i], n);
    }
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h1, (unsigned long long)h2);
}

/* The payload's hash in a cache file: a flipped byte is caught before the
 * driver sees the binary (drivers may crash on a corrupt one). */
static void payload_hash(const unsigned char *bin, size_t n, uint64_t h[2])
{
    h[0] = fnv1a(0xcbf29ce484222325ULL, bin, n);
    h[1] = fnv1a(0x84222325cbf29ce4ULL ^ (uint64_t)n, bin, n);
}

/* ------------------------------------------------------------------ cache files */

/* The cache folder, or 0 when the cache is off or no folder can be named. */
static int cache_dir(char *dir, size_t size)
{
    const char *off = getenv("NSA_OPENCL_NO_CACHE");
    if (off && *off && strcmp(off, "0") != 0) return 0;
    char set[4096]; /* nsa_set_cache_dir, else NSA_CACHE_DIR */
    const char *d;
    int n;
    if (ocl_host->setting(NSA_SETTING_CACHE_DIR, set, sizeof set)) {
        if (strcmp(set, "off") == 0) return 0;
        n = snprintf(dir, size, "%s", set);
    } else if ((d = getenv("XDG_CACHE_HOME")) && *d) {
        n = snprintf(dir, size, "%s/libnsa", d);
    } else if ((d = getenv("HOME")) && *d) {
        n = snprintf(dir, size, "%s/.cache/libnsa", d);
    } else {
        return 0;
    }
    return n > 0 && (size_t)n < size;
}

/* mkdir -p */
static int make_dirs(const char *path)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return 0;
    for (char *p = tmp + 1; *p; ++p) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return 0;
        *p = '/';
    }
    return mkdir(tmp, 0755) == 0 || errno == EEXIST;
}

/* The payload of the cache file at path, or NULL: absent, not a regular file
 * (opened without blocking, so a FIFO cannot hang us), wrong magic, a size that
 * is not the file's, or a payload whose hash differs. The caller then builds
 * from source and replaces the file (cache_write: a new file renamed over it).
 * *present: whether anything is at path. */
static unsigned char *cache_read(const char *path, size_t *size, int *present)
{
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    *present = fd >= 0 || errno != ENOENT; /* something is there, readable or not */
    if (fd < 0) return NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 32 || sb.st_size > ((off_t)1 << 31)) {
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return NULL;
    }
    char magic[8];
    uint64_t n = 0, want[2], got[2];
    unsigned char *bin = NULL;
    if (fread(magic, 1, 8, f) == 8 && memcmp(magic, cache_magic, 8) == 0 && fread(&n, sizeof n, 1, f) == 1 &&
        fread(want, sizeof want, 1, f) == 1 && n > 0 && n == (uint64_t)sb.st_size - 32 &&
        (bin = malloc((size_t)n)) != NULL) {
        if (fread(bin, 1, (size_t)n, f) != (size_t)n || fgetc(f) != EOF) {
            free(bin);
            bin = NULL;
        } else {
            payload_hash(bin, (size_t)n, got);
            if (got[0] != want[0] || got[1] != want[1]) {
                free(bin);
                bin = NULL;
            }
        }
    }
    fclose(f);
    *size = (size_t)n;
    return bin;
}

static void cache_write(const char *dir, const char *path, const unsigned char *bin, size_t size)
{
    static unsigned counter;
    char tmp[4300];
    if (!make_dirs(dir)) return;
    const unsigned n_tmp = __atomic_fetch_add(&counter, 1u, __ATOMIC_RELAXED); /* unique per thread, too */
    if (snprintf(tmp, sizeof tmp, "%s.%ld.%u.tmp", path, (long)getpid(), n_tmp) >= (int)sizeof tmp) return;
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    const uint64_t n = size;
    uint64_t h[2];
    payload_hash(bin, size, h);
    int ok = fwrite(cache_magic, 1, 8, f) == 8 && fwrite(&n, sizeof n, 1, f) == 1 && fwrite(h, sizeof h, 1, f) == 1 &&
             fwrite(bin, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) remove(tmp);
}

/* ------------------------------------------------------------------ build */

static nsa_status build_failed(ocl_context *c, cl_program prog, cl_int err, const char *options)
{
    size_t n = 0;
    char *log = NULL;
    if (clGetProgramBuildInfo(prog, c->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) == CL_SUCCESS && n > 0 &&
        (log = malloc(n + 1)) != NULL) {
        if (clGetProgramBuildInfo(prog, c->device, CL_PROGRAM_BUILD_LOG, n, log, NULL) != CL_SUCCESS) log[0] = 0;
        log[n] = '\0';
    }
    nsa_status s = OCL_ERR(NSA_ERR_KERNEL_BUILD, "opencl: building the kernels for %s (options \"%s\") failed: %d (%s); "
                                                 "compiler log:\n%s",
                           c->device_name, options, (int)err, ocl_error_name(err), log ? log : "(none)");
    free(log);
    return s;
}

/* The built program's binary for our device (malloc'ed), or NULL. */
static unsigned char *program_binary(ocl_context *c, cl_program prog, size_t *size)
{
    cl_uint ndev = 0;
    if (clGetProgramInfo(prog, CL_PROGRAM_NUM_DEVICES, sizeof ndev, &ndev, NULL) != CL_SUCCESS || ndev != 1)
        return NULL;
    cl_device_id dev;
    if (clGetProgramInfo(prog, CL_PROGRAM_DEVICES, sizeof dev, &dev, NULL) != CL_SUCCESS || dev != c->device)
        return NULL;
    size_t n = 0;
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL) != CL_SUCCESS || n == 0) return NULL;
    unsigned char *bin = malloc(n);
    if (!bin) return NULL;
    unsigned char *bins[1] = {bin};
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) != CL_SUCCESS) {
        free(bin);
        return NULL;
    }
    *size = n;
    return bin;
}

static cl_program build_from_binary(ocl_context *c, const unsigned char *bin, size_t size, const char *options)
{
    cl_int err, status;
    cl_program prog = clCreateProgramWithBinary(c->context, 1, &c->device, &size, &bin, &status, &err);
    if (err != CL_SUCCESS || status != CL_SUCCESS) {
        if (err == CL_SUCCESS) clReleaseProgram(prog);
        return NULL;
    }
    if (clBuildProgram(prog, 1, &c->device, options, NULL, NULL) != CL_SUCCESS) {
        clReleaseProgram(prog);
        return NULL;
    }
    return prog;
}

static nsa_status make_kernels(ocl_context *c, ocl_program *p)
{
    for (int i = 0; i < OCL_K_COUNT; ++i) {
        cl_int err;
        p->kernel[i] = clCreateKernel(p->program, kernel_names[i], &err);
        if (err != CL_SUCCESS) {
            p->kernel[i] = NULL;
            return OCL_ERR(NSA_ERR_KERNEL_BUILD, "opencl: clCreateKernel(%s): %d (%s)", kernel_names[i], (int)err,
                           ocl_error_name(err));
        }
        err = clGetKernelWorkGroupInfo(p->kernel[i], c->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof p->kernel_wg[i],
                                       &p->kernel_wg[i], NULL);
        if (err != CL_SUCCESS) return ocl_fail(err, "clGetKernelWorkGroupInfo");
    }
    return NSA_SUCCESS;
}

void ocl_program_release(ocl_program *p)
{
    for (int i = 0; i < OCL_K_COUNT; ++i)
        if (p->kernel[i]) clReleaseKernel(p->kernel[i]);
    if (p->program) clReleaseProgram(p->program);
    memset(p, 0, sizeof *p);
}

nsa_status ocl_program_get(ocl_context *c, nsa_dtype dtype, ocl_program **out)
{
    static const char *const dtype_names[] = {"f32", "f16", "bf16"};
    if ((int)dtype < 0 || dtype > NSA_DTYPE_BF16)
        return OCL_ERR(NSA_ERR_INVALID_DTYPE, "opencl: no kernels for dtype %d", (int)dtype);
    ocl_program *p = &c->programs[dtype];
    if (p->program) {
        *out = p;
        return NSA_SUCCESS;
    }
    char options[1024];
    const char *extra = getenv("NSA_OPENCL_BUILD_OPTIONS");
    snprintf(options, sizeof options, "-cl-std=CL1.2 -DNSA_DTYPE=%d%s%s", (int)dtype, extra && *extra ? " " : "",
             extra && *extra ? extra : "");

    char dir[4096], path[4200], key[33];
    const int use_cache = cache_dir(dir, sizeof dir);
    if (use_cache) {
        cache_key(c, options, key);
        snprintf(path, sizeof path, "%s/opencl-%s.bin", dir, key);
        size_t size = 0;
        int present = 0;
        unsigned char *bin = cache_read(path, &size, &present);
        if (bin) {
            p->program = build_from_binary(c, bin, size, options);
            p->from_cache = p->program != NULL;
            free(bin);
        }
        if (p->from_cache)
            ocl_host->log(NSA_LOG_INFO, "opencl: %s kernels for %s from the cache (%s)", dtype_names[dtype],
                          c->device_name, path);
        else if (present)
            ocl_host->log(NSA_LOG_WARN, "opencl: cache entry %s is unreadable, corrupt or refused by the driver: "
                          "rebuilding it", path);
    }
    if (!p->program) {
        cl_int err;
        const char *src = nsa_opencl_source;
        const size_t len = nsa_opencl_source_size;
        p->program = clCreateProgramWithSource(c->context, 1, &src, &len, &err);
        if (err != CL_SUCCESS) {
            p->program = NULL;
            return ocl_fail(err, "clCreateProgramWithSource");
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        err = clBuildProgram(p->program, 1, &c->device, options, NULL, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double build_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
        if (err != CL_SUCCESS) {
            nsa_status s = build_failed(c, p->program, err, options);
            ocl_program_release(p);
            return s;
        }
        ocl_host->log(NSA_LOG_INFO, "opencl: %s kernels for %s built from source in %.0f ms%s%s", dtype_names[dtype],
                      c->device_name, build_ms, use_cache ? ", cached at " : " (cache off)", use_cache ? path : "");
        if (use_cache) {
            size_t size = 0;
            unsigned char *bin = program_binary(c, p->program, &size);
            if (bin) cache_write(dir, path, bin, size);
            free(bin);
        }
    }
    nsa_status s = make_kernels(c, p);
    if (s != NSA_SUCCESS) {
        ocl_program_release(p);
        return s;
    }
    *out = p;
    return NSA_SUCCESS;
}
