/*
 * test_topn.cu -- the top-n ranking of kernels/cuda/topn.cuh (warp_select_row,
 * shared by SELECT_TOPN and every fused scores kernel) against a CPU ranking
 * written from the semantics (section 3), on crafted score rows.
 *
 * The parity suite reaches this code end to end, but on random scores only,
 * where the filter of warp_nth_key almost never overflows. Here each row is
 * ranked both ways the kernel can (the filter on the lanes' maxima, and the n
 * rounds it falls back to, forced with warp_select_row<true>), over rows built to
 * reach every branch:
 *   random scores for E (eligible blocks) from 1 to 2000 (E > 1024: the path
 *   without keys in registers), n = 1, 16, 32, 33 (n > 32: no filter);
 *   many equal scores (the tie rule: lower j first) and all-zero rows;
 *   the largest scores all in a few lanes' slots (j % 32 fixed), so that more
 *   than TOPN_CAND keys pass the filter and the rounds must take over;
 *   n_init = n_local = 0 and larger forced sets.
 * The streaming ranking of scores_sm80_kq (stream_offer / stream_emit, n <= 32)
 * ranks the same rows offered in chunks of 16 and of 29 blocks through a ring
 * of 64 slots, the last chunk reaching 3 blocks past the row's eligible ones
 * (as a CTA's earlier tokens are offered its later tokens' blocks).
 * Outputs are poisoned first and every slot is compared.
 *
 * Exit status: 0 pass, 1 fail, 77 skipped (no CUDA device).
 */
#include "topn.cuh"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

using namespace nsa_cuda;

constexpr int WARPS = 4;

/* Row r (scores at sc + off[r], position tl[r]) into out + r * g.n; one warp per row. */
template <bool ROUNDS>
__global__ void select_kernel(Geom g, const float *sc, const int64_t *off, const int64_t *tl, int rows, int *out)
{
    __shared__ uint64_t cand[WARPS][TOPN_CAND];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = blockIdx.x * WARPS + warp; r < rows; r += gridDim.x * WARPS)
        warp_select_row<ROUNDS>(g, sc + off[r], tl[r], out + (int64_t)r * g.n, lane, cand[warp]);
}

/* Row r through the streaming ranking, offered `chunk` blocks at a time; one
 * warp per row, each with its own token state (TopnStream of WARPS tokens). */
constexpr int RING = 64;
__global__ void stream_kernel(Geom g, const float *sc, const int64_t *off, const int64_t *tl, int rows, int chunk,
                              int *out)
{
    extern __shared__ __align__(16) unsigned char sm[];
    const TopnStream ts(sm, WARPS, RING, (int)g.n);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *ring = ts.ring + warp * RING;
    for (int r = blockIdx.x * WARPS + warp; r < rows; r += gridDim.x * WARPS) {
        for (int e = lane; e < RING; e += 32) ring[e] = 0.f;
        if (lane == 0) {
            ts.thr[warp] = 0;
            ts.cnt[2 * warp] = ts.cnt[2 * warp + 1] = 0;
        }
        __syncwarp();
        const float *s = sc + off[r];
        const int64_t E = tl[r] / g.ls + 1;
        int64_t j0 = 0;
        for (; j0 + chunk < E; j0 += chunk) {
            for (int64_t j = j0 + lane; j < j0 + chunk; j += 32) ring[j & (RING - 1)] = s[j];
            __syncwarp();
            stream_offer(ts, g, warp, tl[r], j0, j0 + chunk, lane);
        }
        for (int64_t j = j0 + lane; j < E; j += 32) ring[j & (RING - 1)] = s[j];
        __syncwarp();
        stream_offer(ts, g, warp, tl[r], j0, E + 3, lane);
        stream_emit(ts, g, warp, out + (int64_t)r * g.n, lane);
        __syncwarp();
    }
}

static const char *const mode_names[] = {"filter", "rounds", "stream16", "stream29"};

/* The semantics' selection: forced blocks above every other (lower j first),
 * then higher score, then lower j; the n best, ascending, -1 padded. */
static std::vector<int> cpu_select(const float *s, int64_t tl, int64_t ls, int64_t n, int64_t n_init, int64_t n_local)
{
    const int64_t cur = tl / ls, E = cur + 1;
    std::vector<int64_t> j(E);
    for (int64_t i = 0; i < E; i++) j[i] = i;
    auto forced = [&](int64_t b) { return b < n_init || (b <= cur && b > cur - n_local); };
    std::sort(j.begin(), j.end(), [&](int64_t a, int64_t b) {
        const bool fa = forced(a), fb = forced(b);
        if (fa != fb) return fa;
        if (!fa && s[a] != s[b]) return s[a] > s[b];
        return a < b;
    });
    std::vector<int> out;
    for (int64_t i = 0; i < std::min(n, E); i++) out.push_back((int)j[i]);
    std::sort(out.begin(), out.end());
    while ((int64_t)out.size() < n) out.push_back(-1);
    return out;
}

static uint32_t rng = 2024u;
static float urand()
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f;
}

struct Row {
    std::vector<float> s;
    int64_t tl;
};

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "test_topn: %s: %s\n", #x, cudaGetErrorString(e_));                               \
            return -1;                                                                                         \
        }                                                                                                      \
    } while (0)

/* Ranks the rows on the device (mode: 0 filter, 1 rounds, 2 / 3 streaming in chunks of 16 / 29) and compares
 * every slot; the number of bad rows, -1 on a CUDA error. */
