/*
 * wgmma.cuh -- Hopper warpgroup MMA (wgmma.mma_async, sm_90a) for the tile
 * kernels: a warpgroup (4 warps, 128 threads) multiplies a 64-row A by an
 * N-column B read straight from shared memory through a matrix descriptor,
 * asynchronously, accumulating in fp32 registers.
 *
 * Only code compiled for sm_90a may run these instructions; NSA_WGMMA is
 * defined in that compilation and kernels guard their wgmma bodies with it
 * (attn_sm90.cu: the host asks a probe kernel which code the device runs).
 *
 * Layouts (the PTX ISA, "asynchronous warpgroup level matrix"):
 *   accumulator m64nN, per warp w of the warpgroup: rows 16w .. 16w+15,
 *     d[j][e] = row 16w + lane/4 + 8*(e/2), column 8j + 2*(lane%4) + e%2,
 *     i.e. the mma.sync m16n8 C fragments of nsa_cuda.cuh, N/8 of them;
 *   A from registers (m64k16, 16-bit): per warp the mma.sync m16n8k16 A
 *     fragment, so P = softmax(S) feeds P V straight from the accumulator;
 *   shared-memory operands: 128-byte swizzle. A [rows][D] tile is stored as
 *     D/64 panels of [rows][64 elements]; row r of a panel is 128 bytes at
 *     r * 128 whose 16-byte chunk c sits at chunk c ^ (r % 8). Panels start
 *     on 1024-byte boundaries.
 *       K-major (Q, K: the reduction dim contiguous): stride between 8-row
 *       groups 1024 B; the k-step of 16 elements moves the start by 32 B.
 *       MN-major (V, whose rows are the reduction dim): 8-row groups 1024 B
 *       apart, 64-column panels `lbo` bytes apart; transpose flag set.
 */
#ifndef NSA_KERNELS_CUDA_WGMMA_CUH
#define NSA_KERNELS_CUDA_WGMMA_CUH

#include "nsa_cuda.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NSA_WGMMA 1
#endif

namespace nsa_cuda {

/* Byte offset of 16-byte chunk c (elements 8c .. 8c+7) of row r in a
 * swizzled [rows][D] tile (panels of 64 elements). */
NSA_DEV uint32_t sw128_off(int r, int c, int rows)
{
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* Matrix descriptor of a 128-byte-swizzled operand at shared address saddr
 * (1024-byte aligned atom base plus the k-step offset); lbo: the MN-major
 * panel stride in bytes (16 for K-major operands, where it is unused). */
NSA_DEV uint64_t sw128_desc(uint32_t saddr, uint32_t lbo)
{
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
           (1ull << 62);
}

/* The descriptor of the operand `bytes` (a multiple of 16) further on than
 * the one d describes: only the start-address field (bits 0-13, 16-byte
 * units) moves. Shared addresses stay below 2^18, so the field cannot carry
 * into the next one. The loops build one descriptor per tile this way
 * instead of one per k-step (v6: ~10 integer instructions each). */
NSA_DEV uint64_t desc_at(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }

/* The fences and waits compile to nothing for targets without wgmma, so that
 * code shared with the mma.sync kernels builds for every listed target (the
 * wgmma kernels never run there: the host asks sm90a_available()). */
NSA_DEV void wg_fence()
{
#ifdef NSA_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
NSA_DEV void wg_commit()
{
#ifdef NSA_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> NSA_DEV void wg_wait()
{
#ifdef NSA_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* Shared-memory writes of this thread (cp.async, st.shared) become visible to
 * the async proxy that wgmma reads through; then a barrier. */
NSA_DEV void fence_async_smem()
{
#ifdef NSA_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/* Keeps the compiler from moving reads or writes of an accumulator across
 * the asynchronous MMA that owns it (an empty asm that "changes" it). */
template <int NJ> NSA_DEV void wg_hold(float (&d)[NJ][4])
{
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[j][e])::"memory");
}

/* Wg<T>::ssN: d (m64nN) = [d +] A(desc) B(desc), scale_d 0 overwrites d.
 * Wg<T>::rsN: d += A(registers) B(desc), B MN-major (transposed).
 * Inline asm needs one operand per accumulator register, so each width is
 * written out (the operand lists were generated, not typed). */
template <typename T> struct Wg;

#define NSA_WG_SS32(PTX_T) \
    static NSA_DEV void ss32(float (&d)[4][4], uint64_t da, uint64_t db, int scale_d) \
    { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32." PTX_T "." PTX_T " " \
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n" \
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]) \
                     : "l"(da), "l"(db), "r"(scale_d)); \
    }

#define NSA_WG_SS64(PTX_T) \
    static NSA_DEV void ss64(float (&d)[8][4], uint64_t da, uint64_t db, int scale_d) \
    { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_T "." PTX_T " " \
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
                     : "l"(da), "l"(db), "r"(scale_d)); \
    }

