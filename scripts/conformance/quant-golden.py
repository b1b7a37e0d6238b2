#!/usr/bin/env python3
"""Golden vectors for the K-quant reference quantizers (Q2_K..Q6_K) and IQ4_NL.

Quantizes a fixed set of deterministic f32 rows (256 values each, one super-block) with the
real ggml's `quantize_row_q{2..6}_K_ref` and `quantize_row_iq4_nl_ref` (libggml-base.so of llama.cpp b11434, through ctypes)
and writes, under backend-cpu/tests/data/k_quant_golden/:

  input.f32   the rows, little-endian f32, row after row
  q2_k.bin .. q6_k.bin, iq4_nl.bin   the quantized rows, block after block

backend-cpu's unit tests `quant_k_quants_match_ggml_golden_bytes` and
`quant_iq4_nl_matches_ggml_golden_bytes` check that our quantizers give the same bytes.

Usage: quant-golden.py [--lib DIR] [--out DIR]
"""

import argparse
import ctypes
import math
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
QK_K = 256
TYPES = [("q2_k", "quantize_row_q2_K_ref", 84), ("q3_k", "quantize_row_q3_K_ref", 110),
         ("q4_k", "quantize_row_q4_K_ref", 144), ("q5_k", "quantize_row_q5_K_ref", 176),
         ("q6_k", "quantize_row_q6_K_ref", 210),
         # 8 blocks of 32 per row; ggml leaves the indices of an all-zero block (d = 0) to its
         # scratch array's previous contents, so the test compares only d of such blocks
         ("iq4_nl", "quantize_row_iq4_nl_ref", 8 * 18)]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def rows():
    rng = random.Random(20261130)
    gauss = lambda s: [rng.gauss(0.0, s) for _ in range(QK_K)]
    out = []
    out.append([0.0] * QK_K)                                   # all zeros
    out.append([0.5] * QK_K)                                   # positive constant
    out.append([-3.0] * QK_K)                                  # negative constant
    out.append([v * 1e-20 for v in gauss(1.0)])                # below GROUP_MAX_EPS scale
    out.append([v * 1e-12 for v in gauss(1.0)])                # tiny
    out.append([v * 10.0 ** rng.uniform(-4, 4) for v in gauss(1.0)])  # large range
    r = gauss(0.1)
    r[77] = 100.0                                              # one outlier
    out.append(r)
    r = gauss(0.1)
    r[200] = -250.0                                            # one negative outlier
    out.append(r)
    out.append([rng.uniform(0.0, 1.0) for _ in range(QK_K)])   # all positive
    out.append([rng.uniform(-2.0, -0.5) for _ in range(QK_K)])  # all negative
    r = [0.0] * QK_K
    for i in rng.sample(range(QK_K), 5):
        r[i] = rng.gauss(0, 1)
    out.append(r)                                              # a few nonzero
    out.append([(i % 9 - 4) * 0.5 for i in range(QK_K)])       # ties for rounding
    out.append([float(i % 16) for i in range(QK_K)])           # small integers
    r = gauss(1.0)
    for g in range(0, QK_K, 32):
        if (g // 32) % 2:
            r[g:g + 32] = [0.0] * 32                           # zero groups between others
    out.append(r)
    r = gauss(1.0)
    for g in range(0, QK_K, 16):
        r[g:g + 16] = [v * 10.0 ** ((g // 16) % 5 - 2) for v in r[g:g + 16]]  # scales per group
    out.append(r)
    out.append([rng.uniform(-1, 1) ** 3 for _ in range(QK_K)])
    out.append([math.sin(i * 0.1) for i in range(QK_K)])
    for s in (1.0, 0.02, 1e3, 7.5, 0.3, 1e-3):
        out.append(gauss(s))
    out.append([abs(v) for v in gauss(1.0)])
    return [[f32(v) for v in r] for r in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="/var/cache/ggml-rpc-peer/b11434/lib")
    ap.add_argument("--out", default=os.path.join(ROOT, "backend-cpu/tests/data/k_quant_golden"))
    args = ap.parse_args()
    lib = ctypes.CDLL(os.path.join(args.lib, "libggml-base.so"))
    data = rows()
    flat = [v for r in data for v in r]
    src = (ctypes.c_float * len(flat))(*flat)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "input.f32"), "wb") as f:
        f.write(struct.pack("<%df" % len(flat), *flat))
    for name, fn, size in TYPES:
        func = getattr(lib, fn)
        func.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        func.restype = None
        dst = (ctypes.c_uint8 * (size * len(data)))()
        func(src, dst, len(flat))
        with open(os.path.join(args.out, name + ".bin"), "wb") as f:
            f.write(bytes(dst))
    print("%d rows of %d into %s" % (len(data), QK_K, args.out))


if __name__ == "__main__":
    main()
