/*
 * topn.cuh -- the ranking of SELECT_TOPN (semantics section 3), shared by the
 * plain top-n kernel (topn.cu) and the fused SCORES_TOPN kernels (scores_sm80.cu, scores_sm90.cu),
 * so that both pick bitwise the same blocks from the same f32 scores.
 *
 * Every eligible block j gets a unique 64-bit rank key:
 *   forced:   1 << 63 | (2^31 - 1 - j)                  (above all, lower j first)
 *   unforced: ord(score) << 31 | (2^31 - 1 - j)         (higher score first, ties: lower j)
 * where ord() maps a float's bits to an order-preserving unsigned integer.
 * The n-th largest key is the threshold: warp_nth_key (v6) finds it by
 * filtering on the lanes' maxima, the n rounds of v3 remain as its fallback.
 */
#ifndef NSA_KERNELS_CUDA_TOPN_CUH
#define NSA_KERNELS_CUDA_TOPN_CUH

#include <climits>

#include "nsa_cuda.cuh"
#include "nsa_cuda_kernels.h"

namespace nsa_cuda {

NSA_DEV uint64_t rank_key(float score, int64_t j, bool forced)
{
    const uint64_t low = (uint64_t)(0x7fffffffLL - j);
    if (forced) return (1ull << 63) | low;
    uint32_t u = __float_as_uint(score);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 31) | low;
}

NSA_DEV uint64_t warp_max_u64(uint64_t v)
{
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* Scratch a warp lends warp_select_row (shared memory, 8-byte aligned). */
constexpr int TOPN_CAND = 64;

/* The n-th largest of the warp's keys (0 = no key; more than n real keys,
 * unique; n <= 32), the lane's u-th key being kat(u), u < NU (NU = 0: u < nu,
 * read as often as needed: keys in shared memory), by filtering (v6):
 *   theta = the n-th largest lane maximum; n distinct keys are >= theta, so
 *   the n largest keys all are. The candidates (keys >= theta: about 21 of
 *   up to 1024 on random scores) go to the scratch list, and the one with
 *   exactly n - 1 candidates above it is the answer.
 * Returns false (answer unset) when more than TOPN_CAND keys pass the filter;
 * the caller then takes the n rounds. Same answer as the n rounds of "largest
 * key below the previous one", at about a seventh of their instructions. */
template <int NU, typename KeyAt>
NSA_DEV bool warp_nth_key(KeyAt kat, int nu, int n, uint64_t *cand, int lane, uint64_t &nth)
{
    const int cu = NU > 0 ? NU : nu;
    uint64_t mx = 0;
#pragma unroll
    for (int u = 0; u < cu; u++) {
        const uint64_t k = kat(u);
        mx = k > mx ? k : mx;
    }
    int rk = 0; /* lanes whose maximum is above mine (maxima are unique or 0) */
    for (int o = 0; o < 32; o++) rk += __shfl_sync(0xffffffffu, mx, o) > mx;
    const unsigned who = __ballot_sync(0xffffffffu, rk == n - 1 && mx != 0);
    if (!who) return false;
    const uint64_t theta = __shfl_sync(0xffffffffu, mx, __ffs(who) - 1);
    int cnt = 0;
#pragma unroll
    for (int u = 0; u < cu; u++) cnt += kat(u) >= theta;
    int off = cnt; /* inclusive prefix over the lanes, then exclusive */
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, off, o);
        if (lane >= o) off += v;
    }
    const int total = __shfl_sync(0xffffffffu, off, 31);
    if (total > TOPN_CAND) return false;
    off -= cnt;
#pragma unroll
    for (int u = 0; u < cu; u++) {
        const uint64_t k = kat(u);
        if (k >= theta) cand[off++] = k;
    }
    __syncwarp();
    uint64_t found = 0;
    for (int c = lane; c < total; c += 32) {
        const uint64_t x = cand[c];
        int above = 0;
        for (int d = 0; d < total; d++) above += cand[d] > x;
        if (above == n - 1) found = x;
    }
    __syncwarp(); /* the list may be overwritten by the warp's next row */
    nth = warp_max_u64(found);
    return true;
}

