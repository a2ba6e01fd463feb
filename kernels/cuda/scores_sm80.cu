/*
 * scores_sm80.cu -- BLOCK_SCORES / SCORES_TOPN on mma.sync: the general
 * kernel (scores_sm80) and the G = 16 kernel (scores_sm80_g16) from
 * scores_sm80.cuh; the small-group instances (scores_sm80_kq) are in
 * scores_sm80_kq.cu.
 */
#include "scores_sm80.cuh"

namespace nsa_cuda {

cudaError_t scores_sm80(const Geom &g, const Dev &dev, const ScoresTile &tile, int gp, bool rows_smem,
                        const Tiles &tl, int dqkp, View q, View kc, View lse, MView sc, MView idx, cudaStream_t s)
{
    if (tl.count == 0 || (idx.p && g.n == 0)) return cudaSuccess;
    switch (gp) {
    case 0: return scores_sm80_gp<0>(g, dev, tile, rows_smem, tl, dqkp, q, kc, lse, sc, idx, s);
    case 16: return scores_sm80_gp<16>(g, dev, tile, rows_smem, tl, dqkp, q, kc, lse, sc, idx, s);
    default: return scores_sm80_kq(gp, g, dev, tile, rows_smem, tl, dqkp, q, kc, lse, sc, idx, s);
    }
}

} // namespace nsa_cuda
