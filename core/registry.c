/*
 * The backend registry: the built-in cpu backend plus loadable modules
 * (libnsa_backend_<name>.so) found, in this order, in NSA_BACKEND_PATH (a colon
 * list), the install directory, and the folder "nsa" beside libnsa itself.
 * A module is loaded once, on first use, and kept for the life of the process.
 * Only names that mean something take one of the registry's slots: the known
 * backends and modules whose file exists. A name that is neither (a typo, a
 * probe of many names) is answered from a scratch entry and forgotten, so no
 * sequence of bad names can crowd out a real backend.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Messages here are cut to their fixed-size fields on purpose (gcc's warning). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

#ifndef NSA_MODULE_DIR
#define NSA_MODULE_DIR "/usr/local/lib/nsa"
#endif

/* Known backends, in order of preference when the caller names none. */
static const char *const known[] = {"cuda", "hip", "opencl", "cpu"};
#define NUM_KNOWN (int)(sizeof known / sizeof known[0])
#define MAX_ENTRIES 16

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char search_path[1024]; /* the folders searched for the last missing module */
static nsa_registered entries[MAX_ENTRIES];
static int num_entries;

/* NULL when name is a well-formed backend name, else what is wrong with it
 * (written into why). */
static const char *name_problem(const char *name, char *why, size_t size)
{
    size_t n = strlen(name);
    if (n == 0) {
        snprintf(why, size, "an empty name");
        return why;
    }
    if (n >= sizeof entries[0].name) {
        snprintf(why, size, "the name is %zu characters long; backend names have at most %zu", n,
                 sizeof entries[0].name - 1);
        return why;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') continue;
        if (c > ' ' && c < 0x7f)
            snprintf(why, size, "character %zu is '%c'; backend names use only a-z, 0-9 and _", i + 1, c);
        else
            snprintf(why, size, "character %zu is byte 0x%02x; backend names use only a-z, 0-9 and _", i + 1, c);
        return why;
    }
    return NULL;
}

static int is_known(const char *name)
{
    for (int i = 0; i < NUM_KNOWN; i++)
        if (strcmp(known[i], name) == 0) return 1;
    return 0;
}

/* Tries to dlopen dir/libnsa_backend_<name>.so. Returns the handle, or NULL with
 * *exists telling whether the file was there (and why it failed in why). */
static void *try_open(const char *dir, const char *name, int *exists, char *why, size_t why_size)
{
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/libnsa_backend_%s.so", dir, name);
    if (n < 0 || (size_t)n >= sizeof path) return NULL;
    if (access(path, F_OK) != 0) return NULL;
    *exists = 1;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, why_size, "%s", e ? e : path);
    }
    return h;
}

/* The folder libnsa was loaded from, + "/nsa". */
static const char anchor; /* any object inside libnsa, for dladdr */

static int beside_library(char *out, size_t size)
{
    Dl_info info;
    if (!dladdr(&anchor, &info) || !info.dli_fname) return 0;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash) return 0;
    int n = snprintf(out, size, "%.*s/nsa", (int)(slash - info.dli_fname), info.dli_fname);
    return n > 0 && (size_t)n < size;
}

