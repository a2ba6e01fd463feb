"""Decoding and chunked prefill on torch tensors: nsa.DecodePlan (libnsa 0.5; docs/nsa-semantics.md
section 10, include/nsa.h "decoding").

    plan = nsa.DecodePlan(Hq, Hkv, Dqk, Dv, batch=B, max_step_tokens=16, max_context=4096,
                          page_size=64, num_pages=B * 64, dtype=torch.bfloat16, device="cuda")
    k_cache, v_cache, kc_cache, vc_cache = plan.new_caches()
    o, lse, selected = plan.step(q, k, v, gates, cu_seqlens_q, cache_seqlens, block_table,
                                 k_cache, v_cache, kc_cache, vc_cache, cmp_block_table)
    cache_seqlens += cu_seqlens_q.diff()    # the caller advances the cached lengths

A step appends the new tokens' k, v to the caller's paged caches in place (vLLM /
FlashAttention layout: [num_pages, page_size, Hkv, D], sequence b's position x in page
block_table[b][x // page_size], slot x % page_size), forms the compressed rows (MEAN) the
new tokens complete into kc_cache / vc_cache (pages of cmp_block_table), and returns the
new tokens' rows of o, the LSEs and the selected blocks: each is the row of nsa.forward over
the sequence's first TK0 + TQ tokens (bitwise on the cpu backend). CPU tensors run on the
cpu backend, CUDA tensors on the cuda backend's decode step (python/tests/cuda_device_check.py
checks this wrapper's CUDA path against nsa.forward on the GPU).
"""
import ctypes

import torch

from . import _CFG_KEYS, _DTYPES, _Wrap, _branches, _context, _defaults, _float_type
from ._lib import Config, DecodeArgs, DecodeLimits, PlanInfo, Tensor, check, lib

_BRANCH = ("cmp", "slc", "win")


def _num_cmp_blocks(length, l, d):
    return (length - l) // d + 1 if length >= l else 0


