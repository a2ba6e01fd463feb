"""Tests of the Python package against the library's own tool and finite differences.

  - forward and backward on CPU tensors equal, bitwise, what `nsa run` computes from
    the same inputs written as .npy files (the tool reaches the library through
    its own C code: this checks the binding's views, strides and buffers);
  - torch.autograd.gradcheck accepts the gradients: float32 tensors on the cpu
    backend, which computes in fp64, with loose tolerances (every block selected, so
    no selection flips); float64 tensors with gradcheck's default tolerances, for
    nsa.attention and for the custom op libnsa::forward, on a packed batch with all
    three branches, G = 2, Dqk != Dv and a real top-n choice; float64 where the
    backend lacks it (a fake module, as a GPU backend would) raises nsa.Error;
  - packed batches equal their sequences run one by one; a shared k gets the sum
    of the branch gradients; bad arguments raise ValueError, library failures
    nsa.Error with its message; CUDA tensors where a GPU is present (else skipped);
  - nsa.DecodePlan (decoding): chunked prefill then decode steps over shuffled paged
    caches give rows bitwise equal to nsa.forward's; bad limits and tables raise
    nsa.Error with the library's status and message;
  - the torch.library ops (nsa.ops) equal the autograd function bitwise, pass
    torch.library.opcheck and trace under torch.compile(fullgraph=True);
    NumPy arrays reach the library through DLPack.

Environment: NSA_LIBRARY (libnsa.so) and NSA_TOOL (the nsa program); meson's
`python` test sets both. Run: python3 -m unittest discover python/tests
"""
import ctypes
import os
import subprocess
import tempfile
import unittest
from unittest import mock

import numpy as np
import torch

import nsa

TOOL = os.environ.get("NSA_TOOL", os.path.join(os.path.dirname(__file__), "../../build/tools/nsa"))
SMALL = dict(cmp_block=8, cmp_stride=4, slc_block=16, num_selected=4, num_init=1, num_local=1, window=32)
FLAGS = ["--l", "8", "--d", "4", "--ls", "16", "--n", "4", "--n-init", "1", "--n-local", "1", "--w", "32"]


def inputs(T=100, Hq=4, Hkv=2, Dqk=16, Dv=8, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(T, Hq, Dqk, generator=g) * 4 - 2
    k = torch.rand(T, Hkv, Dqk, generator=g) * 4 - 2
    v = torch.rand(T, Hkv, Dv, generator=g) * 2 - 1
    gates = [torch.rand(T, Hq, generator=g) * 0.9 + 0.05 for _ in range(3)]
    for t in [q, k, v] + gates:
        t.requires_grad_(grad)
    return q, k, v, gates


def run_tool(tmp, T, Hq, Hkv, Dqk, Dv, extra):
    out = os.path.join(tmp, "out")
    cmd = [TOOL, "run", "--backend", "cpu", "--inputs", tmp, "--outputs", out, "--T", str(T), "--hq", str(Hq),
           "--hkv", str(Hkv), "--dqk", str(Dqk), "--dv", str(Dv), "--dtype", "f32", "--iters", "1", "--warmup", "0",
           "--check-tokens", "0"] + FLAGS + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr}")
    return out