#define NSA_WG_SS128(PTX_T) \
    static NSA_DEV void ss128(float (&d)[16][4], uint64_t da, uint64_t db, int scale_d) \
    { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX_T "." PTX_T " " \
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
                     : "l"(da), "l"(db), "r"(scale_d)); \
    }

#define NSA_WG_RS64(PTX_T) \
    static NSA_DEV void rs64(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db) \
    { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_T "." PTX_T " " \
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n" \
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)); \
    }

#define NSA_WG_RS128(PTX_T) \
    static NSA_DEV void rs128(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db) \
    { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX_T "." PTX_T " " \
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n" \
                     : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]) \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)); \
    }

#define NSA_WG_16BIT(T, PTX_T)                                                                                  \
    template <> struct Wg<T> {                                                                                   \
        NSA_WG_SS32(PTX_T)                                                                                       \
        NSA_WG_SS64(PTX_T)                                                                                       \
        NSA_WG_SS128(PTX_T)                                                                                      \
        NSA_WG_RS64(PTX_T)                                                                                       \
        NSA_WG_RS128(PTX_T)                                                                                      \
    };
NSA_WG_16BIT(__nv_bfloat16, "bf16")
NSA_WG_16BIT(__half, "f16")
#undef NSA_WG_16BIT
#undef NSA_WG_SS32
#undef NSA_WG_SS64
#undef NSA_WG_SS128
#undef NSA_WG_RS64
#undef NSA_WG_RS128

/* Width-generic entry points for the kernels (ss: N = 32, 64 or 128; rs: 64 or 128). */
template <typename T, int N> NSA_DEV void wg_ss(float (&d)[N / 8][4], uint64_t da, uint64_t db, int scale_d)
{
    if constexpr (N == 32)
        Wg<T>::ss32(d, da, db, scale_d);
    else if constexpr (N == 64)
        Wg<T>::ss64(d, da, db, scale_d);
    else
        Wg<T>::ss128(d, da, db, scale_d);
}
template <typename T, int N> NSA_DEV void wg_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db)
{
    if constexpr (N == 64)
        Wg<T>::rs64(d, a, db);
    else
        Wg<T>::rs128(d, a, db);
}

/* S = Q K^T over DQK dims, queued as one wgmma group: Q and K both K-major in
 * 128-byte-swizzled panels of 64 dims (qd, kd: their descriptors; QROWS, N
 * rows a panel), one m64nNk16 per 16 dims. */
template <typename T, int N, int DQK, int QROWS>
NSA_DEV void wg_qk(float (&s)[N / 8][4], uint64_t qd, uint64_t kd)
{
#pragma unroll
    for (int j = 0; j < N / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < DQK / 16; kk++) {
        const uint32_t off = (kk & 3) * 32; /* 16 dims into the 128-byte row */
        wg_ss<T, N>(s, desc_at(qd, (kk >> 2) * QROWS * 128 + off), desc_at(kd, (kk >> 2) * N * 128 + off), kk > 0);
    }
    wg_commit();
}

/* O += P V over NK keys: P from the registers that hold S (rounded to T, the
 * A fragments of one k16 step per pair of 8-key columns), V from shared
 * memory (vd: its MN-major descriptor, 16 keys = 16 rows of 128 bytes per
 * step), queued as one wgmma group. */
template <typename T, int DV, int NK>
NSA_DEV void wg_pv(float (&o)[DV / 8][4], const float (&s)[NK / 8][4], uint64_t vd)
{
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < NK / 16; kk++) {
        uint32_t a[4];
        a[0] = Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]);
        a[1] = Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]);
        a[2] = Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        wg_rs<T, DV>(o, a, desc_at(vd, kk * 16 * 128));
    }
    wg_commit();
}

} // namespace nsa_cuda

#endif
