/*
 * test_abi.c -- the growing-struct rule of nsa.h, on the cpu backend: structs
 * from the first layout (the plain 0.1 entry points), from a header newer than
 * the library (larger, with and without fields set in the part this library
 * does not know), and too small ones; the library must accept the first two
 * kinds with the right results and refuse the others with
 * NSA_ERR_VERSION_MISMATCH and a message that gives the sizes, reading and
 * writing no byte past the size it was given.
 * Exit status 0 pass, 1 fail.
 */
#include <stdio.h>
#include <stddef.h>
#include <string.h>

#include "nsa.h"

static int failures = 0;
#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            failures++;                                                                                        \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                        \
            printf(__VA_ARGS__);                                                                               \
            printf(" (last error: %s)\n", nsa_last_error());                                                   \
        }                                                                                                      \
    } while (0)

#define EXTRA 64
/* a struct as a newer header might define it: the known layout, then fields this library lacks */
typedef struct {
    nsa_config cfg;
    unsigned char more[EXTRA];
} config_v9;
typedef struct {
    nsa_forward_args a;
    unsigned char more[EXTRA];
} args_v9;
typedef struct {
    nsa_plan_info info;
    unsigned char more[EXTRA];
} info_v9;
typedef struct {
    nsa_backend_info info;
    unsigned char more[EXTRA];
} backend_v9;

