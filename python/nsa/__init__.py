"""libnsa from PyTorch: Native Sparse Attention forward and backward on torch tensors.

    import torch, nsa
    o = nsa.attention(q, k, v, (g_cmp, g_slc, g_win))            # [T, Hq, Dv]
    o.sum().backward()                                            # dq, dk, dv, dg through nsa_backward

Tensors are used in place (zero copy): CPU tensors run on the cpu backend, CUDA
tensors on the cuda backend (hip on a ROCm build of torch) on torch's current
stream of their device. The memory decides the backend, since a backend can only
read its own kind of memory; `backend=` may name it explicitly and must agree.

Shapes (FlashAttention's packed varlen convention): q [T, Hq, Dqk]; k [T, Hkv, Dqk]
and v [T, Hkv, Dv], one tensor for all three branches or a tuple of three (per
branch); gates (g_cmp, g_slc, g_win) float32 [T, Hq] (float64 with float64 inputs;
None for a branch that is off); T = cu_seqlens[-1] tokens of len(cu_seqlens) - 1
sequences (default: one sequence). The last dimension must be contiguous; other
strides are passed through. dtype float32, float16, bfloat16 or float64 (q, k, v
alike; float64 on the cpu backend only, fp64 end to end, so torch.autograd.gradcheck
passes with its default tolerances; a GPU backend refuses it with nsa.Error); the
gradients have the input dtype, dg the gates' (float32, float64 with float64 inputs).
Compression: MEAN (the paper's default); LINEAR and EXTERNAL are in the C API only.

Other frameworks' tensors (anything with __dlpack__: NumPy, JAX, CuPy) are taken zero
copy; results are torch tensors. nsa.ops.attention is nsa.attention as the torch.library
custom ops libnsa::forward / libnsa::backward (torch.compile traces them; torch >= 2.4).

Decoding (libnsa 0.5): nsa.DecodePlan makes a decode plan; its step() runs nsa_decode over the
caller's paged K/V caches in place and returns the new tokens' rows, each the row nsa.forward
computes (bitwise on the cpu backend). See nsa/decode.py.

Errors of the library raise nsa.Error carrying its status and message.
"""
import threading

import torch

from ._lib import (BACKWARD_TRUST_INDICES, BackwardArgs, CONFIG_TRAINING, Config, Error, ForwardArgs, PlanInfo,
                   Tensor, check, lib, version)
import ctypes

__all__ = ["attention", "forward", "config", "ops", "DecodePlan", "Error", "version"]

_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 4}


def _float_type(dtype):
    """the library's float type of a call (gates, LSEs, dg): float64 for float64 inputs, else float32"""
    return torch.float64 if dtype == torch.float64 else torch.float32
_CFG_KEYS = ("cmp_block", "cmp_stride", "slc_block", "num_selected", "num_init", "num_local", "window", "scale")


def config(**overrides):
    """The library's defaults (the paper's configuration) with overrides, as a dict."""
    c = Config()
    check("nsa_config_init", lib.nsa_config_init_sized(ctypes.byref(c), ctypes.sizeof(c)))
    out = {name: getattr(c, name) for name, _ in Config._fields_}
    for k, v in overrides.items():
        if k not in out:
            raise ValueError(f"nsa.config: unknown field {k!r}")
        out[k] = v
    return out


_DEFAULTS = None


def _defaults():
    """The library's defaults, read once."""
    global _DEFAULTS
    if _DEFAULTS is None:
        _DEFAULTS = config()
    return _DEFAULTS


# ---------------------------------------------------------------- contexts and plans

_lock = threading.Lock()
_contexts = {}  # (backend, device, stream) -> context handle
_plans = {}     # (context, config fields, cu_seqlens) -> (plan, workspace bytes); at most _MAX_PLANS
_MAX_PLANS = 32


def _backend_for(t, backend):
    if t.device.type == "cpu":
        want = "cpu"
    elif t.device.type == "cuda":
        want = "hip" if getattr(torch.version, "hip", None) else "cuda"
    else:
        raise ValueError(f"nsa: tensors on {t.device} are not supported (cpu or cuda)")
    if backend is not None and backend != want:
        raise ValueError(f"nsa: backend={backend!r} cannot read {t.device.type} memory (use {want!r})")
    return want


def _context(t, backend):
    name = _backend_for(t, backend)
    device = t.device.index if t.device.type == "cuda" else 0
    stream = torch.cuda.current_stream(t.device).cuda_stream if t.device.type == "cuda" else 0
    key = (name, device, stream)
    with _lock:
        ctx = _contexts.get(key)
        if ctx is None:
            h = ctypes.c_void_p()
            check("nsa_context_create_with_stream",
                  lib.nsa_context_create_with_stream(name.encode(), device, ctypes.c_void_p(stream or None),
                                                     ctypes.byref(h)))
            ctx = _contexts[key] = h.value
    return ctx


