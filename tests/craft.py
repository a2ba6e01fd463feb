#!/usr/bin/env python3
"""Writes crafted (hostile) input files for tests/test_cli.sh and the fuzz seeds.

  craft.py npy OUT SHAPE DESCR DATA_BYTES   a .npy (version 1.0) whose header says
                                            SHAPE ("4,2,1") and DESCR ("<f4") and that
                                            carries DATA_BYTES bytes of data, whatever
                                            the shape needs
  craft.py parity OUT T HQ DV [SIZE]        an nsa parity file with one record of T
                                            tokens, Hq heads, Dv dims whose o is
                                            "present", padded with floats to SIZE
                                            bytes (default 256)
Only the standard library is used (no numpy).
"""
import struct
import sys


def npy(out, shape, descr, data_bytes):
    dims = [int(x) for x in shape.split(",") if x]
    shp = "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shp)
    pad = (64 - (10 + len(d) + 1) % 64) % 64
    header = (d + " " * pad + "\n").encode()
    with open(out, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header)
        f.write(bytes(int(data_bytes)))


def parity(out, T, hq, dv, size=256):
    rec = struct.pack("<I", 0x31524352)
    rec += struct.pack("<H", 0) * 4                     # label, backend, device, version
    cfg = [hq, 1, 4, dv, 4, 2, 8, 0, 0, 0, 8]           # hq hkv dqk dv l d ls n n_init n_local w
    rec += struct.pack("<11q", *cfg)
    rec += struct.pack("<fii", 0.0, 0, 0)               # scale, compress, dtype
    rec += struct.pack("<q", 1) + struct.pack("<2q", 0, T)  # batch 1, cu_seqlens {0, T}
    rec += struct.pack("<Q", 1)                         # seed
    rec += struct.pack("<4i", 0, 0, 0, 0)               # fixed, pe, layout, status
    rec += struct.pack("<q", T) + struct.pack("<I", 1)  # T, present: o
    data = b"NSAPRTY1" + rec
    data += struct.pack("<f", 1.5) * max(0, (size - len(data)) // 4)
    with open(out, "wb") as f:
        f.write(data)


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) == 5 and a[0] == "npy":
        npy(a[1], a[2], a[3], a[4])
    elif len(a) in (5, 6) and a[0] == "parity":
        parity(a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]) if len(a) == 6 else 256)
    else:
        sys.exit(__doc__)
