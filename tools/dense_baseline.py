#!/usr/bin/env python3
"""Dense causal attention baselines for `nsa bench`: PyTorch's
scaled_dot_product_attention (GQA, causal) with its cuDNN and FlashAttention
back ends, timed on the same GPU as the library, in the same device call.

    python3 tools/dense_baseline.py --T 8192 65536 --hq 64 --hkv 4 --dqk 128 --dv 128

One JSON object per line and back end: {"baseline": "torch-sdpa-cudnn", "T": ...,
"fwd_ms": ...} (or "error": the reason, e.g. FlashAttention takes Dqk == Dv
only). Time: CUDA events around each call, after warm-up calls; the median.
Inputs are drawn once per T (uniform in [-1, 1)), bf16 unless --dtype f16.
Needs PyTorch with CUDA (the device machine has it; nothing here is installed
by the library's build).
"""
import argparse
import json
import statistics


def time_ms(fn, iters, warmup):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
    ap.add_argument("--hq", type=int, default=64)
    ap.add_argument("--hkv", type=int, default=4)
    ap.add_argument("--dqk", type=int, default=192)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
    for T in a.T:
        gen = torch.Generator(device="cuda").manual_seed(T)

        def draw(h, d):
            return (torch.rand(1, h, T, d, device="cuda", generator=gen) * 2 - 1).to(dtype)

        q, k, v = draw(a.hq, a.dqk), draw(a.hkv, a.dqk), draw(a.hkv, a.dv)
        for name, be in backends:
            rec = {"baseline": f"torch-sdpa-{name}", "T": T, "hq": a.hq, "hkv": a.hkv, "dqk": a.dqk, "dv": a.dv,
                   "dtype": a.dtype, "device": torch.cuda.get_device_name()}
            try:
                with sdpa_kernel([be]):
                    def run():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    rec["fwd_ms"] = round(time_ms(run, a.iters if T < 32768 else max(3, a.iters // 2), a.warmup), 4)
            except Exception as e:  # an unsupported shape for this back end
                rec["error"] = str(e).split("\n")[0][:200]
            print(json.dumps(rec), flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