def _plan(ctx, cfg, cu, cuk=None):
    key = (ctx, tuple(sorted(cfg.items())), cu, cuk)
    with _lock:
        hit = _plans.get(key)
        if hit is not None:
            return hit
        c = Config()
        check("nsa_config_init", lib.nsa_config_init_sized(ctypes.byref(c), ctypes.sizeof(c)))
        for k, v in cfg.items():
            setattr(c, k, v)
        arr = (ctypes.c_int64 * len(cu))(*cu)
        h = ctypes.c_void_p()
        if cuk is None:
            check("nsa_plan_create", lib.nsa_plan_create_sized(ctx, ctypes.byref(c), ctypes.sizeof(c), arr,
                                                                len(cu) - 1, ctypes.byref(h)))
        else:
            if not hasattr(lib, "nsa_plan_create_varlen_sized"):
                raise RuntimeError("nsa: cu_seqlens_k needs libnsa 0.6 or newer")
            arrk = (ctypes.c_int64 * len(cuk))(*cuk)
            check("nsa_plan_create_varlen",
                  lib.nsa_plan_create_varlen_sized(ctx, ctypes.byref(c), ctypes.sizeof(c), arr, arrk, len(cu) - 1,
                                                   ctypes.byref(h)))
        info = PlanInfo()
        check("nsa_plan_get_info", lib.nsa_plan_get_info_sized(h, ctypes.byref(info), ctypes.sizeof(info)))
        if len(_plans) >= _MAX_PLANS:  # forget the oldest (its work was ordered before any later call's)
            old = next(iter(_plans))
            lib.nsa_plan_destroy(_plans.pop(old)[0])
        hit = _plans[key] = (h.value, info.workspace_bytes, info.total_cmp_blocks)
        return hit


