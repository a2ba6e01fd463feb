"""ctypes bindings to libnsa's C API (include/nsa.h), the subset the package uses.

Why ctypes: the library is a flat C API whose structs carry their size to the
library (the *_sized entry points), so a binding needs no compiler, works with
any installed libnsa of a compatible version, and `pip install ./python` stays
a pure-Python install.

The library is found, in order: $NSA_LIBRARY (a path to libnsa.so), the
directory of $NSA_LIBRARY_DIR, ctypes.util.find_library("nsa") (the system
search path, an installed prefix in LD_LIBRARY_PATH), and a meson build tree
next to this file (../../build/core/libnsa.so) for use from a checkout.
"""
import ctypes
import ctypes.util
import os

c_int64 = ctypes.c_int64


class Error(RuntimeError):
    """A libnsa call failed. .status is the nsa_status name, str() the library's message."""

    def __init__(self, call, status, message):
        self.call = call
        self.status = status
        self.message = message
        super().__init__(f"{call}: {status}: {message}")


class Config(ctypes.Structure):
    _fields_ = [
        ("num_q_heads", c_int64),
        ("num_kv_heads", c_int64),
        ("head_dim_qk", c_int64),
        ("head_dim_v", c_int64),
        ("cmp_block", c_int64),
        ("cmp_stride", c_int64),
        ("slc_block", c_int64),
        ("num_selected", c_int64),
        ("num_init", c_int64),
        ("num_local", c_int64),
        ("window", c_int64),
        ("scale", ctypes.c_float),
        ("compress", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("flags", ctypes.c_uint64),
    ]


class Tensor(ctypes.Structure):
    _fields_ = [("buffer", ctypes.c_void_p), ("offset", c_int64), ("stride_token", c_int64),
                ("stride_head", c_int64)]


T3 = Tensor * 3


class ForwardArgs(ctypes.Structure):
    _fields_ = [
        ("q", Tensor), ("k", T3), ("v", T3), ("gate", T3),
        ("w_k", Tensor), ("w_v", Tensor), ("pe_k", Tensor), ("pe_v", Tensor),
        ("kc", Tensor), ("vc", Tensor), ("block_indices", Tensor),
        ("o", Tensor), ("lse", T3), ("selected", Tensor), ("flags", ctypes.c_uint),
    ]


class BackwardArgs(ctypes.Structure):
    _fields_ = [
        ("q", Tensor), ("k", T3), ("v", T3), ("gate", T3),
        ("w_k", Tensor), ("w_v", Tensor), ("pe_k", Tensor), ("pe_v", Tensor),
        ("kc", Tensor), ("vc", Tensor),
        ("lse", T3), ("block_indices", Tensor), ("dout", Tensor),
        ("dq", Tensor), ("dk", T3), ("dv", T3), ("dgate", T3),
        ("dw_k", Tensor), ("dw_v", Tensor), ("dpe_k", Tensor), ("dpe_v", Tensor),
        ("dkc", Tensor), ("dvc", Tensor), ("flags", ctypes.c_uint),
    ]


class DecodeLimits(ctypes.Structure):  # libnsa 0.5
    _fields_ = [(name, c_int64) for name in (
        "batch", "max_step_tokens", "max_total_tokens", "max_context", "page_size", "num_pages", "max_pages",
        "cmp_page_size", "num_cmp_pages", "max_cmp_pages")]


class DecodeArgs(ctypes.Structure):  # libnsa 0.5
    _fields_ = [
        ("q", Tensor), ("k", T3), ("v", T3), ("gate", T3),
        ("w_k", Tensor), ("w_v", Tensor), ("pe_k", Tensor), ("pe_v", Tensor),
        ("cu_seqlens_q", Tensor), ("cache_seqlens", Tensor),
        ("k_cache", T3), ("v_cache", T3), ("block_table", Tensor),
        ("kc_cache", Tensor), ("vc_cache", Tensor), ("cmp_block_table", Tensor),
        ("o", Tensor), ("lse", T3), ("selected", Tensor), ("status", Tensor),
    ]


class PlanInfo(ctypes.Structure):
    _fields_ = [
        ("batch", c_int64), ("total_tokens", c_int64), ("total_cmp_blocks", c_int64),
        ("max_cmp_blocks", c_int64), ("max_slc_blocks", c_int64), ("workspace_bytes", ctypes.c_size_t),
        ("num_stages", ctypes.c_int), ("stages", ctypes.c_char * 256),
        ("backend_bytes", ctypes.c_size_t),  # libnsa 0.3: zero from a library that lacks it
        ("num_bwd_stages", ctypes.c_int), ("bwd_stages", ctypes.c_char * 128),  # libnsa 0.3, the same
        ("total_keys", c_int64),  # libnsa 0.6 (a struct of an older library is shorter: zero)
    ]


DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_I32, DTYPE_F64 = 0, 1, 2, 3, 4  # F64: libnsa 0.4, cpu backend only
CONFIG_TRAINING = 1
FORWARD_TRUST_INDICES = 1
BACKWARD_TRUST_INDICES = 1


def _candidates():
    env = os.environ.get("NSA_LIBRARY")
    if env:
        yield env
    d = os.environ.get("NSA_LIBRARY_DIR")
    if d:
        yield os.path.join(d, "libnsa.so")
    found = ctypes.util.find_library("nsa")
    if found:
        yield found
    here = os.path.dirname(os.path.abspath(__file__))
    for rel in ("../../build/core/libnsa.so", "../../build-ci/core/libnsa.so"):
        yield os.path.normpath(os.path.join(here, rel))


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError("libnsa not found; set NSA_LIBRARY to the path of libnsa.so (tried: " +
                      "; ".join(tried or ["nothing"]) + ")")


lib = _load()
P = ctypes.c_void_p
lib.nsa_status_string.restype = ctypes.c_char_p
lib.nsa_status_string.argtypes = [ctypes.c_int]
lib.nsa_last_error.restype = ctypes.c_char_p
lib.nsa_version_string.restype = ctypes.c_char_p
lib.nsa_config_init_sized.argtypes = [ctypes.POINTER(Config), ctypes.c_size_t]
lib.nsa_context_create_with_stream.argtypes = [ctypes.c_char_p, ctypes.c_int, P, ctypes.POINTER(P)]
lib.nsa_context_destroy.argtypes = [P]
lib.nsa_context_backend.restype = ctypes.c_char_p
lib.nsa_context_backend.argtypes = [P]
lib.nsa_context_device.restype = ctypes.c_char_p
lib.nsa_context_device.argtypes = [P]
lib.nsa_context_synchronize.argtypes = [P]
lib.nsa_buffer_wrap.argtypes = [P, P, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(P)]
lib.nsa_buffer_alloc.argtypes = [P, ctypes.c_size_t, ctypes.POINTER(P)]
lib.nsa_buffer_free.argtypes = [P]
lib.nsa_plan_create_sized.argtypes = [P, ctypes.POINTER(Config), ctypes.c_size_t, ctypes.POINTER(c_int64), c_int64,
                                      ctypes.POINTER(P)]
if hasattr(lib, "nsa_plan_create_varlen_sized"):  # libnsa 0.6: shards and chunked prefill (cu_seqlens_k)
    lib.nsa_plan_create_varlen_sized.argtypes = [P, ctypes.POINTER(Config), ctypes.c_size_t, ctypes.POINTER(c_int64),
                                                 ctypes.POINTER(c_int64), c_int64, ctypes.POINTER(P)]
lib.nsa_plan_destroy.argtypes = [P]
lib.nsa_plan_get_info_sized.argtypes = [P, ctypes.POINTER(PlanInfo), ctypes.c_size_t]
lib.nsa_forward_sized.argtypes = [P, ctypes.POINTER(ForwardArgs), ctypes.c_size_t, P]
lib.nsa_backward_sized.argtypes = [P, ctypes.POINTER(BackwardArgs), ctypes.c_size_t, P]
if hasattr(lib, "nsa_decode_sized"):  # libnsa 0.5: decoding (nsa.DecodePlan)
    lib.nsa_decode_plan_create_sized.argtypes = [P, ctypes.POINTER(Config), ctypes.c_size_t,
                                                 ctypes.POINTER(DecodeLimits), ctypes.c_size_t, ctypes.POINTER(P)]
    lib.nsa_decode_sized.argtypes = [P, ctypes.POINTER(DecodeArgs), ctypes.c_size_t, P]
    lib.nsa_decode_check.argtypes = [P]


def check(call, status):
    """Raises Error with the library's message unless status is NSA_SUCCESS (0)."""
    if status != 0:
        raise Error(call, lib.nsa_status_string(status).decode(), lib.nsa_last_error().decode(errors="replace"))


def version():
    return lib.nsa_version_string().decode()