/* Loads module r->name into r. *found: whether its file exists in a searched folder. */
static void load_module(nsa_registered *r, int *found)
{
    char why[NSA_REASON_MAX] = "";
    char searched[1024] = "";
    void *h = NULL;
    int exists = 0;

    char env[4096]; /* nsa_set_backend_path, else NSA_BACKEND_PATH */
    if (nsa_setting(NSA_SETTING_BACKEND_PATH, env, sizeof env)) {
        char *copy = strdup(env);
        if (!copy) {
            r->load_status = NSA_ERR_OUT_OF_MEMORY;
            snprintf(r->reason, sizeof r->reason, "out of memory while reading the backend path");
            return;
        }
        char *save = NULL;
        for (char *dir = strtok_r(copy, ":", &save); dir && !h && !exists; dir = strtok_r(NULL, ":", &save))
            h = try_open(dir, r->name, &exists, why, sizeof why);
        free(copy);
        snprintf(searched, sizeof searched, "backend path %s, ", env);
    }
    char beside[2048];
    int have_beside = beside_library(beside, sizeof beside);
    if (!h && !exists) h = try_open(NSA_MODULE_DIR, r->name, &exists, why, sizeof why);
    if (!h && !exists && have_beside) h = try_open(beside, r->name, &exists, why, sizeof why);
    size_t used = strlen(searched);
    snprintf(searched + used, sizeof searched - used, "%s%s%s", NSA_MODULE_DIR, have_beside ? ", " : "",
             have_beside ? beside : "");

    *found = exists;
    if (!h) {
        r->load_status = NSA_ERR_BACKEND_UNAVAILABLE;
        if (exists)
            snprintf(r->reason, sizeof r->reason, "module failed to load: %s", why);
        else
            snprintf(r->reason, sizeof r->reason, "module libnsa_backend_%s.so not found", r->name);
        snprintf(search_path, sizeof search_path, "%s", searched);
        return;
    }
    const void *vsym = dlsym(h, NSA_BACKEND_VERSION_SYMBOL);
    nsa_backend_entry_fn entry = NULL;
    void *sym = dlsym(h, NSA_BACKEND_ENTRY_SYMBOL);
    memcpy(&entry, &sym, sizeof entry);
    if (!vsym || !entry) {
        r->load_status = NSA_ERR_BACKEND_UNAVAILABLE;
        snprintf(r->reason, sizeof r->reason, "module libnsa_backend_%s.so lacks the symbol %s", r->name,
                 vsym ? NSA_BACKEND_ENTRY_SYMBOL : NSA_BACKEND_VERSION_SYMBOL);
        dlclose(h);
        return;
    }
    /* The version must be an int variable; anything else (a function, say) is
     * refused unread: its address need not even be aligned for an int.
     * (ELF64_ST_TYPE and ELF32_ST_TYPE are the same macro.) */
    Dl_info di;
    const ElfW(Sym) *es = NULL;
    if (dladdr1(vsym, &di, (void **)&es, RTLD_DL_SYMENT) && es && ELF64_ST_TYPE(es->st_info) != STT_OBJECT) {
        r->load_status = NSA_ERR_VERSION_MISMATCH;
        snprintf(r->reason, sizeof r->reason,
                 "module libnsa_backend_%s.so: its symbol %s is not an int variable (ELF symbol type %d)", r->name,
                 NSA_BACKEND_VERSION_SYMBOL, (int)ELF64_ST_TYPE(es->st_info));
        dlclose(h);
        return;
    }
    int version;
    memcpy(&version, vsym, sizeof version); /* no alignment assumed */
    if (version != NSA_BACKEND_API_VERSION) {
        r->load_status = NSA_ERR_VERSION_MISMATCH;
        snprintf(r->reason, sizeof r->reason,
                 "module libnsa_backend_%s.so was built for backend API version %d, this libnsa %s needs %d", r->name,
                 version, nsa_version_string(), NSA_BACKEND_API_VERSION);
        dlclose(h);
        return;
    }
    const nsa_backend *be = entry(&nsa_host);
    if (!be || be->api_version != NSA_BACKEND_API_VERSION) {
        r->load_status = be ? NSA_ERR_VERSION_MISMATCH : NSA_ERR_BACKEND_UNAVAILABLE;
        snprintf(r->reason, sizeof r->reason, "module libnsa_backend_%s.so: %s", r->name,
                 be ? "its vtable has another API version" : (*nsa_last_error() ? nsa_last_error() : "entry returned NULL"));
        dlclose(h);
        return;
    }
    r->be = be;
    r->load_status = NSA_SUCCESS;
}

