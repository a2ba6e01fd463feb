#!/usr/bin/env python3
"""Summarise dev/cuda/decode_trace.sh's output: per attention launch (a launch
of a step follows the one before it in time), its span, the splits' time from start to stored
state, and each last CTA's tail phases (us from the launch's first CTA start).
Usage: decode_trace.py trace_b1.txt [...]"""
import sys
from collections import defaultdict

NAMES = {1: "keys done", 2: "state stored", 3: "tail begins", 4: "o_b merged", 5: "p_cmp", 6: "block scores", 7: "ranked"}


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


def main():
    for path in sys.argv[1:]:
        recs = []
        for line in open(path):
            if line.startswith("nsa-trace "):
                z, r, g, ph, t = (int(x) for x in line.split()[1:6])
                recs.append((z, r, g, ph, t))
        print(f"== {path}: {len(recs)} records")
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
