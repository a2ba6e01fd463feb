/*
 * scores_sm80_kq.cu -- the small-group instances (G < 16) of the transposed
 * scores kernel of scores_sm80.cuh: the group padded to gp = 1, 2, 4 or 8
 * query rows per token, 16 / gp tokens per warp.
 */
#include "scores_sm80.cuh"

namespace nsa_cuda {

cudaError_t scores_sm80_kq(int gp, const Geom &g, const Dev &dev, const ScoresTile &tile, bool rows_smem,
                           const Tiles &tl, int dqkp, View q, View kc, View lse, MView sc, MView idx, cudaStream_t s)
{
    switch (gp) {
    case 1: return scores_sm80_gp<1>(g, dev, tile, rows_smem, tl, dqkp, q, kc, lse, sc, idx, s);
    case 2: return scores_sm80_gp<2>(g, dev, tile, rows_smem, tl, dqkp, q, kc, lse, sc, idx, s);
    case 4: return scores_sm80_gp<4>(g, dev, tile, rows_smem, tl, dqkp, q, kc, lse, sc, idx, s);
    case 8: return scores_sm80_gp<8>(g, dev, tile, rows_smem, tl, dqkp, q, kc, lse, sc, idx, s);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace nsa_cuda