static int all(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

static nsa_config small_config(void)
{
    nsa_config c;
    nsa_config_init(&c);
    c.num_q_heads = 4;
    c.num_kv_heads = 1;
    c.head_dim_qk = c.head_dim_v = 16;
    c.dtype = NSA_DTYPE_F32;
    return c;
}

int main(void)
{
    nsa_context *ctx = NULL;
    nsa_status s = nsa_context_create("cpu", 0, &ctx);
    if (s != NSA_SUCCESS) {
        printf("FAIL: no cpu context: %s\n", nsa_last_error());
        return 1;
    }
    const int64_t cu[] = {0, 100};
    nsa_plan *plan = NULL;

    /* config_init: a newer header's larger struct gets the defaults and zeros past them */
    config_v9 c9;
    memset(&c9, 0xAB, sizeof c9);
    CHECK(nsa_config_init_sized(&c9.cfg, sizeof c9) == NSA_SUCCESS, "config_init of a larger struct");
    CHECK(c9.cfg.num_q_heads == 64 && c9.cfg.dtype == NSA_DTYPE_BF16 && all(c9.more, EXTRA, 0),
          "config_init: defaults, then zeros in the unknown part");
    CHECK(nsa_config_init_sized(&c9.cfg, 8) == NSA_ERR_VERSION_MISMATCH && strstr(nsa_last_error(), "8 bytes"),
          "config_init of an 8-byte struct is refused, naming its size");

    /* plan_create: first layout (the 0.1 symbol), a larger struct with a zero tail, one setting an unknown field */
    const nsa_config base = small_config();
    CHECK((nsa_plan_create)(ctx, &base, cu, 1, &plan) == NSA_SUCCESS, "the 0.1 nsa_plan_create");
    nsa_plan_destroy(plan);
    plan = NULL;
    memset(&c9, 0, sizeof c9);
    c9.cfg = base;
    CHECK(nsa_plan_create_sized(ctx, &c9.cfg, sizeof c9, cu, 1, &plan) == NSA_SUCCESS,
          "a newer header's config that leaves its new fields zero");
    nsa_plan_destroy(plan);
    plan = NULL;
    c9.more[5] = 1;
    s = nsa_plan_create_sized(ctx, &c9.cfg, sizeof c9, cu, 1, &plan);
    CHECK(s == NSA_ERR_VERSION_MISMATCH && plan == NULL && strstr(nsa_last_error(), "newer libnsa header"),
          "a newer header's config that sets a new field: status %s", nsa_status_string(s));
    /* a 0.2 header's config ends before flags (added in 0.3): flags take their default, 0 */
    {
        unsigned char old[offsetof(nsa_config, flags)];
        memcpy(old, &base, sizeof old);
        CHECK(nsa_plan_create_sized(ctx, (const nsa_config *)(const void *)old, sizeof old, cu, 1, &plan) ==
                  NSA_SUCCESS, "a 0.2 header's config (%zu bytes, no flags)", sizeof old);
        nsa_plan_destroy(plan);
        plan = NULL;
        nsa_config got;
        memset(&got, 0xAB, sizeof got);
        CHECK(nsa_config_init_sized(&got, sizeof old) == NSA_SUCCESS && all((unsigned char *)&got + sizeof old,
                                                                               sizeof got - sizeof old, 0xAB),
              "config_init of a 0.2 header's config writes only its %zu bytes", sizeof old);
    }
    s = nsa_plan_create_sized(ctx, &base, offsetof(nsa_config, flags) - 8, cu, 1, &plan);
    CHECK(s == NSA_ERR_VERSION_MISMATCH && strstr(nsa_last_error(), "smaller than its first layout"),
          "a config smaller than the first layout");
    CHECK(nsa_config_validate_sized(&c9.cfg, sizeof c9) == NSA_ERR_VERSION_MISMATCH, "validate: same rule");

    CHECK(nsa_plan_create(ctx, &base, cu, 1, &plan) == NSA_SUCCESS, "plan");
    if (!plan) goto done;

    /* plan_get_info: writes exactly the caller's size: zeros past what the library knows, nothing beyond */
    {
        unsigned char buf[sizeof(info_v9) + 16];
        memset(buf, 0xCD, sizeof buf);
        info_v9 *i9 = (info_v9 *)buf;
        CHECK(nsa_plan_get_info_sized(plan, &i9->info, sizeof *i9) == NSA_SUCCESS, "get_info into a larger struct");
        CHECK(i9->info.total_tokens == 100 && i9->info.num_stages > 0 && all(i9->more, EXTRA, 0) &&
                  all(buf + sizeof *i9, 16, 0xCD),
              "get_info: the fields, zeros in the unknown part, nothing written past the size");
        nsa_plan_info i1;
        CHECK((nsa_plan_get_info)(plan, &i1) == NSA_SUCCESS && i1.total_tokens == 100, "the 0.1 nsa_plan_get_info");
        CHECK(nsa_plan_get_info_sized(plan, &i1, 4) == NSA_ERR_VERSION_MISMATCH, "get_info into 4 bytes");
    }

    /* backend_list: entries at the caller's stride */
    {
        backend_v9 list[8];
        memset(list, 0xEE, sizeof list);
        int n = 0;
        CHECK(nsa_backend_list_sized(&list[0].info, sizeof list[0], 8, &n) == NSA_SUCCESS && n >= 1,
              "backend_list with a larger element");
        int cpu_at = -1;
        for (int i = 0; i < n && i < 8; i++) {
            CHECK(all(list[i].more, EXTRA, 0), "entry %d: zeros in the unknown part", i);
            if (strcmp(list[i].info.name, "cpu") == 0) cpu_at = i;
        }
        CHECK(cpu_at >= 0 && list[cpu_at].info.available, "cpu listed, available");
    }

    /* forward: first layout (0.1 symbol), larger args with a zero tail (same o), a set unknown field */
    {
        nsa_plan_info info;
        nsa_plan_get_info(plan, &info);
        const int64_t T = 100, nq = T * 4 * 16, nk = T * 16, ng = T * 4;
        nsa_buffer *in = NULL, *o = NULL, *ws = NULL;
        nsa_buffer_alloc(ctx, (size_t)(nq + 2 * nk + 3 * ng) * 4, &in);
        nsa_buffer_alloc(ctx, (size_t)(2 * nq) * 4, &o);
        nsa_buffer_alloc(ctx, info.workspace_bytes, &ws);
        static float host[6400 + 3200 + 1200], o1[6400], o2[6400];
        nsa_random_uniform(3, 0, 0, nq + 2 * nk, -1.f, 1.f, host);
        nsa_random_uniform(3, 1, 0, 3 * ng, 0.f, 1.f, host + nq + 2 * nk);
        nsa_buffer_write(in, 0, host, sizeof host);
        args_v9 a9;
        memset(&a9, 0, sizeof a9);
        nsa_forward_args *a = &a9.a;
        a->q = nsa_tensor_dense(in, 0, 4, 16);
        for (int b = 0; b < 3; b++) {
            a->k[b] = nsa_tensor_dense(in, nq, 1, 16);
            a->v[b] = nsa_tensor_dense(in, nq + nk, 1, 16);
            a->gate[b] = nsa_tensor_dense(in, nq + 2 * nk + b * ng, 4, 1);
        }
        a->o = nsa_tensor_dense(o, 0, 4, 16);
        CHECK((nsa_forward)(plan, a, ws) == NSA_SUCCESS, "the 0.1 nsa_forward");
        a->o = nsa_tensor_dense(o, nq, 4, 16);
        CHECK(nsa_forward_sized(plan, a, sizeof a9, ws) == NSA_SUCCESS, "forward with a newer header's args");
        nsa_buffer_read(o, 0, o1, sizeof o1);
        nsa_buffer_read(o, (size_t)nq * 4, o2, sizeof o2);
        CHECK(memcmp(o1, o2, sizeof o1) == 0, "the same o both ways");
        a9.more[EXTRA - 1] = 7;
        CHECK(nsa_forward_sized(plan, a, sizeof a9, ws) == NSA_ERR_VERSION_MISMATCH, "args setting an unknown field");
        CHECK(nsa_forward_sized(plan, a, 16, ws) == NSA_ERR_VERSION_MISMATCH, "args of 16 bytes");
        nsa_buffer_free(in);
        nsa_buffer_free(o);
        nsa_buffer_free(ws);
    }

    /* enum values are part of the ABI: the dtypes keep their numbers (f64, added
     * in 0.4, took the next free one) and the library's names and sizes agree */
    {
        static const struct {
            nsa_dtype dt;
            int value;
            size_t size;
            const char *name;
        } dts[] = {{NSA_DTYPE_F32, 0, 4, "f32"}, {NSA_DTYPE_F16, 1, 2, "f16"}, {NSA_DTYPE_BF16, 2, 2, "bf16"},
                   {NSA_DTYPE_I32, 3, 4, "i32"}, {NSA_DTYPE_F64, 4, 8, "f64"}};
        for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
            CHECK((int)dts[i].dt == dts[i].value, "dtype %s has value %d, the ABI fixed %d", dts[i].name,
                  (int)dts[i].dt, dts[i].value);
            CHECK(nsa_dtype_size(dts[i].dt) == dts[i].size && strcmp(nsa_dtype_name(dts[i].dt), dts[i].name) == 0,
                  "dtype %d: size %zu, name %s", dts[i].value, nsa_dtype_size(dts[i].dt), nsa_dtype_name(dts[i].dt));
        }
        CHECK(nsa_dtype_size((nsa_dtype)5) == 0, "dtype 5 is unknown");
    }

done:
    nsa_plan_destroy(plan);
    nsa_context_destroy(ctx);
    printf("%s: %d failure%s\n", failures ? "FAIL" : "PASS", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