def _ceil_div(a, b):
    return -(-a // b)


class DecodePlan:
    """A decode plan (nsa_decode_plan_create) for one configuration and its capacities.

    Heads and dims are positional; the capacities are keywords (include/nsa.h
    nsa_decode_limits): batch, max_step_tokens and max_context are required; max_pages
    (default: the pages of a max_context sequence), max_total_tokens (batch *
    max_step_tokens), cmp_page_size (16), max_cmp_pages (the compressed pages of a
    max_context sequence) and num_cmp_pages (batch * max_cmp_pages) have defaults.
    dtype (float32, float16, bfloat16, float64 on cpu) and device pick the caches' and
    q's type and memory; other keywords override the library's configuration (cmp_block,
    cmp_stride, slc_block, num_selected, num_init, num_local, window, scale). Compression
    is MEAN. Library failures raise nsa.Error with its message."""

    def __init__(self, num_q_heads, num_kv_heads, head_dim_qk, head_dim_v, *, batch, max_step_tokens, max_context,
                 page_size, num_pages, max_pages=None, max_total_tokens=None, cmp_page_size=16, max_cmp_pages=None,
                 num_cmp_pages=None, dtype=torch.float32, device="cpu", backend=None, **overrides):
        self._plan = None
        if dtype not in _DTYPES:
            raise ValueError(f"nsa.DecodePlan: dtype {dtype} is not supported (float32, float16, bfloat16, float64)")
        for k in overrides:
            if k not in _CFG_KEYS:
                raise ValueError(f"nsa.DecodePlan: unknown config field {k!r} (known: {', '.join(_CFG_KEYS)})")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # tensors carry their index ("cuda:0"); a plan for "cuda" is one for the current device
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = dtype
        self.config = dict(_defaults(), num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk,
                           head_dim_v=head_dim_v, dtype=_DTYPES[dtype], compress=0, flags=0)
        self.config.update(overrides)
        c = self.config
        nc = _num_cmp_blocks(max_context, c["cmp_block"], c["cmp_stride"]) if page_size > 0 else 0
        if max_pages is None:
            max_pages = _ceil_div(max_context, page_size) if page_size > 0 else 1
        if max_cmp_pages is None:
            max_cmp_pages = _ceil_div(nc, cmp_page_size) if cmp_page_size > 0 else 0
        self.limits = dict(batch=batch, max_step_tokens=max_step_tokens,
                           max_total_tokens=batch * max_step_tokens if max_total_tokens is None else max_total_tokens,
                           max_context=max_context, page_size=page_size, num_pages=num_pages, max_pages=max_pages,
                           cmp_page_size=cmp_page_size,
                           num_cmp_pages=batch * max_cmp_pages if num_cmp_pages is None else num_cmp_pages,
                           max_cmp_pages=max_cmp_pages)
        self._ctx = _context(torch.empty(0, device=self.device), backend)
        cfg = Config()
        check("nsa_config_init", lib.nsa_config_init_sized(ctypes.byref(cfg), ctypes.sizeof(cfg)))
        for k, v in c.items():
            setattr(cfg, k, v)
        lim = DecodeLimits(**self.limits)
        h = ctypes.c_void_p()
        check("nsa_decode_plan_create", lib.nsa_decode_plan_create_sized(
            self._ctx, ctypes.byref(cfg), ctypes.sizeof(cfg), ctypes.byref(lim), ctypes.sizeof(lim), ctypes.byref(h)))
        self._plan = h.value
        info = PlanInfo()
        check("nsa_plan_get_info", lib.nsa_plan_get_info_sized(self._plan, ctypes.byref(info), ctypes.sizeof(info)))
        self.stages = info.stages.decode()
        self.workspace_bytes = info.workspace_bytes
        self._ws = torch.empty((max(info.workspace_bytes, 1),), dtype=torch.uint8, device=self.device)
        self._on = (True, c["num_selected"] > 0, c["window"] > 0)

    def close(self):
        """Frees the plan (also done when it is garbage-collected)."""
        if self._plan is not None and lib is not None:
            lib.nsa_plan_destroy(self._plan)
        self._plan = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def new_caches(self):
        """Zeroed caches of the plan's capacities: (k_cache, v_cache) [num_pages, page_size, Hkv, Dqk | Dv] and
        (kc_cache, vc_cache) [num_cmp_pages, cmp_page_size, Hkv, Dqk | Dv]."""
        c, L = self.config, self.limits
        hkv, dqk, dv = c["num_kv_heads"], c["head_dim_qk"], c["head_dim_v"]
        z = lambda *s: torch.zeros(s, dtype=self.dtype, device=self.device)  # noqa: E731
        return (z(L["num_pages"], L["page_size"], hkv, dqk), z(L["num_pages"], L["page_size"], hkv, dv),
                z(L["num_cmp_pages"], L["cmp_page_size"], hkv, dqk), z(L["num_cmp_pages"], L["cmp_page_size"], hkv, dv))

    # ------------------------------------------------------------ a step

    def _rows(self, t, name, width_shape, dtype):
        """t as max_total_tokens rows (padded by a copy when it has fewer)."""
        mt = self.limits["max_total_tokens"]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"nsa.DecodePlan.step: {name} must be a torch tensor")
        if t.dtype != dtype or t.device != self.device:
            raise ValueError(f"nsa.DecodePlan.step: {name} must be {dtype} on {self.device}, "
                             f"is {t.dtype} on {t.device}")
        if tuple(t.shape[1:]) != tuple(width_shape) or t.shape[0] > mt:
            raise ValueError(f"nsa.DecodePlan.step: {name} must be [rows <= {mt}, {', '.join(map(str, width_shape))}], "
                             f"has shape {tuple(t.shape)}")
        if t.shape[0] == mt:
            return t
        full = torch.zeros((mt,) + tuple(width_shape), dtype=dtype, device=self.device)
        full[:t.shape[0]] = t
        return full

    def _cache(self, t, name, d):
        hkv = self.config["num_kv_heads"]
        if not isinstance(t, torch.Tensor) or t.dtype != self.dtype or t.device != self.device:
            raise ValueError(f"nsa.DecodePlan.step: {name} must be a {self.dtype} tensor on {self.device}")
        if t.dim() not in (3, 4) or tuple(t.shape[-2:]) != (hkv, d):
            raise ValueError(f"nsa.DecodePlan.step: {name} must be [pages, page_size, {hkv}, {d}] (or [positions, "
                             f"{hkv}, {d}]), has shape {tuple(t.shape)}")
        try:
            return t.view(-1, hkv, d)  # a view: the step writes into the caller's cache
        except RuntimeError as e:
            raise ValueError(f"nsa.DecodePlan.step: {name}'s pages and slots must form one run of positions "
                             f"(strides {t.stride()}): {e}") from None

    def _ints(self, x, name, ndim):
        if not isinstance(x, torch.Tensor):
            x = torch.tensor(x, dtype=torch.int32, device=self.device)
        if x.dtype != torch.int32 or x.device != self.device or x.dim() != ndim or x.stride(-1) != 1:
            raise ValueError(f"nsa.DecodePlan.step: {name} must be an int32 tensor of {ndim} dimension(s) on "
                             f"{self.device} with contiguous rows")
        return x

    def step(self, q, k, v, gates, cu_seqlens_q, cache_seqlens, block_table, k_cache, v_cache, kc_cache=None,
             vc_cache=None, cmp_block_table=None):
        """One nsa_decode step. q [R, Hq, Dqk], k [R, Hkv, Dqk] and v [R, Hkv, Dv] (one tensor for all branches or
        a tuple of three, as in nsa.forward), gates (g_cmp, g_slc, g_win) [R, Hq] of the float type: the step's R
        packed new tokens (R <= max_total_tokens; fewer rows are padded by a copy). cu_seqlens_q int32 [B + 1],
        cache_seqlens int32 [B] (TK0 of each sequence; not changed: advance it yourself), block_table int32
        [B, max_pages], cmp_block_table int32 [B, max_cmp_pages] (tensors on the device, or lists). k_cache,
        v_cache (one pair, or tuples of three per branch) and kc_cache, vc_cache: the caches, written in place
        (the compressed ones and cmp_block_table may be None or empty when no compressed block fits max_context).
        Returns (o [R, Hq, Dv], [lse_cmp, lse_slc, lse_win] [R, Hq] (None where a branch is off), selected
        [R, Hkv, n] or None), rows past cu_seqlens_q[-1] unspecified."""
        if self._plan is None:
            raise ValueError("nsa.DecodePlan.step: the plan is closed")
        c, L = self.config, self.limits
        hq, hkv, dqk, dv, n = (c["num_q_heads"], c["num_kv_heads"], c["head_dim_qk"], c["head_dim_v"],
                               c["num_selected"])
        ft = _float_type(self.dtype)
        R = q.shape[0] if isinstance(q, torch.Tensor) else 0
        qf = self._rows(q, "q", (hq, dqk), self.dtype)
        k3, v3 = _branches(k, "k"), _branches(v, "v")
        kc3, vc3 = _branches(k_cache, "k_cache"), _branches(v_cache, "v_cache")
        mt = L["max_total_tokens"]
        o = torch.empty((mt, hq, dv), dtype=self.dtype, device=self.device)
        lse = [torch.empty((mt, hq), dtype=ft, device=self.device) if self._on[b] else None for b in range(3)]
        sel = torch.empty((mt, hkv, n), dtype=torch.int32, device=self.device) if self._on[1] else None
        w = _Wrap(self._ctx)
        keep = []  # the tensors made here (padded rows, int32 tables from lists) live until the call returns

        def kept(t):
            keep.append(t)
            return t
        try:
            a = DecodeArgs()
            a.q = w.view(qf, "q", 3)
            padded = {}  # one padded copy per input tensor, so that shared tensors stay one view
            for b in range(3):
                if not self._on[b]:
                    continue
                if gates[b] is None:
                    raise ValueError(f"nsa.DecodePlan.step: the gate of branch {_BRANCH[b]} is needed")
                a.gate[b] = w.view(kept(self._rows(gates[b], f"gate[{_BRANCH[b]}]", (hq,), ft)), "gate", 2)
                for name, src, width, out in (("k", k3[b], (hkv, dqk), a.k), ("v", v3[b], (hkv, dv), a.v)):
                    if id(src) not in padded:
                        padded[id(src)] = kept(self._rows(src, name, width, self.dtype))
                    out[b] = w.view(padded[id(src)], name, 3)
                a.k_cache[b] = w.view(self._cache(kc3[b], "k_cache", dqk), "k_cache", 3)
                a.v_cache[b] = w.view(self._cache(vc3[b], "v_cache", dv), "v_cache", 3)
                a.lse[b] = w.view(lse[b], "lse", 2)
            a.cu_seqlens_q = w.view(kept(self._ints(cu_seqlens_q, "cu_seqlens_q", 1)), "cu_seqlens_q", 1)
            a.cache_seqlens = w.view(kept(self._ints(cache_seqlens, "cache_seqlens", 1)), "cache_seqlens", 1)
            a.block_table = w.view(kept(self._ints(block_table, "block_table", 2)), "block_table", 2)
            empty = lambda t: t is None or (isinstance(t, torch.Tensor) and t.numel() == 0)  # noqa: E731
            if not empty(kc_cache):  # needed when a max_context sequence has a compressed block
                a.kc_cache = w.view(self._cache(kc_cache, "kc_cache", dqk), "kc_cache", 3)
                a.vc_cache = w.view(self._cache(vc_cache, "vc_cache", dv), "vc_cache", 3)
            if not empty(cmp_block_table):
                cbt = kept(self._ints(cmp_block_table, "cmp_block_table", 2))
                a.cmp_block_table = w.view(cbt, "cmp_block_table", 2)
            a.o = w.view(o, "o", 3)
            if sel is not None:
                a.selected = w.view(sel, "selected", 3)
            ws = w.view(self._ws, "workspace", 1)
            check("nsa_decode", lib.nsa_decode_sized(self._plan, ctypes.byref(a), ctypes.sizeof(a), ws.buffer))
        finally:
            w.free()
            del keep
        return o[:R], [x[:R] if x is not None else None for x in lse], sel[:R] if sel is not None else None

    def check(self):
        """nsa_decode_check: waits for the last step and raises nsa.Error if its checks of the lengths and page
        tables failed (a GPU step reports them here; the cpu's step raised already)."""
        check("nsa_decode_check", lib.nsa_decode_check(self._plan))
