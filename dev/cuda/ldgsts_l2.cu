/*
 * ldgsts_l2.cu -- a measuring aid, not part of the library: how many L2
 * sectors does cp.async (16 bytes per thread, .cg) read per sector of data,
 * depending on the shared-memory layout it writes and on the global row stride?
 *
 * Why: at T = 64k, slc_fs (16-byte-padded rows) read 170 GB from L2 for about
 * 115 GB of K/V, and with 16-byte chunks XOR-swizzled inside 256-byte rows
 * 227 GB; attn_wg and scores_wt (128-byte-swizzled panels, contiguous source
 * rows) read what they use (docs/cuda-results.md, v7). Each kernel here copies the same
 * random 16-row chunks of 256-byte rows, one warp per chunk as slc_fs's phase 2
 * does, into one of the layouts below (its buffer 1024-byte aligned, or 16
 * bytes past that: "base +16"), and does nothing else. Run it under
 *   ncu --metrics lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum ./ldgsts_l2
 * and divide each kernel's sectors by the "data sectors" it prints
 * (backends/cuda/device_check.sh, step ldgsts). Build: nvcc -O3 -arch=sm_80 or newer.
 *
 * Measured (H200, 2026-12-01, v8 call 1; slc_fs is today's slc_sm80_g16, attn_wg
 * attn_sm90, scores_wt scores_sm90): L2 sectors per data sector 1.00 for plain rows,
 * panels, the 256-byte swizzle and 32-byte-padded rows on an aligned base; 1.50 for
 * 16-byte-padded rows (1.47x the time); 2.00 for any layout 16 bytes off (1.95x);
 * the same for 256-byte and 1 KB source strides. So a 32-byte sector is read twice
 * when its shared-memory destination straddles a 32-byte boundary.
 */
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

namespace {

constexpr int ROWS = 16, CPR = 16, WARPS = 8, CHUNKS = 256; /* rows per chunk, 16-byte chunks per row */

/* byte offset of row r's 16-byte chunk c in a warp's buffer */
struct Plain { static __device__ uint32_t off(int r, int c) { return r * 256 + c * 16; } };
struct Pad16 { static __device__ uint32_t off(int r, int c) { return r * 272 + c * 16; } };
struct Pad32 { static __device__ uint32_t off(int r, int c) { return r * 288 + c * 16; } };
struct Swz256 { static __device__ uint32_t off(int r, int c) { return r * 256 + ((c ^ (r & 7)) << 4); } };
struct SwzPair { static __device__ uint32_t off(int r, int c) { return r * 256 + ((c ^ ((r & 3) << 1)) << 4); } };
struct Panel { static __device__ uint32_t off(int r, int c) { return (c >> 3) * ROWS * 128 + r * 128 + ((c & 7) << 4); } };
struct Sw128 {
    static __device__ uint32_t off(int r, int c) { return (c >> 3) * ROWS * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4); }
};
constexpr uint32_t BUF = ROWS * 288 + 128; /* the largest layout, with room for a base offset */

__device__ uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    return x ^ (x >> 16);
}

/* every warp copies CHUNKS chunks of 16 rows starting at random rows of src
 * (row stride rs bytes, nrows rows) into its own buffer, waiting for each */
template <typename L, int BASE>
__global__ void __launch_bounds__(32 * WARPS) copy_chunks(const char *src, int64_t rs, int nrows, int *sink)
{
    extern __shared__ __align__(16) unsigned char sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* the buffer starts BASE bytes past a 1024-byte boundary (the launcher added 1 KB) */
    unsigned char *const al = sm + ((1024u - ((uint32_t)__cvta_generic_to_shared(sm) & 1023u)) & 1023u);
    unsigned char *buf = al + warp * BUF + BASE;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(buf);
    for (int i = 0; i < CHUNKS; i++) {
        const uint32_t id = (blockIdx.x * WARPS + warp) * CHUNKS + i;
        const int64_t row0 = (int64_t)(mix(id) % (uint32_t)(nrows / ROWS)) * ROWS;
#pragma unroll
        for (int k = 0; k < ROWS * CPR / 32; k++) {
            const int x = lane + 32 * k, r = x / CPR, c = x % CPR;
            const char *g = src + (row0 + r) * rs + c * 16;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sbase + L::off(r, c)), "l"(g));
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
        __syncwarp();
    }
    if (lane == 0 && buf[5] == 0x7f && buf[9] == 0x11) atomicAdd(sink, 1); /* keep the copies */
}

template <typename L, int BASE = 0>
int run(const char *name, const char *src, int64_t rs, int nrows, int *sink, int blocks)
{
    const size_t smem = WARPS * BUF + 1024;
    auto kern = copy_chunks<L, BASE>;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) return 1;
    kern<<<blocks, 32 * WARPS, smem>>>(src, rs, nrows, sink);
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    const double sectors = (double)blocks * WARPS * CHUNKS * ROWS * 256 / 32;
    printf("%-9s base +%2d, row stride %5lld B: data sectors %.0f\n", name, BASE, (long long)rs, sectors);
    return 0;
}

} // namespace

int main()
{
    int dev = 0, sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        fprintf(stderr, "ldgsts_l2: no CUDA device\n");
        return 77;
    }
    const int nrows = 1 << 16;
    const int64_t strides[2] = {256, 1024};
    char *src = nullptr;
    int *sink = nullptr;
    if (cudaMalloc(&src, (size_t)nrows * 1024) != cudaSuccess || cudaMalloc(&sink, sizeof(int)) != cudaSuccess) {
        fprintf(stderr, "ldgsts_l2: cudaMalloc failed\n");
        return 1;
    }
    cudaMemset(src, 1, (size_t)nrows * 1024);
    cudaMemset(sink, 0, sizeof(int));
    int bad = 0;
    for (int64_t rs : strides) {
        bad |= run<Plain>("plain", src, rs, nrows, sink, sms);
        bad |= run<Pad16>("pad16", src, rs, nrows, sink, sms);
        bad |= run<Pad32>("pad32", src, rs, nrows, sink, sms);
        bad |= run<Swz256>("swz256", src, rs, nrows, sink, sms);
        bad |= run<SwzPair>("swzpair", src, rs, nrows, sink, sms);
        bad |= run<Panel>("panel", src, rs, nrows, sink, sms);
        bad |= run<Sw128>("sw128", src, rs, nrows, sink, sms);
        bad |= run<Swz256, 16>("swz256", src, rs, nrows, sink, sms);
        bad |= run<Sw128, 16>("sw128", src, rs, nrows, sink, sms);
        bad |= run<Pad16, 16>("pad16", src, rs, nrows, sink, sms);
    }
    cudaFree(src);
    cudaFree(sink);
    if (bad) fprintf(stderr, "ldgsts_l2: a launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return bad;
}