static void probe(nsa_registered *r)
{
    const nsa_backend *be = r->be;
    if (!be->probe || !be->context_create || !be->context_destroy || !be->buffer_alloc || !be->buffer_free ||
        !be->buffer_write || !be->buffer_read || !be->buffer_fill || !be->run || !be->synchronize) {
        r->be = NULL;
        r->load_status = NSA_ERR_BACKEND_UNAVAILABLE;
        snprintf(r->reason, sizeof r->reason, "backend %s lacks a required vtable entry", r->name);
        return;
    }
    int count = 0;
    char reason[NSA_REASON_MAX] = "";
    nsa_status s = be->probe(&count, reason, sizeof reason);
    if (s != NSA_SUCCESS || count <= 0) {
        r->device_count = 0;
        snprintf(r->reason, sizeof r->reason, "%s", reason[0] ? reason : "no device found");
    } else {
        r->device_count = count;
        snprintf(r->reason, sizeof r->reason, "%s", reason);
    }
}

const nsa_registered *nsa_registry_get(const char *name, nsa_registered *scratch)
{
    char why[128];
    if (name_problem(name, why, sizeof why)) {
        nsa_set_error(NSA_ERR_BACKEND_UNAVAILABLE, "backend name \"%.40s%s\" is malformed: %s", name,
                      strlen(name) > 40 ? "..." : "", why);
        return NULL;
    }
    int log_level = -1;
    char log_msg[NSA_REASON_MAX + 1200];
    pthread_mutex_lock(&lock);
    nsa_registered *r = NULL;
    for (int i = 0; i < num_entries; i++)
        if (strcmp(entries[i].name, name) == 0) r = &entries[i];
    if (!r) {
        memset(scratch, 0, sizeof *scratch);
        snprintf(scratch->name, sizeof scratch->name, "%s", name);
        if (strcmp(name, "cpu") == 0) {
            scratch->be = nsa_cpu_backend(&nsa_host);
            scratch->load_status = scratch->be ? NSA_SUCCESS : NSA_ERR_INTERNAL;
            snprintf(scratch->reason, sizeof scratch->reason, "built in");
        } else if (num_entries == MAX_ENTRIES) {
            /* reached only with MAX_ENTRIES - NUM_KNOWN + 1 distinct module files */
            scratch->load_status = NSA_ERR_BACKEND_UNAVAILABLE;
            snprintf(scratch->reason, sizeof scratch->reason,
                     "not loaded: %d backends are registered already, the most one process keeps", MAX_ENTRIES);
        } else {
            int found = 0;
            load_module(scratch, &found);
            /* logged once the lock is released (a log callback may call libnsa) */
            if (scratch->load_status == NSA_SUCCESS) {
                log_level = NSA_LOG_DEBUG;
                snprintf(log_msg, sizeof log_msg, "backend %s: module loaded", name);
            } else if (found) {
                log_level = NSA_LOG_WARN;
                snprintf(log_msg, sizeof log_msg, "backend %s: %s", name, scratch->reason);
            } else {
                log_level = NSA_LOG_DEBUG;
                snprintf(log_msg, sizeof log_msg, "backend %s: %s (searched %s)", name, scratch->reason, search_path);
            }
            if (!found && !is_known(name)) {
                /* no such module anywhere: answered from scratch, not kept */
                pthread_mutex_unlock(&lock);
                nsa_log(log_level, "%s", log_msg);
                return scratch;
            }
        }
        if (scratch->be) probe(scratch);
        if (num_entries < MAX_ENTRIES) {
            r = &entries[num_entries++];
            *r = *scratch;
        } else {
            r = scratch;
        }
    }
    pthread_mutex_unlock(&lock);
    if (log_level >= 0) nsa_log(log_level, "%s", log_msg);
    return r;
}

nsa_status (nsa_backend_list)(nsa_backend_info *infos, int capacity, int *count)
{
    return nsa_backend_list_sized(infos, NSA_BACKEND_INFO_SIZE_FIRST, capacity, count);
}