static int run(const char *name, const std::vector<Row> &rows, int64_t n, int64_t n_init, int64_t n_local, int mode)
{
    Geom g;
    memset(&g, 0, sizeof g);
    g.ls = 64;
    g.n = n;
    g.n_init = n_init;
    g.n_local = n_local;
    std::vector<float> flat;
    std::vector<int64_t> off, tl;
    for (const Row &r : rows) {
        off.push_back((int64_t)flat.size());
        tl.push_back(r.tl);
        flat.insert(flat.end(), r.s.begin(), r.s.end());
    }
    float *dsc = nullptr;
    int64_t *doff = nullptr, *dtl = nullptr;
    int *dout = nullptr;
    const size_t nout = rows.size() * (size_t)n;
    CK(cudaMalloc(&dsc, flat.size() * sizeof(float)));
    CK(cudaMalloc(&doff, off.size() * sizeof(int64_t)));
    CK(cudaMalloc(&dtl, tl.size() * sizeof(int64_t)));
    CK(cudaMalloc(&dout, nout * sizeof(int)));
    CK(cudaMemcpy(dsc, flat.data(), flat.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(doff, off.data(), off.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dtl, tl.data(), tl.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0x7f, nout * sizeof(int))); /* poison: no valid index */
    const unsigned blocks = (unsigned)((rows.size() + WARPS - 1) / WARPS);
    if (mode == 1)
        select_kernel<true><<<blocks, 32 * WARPS>>>(g, dsc, doff, dtl, (int)rows.size(), dout);
    else if (mode == 0)
        select_kernel<false><<<blocks, 32 * WARPS>>>(g, dsc, doff, dtl, (int)rows.size(), dout);
    else
        stream_kernel<<<blocks, 32 * WARPS, WARPS * (4 * RING + 8 * n + 8 * TOPN_BUF + 16)>>>(
            g, dsc, doff, dtl, (int)rows.size(), mode == 2 ? 16 : 29, dout);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<int> got(nout);
    CK(cudaMemcpy(got.data(), dout, nout * sizeof(int), cudaMemcpyDeviceToHost));
    cudaFree(dsc);
    cudaFree(doff);
    cudaFree(dtl);
    cudaFree(dout);
    int bad = 0;
    for (size_t r = 0; r < rows.size(); r++) {
        const std::vector<int> want = cpu_select(rows[r].s.data(), rows[r].tl, g.ls, n, n_init, n_local);
        if (memcmp(want.data(), got.data() + r * n, (size_t)n * sizeof(int)) != 0) {
            if (bad < 3) {
                fprintf(stderr, "FAIL %s (%s), row %zu (E = %lld): slot", name, mode_names[mode], r,
                        (long long)rows[r].s.size());
                for (int64_t b = 0; b < n; b++)
                    if (want[b] != got[r * n + b])
                        fprintf(stderr, " %lld: want %d got %d;", (long long)b, want[b], got[r * n + b]);
                fprintf(stderr, "\n");
            }
            bad++;
        }
    }
    printf("%s %s (%s): %zu rows, %d wrong\n", bad ? "FAIL" : "PASS", name, mode_names[mode],
           rows.size(), bad);
    return bad;
}

/* A row of E eligible blocks (position tl = (E - 1) * 64 + 17) with scores from f(j). */
template <typename F> static Row make_row(int64_t E, F f)
{
    Row r;
    r.tl = (E - 1) * 64 + 17;
    for (int64_t j = 0; j < E; j++) r.s.push_back(f(j));
    return r;
}

int main()
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    const int64_t Es[] = {1, 2, 5, 16, 17, 18, 31, 32, 33, 34, 64, 100, 511, 512, 1000, 1024, 1025, 2000};
    std::vector<Row> random, ties, zeros, lanes;
    for (int64_t E : Es)
        for (int rep = 0; rep < 8; rep++) {
            random.push_back(make_row(E, [](int64_t) { return urand(); }));
            ties.push_back(make_row(E, [](int64_t) { return (float)(int)(urand() * 3.0f) * 0.5f; }));
            /* the best scores in the slots of lanes 3, 4 and 5 (j % 32): about 3 E / 32 of
             * them pass the filter, over TOPN_CAND once E is past ~700 */
            lanes.push_back(make_row(E, [](int64_t j) {
                const int64_t ln = j % 32;
                return ln >= 3 && ln <= 5 ? 2.0f + urand() : urand();
            }));
        }
    for (int64_t E : Es) zeros.push_back(make_row(E, [](int64_t) { return 0.0f; }));

    struct Cfg {
        int64_t n, n_init, n_local;
    } cfgs[] = {{16, 1, 2}, {1, 0, 0}, {16, 0, 0}, {32, 1, 2}, {33, 1, 2}, {16, 4, 8}, {8, 3, 5}};
    int bad = 0;
    for (const Cfg &c : cfgs)
        for (int mode = 0; mode < (c.n <= 32 ? 4 : 2); mode++) {
            char name[96];
            const struct {
                const char *what;
                const std::vector<Row> *rows;
            } sets[] = {{"random", &random}, {"ties", &ties}, {"zeros", &zeros}, {"lane-heavy", &lanes}};
            for (const auto &st : sets) {
                snprintf(name, sizeof name, "%s n=%lld n_init=%lld n_local=%lld", st.what, (long long)c.n,
                         (long long)c.n_init, (long long)c.n_local);
                const int b = run(name, *st.rows, c.n, c.n_init, c.n_local, mode);
                if (b < 0) return 1;
                bad += b;
            }
        }
    printf("test_topn: %d wrong rows\n", bad);
    return bad ? 1 : 0;
}
