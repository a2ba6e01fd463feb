/*
 * oclgrind_shim.c: a development aid (not built by meson) for running the OpenCL
 * backend under Oclgrind 21.10 with --uninitialized, whose shadow-memory tracking has
 * two bugs that flag correct code:
 *   1. clEnqueueWriteBuffer at a nonzero offset marks the wrong byte range as written
 *      (the core writes the plan tables at offsets);
 *   2. after clEnqueueFillBuffer, values that a kernel later stores into the buffer
 *      still read as uninitialized in the next kernel (the tests poison outputs and
 *      workspaces with fills).
 * The shim turns offset writes into whole-buffer read-modify-writes and fills into
 * writes. Usage (one case per process: in a long-lived process Oclgrind still
 * reports values after the first forward, which the poisoned-workspace parity runs
 * show to be false):
 *   gcc -shared -fPIC backends/opencl/oclgrind_shim.c -o /tmp/oclgrind_shim.so -ldl
 *   oclgrind --uninitialized --build-options -cl-opt-disable \
 *     env LD_PRELOAD=/tmp/oclgrind_shim.so:/usr/lib/oclgrind/liboclgrind-rt.so <program>
 * (-cl-opt-disable: the plugin aborts on LLVM's `freeze` instruction otherwise.)
 */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
typedef cl_int (*wfn)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *, cl_uint, const cl_event *, cl_event *);
typedef cl_int (*rfn)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, cl_uint, const cl_event *, cl_event *);
cl_int clEnqueueWriteBuffer(cl_command_queue q, cl_mem m, cl_bool blk, size_t off, size_t n, const void *p,
                            cl_uint ne, const cl_event *ev, cl_event *out)
{
    static wfn w; static rfn r;
    if (!w) { w = (wfn)dlsym(RTLD_NEXT, "clEnqueueWriteBuffer"); r = (rfn)dlsym(RTLD_NEXT, "clEnqueueReadBuffer"); }
    if (off == 0) return w(q, m, blk, off, n, p, ne, ev, out);
    size_t size = 0;
    clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL);
    unsigned char *all = malloc(size);
    cl_int e = r(q, m, CL_TRUE, 0, size, all, ne, ev, NULL);
    if (e) { free(all); return e; }
    memcpy(all + off, p, n);
    e = w(q, m, CL_TRUE, 0, size, all, 0, NULL, out);
    free(all);
    return e;
}

cl_int clEnqueueFillBuffer(cl_command_queue q, cl_mem m, const void *pat, size_t psize, size_t off, size_t n,
                           cl_uint ne, const cl_event *ev, cl_event *out)
{
    unsigned char *h = malloc(n ? n : 1);
    for (size_t i = 0; i < n; ++i) h[i] = ((const unsigned char *)pat)[i % psize];
    cl_int e = clFinish(q);
    if (!e) e = clEnqueueWriteBuffer(q, m, CL_TRUE, off, n, h, ne, ev, out);
    free(h);
    return e;
}