class TestAgainstTool(unittest.TestCase):
    def setUp(self):
        if not os.access(TOOL, os.X_OK):
            self.skipTest(f"the nsa tool is not at {TOOL} (set NSA_TOOL)")

    def write(self, tmp, q, k, v, gates):
        np.save(os.path.join(tmp, "q.npy"), q.detach().numpy())
        np.save(os.path.join(tmp, "k.npy"), k.detach().numpy())
        np.save(os.path.join(tmp, "v.npy"), v.detach().numpy())
        for name, gt in zip(("g_cmp", "g_slc", "g_win"), gates):
            np.save(os.path.join(tmp, name + ".npy"), gt.detach().numpy())

    def test_forward_equals_nsa_run(self):
        q, k, v, gates = inputs()
        o, lse, sel = nsa.forward(q, k, v, gates, **SMALL)
        with tempfile.TemporaryDirectory() as tmp:
            self.write(tmp, q, k, v, gates)
            out = run_tool(tmp, 100, 4, 2, 16, 8, [])
            self.assertTrue(np.array_equal(np.load(os.path.join(out, "o.npy")), o.numpy()), "o differs")
            for name, t in zip(("lse_cmp", "lse_slc", "lse_win"), lse):
                self.assertTrue(np.array_equal(np.load(os.path.join(out, name + ".npy")), t.numpy()), name)
            self.assertTrue(np.array_equal(np.load(os.path.join(out, "selected.npy")), sel.numpy()), "selected")

    def test_backward_equals_nsa_run(self):
        q, k, v, gates = inputs(grad=True)
        o = nsa.attention(q, k, v, gates, **SMALL)
        do = torch.rand(o.shape, generator=torch.Generator().manual_seed(7)) * 2 - 1
        o.backward(do)
        with tempfile.TemporaryDirectory() as tmp:
            self.write(tmp, q, k, v, gates)
            np.save(os.path.join(tmp, "do.npy"), do.numpy())
            out = run_tool(tmp, 100, 4, 2, 16, 8, ["--backward"])
            want = {"dq": q.grad, "dk": k.grad, "dv": v.grad, "dg_cmp": gates[0].grad, "dg_slc": gates[1].grad,
                    "dg_win": gates[2].grad}
            for name, t in want.items():
                self.assertTrue(np.array_equal(np.load(os.path.join(out, name + ".npy")), t.numpy()), name)


class TestAutograd(unittest.TestCase):
    def test_gradcheck(self):
        # T = 24 < n * l_s: every eligible block is selected, so a perturbation cannot change the selection
        q, k, v, gates = inputs(T=24, Hq=2, Hkv=1, Dqk=4, Dv=3, seed=3, grad=True)
        fn = lambda q, k, v, g0, g1, g2: nsa.attention(q, k, v, (g0, g1, g2), **SMALL)
        self.assertTrue(torch.autograd.gradcheck(fn, (q, k, v, *gates), eps=1e-3, atol=2e-3, rtol=2e-3,
                                                 nondet_tol=0.0))

    def test_shared_k_gets_the_sum(self):
        q, k, v, gates = inputs(seed=5, grad=True)
        nsa.attention(q, k, v, gates, **SMALL).sum().backward()
        k3 = [k.detach().clone().requires_grad_() for _ in range(3)]
        v3 = [v.detach().clone().requires_grad_() for _ in range(3)]
        q2 = q.detach().clone().requires_grad_()
        nsa.attention(q2, tuple(k3), tuple(v3), [g.detach() for g in gates], **SMALL).sum().backward()
        torch.testing.assert_close(k.grad, sum(t.grad for t in k3), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v.grad, sum(t.grad for t in v3), rtol=1e-5, atol=1e-6)
        self.assertTrue(torch.equal(q.grad, q2.grad))

    def test_packed_batch_equals_sequences(self):
        q, k, v, gates = inputs(T=90, seed=9)
        o, _, _ = nsa.forward(q, k, v, gates, cu_seqlens=[0, 37, 90], **SMALL)
        for a, b in ((0, 37), (37, 90)):
            part, _, _ = nsa.forward(q[a:b], k[a:b], v[a:b], [g[a:b] for g in gates], **SMALL)
            self.assertTrue(torch.equal(o[a:b], part), f"tokens {a}..{b}")

    def test_bf16_and_strided_views(self):
        q, k, v, gates = inputs(seed=11)
        qkv = torch.cat([q, k.repeat(1, 2, 1)], dim=1).to(torch.bfloat16)  # q and k in one tensor: strided views
        qb, kb = qkv[:, :4], qkv[:, 4:6]
        o1, _, _ = nsa.forward(qb, kb, v.to(torch.bfloat16), gates, **SMALL)
        o2, _, _ = nsa.forward(qb.contiguous(), kb.contiguous(), v.to(torch.bfloat16), gates, **SMALL)
        self.assertEqual(o1.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(o1, o2))