/* One warp selects for one (token, group): row[j] (j <= cur = floor(tl / l_s))
 * holds the scores, dst the n output slots (contiguous), cand TOPN_CAND
 * entries of scratch (warp_nth_key). The whole warp must call it (shuffles,
 * ballots). Same keys and the same threshold rule as topn_kernel: the n-th
 * largest key, then every block whose key is at least that, in ascending j,
 * -1 padded. ROUNDS: the threshold by the n rounds alone, never by the
 * filter (tests/test_topn.cu checks both ways against a CPU ranking). */
template <bool ROUNDS = false>
NSA_DEV void warp_select_row(const Geom &g, const float *row, int64_t tl, int *dst, int lane, uint64_t *cand)
{
    const int64_t cur = nsa_slc_last(tl, g.ls), E = cur + 1;
    if (E <= g.n) {
        for (int64_t b = lane; b < g.n; b += 32) dst[b] = b < E ? (int)b : -1;
        return;
    }
    /* forced test with cur hoisted: nsa_slc_forced divides t / l_s on every
     * call, which was a third of this function's instructions (v4) */
    const int64_t ninit = g.n_init, lo_local = cur - g.n_local;
    auto key = [&](int64_t j) { return rank_key(row[j], j, j < ninit || (j <= cur && j > lo_local)); };
    uint64_t prev = ~0ull;
    if (E <= 32 * 32) {
        /* keys in registers (slots u < ceil(E / 32) used; the rest stay 0,
         * below every real key, and are never picked: n < E real keys) */
        uint64_t kc[32];
#pragma unroll
        for (int u = 0; u < 32; u++) {
            const int64_t j = (int64_t)u * 32 + lane;
            kc[u] = j < E ? key(j) : 0;
        }
        if (g.n > 32 || ROUNDS || !warp_nth_key<32>([&](int u) { return kc[u]; }, 32, (int)g.n, cand, lane, prev)) {
            const int nu = (int)((E + 31) / 32);
            for (int64_t r = 0; r < g.n; r++) {
                uint64_t best = 0;
#pragma unroll
                for (int u = 0; u < 32; u++)
                    if (u < nu && kc[u] < prev && kc[u] > best) best = kc[u];
                prev = warp_max_u64(best);
            }
        }
    } else if (g.n > 32 || ROUNDS ||
               !warp_nth_key<0>([&](int u) { return (int64_t)u * 32 + lane < E ? key((int64_t)u * 32 + lane) : 0ull; },
                                (int)((E + 31) / 32), (int)g.n, cand, lane, prev)) {
        /* past 1024 blocks the filter reads the keys from the row (the n rounds alone would
         * make n passes over it); the rounds remain its fallback */
        for (int64_t r = 0; r < g.n; r++) {
            uint64_t best = 0;
            for (int64_t j = lane; j < E; j += 32) {
                const uint64_t kj = key(j);
                if (kj < prev && kj > best) best = kj;
            }
            prev = warp_max_u64(best);
        }
    }
    int64_t cnt = 0;
    for (int64_t base = 0; base < E; base += 32) {
        const int64_t j = base + lane;
        const bool sel = j < E && key(j) >= prev;
        const unsigned bal = __ballot_sync(0xffffffffu, sel);
        if (sel) dst[cnt + __popc(bal & ((1u << lane) - 1u))] = (int)j;
        cnt += __popc(bal);
    }
}

/* ------------------------------------------------------------ streaming top-n
 * scores_sm80_kq ranks a token's selection blocks as its K tiles complete
 * them, so a CTA keeps a ring of rw (a power of two) partial scores per token
 * instead of the whole row (T / l_s floats, which at G < 16 and long T does
 * not fit beside the tiles). Per token: list, the n largest rank keys seen so
 * far (descending after each merge), and buf, up to TOPN_BUF newer keys above
 * the list's n-th (thr; 0 while the list holds fewer than n). The keys are
 * rank_key's, so the result is warp_select_row's: the n largest keys of all
 * blocks are the n largest of (the n largest of the blocks offered so far)
 * and the blocks after them. Layout (one block of shared memory, tiles.h
 * scores_kq_ring_smem): ring [tokens][rw] f32, list [tokens][n] u64,
 * buf [tokens][TOPN_BUF] u64, thr [tokens] u64, cnt [tokens][2] int (list,
 * buf). A token's state is used by one warp only. */
constexpr int TOPN_BUF = 32;

