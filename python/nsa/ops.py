"""libnsa as torch.library custom ops, so that torch.compile and other tracers see NSA as
one operator with a known output shape and a registered backward:

    o = nsa.ops.attention(q, [k], [v], [g_cmp, g_slc, g_win])          # like nsa.attention
    o = torch.compile(f, fullgraph=True)(...)                           # f calls nsa.ops.attention

    libnsa::forward(q, k[], v[], gates[], cu_seqlens, config, backend)
        -> (o, lse_cmp, lse_slc, lse_win, selected)
    libnsa::backward(q, k[], v[], gates[], lse_cmp, lse_slc, lse_win, selected, do,
                     cu_seqlens, config, backend) -> (dq, dk[], dv[], dg[])

k and v are lists of one tensor (shared by the three branches: its gradient is the sum) or
three (per branch); gates a list of three float32 [T, Hq] tensors (float64 with float64
inputs; the LSEs likewise), an empty tensor for a
branch that is off (then an empty tensor stands in for its LSE, and for selected when the
selected branch is off; nsa.ops.attention takes None there). config: the integers cmp_block, cmp_stride, slc_block,
num_selected, num_init, num_local, window (-1: the library's default) and scale (0.0:
1/sqrt(Dqk)); cu_seqlens the packed sequences' offsets ([0, T]: one sequence);
backend "" chooses by the tensors' memory, as nsa.attention does.
"""
from typing import List, Sequence, Tuple

import torch

if not hasattr(torch.library, "custom_op"):
    raise ImportError("nsa.ops needs torch.library.custom_op (torch 2.4 or newer)")

from . import _backward, _defaults, _float_type, _forward, _from_dlpack, _spec

_INT_KEYS = ("cmp_block", "cmp_stride", "slc_block", "num_selected", "num_init", "num_local", "window")


def _cfg(config: Sequence[int], scale: float):
    if len(config) != len(_INT_KEYS):
        raise ValueError(f"nsa.ops: config has {len(config)} integers, {len(_INT_KEYS)} are needed ({', '.join(_INT_KEYS)})")
    out = {k: int(v) for k, v in zip(_INT_KEYS, config) if int(v) >= 0}
    if scale != 0.0:
        out["scale"] = float(scale)
    return out


def _three(x: List[torch.Tensor], name: str):
    if len(x) == 1:
        return (x[0], x[0], x[0])
    if len(x) == 3:
        return tuple(x)
    raise ValueError(f"nsa.ops: {name} is a list of one tensor (shared) or three (per branch), not {len(x)}")


def _empty(like):
    return like.new_empty((0,), dtype=_float_type(like.dtype))


def _gates(gates):
    """the ops' gates (an empty tensor for a branch that is off) as the library's (None)"""
    return tuple(g if g.numel() > 0 else None for g in gates)


