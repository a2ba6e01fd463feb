/*
 * Process-wide settings that used to be environment-only (include/nsa.h,
 * "Settings"): the log callback, the kernel cache folder, the CPU backend's
 * thread count and the backend module search path. A value set through the API
 * wins; unset, the environment variable is the default. Backends read them
 * through the host API (setting, log), so a module never calls getenv for them.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SETTING_MAX 4096

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char s_cache_dir[SETTING_MAX], s_backend_path[SETTING_MAX]; /* "" : unset */
static int s_threads;                                            /* 0 : unset */
static nsa_log_fn s_log_fn;
static void *s_log_user;
static int s_log_level = -1; /* with a callback: its max level */

static nsa_status set_string(char *dst, const char *value, const char *fn, const char *what)
{
    nsa_clear_error();
    if (value && !*value)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "%s: %s is empty (pass NULL to go back to the environment)", fn,
                             what);
    if (value && strlen(value) >= SETTING_MAX)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "%s: %s is %zu characters long (at most %d)", fn, what,
                             strlen(value), SETTING_MAX - 1);
    pthread_mutex_lock(&mu);
    snprintf(dst, SETTING_MAX, "%s", value ? value : "");
    pthread_mutex_unlock(&mu);
    return NSA_SUCCESS;
}

nsa_status nsa_set_cache_dir(const char *dir) { return set_string(s_cache_dir, dir, "nsa_set_cache_dir", "dir"); }

nsa_status nsa_set_backend_path(const char *dirs)
{
    return set_string(s_backend_path, dirs, "nsa_set_backend_path", "dirs");
}

nsa_status nsa_set_cpu_threads(int threads)
{
    nsa_clear_error();
    if (threads < 0 || threads > NSA_CPU_THREADS_MAX)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_set_cpu_threads: threads = %d is outside 0 .. %d (0: back "
                             "to NSA_CPU_THREADS, else all online CPUs)", threads, NSA_CPU_THREADS_MAX);
    pthread_mutex_lock(&mu);
    s_threads = threads;
    pthread_mutex_unlock(&mu);
    return NSA_SUCCESS;
}

nsa_status nsa_set_log(nsa_log_fn fn, nsa_log_level max_level, void *user)
{
    nsa_clear_error();
    if ((int)max_level < NSA_LOG_ERROR || (int)max_level > NSA_LOG_DEBUG)
        return nsa_set_error(NSA_ERR_INVALID_VALUE, "nsa_set_log: max_level = %d is not an nsa_log_level (0 .. 3)",
                             (int)max_level);
    pthread_mutex_lock(&mu);
    s_log_fn = fn;
    s_log_user = fn ? user : NULL;
    s_log_level = fn ? (int)max_level : -1;
    pthread_mutex_unlock(&mu);
    return NSA_SUCCESS;
}

const char *nsa_log_level_name(nsa_log_level level)
{
    switch (level) {
    case NSA_LOG_ERROR: return "error";
    case NSA_LOG_WARN: return "warn";
    case NSA_LOG_INFO: return "info";
    case NSA_LOG_DEBUG: return "debug";
    }
    return "unknown";
}

/* NSA_LOG=error|warn|info|debug: the level printed to stderr when no callback is set (-1: none) */
static int env_log_level(void)
{
    const char *e = getenv("NSA_LOG");
    if (!e || !*e) return -1;
    for (int l = NSA_LOG_ERROR; l <= NSA_LOG_DEBUG; l++)
        if (strcmp(e, nsa_log_level_name((nsa_log_level)l)) == 0) return l;
    return NSA_LOG_WARN; /* a value we do not know still asks for something */
}

/* the callback and the level messages reach (-1: none) */
static int log_target(nsa_log_fn *fn, void **user)
{
    pthread_mutex_lock(&mu);
    *fn = s_log_fn;
    *user = s_log_user;
    int max = s_log_level;
    pthread_mutex_unlock(&mu);
    return *fn ? max : env_log_level();
}

int nsa_log_enabled(int level)
{
    nsa_log_fn fn;
    void *user;
    return level >= NSA_LOG_ERROR && level <= log_target(&fn, &user);
}

void nsa_log(int level, const char *fmt, ...)
{
    nsa_log_fn fn;
    void *user;
    const int max = log_target(&fn, &user);
    if (level < NSA_LOG_ERROR || level > max) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (fn) fn((nsa_log_level)level, msg, user); /* outside the lock: the callback may call libnsa */
    else fprintf(stderr, "libnsa %s: %s\n", nsa_log_level_name((nsa_log_level)level), msg);
}

int nsa_setting(const char *name, char *buf, size_t size)
{
    if (!name || !buf || size == 0) return 0;
    buf[0] = '\0';
    const char *env = NULL;
    int set = 0;
    pthread_mutex_lock(&mu);
    if (strcmp(name, NSA_SETTING_CACHE_DIR) == 0) {
        if (s_cache_dir[0]) set = snprintf(buf, size, "%s", s_cache_dir) < (int)size;
        env = "NSA_CACHE_DIR";
    } else if (strcmp(name, NSA_SETTING_BACKEND_PATH) == 0) {
        if (s_backend_path[0]) set = snprintf(buf, size, "%s", s_backend_path) < (int)size;
        env = "NSA_BACKEND_PATH";
    } else if (strcmp(name, NSA_SETTING_CPU_THREADS) == 0) {
        if (s_threads > 0) set = snprintf(buf, size, "%d", s_threads) < (int)size;
        env = "NSA_CPU_THREADS";
    }
    pthread_mutex_unlock(&mu);
    if (set || !env) return set;
    const char *v = getenv(env);
    return v && *v && snprintf(buf, size, "%s", v) < (int)size;
}