/* infos is an array of capacity entries of info_size bytes each (the caller's sizeof) */
nsa_status nsa_backend_list_sized(nsa_backend_info *infos, size_t info_size, int capacity, int *count)
{
    nsa_clear_error();
    if (!count) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_backend_list: count is NULL");
    if (infos && capacity < 0)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_backend_list: capacity = %d is negative", capacity);
    if (infos && info_size < NSA_BACKEND_INFO_SIZE_FIRST)
        return nsa_struct_out(infos, info_size, NSA_BACKEND_INFO_SIZE_FIRST, NULL, 0, "nsa_backend_list", "infos[]");
    *count = NUM_KNOWN;
    if (!infos) return NSA_SUCCESS;
    for (int i = 0; i < NUM_KNOWN && i < capacity; i++) {
        nsa_registered scratch;
        const nsa_registered *r = nsa_registry_get(known[i], &scratch);
        nsa_backend_info o;
        memset(&o, 0, sizeof o);
        snprintf(o.name, sizeof o.name, "%s", known[i]);
        if (r) {
            o.available = r->be && r->device_count > 0;
            o.device_count = r->device_count;
            snprintf(o.reason, sizeof o.reason, "%s", r->reason);
        }
        nsa_struct_out((unsigned char *)infos + (size_t)i * info_size, info_size, NSA_BACKEND_INFO_SIZE_FIRST, &o,
                       sizeof o, "nsa_backend_list", "infos[]");
    }
    nsa_clear_error();
    return NSA_SUCCESS;
}

nsa_status nsa_device_name(const char *backend, int index, char *name, size_t size)
{
    nsa_clear_error();
    if (!backend) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_device_name: backend is NULL");
    if (!name) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_device_name: name is NULL");
    if (size == 0) return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_device_name: size is 0");
    nsa_registered scratch;
    const nsa_registered *r = nsa_registry_get(backend, &scratch);
    if (!r) return NSA_ERR_BACKEND_UNAVAILABLE;
    if (!r->be || r->device_count <= 0)
        return nsa_set_error(r->be ? NSA_ERR_BACKEND_UNAVAILABLE : r->load_status, "backend %s is unavailable: %s",
                             backend, r->reason);
    if (index < 0 || index >= r->device_count)
        return nsa_set_error(NSA_ERR_DEVICE_NOT_FOUND, "nsa_device_name: index = %d, but backend %s has %d device(s)",
                             index, backend, r->device_count);
    if (!r->be->device_name) {
        snprintf(name, size, "%s device %d", backend, index);
        return NSA_SUCCESS;
    }
    return nsa_backend_error(r->be->device_name(index, name, size), backend, "naming device %d", index);
}

/* A one-line summary of every known backend, for "unavailable" messages. */
static void describe_all(char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < NUM_KNOWN; i++) {
        nsa_registered scratch;
        const nsa_registered *r = nsa_registry_get(known[i], &scratch);
        if (!r) continue;
        int n;
        if (r->be && r->device_count > 0)
            n = snprintf(out + used, size - used, "%s%s: available (%d device%s)", used ? "; " : "", r->name,
                         r->device_count, r->device_count == 1 ? "" : "s");
        else
            n = snprintf(out + used, size - used, "%s%s: %s", used ? "; " : "", r->name, r->reason);
        if (n < 0 || (size_t)n >= size - used) break;
        used += (size_t)n;
    }
}

/* Walks the preference list `request` (a name, a comma list, or NULL: then
 * NSA_BACKEND, then the best available) in order and calls use() on each
 * available backend until one succeeds; a backend that is unavailable, or whose
 * use() fails, is passed over for the next. When none succeeds, the message
 * says why for each listed name. */
