/*
 * combine.cl: the gated sum (semantics section 6),
 *     o(t, h) = g_cmp * o_cmp + g_slc * o_slc + g_win * o_win,
 * in f32, branches added in that order, each term by one fma (so that a sum stopped
 * after two terms and resumed later is bitwise the sum made at once); a disabled
 * branch (has_* = 0) is skipped and its gate not read. o is stored in the storage
 * type (round to nearest even).
 * Element-wise over T * Hq * Dv elements (e = first + global id, guarded e < total).
 * SLC_COMBINE stops after the selected branch's term (combine_partial, the sum
 * stored in place of o_cmp); COMBINE then resumes from it (c_done = 1: oc holds
 * the partial sum, its gate is not read, and has_s is 0).
 */
/* The gated sum of row (t, h), element c (combine, and the decode step's decode_combine). */
inline float combine_value(const __global float *oc, long oc_off, long oc_st, long oc_sh,
                           const __global float *os, long os_off, long os_st, long os_sh,
                           const __global float *ow, long ow_off, long ow_st, long ow_sh,
                           const __global float *gc, long gc_off, long gc_st, long gc_sh,
                           const __global float *gs, long gs_off, long gs_st, long gs_sh,
                           const __global float *gw, long gw_off, long gw_st, long gw_sh,
                           int has_c, int has_s, int has_w, long t, long h, long c)
{
    float y = 0.0f;
    if (has_c) y = fma(gc[gc_off + t * gc_st + h * gc_sh], oc[oc_off + t * oc_st + h * oc_sh + c], y);
    if (has_s) y = fma(gs[gs_off + t * gs_st + h * gs_sh], os[os_off + t * os_st + h * os_sh + c], y);
    if (has_w) y = fma(gw[gw_off + t * gw_st + h * gw_sh], ow[ow_off + t * ow_st + h * ow_sh + c], y);
    return y;
}

__kernel void combine(const __global float *oc, long oc_off, long oc_st, long oc_sh,
                      const __global float *os, long os_off, long os_st, long os_sh,
                      const __global float *ow, long ow_off, long ow_st, long ow_sh,
                      const __global float *gc, long gc_off, long gc_st, long gc_sh,
                      const __global float *gs, long gs_off, long gs_st, long gs_sh,
                      const __global float *gw, long gw_off, long gw_st, long gw_sh,
                      int has_c, int has_s, int has_w, int c_done,
                      __global nsa_t *o, long o_off, long o_st, long o_sh,
                      long Hq, long Dv, long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total) return;
    const long c = e % Dv, th = e / Dv, h = th % Hq, t = th / Hq;
    float y;
    if (c_done) {
        y = oc[oc_off + t * oc_st + h * oc_sh + c];
        if (has_w) y = fma(gw[gw_off + t * gw_st + h * gw_sh], ow[ow_off + t * ow_st + h * ow_sh + c], y);
    } else {
        y = combine_value(oc, oc_off, oc_st, oc_sh, os, os_off, os_st, os_sh, ow, ow_off, ow_st, ow_sh, gc, gc_off,
                          gc_st, gc_sh, gs, gs_off, gs_st, gs_sh, gw, gw_off, gw_st, gw_sh, has_c, has_s, has_w, t, h, c);
    }
    st(o, o_off + t * o_st + h * o_sh + c, y);
}

/* SLC_COMBINE's end: oc := gc oc + gs os for the run's elements (each read and
 * written by one work-item, in place). */
__kernel void combine_partial(__global float *oc, long oc_off, long oc_st, long oc_sh,
                              const __global float *os, long os_off, long os_st, long os_sh,
                              const __global float *gc, long gc_off, long gc_st, long gc_sh,
                              const __global float *gs, long gs_off, long gs_st, long gs_sh,
                              long Hq, long Dv, long total, long first)
{
    const long e = first + (long)get_global_id(0);
    if (e >= total) return;
    const long c = e % Dv, th = e / Dv, h = th % Hq, t = th / Hq;
    oc[oc_off + t * oc_st + h * oc_sh + c] =
        combine_value(oc, oc_off, oc_st, oc_sh, os, os_off, os_st, os_sh, os, os_off, os_st, os_sh, gc, gc_off, gc_st,
                      gc_sh, gs, gs_off, gs_st, gs_sh, gs, gs_off, gs_st, gs_sh, 1, 1, 0, t, h, c);
}
