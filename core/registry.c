/*
 * The backend registry: the built-in cpu backend plus loadable modules
 * (libnsa_backend_<name>.so) found, in this order, in NSA_BACKEND_PATH (a colon
 * list), the install directory, and the folder "nsa" beside libnsa itself.
 * A module is loaded once, on first use, and kept for the life of the process.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Messages here are cut to their fixed-size fields on purpose. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

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

static int valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof entries[0].name) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return 0;
    }
    return 1;
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

static void load_module(nsa_registered *r)
{
    char why[NSA_REASON_MAX] = "";
    char searched[1024] = "";
    void *h = NULL;
    int exists = 0;

    const char *env = getenv("NSA_BACKEND_PATH");
    if (env && *env) {
        char *copy = strdup(env);
        if (!copy) {
            r->load_status = NSA_ERR_OUT_OF_MEMORY;
            snprintf(r->reason, sizeof r->reason, "out of memory while reading NSA_BACKEND_PATH");
            return;
        }
        char *save = NULL;
        for (char *dir = strtok_r(copy, ":", &save); dir && !h && !exists; dir = strtok_r(NULL, ":", &save))
            h = try_open(dir, r->name, &exists, why, sizeof why);
        free(copy);
        snprintf(searched, sizeof searched, "NSA_BACKEND_PATH=%s, ", env);
    }
    char beside[2048];
    int have_beside = beside_library(beside, sizeof beside);
    if (!h && !exists) h = try_open(NSA_MODULE_DIR, r->name, &exists, why, sizeof why);
    if (!h && !exists && have_beside) h = try_open(beside, r->name, &exists, why, sizeof why);
    size_t used = strlen(searched);
    snprintf(searched + used, sizeof searched - used, "%s%s%s", NSA_MODULE_DIR, have_beside ? ", " : "",
             have_beside ? beside : "");

    if (!h) {
        r->load_status = NSA_ERR_BACKEND_UNAVAILABLE;
        if (exists)
            snprintf(r->reason, sizeof r->reason, "module failed to load: %s", why);
        else
            snprintf(r->reason, sizeof r->reason, "module libnsa_backend_%s.so not found", r->name);
        snprintf(search_path, sizeof search_path, "%s", searched);
        return;
    }
    const int *version = (const int *)dlsym(h, NSA_BACKEND_VERSION_SYMBOL);
    nsa_backend_entry_fn entry = NULL;
    void *sym = dlsym(h, NSA_BACKEND_ENTRY_SYMBOL);
    memcpy(&entry, &sym, sizeof entry);
    if (!version || !entry) {
        r->load_status = NSA_ERR_BACKEND_UNAVAILABLE;
        snprintf(r->reason, sizeof r->reason, "module libnsa_backend_%s.so lacks the symbol %s", r->name,
                 version ? NSA_BACKEND_ENTRY_SYMBOL : NSA_BACKEND_VERSION_SYMBOL);
        dlclose(h);
        return;
    }
    if (*version != NSA_BACKEND_API_VERSION) {
        r->load_status = NSA_ERR_VERSION_MISMATCH;
        snprintf(r->reason, sizeof r->reason,
                 "module libnsa_backend_%s.so was built for backend API version %d, this libnsa %s needs %d", r->name,
                 *version, nsa_version_string(), NSA_BACKEND_API_VERSION);
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

const nsa_registered *nsa_registry_get(const char *name)
{
    if (!valid_name(name)) {
        nsa_set_error(NSA_ERR_BACKEND_UNAVAILABLE,
                      "backend name \"%s\" is malformed: names are 1-31 characters of a-z, 0-9 and _", name);
        return NULL;
    }
    pthread_mutex_lock(&lock);
    nsa_registered *r = NULL;
    for (int i = 0; i < num_entries; i++)
        if (strcmp(entries[i].name, name) == 0) r = &entries[i];
    if (!r && num_entries < MAX_ENTRIES) {
        r = &entries[num_entries++];
        memset(r, 0, sizeof *r);
        snprintf(r->name, sizeof r->name, "%s", name);
        if (strcmp(name, "cpu") == 0) {
            r->be = nsa_cpu_backend(&nsa_host);
            r->load_status = r->be ? NSA_SUCCESS : NSA_ERR_INTERNAL;
            snprintf(r->reason, sizeof r->reason, "built in");
        } else {
            load_module(r);
        }
        if (r->be) probe(r);
    }
    pthread_mutex_unlock(&lock);
    if (!r) nsa_set_error(NSA_ERR_BACKEND_UNAVAILABLE, "too many distinct backend names requested");
    return r;
}

nsa_status nsa_backend_list(nsa_backend_info *infos, int capacity, int *count)
{
    nsa_clear_error();
    if (!count) return nsa_set_error(NSA_ERR_NULL_POINTER, "nsa_backend_list: count is NULL");
    if (infos && capacity < 0)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_backend_list: capacity = %d is negative", capacity);
    *count = NUM_KNOWN;
    if (!infos) return NSA_SUCCESS;
    for (int i = 0; i < NUM_KNOWN && i < capacity; i++) {
        const nsa_registered *r = nsa_registry_get(known[i]);
        nsa_backend_info *o = &infos[i];
        memset(o, 0, sizeof *o);
        snprintf(o->name, sizeof o->name, "%s", known[i]);
        if (r) {
            o->available = r->be && r->device_count > 0;
            o->device_count = r->device_count;
            snprintf(o->reason, sizeof o->reason, "%s", r->reason);
        }
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
    const nsa_registered *r = nsa_registry_get(backend);
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
    return r->be->device_name(index, name, size);
}

/* A one-line summary of every known backend, for "unavailable" messages. */
static void describe_all(char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < NUM_KNOWN; i++) {
        const nsa_registered *r = nsa_registry_get(known[i]);
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

/* Picks the backend for a context: `request` is a name, a comma list, or NULL
 * (then NSA_BACKEND, then the best available). */
nsa_status nsa_registry_choose(const char *request, const nsa_registered **out);
nsa_status nsa_registry_choose(const char *request, const nsa_registered **out)
{
    const char *source = "the backend argument";
    if (!request || !*request) {
        request = getenv("NSA_BACKEND");
        source = "NSA_BACKEND";
    }
    char list[512];
    if (!request || !*request) {
        snprintf(list, sizeof list, "cuda,hip,opencl,cpu");
        source = NULL;
    } else {
        if (strlen(request) >= sizeof list)
            return nsa_set_error(NSA_ERR_BACKEND_UNAVAILABLE, "%s is too long (%zu characters)", source,
                                 strlen(request));
        snprintf(list, sizeof list, "%s", request);
    }
    char tried[1536] = "";
    size_t used = 0;
    int mismatch = 0;
    char *save = NULL;
    for (char *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        while (*name == ' ') name++;
        size_t n = strlen(name);
        while (n && name[n - 1] == ' ') name[--n] = '\0';
        const nsa_registered *r = nsa_registry_get(name);
        const char *why = r ? r->reason : "not a valid backend name (a-z, 0-9, _)";
        if (r && r->be && r->device_count > 0) {
            *out = r;
            nsa_clear_error();
            return NSA_SUCCESS;
        }
        if (r && r->load_status == NSA_ERR_VERSION_MISMATCH) mismatch = 1;
        int k = snprintf(tried + used, sizeof tried - used, "%s%s: %s", used ? "; " : "", name, why);
        if (k > 0 && (size_t)k < sizeof tried - used) used += (size_t)k;
    }
    char all[1536];
    describe_all(all, sizeof all);
    nsa_status st = mismatch ? NSA_ERR_VERSION_MISMATCH : NSA_ERR_BACKEND_UNAVAILABLE;
    pthread_mutex_lock(&lock);
    char where[1100];
    snprintf(where, sizeof where, "%s%s%s", search_path[0] ? " (modules searched in: " : "", search_path,
             search_path[0] ? ")" : "");
    pthread_mutex_unlock(&lock);
    if (source)
        return nsa_set_error(st, "%s = \"%s\": no listed backend is available (%s). All backends: %s%s", source,
                             request, tried, all, where);
    return nsa_set_error(st, "no backend is available. All backends: %s%s", all, where);
}
