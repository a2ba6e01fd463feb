/*
 * A built GPU module loads on this machine and, when its device or vendor
 * runtime is absent, reports the backend unavailable with a reason instead of
 * failing:   test_module <backend>
 *
 * Exit 0: the module loaded and its "unavailable" path behaved (named status,
 * the reason in the message). Exit 77: the backend is available here, so the
 * unavailable path cannot be exercised (its parity test covers the device).
 */
#include <stdio.h>
#include <string.h>

#include "nsa.h"

static int fail(const char *what)
{
    fprintf(stderr, "FAIL: %s\n", what);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <backend>\n", argv[0]);
        return 2;
    }
    const char *name = argv[1];
    nsa_backend_info infos[16];
    int count = 0;
    if (nsa_backend_list(infos, 16, &count) != NSA_SUCCESS) return fail(nsa_last_error());
    const nsa_backend_info *me = NULL;
    for (int i = 0; i < count && i < 16; i++)
        if (strcmp(infos[i].name, name) == 0) me = &infos[i];
    if (!me) return fail("the backend is not in nsa_backend_list");
    printf("%s: available=%d devices=%d reason=\"%s\"\n", name, me->available, me->device_count, me->reason);
    if (me->available) {
        printf("%s has a device here: the unavailable path is not exercised (skip)\n", name);
        return 77;
    }
    if (!me->reason[0]) return fail("unavailable without a reason");
    if (strstr(me->reason, "not found") && strstr(me->reason, "module libnsa_backend_"))
        return fail("the module was not found: NSA_BACKEND_PATH should point at the build tree");
    if (strstr(me->reason, "failed to load")) return fail("the module failed to load (dlopen)");
    if (me->device_count != 0) return fail("unavailable but device_count != 0");

    nsa_context *ctx = NULL;
    nsa_status s = nsa_context_create(name, -1, &ctx);
    printf("nsa_context_create(\"%s\") -> %s: %s\n", name, nsa_status_string(s), nsa_last_error());
    if (s != NSA_ERR_BACKEND_UNAVAILABLE) return fail("expected NSA_ERR_BACKEND_UNAVAILABLE");
    if (ctx) return fail("a context came back with an error status");
    if (!strstr(nsa_last_error(), me->reason)) return fail("the message does not carry the module's reason");
    char dev[64];
    if (nsa_device_name(name, 0, dev, sizeof dev) != NSA_ERR_BACKEND_UNAVAILABLE)
        return fail("nsa_device_name on an unavailable backend");
    printf("ok: %s loads and reports itself unavailable: %s\n", name, me->reason);
    return 0;
}