class _Wrap:
    """The nsa_buffers of one call: one per torch storage, freed at the end."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.bufs = {}

    def view(self, t, name, ndim):
        if t is None:
            return Tensor()
        if t.dim() != ndim:
            raise ValueError(f"nsa: {name} must have {ndim} dimensions, has shape {tuple(t.shape)}")
        if ndim == 3 and t.shape[2] > 1 and t.stride(2) != 1:
            raise ValueError(f"nsa: {name}'s last dimension must be contiguous (strides {t.stride()})")
        st = t.untyped_storage()
        ptr, nbytes = st.data_ptr(), st.nbytes()
        buf = self.bufs.get(ptr)
        if buf is None:
            h = ctypes.c_void_p()
            if ptr == 0:  # an empty tensor without storage (no rows): a small buffer of the library's stands in
                check("nsa_buffer_alloc", lib.nsa_buffer_alloc(self.ctx, 64, ctypes.byref(h)))
            else:
                check("nsa_buffer_wrap", lib.nsa_buffer_wrap(self.ctx, ctypes.c_void_p(ptr), 0, nbytes,
                                                             ctypes.byref(h)))
            buf = self.bufs[ptr] = h.value
        return Tensor(buf, t.storage_offset(), t.stride(0), t.stride(1) if ndim >= 2 else 1)

    def free(self):
        for b in self.bufs.values():
            lib.nsa_buffer_free(b)
        self.bufs = {}


def _branches(x, name):
    if isinstance(x, (tuple, list)):
        if len(x) != 3:
            raise ValueError(f"nsa: {name} must be one tensor or a tuple of three (cmp, slc, win)")
        return tuple(x)
    return (x, x, x)


def _spec(q, k3, v3, gates, cu_seqlens, overrides, cu_seqlens_k=None):
    if q.dtype not in _DTYPES:
        raise ValueError(f"nsa: dtype {q.dtype} is not supported (float32, float16, bfloat16, float64)")
    for name, t in (("k", k3[0]), ("v", v3[0])):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"nsa: {name} must have q's dtype and device ({q.dtype}, {q.device})")
    ft = _float_type(q.dtype)
    for b, g in enumerate(gates):
        if g is not None and (g.dtype != ft or g.device != q.device):
            raise ValueError(f"nsa: the gate of branch {('cmp', 'slc', 'win')[b]} must be {ft} on {q.device} "
                             f"for {q.dtype} inputs, is {g.dtype} on {g.device}")
    T = q.shape[0]
    cu = tuple(int(x) for x in (cu_seqlens if cu_seqlens is not None else (0, T)))
    if cu[-1] != T:
        raise ValueError(f"nsa: cu_seqlens[-1] = {cu[-1]} but q has {T} tokens")
    cuk = None
    if cu_seqlens_k is not None:  # the queries are the last positions of their sequences' keys
        cuk = tuple(int(x) for x in cu_seqlens_k)
        if len(cuk) != len(cu):
            raise ValueError(f"nsa: cu_seqlens_k has {len(cuk)} offsets, cu_seqlens {len(cu)}")
        TK = k3[0].shape[0]
        if cuk[-1] != TK:
            raise ValueError(f"nsa: cu_seqlens_k[-1] = {cuk[-1]} but k has {TK} tokens")
    for k in overrides:
        if k not in _CFG_KEYS:
            raise ValueError(f"nsa: unknown config field {k!r} (known: {', '.join(_CFG_KEYS)})")
    cfg = dict(num_q_heads=q.shape[1], num_kv_heads=k3[0].shape[1], head_dim_qk=q.shape[2],
               head_dim_v=v3[0].shape[2], dtype=_DTYPES[q.dtype], compress=0)
    cfg.update(overrides)
    return cfg, (cu, cuk)


def _forward(q, k3, v3, gates, cfg, cu, backend, training):
    ctx = _context(q, backend)
    if training:
        cfg = dict(cfg, flags=CONFIG_TRAINING)
    plan, ws_bytes, _ = _plan(ctx, cfg, *cu)
    full = dict(_defaults(), **cfg)
    on = (True, full["num_selected"] > 0, full["window"] > 0)
    T, Hq, Hkv = q.shape[0], q.shape[1], k3[0].shape[1]
    o = torch.empty((T, Hq, v3[0].shape[2]), dtype=q.dtype, device=q.device)
    lse = [torch.empty((T, Hq), dtype=_float_type(q.dtype), device=q.device) if on[b] else None for b in range(3)]
    sel = torch.empty((T, Hkv, full["num_selected"]), dtype=torch.int32, device=q.device) if on[1] else None
    ws = torch.empty((max(ws_bytes, 1),), dtype=torch.uint8, device=q.device)
    w = _Wrap(ctx)
    try:
        a = ForwardArgs()
        a.q = w.view(q, "q", 3)
        for b in range(3):
            a.k[b] = w.view(k3[b], "k", 3)
            a.v[b] = w.view(v3[b], "v", 3)
            if on[b]:
                if gates[b] is None:
                    raise ValueError(f"nsa: the gate of branch {('cmp', 'slc', 'win')[b]} is needed")
                a.gate[b] = w.view(gates[b], "gate", 2)
                a.lse[b] = w.view(lse[b], "lse", 2)
        a.o = w.view(o, "o", 3)
        if sel is not None:
            a.selected = w.view(sel, "selected", 3)
        wsv = w.view(ws, "workspace", 1)
        check("nsa_forward", lib.nsa_forward_sized(plan, ctypes.byref(a), ctypes.sizeof(a), wsv.buffer))
    finally:
        w.free()
    return o, lse, sel


def _from_dlpack(q, k, v, gates):
    """Tensors of other frameworks (any object with __dlpack__: NumPy, JAX, CuPy ...) as torch
    tensors on the same memory, zero copy; torch tensors and None pass unchanged."""
    def one(x, name):
        if x is None or isinstance(x, torch.Tensor):
            return x
        if hasattr(x, "__dlpack__"):
            return torch.from_dlpack(x)
        raise TypeError(f"nsa: {name} must be a torch tensor or an object with __dlpack__, not {type(x).__name__}")

    def many(x, name):  # one tensor or a tuple / list of them
        if isinstance(x, (tuple, list)):
            return type(x)(one(y, name) for y in x)
        return one(x, name)
    return one(q, "q"), many(k, "k"), many(v, "v"), many(gates, "gates")


def forward(q, k, v, gates, cu_seqlens=None, backend=None, cu_seqlens_k=None, **cfg):
    """The NSA forward (no autograd): returns (o, [lse_cmp, lse_slc, lse_win], selected) as
    torch tensors; inputs may be torch tensors or any DLPack tensors (NumPy arrays, ...).
    cu_seqlens_k (libnsa 0.6): k and v have cu_seqlens_k[-1] rows and each sequence's queries
    are the last positions of its keys (a shard of a longer sequence, or chunked prefill)."""
    q, k, v, gates = _from_dlpack(q, k, v, gates)
    k3, v3 = _branches(k, "k"), _branches(v, "v")
    spec, cu = _spec(q, k3, v3, gates, cu_seqlens, cfg, cu_seqlens_k)
    return _forward(q, k3, v3, tuple(gates), spec, cu, backend, False)


def _backward(q, k3, v3, gates, lse, sel, do, spec, cu, backend, shared):
    """nsa_backward: (dq, dk[3], dv[3], dg[3]). shared = (for k, for v) three flags each: branch
    b's tensor is branch 0's. A shared tensor's gradient is the library's sum, returned in
    slot 0 (None in the slots that share it)."""
    spec = dict(spec, flags=CONFIG_TRAINING)
    ctx = _context(q, backend)
    plan, ws_bytes, _ = _plan(ctx, spec, *cu)
    on = tuple(t is not None for t in lse)
    do = do if do.dim() == 3 and do.stride(2) == 1 else do.contiguous()
    dq = torch.empty_like(q)
    dk = [None, None, None]
    dv = [None, None, None]
    for b in range(3):  # one gradient tensor per distinct input tensor: the library sums shared ones
        if not on[b]:
            continue
        dk[b] = dk[0] if b > 0 and shared[0][b] and dk[0] is not None else torch.empty_like(k3[b])
        dv[b] = dv[0] if b > 0 and shared[1][b] and dv[0] is not None else torch.empty_like(v3[b])
    dg = [torch.empty_like(g) if g is not None and on[b] else None for b, g in enumerate(gates)]
    ws = torch.empty((max(ws_bytes, 1),), dtype=torch.uint8, device=q.device)
    w = _Wrap(ctx)
    try:
        a = BackwardArgs()
        a.q = w.view(q, "q", 3)
        a.dout = w.view(do, "grad", 3)
        a.dq = w.view(dq, "dq", 3)
        for b in range(3):
            if not on[b]:
                continue
            a.k[b] = w.view(k3[b], "k", 3)
            a.v[b] = w.view(v3[b], "v", 3)
            a.gate[b] = w.view(gates[b], "gate", 2)
            a.lse[b] = w.view(lse[b], "lse", 2)
            a.dk[b] = w.view(dk[b], "dk", 3)
            a.dv[b] = w.view(dv[b], "dv", 3)
            a.dgate[b] = w.view(dg[b], "dgate", 2)
        if sel is not None:
            a.block_indices = w.view(sel, "selected", 3)
        a.flags = BACKWARD_TRUST_INDICES
        wsv = w.view(ws, "workspace", 1)
        check("nsa_backward", lib.nsa_backward_sized(plan, ctypes.byref(a), ctypes.sizeof(a), wsv.buffer))
    finally:
        w.free()
    gk = [dk[b] if dk[b] is not None and (b == 0 or dk[b] is not dk[0]) else None for b in range(3)]
    gv = [dv[b] if dv[b] is not None and (b == 0 or dv[b] is not dv[0]) else None for b in range(3)]
    return dq, gk, gv, dg


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(actx, q, k0, k1, k2, v0, v1, v2, g0, g1, g2, spec, cu, backend):
        k3, v3, gates = (k0, k1, k2), (v0, v1, v2), (g0, g1, g2)
        o, lse, sel = _forward(q, k3, v3, gates, spec, cu, backend, True)
        actx.spec, actx.cu, actx.backend = spec, cu, backend
        actx.shared = tuple(x is k0 for x in (k0, k1, k2)), tuple(x is v0 for x in (v0, v1, v2))
        actx.save_for_backward(q, k0, k1, k2, v0, v1, v2, g0, g1, g2, lse[0], lse[1], lse[2], sel)
        return o

    @staticmethod
    def backward(actx, do):
        q, k0, k1, k2, v0, v1, v2, g0, g1, g2, l0, l1, l2, sel = actx.saved_tensors
        dq, gk, gv, dg = _backward(q, (k0, k1, k2), (v0, v1, v2), (g0, g1, g2), (l0, l1, l2), sel, do, actx.spec,
                                   actx.cu, actx.backend, actx.shared)
        return (dq, gk[0], gk[1], gk[2], gv[0], gv[1], gv[2], dg[0], dg[1], dg[2], None, None, None)


def attention(q, k, v, gates, cu_seqlens=None, backend=None, cu_seqlens_k=None, **cfg):
    """NSA attention with autograd: o [T, Hq, Dv]. Gradients flow to q, k, v and the gates
    (through nsa_backward; the block selection is a constant, as in the paper).
    cu_seqlens_k (libnsa 0.6): as for forward(); k and v then get this shard's part of their
    gradient (sum the shards' parts for the sequence's, docs/nsa-semantics.md section 11)."""
    q, k, v, gates = _from_dlpack(q, k, v, gates)
    k3, v3 = _branches(k, "k"), _branches(v, "v")
    gates = tuple(gates)
    spec, cu = _spec(q, k3, v3, gates, cu_seqlens, cfg, cu_seqlens_k)
    return _Attention.apply(q, k3[0], k3[1], k3[2], v3[0], v3[1], v3[2], gates[0], gates[1], gates[2], spec, cu,
                            backend)


from .decode import DecodePlan  # noqa: E402  (decoding: libnsa 0.5)

try:  # the torch.library custom ops (torch >= 2.4) use the functions above
    from . import ops  # noqa: E402
except ImportError:  # an older torch: nsa.attention and nsa.forward only
    ops = None