class TestCustomOp(unittest.TestCase):
    """nsa.ops: the torch.library ops libnsa::forward / libnsa::backward."""

    def grads(self, fn, q, k, v, gates):
        o = fn(q, k, v, gates, **SMALL)
        do = torch.rand(o.shape, generator=torch.Generator().manual_seed(17)) * 2 - 1
        leaves = [q] + (list(k) if isinstance(k, (tuple, list)) else [k]) + \
                 (list(v) if isinstance(v, (tuple, list)) else [v]) + list(gates)
        return o, torch.autograd.grad(o, leaves, do)

    def test_equals_autograd_function(self):
        q, k, v, gates = inputs(seed=19, grad=True)
        o1, g1 = self.grads(nsa.attention, q, k, v, gates)
        o2, g2 = self.grads(nsa.ops.attention, q, k, v, gates)
        self.assertTrue(torch.equal(o1, o2))
        for a, b in zip(g1, g2):
            self.assertTrue(torch.equal(a, b))
        k3 = tuple(torch.rand(k.shape, generator=torch.Generator().manual_seed(s)).requires_grad_() for s in (1, 2, 3))
        o1, g1 = self.grads(nsa.attention, q, k3, v, gates)
        o2, g2 = self.grads(nsa.ops.attention, q, list(k3), v, gates)
        self.assertTrue(torch.equal(o1, o2))
        for a, b in zip(g1, g2):
            self.assertTrue(torch.equal(a, b))

    def test_opcheck(self):
        # schema, fake (meta) kernel against the real one, autograd registration, tracing
        q, k, v, gates = inputs(T=40, seed=23, grad=True)
        cfg = [SMALL[key] for key in ("cmp_block", "cmp_stride", "slc_block", "num_selected", "num_init",
                                      "num_local", "window")]
        torch.library.opcheck(torch.ops.libnsa.forward.default, (q, [k], [v], gates, [0, 17, 40], cfg, 0.0, ""))
        branch_off = dict(cfg=list(cfg))
        branch_off["cfg"][3] = 0  # the selected branch off: empty lse_slc and selected, its gate None
        torch.library.opcheck(torch.ops.libnsa.forward.default,
                              (q, [k], [v], [gates[0], torch.empty(0), gates[2]], [0, 40], branch_off["cfg"], 0.0,
                               ""))

    def test_torch_compile(self):
        q, k, v, gates = inputs(seed=29, grad=True)
        loss = lambda q, k, v, g0, g1, g2: nsa.ops.attention(q, k, v, [g0, g1, g2], **SMALL).square().sum()
        compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
        l1, l2 = compiled(q, k, v, *gates), loss(q, k, v, *gates)
        self.assertTrue(torch.equal(l1, l2))
        g1 = torch.autograd.grad(l1, [q, k, v, *gates])
        g2 = torch.autograd.grad(l2, [q, k, v, *gates])
        for a, b in zip(g1, g2):
            self.assertTrue(torch.equal(a, b))


class TestDLPack(unittest.TestCase):
    def test_numpy_inputs(self):
        q, k, v, gates = inputs(seed=31)
        o1, lse1, sel1 = nsa.forward(q.numpy(), k.numpy(), v.numpy(), [g.numpy() for g in gates], **SMALL)
        o2, lse2, sel2 = nsa.forward(q, k, v, gates, **SMALL)
        self.assertIsInstance(o1, torch.Tensor)
        self.assertTrue(torch.equal(o1, o2) and torch.equal(sel1, sel2))
        self.assertTrue(np.array_equal(np.from_dlpack(o1), o2.numpy()))  # and back, zero copy
        with self.assertRaises(TypeError):
            nsa.forward([1.0], k, v, gates, **SMALL)


class TestErrors(unittest.TestCase):
    def test_bad_arguments(self):
        q, k, v, gates = inputs()
        with self.assertRaises(ValueError):
            nsa.forward(q[:, :, :1].expand(-1, -1, 16), k, v, gates, **SMALL)  # last dim not contiguous
        with self.assertRaises(ValueError):
            nsa.forward(q, k, v, gates, cu_seqlens=[0, 50], **SMALL)
        with self.assertRaises(ValueError):
            nsa.forward(q, k, v, gates, no_such_field=1)
        with self.assertRaises(ValueError):
            nsa.forward(q.int(), k.int(), v.int(), gates, **SMALL)  # not a dtype of the library
        with self.assertRaises(ValueError) as e:  # float64 inputs take float64 gates
            nsa.forward(q.double(), k.double(), v.double(), gates, **SMALL)
        self.assertIn("gate", str(e.exception))
        with self.assertRaises(ValueError):  # and float32 inputs float32 gates
            nsa.forward(q, k, v, [g.double() for g in gates], **SMALL)

    def test_library_errors_carry_the_message(self):
        q, k, v, gates = inputs(Hq=3, Hkv=2)
        with self.assertRaises(nsa.Error) as e:
            nsa.forward(q, k, v, gates, **SMALL)
        self.assertEqual(e.exception.status, "NSA_ERR_INVALID_CONFIG")
        self.assertIn("num_q_heads", str(e.exception))