@torch.library.custom_op("libnsa::forward", mutates_args=())
def _op_forward(q: torch.Tensor, k: List[torch.Tensor], v: List[torch.Tensor], gates: List[torch.Tensor],
                cu_seqlens: List[int], config: List[int], scale: float,
                backend: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    k3, v3, g3 = _three(k, "k"), _three(v, "v"), _gates(gates)
    spec, cu = _spec(q, k3, v3, g3, cu_seqlens, _cfg(config, scale))
    o, lse, sel = _forward(q, k3, v3, g3, spec, cu, backend or None, True)
    lse = [x if x is not None else _empty(q) for x in lse]
    sel = sel if sel is not None else q.new_empty((0,), dtype=torch.int32)
    return o, lse[0], lse[1], lse[2], sel


@_op_forward.register_fake
def _(q, k, v, gates, cu_seqlens, config, scale, backend):
    full = dict(_defaults(), **_cfg(config, scale))
    T, Hq, Hkv, Dv = q.shape[0], q.shape[1], k[0].shape[1], v[0].shape[2]
    on = (True, full["num_selected"] > 0, full["window"] > 0)
    lse = [q.new_empty((T, Hq), dtype=_float_type(q.dtype)) if on[b] else _empty(q) for b in range(3)]
    sel = q.new_empty((T, Hkv, full["num_selected"]) if on[1] else (0,), dtype=torch.int32)
    return q.new_empty((T, Hq, Dv)), lse[0], lse[1], lse[2], sel


@torch.library.custom_op("libnsa::backward", mutates_args=())
def _op_backward(q: torch.Tensor, k: List[torch.Tensor], v: List[torch.Tensor], gates: List[torch.Tensor],
                 lse_cmp: torch.Tensor, lse_slc: torch.Tensor, lse_win: torch.Tensor, selected: torch.Tensor,
                 do: torch.Tensor, cu_seqlens: List[int], config: List[int], scale: float,
                 backend: str) -> Tuple[torch.Tensor, List[torch.Tensor], List[torch.Tensor], List[torch.Tensor]]:
    k3, v3, g3 = _three(k, "k"), _three(v, "v"), _gates(gates)
    spec, cu = _spec(q, k3, v3, g3, cu_seqlens, _cfg(config, scale))
    lse = tuple(x if x.numel() > 0 or x.dim() == 2 else None for x in (lse_cmp, lse_slc, lse_win))
    sel = selected if selected.dim() == 3 else None
    shared = (tuple(len(k) == 1 for _ in range(3)), tuple(len(v) == 1 for _ in range(3)))
    dq, gk, gv, dg = _backward(q, k3, v3, g3, lse, sel, do, spec, cu, backend or None, shared)
    dks = [gk[0]] if len(k) == 1 else [x if x is not None else torch.zeros_like(k3[b]) for b, x in enumerate(gk)]
    dvs = [gv[0]] if len(v) == 1 else [x if x is not None else torch.zeros_like(v3[b]) for b, x in enumerate(gv)]
    dgs = [x if x is not None else torch.zeros_like(g) for x, g in zip(dg, gates)]
    return dq, dks, dvs, dgs


@_op_backward.register_fake
def _(q, k, v, gates, lse_cmp, lse_slc, lse_win, selected, do, cu_seqlens, config, scale, backend):
    dgs = [torch.empty_like(g) for g in gates]
    return torch.empty_like(q), [torch.empty_like(x) for x in k], [torch.empty_like(x) for x in v], dgs


def _setup(ctx, inputs, output):
    q, k, v, gates, cu_seqlens, config, scale, backend = inputs
    _, lc, ls, lw, sel = output
    ctx.save_for_backward(q, *k, *v, *gates, lc, ls, lw, sel)
    ctx.nk, ctx.nv = len(k), len(v)
    ctx.args = (cu_seqlens, config, scale, backend)


def _grad(ctx, do, *unused):
    saved = ctx.saved_tensors
    nk, nv = ctx.nk, ctx.nv
    q, k, v = saved[0], list(saved[1:1 + nk]), list(saved[1 + nk:1 + nk + nv])
    gates, (lc, ls, lw, sel) = list(saved[1 + nk + nv:4 + nk + nv]), saved[4 + nk + nv:]
    dq, dk, dv, dg = _op_backward(q, k, v, gates, lc, ls, lw, sel, do.contiguous(), *ctx.args)
    return dq, dk, dv, dg, None, None, None, None  # cu_seqlens and config are never empty


_op_forward.register_autograd(_grad, setup_context=_setup)


def attention(q, k, v, gates, cu_seqlens=None, backend=None, scale=0.0, **cfg):
    """nsa.attention through the custom op libnsa::forward (and libnsa::backward for its
    gradient): the same arguments; k and v one tensor or three."""
    q, k, v, gates = _from_dlpack(q, k, v, gates)
    kl = list(k) if isinstance(k, (tuple, list)) else [k]
    vl = list(v) if isinstance(v, (tuple, list)) else [v]
    unknown = [key for key in cfg if key not in _INT_KEYS]
    if unknown:
        raise ValueError(f"nsa.ops: unknown config field {unknown[0]!r} (known: {', '.join(_INT_KEYS)}, scale)")
    config = [int(cfg.get(key, -1)) for key in _INT_KEYS]
    cu = [int(x) for x in cu_seqlens] if cu_seqlens is not None else [0, int(q.shape[0])]
    gl = [g if g is not None else _empty(q) for g in gates]
    return _op_forward(q, kl, vl, gl, cu, config, float(scale), backend or "")[0]
