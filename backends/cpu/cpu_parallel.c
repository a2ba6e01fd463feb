/*
 * cpu_parallel.c: the parallel-for behind every cpu stage (see cpu_parallel.h).
 *
 * Threads are started per call and joined before it returns (a stage runs for
 * milliseconds to seconds; starting a thread costs microseconds). Chunks are
 * handed out through one atomic counter, so later tokens (which see more keys)
 * do not leave a thread idle; which thread computes a chunk does not change
 * any result.
 */
#include "cpu_parallel.h"

#include <errno.h>
#include <stdlib.h>

#ifndef NSA_CPU_NO_THREADS
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#endif


nsa_status nsa_cpu_thread_count(int *threads)
{
#ifdef NSA_CPU_NO_THREADS
    *threads = 1;
    return NSA_SUCCESS;
#else
    char env[64]; /* nsa_set_cpu_threads, else NSA_CPU_THREADS */
    if (nsa_cpu_host()->setting(NSA_SETTING_CPU_THREADS, env, sizeof env)) {
        char *end = NULL;
        errno = 0;
        long v = strtol(env, &end, 10);
        if (errno || end == env || *end != '\0' || v < 1)
            return nsa_cpu_host()->set_error(NSA_ERR_INVALID_VALUE,
                                             "cpu backend: NSA_CPU_THREADS='%s' is not a positive integer",
                                             env);
        *threads = v > NSA_CPU_THREADS_MAX ? NSA_CPU_THREADS_MAX : (int)v;
        return NSA_SUCCESS;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    *threads = n < 1 ? 1 : n > NSA_CPU_THREADS_MAX ? NSA_CPU_THREADS_MAX : (int)n;
    return NSA_SUCCESS;
#endif
}

typedef struct pf_shared {
#ifndef NSA_CPU_NO_THREADS
    atomic_llong next; /* first item of the next chunk to hand out */
#else
    long long next;
#endif
    int64_t count, grain;
    nsa_cpu_range_fn fn;
    void *user;
} pf_shared;

typedef struct pf_worker {
    pf_shared *sh;
    void *scratch;
#ifndef NSA_CPU_NO_THREADS
    pthread_t tid;
    int started;
#endif
} pf_worker;

static void *pf_work(void *arg)
{
    pf_worker *w = arg;
    pf_shared *sh = w->sh;
    for (;;) {
#ifndef NSA_CPU_NO_THREADS
        int64_t begin = (int64_t)atomic_fetch_add(&sh->next, (long long)sh->grain);
#else
        int64_t begin = sh->next;
        sh->next += sh->grain;
#endif
        if (begin >= sh->count)
            break;
        int64_t end = sh->count - begin < sh->grain ? sh->count : begin + sh->grain;
        sh->fn(sh->user, begin, end, w->scratch);
    }
    return NULL;
}

nsa_status nsa_cpu_parallel_for(int threads, int64_t count, int64_t grain, size_t scratch_bytes,
                                nsa_cpu_range_fn fn, void *user)
{
    if (count <= 0)
        return NSA_SUCCESS;
    if (threads < 1)
        threads = 1;
#ifdef NSA_CPU_NO_THREADS
    threads = 1;
#endif
    if (grain <= 0) /* about 8 chunks per thread */
        grain = count / ((int64_t)threads * 8);
    if (grain < 1)
        grain = 1;
    int64_t chunks = (count + grain - 1) / grain;
    int nw = chunks < threads ? (int)chunks : threads;

    size_t per = (scratch_bytes + 63u) & ~(size_t)63u;
    size_t head = ((size_t)nw * sizeof(pf_worker) + 63u) & ~(size_t)63u;
    if (per != 0 && (size_t)nw > (SIZE_MAX - head - 64u) / per)
        return nsa_cpu_host()->set_error(NSA_ERR_OUT_OF_MEMORY,
                                         "cpu backend: scratch of %d x %zu bytes overflows", nw, per);
    size_t total = head + (size_t)nw * per;
    /* one allocation: the worker records, then each thread's scratch */
    unsigned char *mem = aligned_alloc(64, (total + 63u) & ~(size_t)63u);
    if (!mem)
        return nsa_cpu_host()->set_error(NSA_ERR_OUT_OF_MEMORY,
                                         "cpu backend: cannot allocate %zu bytes of scratch for %d threads",
                                         total, nw);
    pf_shared sh;
#ifndef NSA_CPU_NO_THREADS
    atomic_init(&sh.next, 0);
#else
    sh.next = 0;
#endif
    sh.count = count;
    sh.grain = grain;
    sh.fn = fn;
    sh.user = user;
    pf_worker *w = (pf_worker *)mem;
    for (int i = 0; i < nw; i++) {
        w[i].sh = &sh;
        w[i].scratch = per ? mem + head + (size_t)i * per : NULL;
    }
#ifndef NSA_CPU_NO_THREADS
    for (int i = 1; i < nw; i++)
        w[i].started = pthread_create(&w[i].tid, NULL, pf_work, &w[i]) == 0;
#endif
    pf_work(&w[0]); /* the calling thread works too, and finishes whatever is left */
#ifndef NSA_CPU_NO_THREADS
    for (int i = 1; i < nw; i++)
        if (w[i].started)
            pthread_join(w[i].tid, NULL);
#endif
    free(mem);
    return NSA_SUCCESS;
}