nsa_status nsa_registry_choose(const char *request, nsa_status (*use)(const nsa_registered *r, void *arg),
                               void *arg)
{
    const char *source = "the backend argument";
    if (!request || !*request) {
        request = getenv("NSA_BACKEND");
        source = "NSA_BACKEND";
    }
    char list[512];
    if (!request || !*request) {
        /* the best available first; a backend whose device 0 is a CPU (OpenCL on PoCL or a CPU
         * runtime) after the built-in cpu backend, which is faster on the same cores */
        static const char *const gpu_first[] = {"cuda", "hip", "opencl"};
        char late[64] = "";
        list[0] = '\0';
        for (size_t i = 0; i < sizeof gpu_first / sizeof gpu_first[0]; i++) {
            nsa_registered scratch;
            const nsa_registered *r = nsa_registry_get(gpu_first[i], &scratch);
            int kind = NSA_DEVICE_KIND_GPU;
            const int cpu_device = r && r->be && r->device_count > 0 && r->be->device_kind &&
                                   r->be->device_kind(0, &kind) == NSA_SUCCESS && kind == NSA_DEVICE_KIND_CPU;
            char *dst = cpu_device ? late : list;
            const size_t cap = cpu_device ? sizeof late : sizeof list;
            snprintf(dst + strlen(dst), cap - strlen(dst), "%s,", gpu_first[i]);
        }
        snprintf(list + strlen(list), sizeof list - strlen(list), "cpu%s%.*s", late[0] ? "," : "",
                 late[0] ? (int)strlen(late) - 1 : 0, late);
        nsa_clear_error();
        source = NULL;
    } else {
        if (strlen(request) >= sizeof list)
            return nsa_set_error(NSA_ERR_BACKEND_UNAVAILABLE, "%s is too long (%zu characters; at most %zu)", source,
                                 strlen(request), sizeof list - 1);
        snprintf(list, sizeof list, "%s", request);
    }
    char tried[1536] = "";
    size_t used = 0;
    int mismatch = 0, listed = 0, attempts = 0;
    nsa_status first_failure = NSA_SUCCESS;
    char only_message[2048] = "";
    for (char *name = list, *next; name; name = next) {
        next = strchr(name, ',');
        if (next) *next++ = '\0';
        while (*name == ' ') name++;
        size_t n = strlen(name);
        while (n && name[n - 1] == ' ') name[--n] = '\0';
        listed++;
        char why[NSA_REASON_MAX + 2048];
        nsa_registered scratch;
        const nsa_registered *r = NULL;
        if (!name_problem(name, why, sizeof why)) r = nsa_registry_get(name, &scratch);
        if (r && r->be && r->device_count > 0) {
            nsa_status s = use(r, arg);
            if (s == NSA_SUCCESS) {
                nsa_clear_error();
                return NSA_SUCCESS;
            }
            attempts++;
            if (first_failure == NSA_SUCCESS) first_failure = s;
            snprintf(why, sizeof why, "%s: %s", nsa_status_string(s), nsa_last_error());
            snprintf(only_message, sizeof only_message, "%s", nsa_last_error());
            if (next) nsa_log(NSA_LOG_WARN, "backend %s passed over: %s", name, why);
        } else if (r) {
            snprintf(why, sizeof why, "%s", r->reason);
            if (next) nsa_log(NSA_LOG_INFO, "backend %s not used: %s", name, why);
            if (r->load_status == NSA_ERR_VERSION_MISMATCH) mismatch = 1;
        }
        int k = snprintf(tried + used, sizeof tried - used, "%s%s: %s", used ? "; " : "", n ? name : "(empty)", why);
        if (k > 0 && (size_t)k < sizeof tried - used) used += (size_t)k;
    }
    /* one backend named, and it failed in use(): its own status and message */
    if (listed == 1 && attempts == 1) return nsa_set_error(first_failure, "%s", only_message);
    char all[1536];
    describe_all(all, sizeof all);
    nsa_status st = first_failure != NSA_SUCCESS ? first_failure
                    : mismatch                   ? NSA_ERR_VERSION_MISMATCH
                                                 : NSA_ERR_BACKEND_UNAVAILABLE;
    pthread_mutex_lock(&lock);
    char where[1100];
    snprintf(where, sizeof where, "%s%s%s", search_path[0] ? " (modules searched in: " : "", search_path,
             search_path[0] ? ")" : "");
    pthread_mutex_unlock(&lock);
    if (source)
        return nsa_set_error(st, "%s = \"%s\": no listed backend could be used (%s). All backends: %s%s", source,
                             request, tried, all, where);
    return nsa_set_error(st, "no backend could be used (%s). All backends: %s%s", tried, all, where);
}
