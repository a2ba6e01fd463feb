#!/usr/bin/env python3
"""Summarise dev/cuda/decode_trace.sh's output: per attention launch (a launch
of a step follows the one before it in time), its span, the splits' time from start to stored
state, and each last CTA's tail phases (us from the launch's first CTA start).
With --timeline: one step's records (the second-to-last step, steps cut at gaps of 15 us) as
runs of one phase, in us from the step's first record; the form to read where launches overlap
(programmatic dependent launch starts a kernel's CTAs before its predecessor ends, which the
per-launch summary does not separate) and for dec_rank_wide's phases 8-11.
Usage: decode_trace.py [--timeline] trace_b1.txt [...]"""
import sys
from collections import defaultdict

NAMES = {1: "keys done", 2: "state stored", 3: "tail begins", 4: "o_b merged", 5: "p_cmp", 6: "block scores", 7: "ranked",
         8: "rank part starts", 9: "part's block scores", 10: "last part ranks", 11: "ranked (wide)"}


def launches(recs):
    """the records in time order, cut where a CTA (z, row, KV head) starts that the current
    launch already holds: launches of one stream run one after another, and every launch
    has a CTA (0, 0, 0)"""
    out, cur = [], None
    for z, r, g, ph, t in sorted(recs, key=lambda x: x[4]):
        key = (z, r, g)
        if ph == 0 and (cur is None or key in cur):
            cur = {}
            out.append(cur)
        if cur is not None:
            cur.setdefault(key, {})[ph] = t
    return out


def timeline(recs):
    """the second-to-last step (the last may be cut short) as runs of one phase"""
    recs = sorted(recs, key=lambda x: x[4])
    steps = [[]]
    for i, x in enumerate(recs):
        if i and x[4] - recs[i - 1][4] > 15000:
            steps.append([])
        steps[-1].append(x)
    s = steps[-2] if len(steps) > 1 else steps[-1]
    t0, runs = s[0][4], []
    for z, r, g, ph, t in s:
        rel = (t - t0) / 1e3
        if runs and runs[-1][0] == ph and rel - runs[-1][2] < 1.0:
            runs[-1][2] = rel
            runs[-1][3] += 1
        else:
            runs.append([ph, rel, rel, 1])
    print(f"{len(steps)} steps; step of {len(s)} records:")
    for ph, a, b, n in runs:
        print(f"  {NAMES.get(ph, 'start'):>20} x{n:<4} {a:7.1f} .. {b:7.1f} us")


def main():
    tl = "--timeline" in sys.argv[1:]
    for path in [a for a in sys.argv[1:] if a != "--timeline"]:
        recs = []
        for line in open(path):
            if line.startswith("nsa-trace "):
                z, r, g, ph, t = (int(x) for x in line.split()[1:6])
                recs.append((z, r, g, ph, t))
        print(f"== {path}: {len(recs)} records")
        if tl:
            timeline(recs)
            continue
        for i, L in enumerate(launches(recs)):
            t0 = min(c[0] for c in L.values())
            t1 = max(max(c.values()) for c in L.values())
            keys = sorted((c[1] - c[0]) / 1e3 for c in L.values() if 1 in c)
            stored = sorted((c[2] - t0) / 1e3 for c in L.values() if 2 in c)
            starts = sorted((c[0] - t0) / 1e3 for c in L.values())
            tails = [c for c in L.values() if 3 in c]
            print(f"launch {i}: {len(L)} CTAs, span {(t1 - t0) / 1e3:.1f} us; CTA starts up to {starts[-1]:.1f} us; "
                  f"keys per CTA {keys[0]:.1f} .. {keys[len(keys) // 2]:.1f} .. {keys[-1]:.1f} us; "
                  f"states stored by {stored[-1]:.1f} us; {len(tails)} last CTAs")
            if tails:
                for ph in range(3, 8):
                    v = sorted((c[ph] - t0) / 1e3 for c in tails if ph in c)
                    if v:
                        print(f"    {NAMES[ph]:>13}: {v[0]:7.1f} .. {v[len(v) // 2]:7.1f} .. {v[-1]:7.1f} us")


if __name__ == "__main__":
    main()
