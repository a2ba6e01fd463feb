"""The Python package on CUDA tensors, checked on a GPU machine (issue 16):

  1. nsa.forward on bf16 CUDA tensors, on a side stream of the caller's, equals
     bitwise what `nsa run --backend cuda` computes from the same inputs written
     as .npy files (o, the three LSEs, the selected blocks);
  2. the call copies no tensor data between host and device: torch.profiler's
     memcpy events during the call (the plan's tables go up when the binding
     makes its plan) are listed with their bytes, and none is as large as the
     smallest input (q, o and the workspace stay where torch put them; the
     library wraps their pointers);
  3. every kernel of the call runs on the caller's stream: the chrome trace puts
     them on the stream of a torch kernel launched on that stream just before;
  4. nsa.attention's backward on the same tensors equals `nsa run --backward`'s
     gradients bitwise (dq, dk, dv, dg_*);
  5. nsa.DecodePlan on bf16 CUDA tensors (G 16, D 64: the tensor-core decode
     step): chunked prefill, then decode steps of 0..4 tokens per sequence over
     shuffled pages; every step's rows of o within twice the bf16 parity
     tolerance of nsa.forward's rows on the same tensors (rows whose selected
     blocks differ, near ties, are counted and left out; at most 5 % allowed),
     the LSEs likewise, and the plan's status clean.

Run from the repository root with the library built (NSA_LIBRARY, NSA_TOOL,
NSA_BACKEND_PATH set as for the meson `python` test):
  python3 python/tests/cuda_device_check.py [T]
Prints one line per check and exits 0 when all pass, 1 when one fails, 77 when
there is no CUDA device.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import nsa  # noqa: E402

TOOL = os.environ.get("NSA_TOOL", "build/tools/nsa")
# the paper's block parameters at a width the tool checks quickly
T = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
Hq, Hkv, Dqk, Dv = 16, 1, 64, 64
CFG = dict(cmp_block=32, cmp_stride=16, slc_block=64, num_selected=16, num_init=1, num_local=2, window=512)
FLAGS = ["--l", "32", "--d", "16", "--ls", "64", "--n", "16", "--n-init", "1", "--n-local", "2", "--w", "512"]
failed = 0


def report(ok, what):
    global failed
    failed += 0 if ok else 1
    print(("PASS " if ok else "FAIL ") + what, flush=True)


def tool(tmp, extra):
    out = os.path.join(tmp, "out")
    cmd = [TOOL, "run", "--backend", "cuda", "--inputs", tmp, "--outputs", out, "--T", str(T), "--hq", str(Hq),
           "--hkv", str(Hkv), "--dqk", str(Dqk), "--dv", str(Dv), "--dtype", "bf16", "--iters", "1", "--warmup", "0",
           "--check-tokens", "0"] + FLAGS + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr}")
    return out


def main():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    g = torch.Generator().manual_seed(11)
    # bf16 values, written as the f32 .npy files the tool reads (it rounds them to bf16: exact)
    q = (torch.rand(T, Hq, Dqk, generator=g) * 4 - 2).bfloat16()
    k = (torch.rand(T, Hkv, Dqk, generator=g) * 4 - 2).bfloat16()
    v = (torch.rand(T, Hkv, Dv, generator=g) * 2 - 1).bfloat16()
    gates = [torch.rand(T, Hq, generator=g) * 0.9 + 0.05 for _ in range(3)]
    do = (torch.rand(T, Hq, Dv, generator=g) * 2 - 1).bfloat16()
    dev = torch.device("cuda")
    qd, kd, vd, dod = (t.to(dev) for t in (q, k, v, do))
    gd = [t.to(dev) for t in gates]
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # first call: the context for this stream is made, kernels loaded; not profiled
        nsa.forward(qd, kd, vd, gd, **CFG)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with torch.cuda.stream(side):
                torch.cuda._sleep(1000)  # a torch kernel on the caller's stream
                o, lse, sel = nsa.forward(qd, kd, vd, gd, **CFG)
            torch.cuda.synchronize()
        trace = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            ev = json.load(f)["traceEvents"]
    kern = [e for e in ev if e.get("cat") == "kernel"]
    mem = [e for e in ev if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    sleep_streams = {e["args"].get("stream") for e in kern if "sleep" in e["name"].lower() or "spin" in e["name"].lower()}
    lib_kern = [e for e in kern if not ("sleep" in e["name"].lower() or "spin" in e["name"].lower())]
    lib_streams = {e["args"].get("stream") for e in lib_kern}
    off = sorted({e["name"][:60] for e in lib_kern if e["args"].get("stream") not in sleep_streams})
    report(len(sleep_streams) == 1 and lib_streams == sleep_streams and len(lib_kern) > 0,
           f"stream: {len(lib_kern)} library kernels on stream(s) {sorted(lib_streams)}, the caller's torch kernel "
           f"on {sorted(sleep_streams)}{'; elsewhere: ' + ', '.join(off) if off else ''}")
    smallest = min(t.numel() * t.element_size() for t in (qd, kd, vd, o))
    copies = [(e["name"], e["args"].get("bytes", 0), e["args"].get("stream")) for e in mem
              if e.get("cat") == "gpu_memcpy"]
    big = [c for c in copies if c[1] >= smallest]
    report(not big and o.is_cuda and o.data_ptr() != 0,
           f"copies: {len(copies)} memcpy during the call, {sum(c[1] for c in copies)} bytes in all "
           f"(largest {max([c[1] for c in copies], default=0)}); smallest tensor {smallest} bytes; "
           f"o at 0x{o.data_ptr():x} on {o.device}; {copies[:6]}")

    with tempfile.TemporaryDirectory() as tmp:
        np.save(os.path.join(tmp, "q.npy"), q.float().numpy())
        np.save(os.path.join(tmp, "k.npy"), k.float().numpy())
        np.save(os.path.join(tmp, "v.npy"), v.float().numpy())
        for name, gt in zip(("g_cmp", "g_slc", "g_win"), gates):
            np.save(os.path.join(tmp, name + ".npy"), gt.numpy())
        np.save(os.path.join(tmp, "do.npy"), do.float().numpy())
        out = tool(tmp, ["--backward"])
        ok = np.array_equal(np.load(os.path.join(out, "o.npy")), o.float().cpu().numpy())
        for name, t in zip(("lse_cmp", "lse_slc", "lse_win"), lse):
            ok = ok and np.array_equal(np.load(os.path.join(out, name + ".npy")), t.cpu().numpy())
        ok = ok and np.array_equal(np.load(os.path.join(out, "selected.npy")), sel.cpu().numpy())
        report(ok, f"forward: o, lse_*, selected of nsa.forward (CUDA tensors, side stream) bitwise equal to "
                   f"nsa run --backend cuda (T {T}, Hq {Hq}, Hkv {Hkv}, D {Dqk}/{Dv}, bf16)")

        leaves = [t.detach().clone().requires_grad_() for t in (qd, kd, vd, *gd)]
        with torch.cuda.stream(side):
            oa = nsa.attention(leaves[0], leaves[1], leaves[2], leaves[3:], **CFG)
            oa.backward(dod)
        torch.cuda.synchronize()
        want = {"dq": leaves[0], "dk": leaves[1], "dv": leaves[2], "dg_cmp": leaves[3], "dg_slc": leaves[4],
                "dg_win": leaves[5]}
        bad = [n for n, t in want.items()
               if not np.array_equal(np.load(os.path.join(out, n + ".npy")), t.grad.float().cpu().numpy())]
        report(not bad and torch.equal(oa, o),
               f"backward: nsa.attention's gradients on CUDA bitwise equal to nsa run --backward"
               f"{' (differ: ' + ', '.join(bad) + ')' if bad else ''}")
    decode_check(dev)
    return 1 if failed else 0


def decode_check(dev):
    g = torch.Generator().manual_seed(23)
    CU, lens, prefill = [0, 700, 1153], [700, 453], [400, 300]
    TT = CU[-1]
    q = (torch.rand(TT, Hq, Dqk, generator=g) * 4 - 2).bfloat16().to(dev)
    k = (torch.rand(TT, Hkv, Dqk, generator=g) * 4 - 2).bfloat16().to(dev)
    v = (torch.rand(TT, Hkv, Dv, generator=g) * 2 - 1).bfloat16().to(dev)
    gates = [(torch.rand(TT, Hq, generator=g) * 0.9 + 0.05).to(dev) for _ in range(3)]
    o_f, lse_f, sel_f = nsa.forward(q, k, v, gates, cu_seqlens=CU, **CFG)
    plan = nsa.DecodePlan(Hq, Hkv, Dqk, Dv, batch=2, max_step_tokens=16, max_context=max(lens), page_size=64,
                          num_pages=2 * 11 + 3, dtype=torch.bfloat16, device="cuda", **CFG)
    L = plan.limits
    bt = torch.randperm(L["num_pages"], generator=g)[:2 * L["max_pages"]].view(2, -1).to(torch.int32).to(dev)
    cbt = torch.randperm(L["num_cmp_pages"], generator=g)[:2 * L["max_cmp_pages"]].view(2, -1).to(torch.int32).to(dev)
    kc, vc, kcc, vcc = plan.new_caches()
    done, steps, rows_all, tie_rows, worst, worst_lse = [0, 0], 0, 0, 0, 0.0, 0.0
    rms = o_f.float().pow(2).mean().sqrt().item()
    while done != lens:
        tq = []
        for b in range(2):
            n = min(16, prefill[b] - done[b]) if done[b] < prefill[b] else int(torch.randint(0, 5, (1,), generator=g))
            tq.append(min(n, lens[b] - done[b]))
        rows = [t for b in range(2) for t in range(CU[b] + done[b], CU[b] + done[b] + tq[b])]
        if not rows:
            continue
        o, lse, sel = plan.step(q[rows], k[rows], v[rows], [x[rows] for x in gates], [0, tq[0], tq[0] + tq[1]],
                                done, bt, kc, vc, kcc, vcc, cbt)
        same = (sel == sel_f[rows]).all(dim=-1).all(dim=-1)  # rows whose selected blocks agree
        ref = o_f[rows].float()
        err = (o.float() - ref).abs() / (0.02 * rms + 0.02 * ref.abs() + 2e-4)
        worst = max(worst, err[same].max().item() if same.any() else 0.0)
        for b in range(3):
            e = (lse[b] - lse_f[b][rows]).abs() / (0.004 + 0.004 * lse_f[b][rows].abs())
            worst_lse = max(worst_lse, e[same].max().item() if same.any() else 0.0)
        rows_all += len(rows)
        tie_rows += int((~same).sum())
        done = [done[b] + tq[b] for b in range(2)]
        steps += 1
    plan.check()
    plan.close()
    report(worst <= 1.0 and worst_lse <= 1.0 and tie_rows <= 0.05 * rows_all,
           f"decode: nsa.DecodePlan on CUDA, {steps} steps, {rows_all} rows: o within {worst:.3f} of twice the bf16 "
           f"tolerance of nsa.forward's rows, LSEs {worst_lse:.3f}; {tie_rows} rows with other selected blocks "
           f"(near ties, left out)")


if __name__ == "__main__":
    sys.exit(main())