class TestDecode(unittest.TestCase):
    """nsa.DecodePlan: chunked prefill then decode steps over shuffled paged caches, on cpu."""
    CU = [0, 37, 100]  # two sequences: 37 and 63 tokens

    def plan(self, **kw):
        args = dict(batch=2, max_step_tokens=16, max_context=63, page_size=8, num_pages=2 * 9 + 3, max_pages=9,
                    cmp_page_size=4, max_cmp_pages=5, num_cmp_pages=2 * 5 + 1)
        args.update(kw)
        return nsa.DecodePlan(4, 2, 16, 8, **args, **SMALL)

    def tables(self, plan, seed):
        g = torch.Generator().manual_seed(seed)
        L = plan.limits
        bt = torch.randperm(L["num_pages"], generator=g)[:2 * L["max_pages"]].view(2, -1).to(torch.int32)
        cbt = torch.randperm(L["num_cmp_pages"], generator=g)[:2 * L["max_cmp_pages"]].view(2, -1).to(torch.int32)
        return bt, cbt

    def decode_all(self, q, k, v, gates, per_branch):
        """prefill + decode the batch; every step's rows against the forward's, bitwise"""
        o_f, lse_f, sel_f = nsa.forward(q, k, v, gates, cu_seqlens=self.CU, **SMALL)
        plan = self.plan()
        self.assertEqual(plan.stages, "decode_append decode_attn")
        caches = plan.new_caches()
        kc = vc = None
        if per_branch:  # a k and a v cache per branch
            kc = tuple(caches[0].clone() for _ in range(3))
            vc = tuple(caches[1].clone() for _ in range(3))
        bt, cbt = self.tables(plan, 7)
        lens, done, rng, steps = [37, 63], [0, 0], torch.Generator().manual_seed(3), 0
        prefill = [20, 30]
        while done != lens:
            tq = []
            for b in range(2):
                if done[b] < prefill[b]:  # chunked prefill, then decode steps of 1..4 (sometimes none)
                    n = min(int(torch.randint(1, 17, (1,), generator=rng)), prefill[b] - done[b])
                else:
                    n = int(torch.randint(0, 5, (1,), generator=rng))
                tq.append(min(n, lens[b] - done[b]))
            rows = [t for b in range(2) for t in range(self.CU[b] + done[b], self.CU[b] + done[b] + tq[b])]
            cu = [0, tq[0], tq[0] + tq[1]]
            pick = lambda x: tuple(t[rows] for t in x) if isinstance(x, tuple) else x[rows]  # noqa: E731
            o, lse, sel = plan.step(q[rows], pick(k), pick(v), [g[rows] for g in gates], cu, done, bt,
                                    kc or caches[0], vc or caches[1], caches[2], caches[3], cbt)
            self.assertEqual(o.shape[0], len(rows))
            self.assertTrue(torch.equal(o, o_f[rows]), f"step {steps}: o")
            for b in range(3):
                self.assertTrue(torch.equal(lse[b], lse_f[b][rows]), f"step {steps}: lse {b}")
            self.assertTrue(torch.equal(sel, sel_f[rows]), f"step {steps}: selected")
            done = [done[b] + tq[b] for b in range(2)]  # the host advances cache_seqlens
            steps += 1
        plan.check()
        self.assertGreater(steps, 10)
        # each branch's caches hold its keys and values: sequence 1's position 62 lies in page bt[1][7], slot 6
        for b in range(3):
            kb, vb = (k[b], v[b]) if per_branch else (k, v)
            self.assertTrue(torch.equal((kc[b] if per_branch else caches[0])[bt[1][7], 6], kb[99]), f"k_cache {b}")
            self.assertTrue(torch.equal((vc[b] if per_branch else caches[1])[bt[1][7], 6], vb[99]), f"v_cache {b}")
        plan.close()

    def test_rows_equal_forward(self):
        q, k, v, gates = inputs(T=100, seed=51)
        self.decode_all(q, k, v, gates, False)

    def test_per_branch_keys_and_caches(self):
        q, k, v, gates = inputs(T=100, seed=55)
        k3 = (k, torch.rand(k.shape, generator=torch.Generator().manual_seed(1)) * 4 - 2, k.flip(0))
        v3 = (v.flip(0), v, torch.rand(v.shape, generator=torch.Generator().manual_seed(2)) * 2 - 1)
        self.decode_all(q, k3, v3, gates, True)

    def test_no_compressed_block(self):
        # max_context below l: no compressed cache at all (None, or the empty tensors new_caches gives)
        plan = nsa.DecodePlan(4, 2, 16, 8, batch=1, max_step_tokens=4, max_context=6, page_size=4, num_pages=3,
                              **SMALL)
        self.assertEqual(plan.limits["max_cmp_pages"], 0)
        q, k, v, gates = inputs(T=6, seed=57)
        o_f, _, _ = nsa.forward(q, k, v, gates, **SMALL)
        kc, vc, kcc, vcc = plan.new_caches()
        o1, _, _ = plan.step(q[:4], k[:4], v[:4], [g[:4] for g in gates], [0, 4], [0], [[2, 0]], kc, vc, kcc, vcc)
        o2, _, _ = plan.step(q[4:], k[4:], v[4:], [g[4:] for g in gates], [0, 2], [4], [[2, 0]], kc, vc)
        self.assertTrue(torch.equal(torch.cat([o1, o2]), o_f))

    def test_errors(self):
        with self.assertRaises(nsa.Error) as e:
            self.plan(page_size=0)
        self.assertEqual(e.exception.status, "NSA_ERR_INVALID_VALUE")
        self.assertIn("lim->page_size", e.exception.message)
        plan = self.plan()
        caches = plan.new_caches()
        bt, cbt = self.tables(plan, 9)
        q, k, v, gates = inputs(T=4, seed=53)
        bt[1][0] = plan.limits["num_pages"]  # a page outside the pool
        with self.assertRaises(nsa.Error) as e:
            plan.step(q, k, v, gates, [0, 2, 4], [0, 0], bt, *caches, cbt)
        self.assertEqual(e.exception.status, "NSA_ERR_INVALID_VALUE")
        self.assertIn("block_table[1][0]", str(e.exception))
        with self.assertRaises(nsa.Error) as e:  # TK0 past max_context
            plan.step(q, k, v, gates, [0, 2, 4], [62, 0], self.tables(plan, 9)[0], *caches, cbt)
        self.assertEqual(e.exception.status, "NSA_ERR_INVALID_SHAPE")
        self.assertIn("max_context", str(e.exception))
        with self.assertRaises(ValueError):  # more rows than max_total_tokens
            big = inputs(T=33, seed=1)
            plan.step(big[0], big[1], big[2], big[3], [0, 16, 32], [0, 0], bt, *caches, cbt)
        with self.assertRaises(ValueError):  # a cache of another dtype
            plan.step(q, k, v, gates, [0, 2, 4], [0, 0], bt, caches[0].double(), caches[1], caches[2], caches[3], cbt)