struct TopnStream {
    float *ring;
    uint64_t *list, *buf, *thr;
    int *cnt;
    int rw, n;
    NSA_DEV TopnStream(void *base, int tokens, int rw_, int n_) : rw(rw_), n(n_)
    {
        ring = (float *)base;
        list = (uint64_t *)(ring + (size_t)tokens * rw);
        buf = list + (size_t)tokens * n;
        thr = buf + (size_t)tokens * TOPN_BUF;
        cnt = (int *)(thr + tokens);
    }
};

/* The warp merges token tok's buf into its list: the at most n + TOPN_BUF
 * <= 64 keys (unique) are ranked two per lane, the n largest stored in order. */
NSA_DEV void stream_merge(const TopnStream &s, int tok, int lane)
{
    uint64_t *L = s.list + (size_t)tok * s.n, *B = s.buf + (size_t)tok * TOPN_BUF;
    int *cnt = s.cnt + 2 * tok;
    const int lc = cnt[0], m = lc + cnt[1];
    auto item = [&](int i) { return i < lc ? L[i] : B[i - lc]; };
    const uint64_t a = lane < m ? item(lane) : 0, b = lane + 32 < m ? item(lane + 32) : 0;
    int ra = 0, rb = 0;
    for (int i = 0; i < m; i++) {
        const uint64_t x = item(i);
        ra += x > a;
        rb += x > b;
    }
    __syncwarp(); /* every lane has read the old list */
    if (lane < m && ra < s.n) L[ra] = a;
    if (lane + 32 < m && rb < s.n) L[rb] = b;
    __syncwarp();
    if (lane == 0) {
        const int nl = m < s.n ? m : s.n;
        cnt[0] = nl;
        cnt[1] = 0;
        s.thr[tok] = nl == s.n ? L[s.n - 1] : 0;
    }
    __syncwarp();
}

/* The warp offers token tok (local position tl) its selection blocks
 * j0 .. j1 - 1, which no later K tile adds to, and clears their ring slots.
 * Blocks past the token's last eligible one (floor(tl / l_s)) are not ranked. */
NSA_DEV void stream_offer(const TopnStream &s, const Geom &g, int tok, int64_t tl, int64_t j0, int64_t j1, int lane)
{
    const int64_t cur = nsa_slc_last(tl, g.ls), lo_local = cur - g.n_local;
    float *r = s.ring + (size_t)tok * s.rw;
    uint64_t *B = s.buf + (size_t)tok * TOPN_BUF;
    int *cnt = s.cnt + 2 * tok;
    for (int64_t base = j0; base < j1; base += 32) {
        const int64_t j = base + lane;
        uint64_t key = 0;
        bool pass = false;
        if (j < j1) {
            float *slot = r + (j & (s.rw - 1));
            if (j <= cur) {
                key = rank_key(*slot, j, j < g.n_init || j > lo_local);
                pass = key > s.thr[tok];
            }
            *slot = 0.f;
        }
        const unsigned bal = __ballot_sync(0xffffffffu, pass);
        if (!bal) continue;
        int bc = cnt[1];
        if (bc + __popc(bal) > TOPN_BUF) {
            stream_merge(s, tok, lane);
            bc = 0;
        }
        if (pass) B[bc + __popc(bal & ((1u << lane) - 1u))] = key;
        __syncwarp();
        if (lane == 0) cnt[1] = bc + __popc(bal);
        __syncwarp();
    }
}

/* The warp's last merge for token tok, then its n output slots dst: the kept
 * blocks in ascending j, -1 padded (warp_select_row's output). */
NSA_DEV void stream_emit(const TopnStream &s, const Geom &g, int tok, int *dst, int lane)
{
    stream_merge(s, tok, lane);
    const int lc = s.cnt[2 * tok];
    const uint64_t *L = s.list + (size_t)tok * s.n;
    const int j = lane < lc ? (int)(0x7fffffffLL - (int64_t)(L[lane] & 0x7fffffffull)) : INT_MAX;
    int rank = 0;
    for (int o = 0; o < lc; o++) rank += __shfl_sync(0xffffffffu, j, o) < j;
    if (lane < lc) dst[rank] = j;
    for (int64_t b = lc + lane; b < g.n; b += 32) dst[b] = -1;
}

} // namespace nsa_cuda

#endif