# float64: a packed batch of two sequences (17 and 40 tokens) with every branch on; the
# second sequence has 5 selection blocks of which top-n keeps 3, so the selection is a
# real choice (gradcheck's 1e-6 steps are far below the score gaps of these inputs: a
# flip would show as a jump, not pass)
CFG64 = dict(cmp_block=4, cmp_stride=2, slc_block=8, num_selected=3, num_init=1, num_local=1, window=8)
CU64 = [0, 17, 57]


def inputs64(seed=41, T=57, Hq=4, Hkv=2, Dqk=6, Dv=4):
    g = torch.Generator().manual_seed(seed)

    def draw(*shape, lo, hi):
        return (torch.rand(*shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).requires_grad_()
    return (draw(T, Hq, Dqk, lo=-2, hi=2), draw(T, Hkv, Dqk, lo=-2, hi=2), draw(T, Hkv, Dv, lo=-1, hi=1),
            [draw(T, Hq, lo=0.05, hi=0.95) for _ in range(3)])


class TestShards(unittest.TestCase):
    """cu_seqlens_k (libnsa 0.6): a sequence computed as shards of its rows, each over the keys below
    the shard's end (docs/nsa-semantics.md section 11), equals the whole sequence's rows; the shards'
    parts of the key gradients sum to the whole's."""

    def test_shards_equal_the_whole(self):
        q, k, v, gates = inputs64(seed=43, T=90)
        do = torch.rand(90, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(44)) - 0.5
        o = nsa.attention(q, k, v, gates, **SMALL)
        o.backward(do)
        whole = [t.grad.clone() for t in (q, k, v, *gates)]
        dk = torch.zeros_like(k)
        dv = torch.zeros_like(v)
        for a, b in ((0, 17), (17, 17), (17, 61), (61, 90)):  # an empty shard too
            q2, k2, v2 = (t.detach()[:b].clone().requires_grad_() for t in (q, k, v))
            g2 = [g.detach()[a:b].clone().requires_grad_() for g in gates]
            part = nsa.attention(q2[a:b], k2, v2, g2, cu_seqlens=[0, b - a], cu_seqlens_k=[0, b], **SMALL)
            self.assertTrue(torch.equal(part, o.detach()[a:b]), f"rows {a}..{b}")
            if b > a:
                part.backward(do[a:b])
                self.assertTrue(torch.equal(q2.grad[a:b], whole[0][a:b]), f"dq rows {a}..{b}")
                for i in range(3):
                    self.assertTrue(torch.equal(g2[i].grad, whole[3 + i][a:b]), f"dgate rows {a}..{b}")
                dk[:b] += k2.grad
                dv[:b] += v2.grad
        torch.testing.assert_close(dk, whole[1], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(dv, whole[2], rtol=1e-10, atol=1e-12)

    def test_bad_cu_seqlens_k(self):
        q, k, v, gates = inputs(T=40)
        with self.assertRaisesRegex(ValueError, "cu_seqlens_k"):
            nsa.forward(q[:10], k, v, [g[:10] for g in gates], cu_seqlens=[0, 10], cu_seqlens_k=[0, 39], **SMALL)
        with self.assertRaisesRegex(nsa.Error, "sequence 0 has 10 queries"):
            nsa.forward(q[:10], k[:5], v[:5], [g[:10] for g in gates], cu_seqlens=[0, 10], cu_seqlens_k=[0, 5],
                        **SMALL)


class TestFloat64(unittest.TestCase):
    """float64 on the cpu backend: fp64 end to end, so gradcheck's default tolerances hold."""
    DEFAULTS = dict(eps=1e-6, atol=1e-5, rtol=1e-3, nondet_tol=0.0)  # torch.autograd.gradcheck's own

    def test_outputs_are_float64(self):
        q, k, v, gates = inputs64()
        o, lse, sel = nsa.forward(q, k, v, gates, cu_seqlens=CU64, **CFG64)
        self.assertEqual(o.dtype, torch.float64)
        self.assertTrue(all(x.dtype == torch.float64 for x in lse))
        # the second sequence's last query: 5 eligible blocks, 3 selected
        self.assertEqual(int((sel[56] >= 0).sum(dim=-1).min()), 3)
        # f64 is not f32 rounded: the float32 run differs by about f32 rounding, not more
        o32, _, _ = nsa.forward(q.float(), k.float(), v.float(), [g.float() for g in gates], cu_seqlens=CU64, **CFG64)
        err = (o.detach() - o32.double()).abs().max().item()
        self.assertGreater(err, 0.0)
        self.assertLess(err, 1e-5)

    def test_gradcheck_autograd_function(self):
        q, k, v, gates = inputs64()
        fn = lambda q, k, v, g0, g1, g2: nsa.attention(q, k, v, (g0, g1, g2), cu_seqlens=CU64, **CFG64)
        self.assertTrue(torch.autograd.gradcheck(fn, (q, k, v, *gates), **self.DEFAULTS))

    @unittest.skipIf(nsa.ops is None, "torch.library.custom_op needs torch >= 2.4")
    def test_gradcheck_custom_op(self):
        q, k, v, gates = inputs64(seed=43)
        cfg = [CFG64[key] for key in ("cmp_block", "cmp_stride", "slc_block", "num_selected", "num_init",
                                      "num_local", "window")]
        op = lambda q, k, v, g0, g1, g2: torch.ops.libnsa.forward.default(q, [k], [v], [g0, g1, g2], CU64, cfg,
                                                                             0.0, "")[0]
        self.assertTrue(torch.autograd.gradcheck(op, (q, k, v, *gates), **self.DEFAULTS))
        # per-branch k and v through nsa.ops.attention (the op's list form)
        k3 = tuple(k.detach().clone().requires_grad_() for _ in range(3))
        fn = lambda q, k0, k1, k2, g0: nsa.ops.attention(q, (k0, k1, k2), v.detach(), (g0, gates[1].detach(),
                                                                                      gates[2].detach()),
                                                          cu_seqlens=CU64, **CFG64)
        self.assertTrue(torch.autograd.gradcheck(fn, (q, *k3, gates[0]), fast_mode=True, **self.DEFAULTS))

    @unittest.skipIf(nsa.ops is None, "torch.library.custom_op needs torch >= 2.4")
    def test_opcheck(self):
        # the fake kernel's float64 LSEs match the real ones (dtype and shape), and the rest of opcheck
        q, k, v, gates = inputs64(seed=47)
        cfg = [CFG64[key] for key in ("cmp_block", "cmp_stride", "slc_block", "num_selected", "num_init",
                                      "num_local", "window")]
        torch.library.opcheck(torch.ops.libnsa.forward.default, (q, [k], [v], gates, CU64, cfg, 0.0, ""))

    def test_refused_where_the_backend_lacks_it(self):
        # what a float64 CUDA tensor meets: the GPU backends refuse f64 at plan creation; here a
        # fake module without f64 stands in for one (tests/fake, fakeplan)
        fake = os.environ.get("NSA_TEST_FAKE_DIR")
        if not fake:
            self.skipTest("NSA_TEST_FAKE_DIR (tests/fake/failing of the build) is not set")
        from nsa import _lib
        _lib.lib.nsa_set_backend_path.argtypes = [ctypes.c_char_p]
        self.assertEqual(_lib.lib.nsa_set_backend_path(fake.encode()), 0)
        q, k, v, gates = inputs64()
        try:
            with mock.patch.object(nsa, "_backend_for", lambda t, backend: "fakeplan"):
                with self.assertRaises(nsa.Error) as e:
                    nsa.attention(q, k, v, gates, cu_seqlens=CU64, **CFG64)
        finally:
            _lib.lib.nsa_set_backend_path(None)
        self.assertEqual(e.exception.status, "NSA_ERR_UNSUPPORTED")
        self.assertIn("fakeplan does not support dtype f64", str(e.exception))


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA device")
class TestCuda(unittest.TestCase):
    def test_cuda_equals_cpu_reference(self):
        q, k, v, gates = inputs(seed=13)
        dev = [t.cuda() for t in (q, k, v, *gates)]
        o, _, _ = nsa.forward(dev[0], dev[1], dev[2], dev[3:], **SMALL)
        ref, _, _ = nsa.forward(q, k, v, gates, **SMALL)
        torch.testing.assert_close(o.cpu(), ref, rtol=1e-4, atol=1e-4)

    def test_float64_is_refused(self):
        q, k, v, gates = inputs64()
        q, k, v = (t.detach().cuda() for t in (q, k, v))
        gates = [g.detach().cuda() for g in gates]
        with self.assertRaises(nsa.Error) as e:
            nsa.forward(q, k, v, gates, cu_seqlens=CU64, **CFG64)
        self.assertEqual(e.exception.status, "NSA_ERR_UNSUPPORTED")
        self.assertIn("dtype f64", str(e.exception))


if __name__ == "__main__":
    unittest.main()
