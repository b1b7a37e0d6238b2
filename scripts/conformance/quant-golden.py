#!/usr/bin/env python3
"""Golden vectors for the reference quantizers of Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4,
TQ1_0, TQ2_0, Q1_0 and Q2_0, for the dequantizers of the last seven, and for the dequantizers
of the grid formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (which have no
quantizer in ggml-cpu).

Quantizes a fixed set of deterministic f32 rows (256 values each, one super-block) with the
real ggml's `quantize_row_q{2..6}_K_ref` and `quantize_row_iq4_nl_ref` (libggml-base.so of llama.cpp b11434, through ctypes)
and writes, under backend-cpu/tests/data/k_quant_golden/:

  input.f32   the rows, little-endian f32, row after row
  q2_k.bin .. q6_k.bin, iq4_nl.bin   the quantized rows, block after block
  input_ext.f32   more rows for the formats added after IQ4_NL (scales at power-of-two and
                  rounding boundaries, subnormals, infinities, NaN)
  iq4_xs.bin, mxfp4.bin, nvfp4.bin, tq1_0.bin, tq2_0.bin, q1_0.bin, q2_0.bin
                  input.f32 followed by input_ext.f32, quantized (one call)
  deq_<type>.bin  DEQ_BLOCKS random blocks of <type> (f16 scales made finite) followed by
                  ggml's dequantization of them (f32); also for the grid formats
  grid_<type>.bin for the grid formats: random blocks (finite scales) whose grid indices run
                  through every entry of the format's grid in order, followed by the 64-bit
                  FNV-1a hash (little-endian) of the bytes of ggml's dequantization of them

backend-cpu's unit tests `quant_k_quants_match_ggml_golden_bytes`,
`quant_iq4_nl_matches_ggml_golden_bytes` and `quant_new_formats_match_ggml_golden` check that
our quantizers give the same bytes and our dequantizers the same floats;
`quant_grid_formats_match_ggml_golden` checks the grid formats' dequantization.

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
# name, quantizer, dequantizer, bytes per 256 values, bytes per block, offsets of f16 scales
EXT_TYPES = [("iq4_xs", "iq4_xs", 136, 136, [0]),
             ("mxfp4", "mxfp4", 8 * 17, 17, []),
             ("nvfp4", "nvfp4", 4 * 36, 36, []),
             ("tq1_0", "tq1_0", 54, 54, [52]),
             ("tq2_0", "tq2_0", 66, 66, [64]),
             ("q1_0", "q1_0", 2 * 18, 18, [0]),
             ("q2_0", "q2_0", 4 * 18, 18, [0])]
DEQ_BLOCKS = 4
# grid formats: name, bytes per block, grid size, grid indices per block
GRID_TYPES = [("iq2_xxs", 66, 256, 32), ("iq2_xs", 74, 512, 32), ("iq2_s", 82, 1024, 32),
              ("iq3_xxs", 98, 256, 64), ("iq3_s", 110, 512, 64),
              ("iq1_s", 50, 2048, 32), ("iq1_m", 56, 2048, 32)]


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


def ext_rows():
    rng = random.Random(20261201)
    out = []
    r = []
    for b in range(QK_K // 16):
        # the largest magnitude of each 16/32-element group just below, at or just above a power
        # of two (log2 rounding in MXFP4), or at a UE4M3 rounding boundary times 6 (NVFP4)
        k = b - 8
        top = [2.0 ** k * (1 - 2.0 ** -24), 2.0 ** k, 2.0 ** k * (1 + 2.0 ** -23),
               6 * 2.0 ** k * (1 + 1 / 16), 6 * 2.0 ** k * (1 + 3 / 16)][b % 5]
        g = [rng.uniform(-1, 1) * top for _ in range(16)]
        g[rng.randrange(16)] = top if b % 2 else -top
        r += g
    out.append(r)
    # FP4 ties: halfway between neighbouring E2M1 levels (times the block scale)
    lv = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    mids = [(a + b) / 2 for a, b in zip(lv, lv[1:])]
    out.append([(6.0 if i % 32 == 0 else mids[i % 7]) * (-1) ** (i // 7) for i in range(QK_K)])
    out.append([rng.gauss(0, 1) * 1e-39 for _ in range(QK_K)])              # subnormals
    out.append([rng.gauss(0, 1) * 1e-3 for _ in range(QK_K)])               # small NVFP4 scales
    out.append([rng.gauss(0, 1) * 5e3 for _ in range(QK_K)])                # beyond UE4M3's 448*6
    r = [rng.gauss(0, 1) for _ in range(QK_K)]
    r[3] = float("inf")
    r[70] = float("-inf")
    out.append(r)
    r = [rng.gauss(0, 1) for _ in range(QK_K)]
    r[5] = float("nan")
    r[100] = float("nan")
    r[255] = float("nan")
    out.append(r)
    out.append([rng.choice([-1.0, 0.0, 1.0]) * 0.7 for _ in range(QK_K)])  # ternary
    out.append([rng.choice([-0.5, 0.5, 1.5, -1.5]) for _ in range(QK_K)])  # Q2_0 ties
    return [[f32(v) for v in r] for r in out]


def finite_half(rng):
    while True:
        h = rng.getrandbits(16)
        if (h >> 10) & 0x1F != 0x1F and (h >> 10) & 0x1F < 24:
            return h


def set_grid_index(name, blk, k, idx):
    """Makes grid index k (0..indices per block) of the block `blk` (a bytearray) `idx`."""
    if name == "iq2_xxs":
        blk[2 + 8 * (k // 4) + k % 4] = idx  # bytes 0..3 of each block's 8 bytes
        return
    if name == "iq2_xs":
        q = struct.unpack_from("<H", blk, 2 + 2 * k)[0]
        struct.pack_into("<H", blk, 2 + 2 * k, (q & ~511) | idx)
        return
    if name == "iq2_s":
        blk[2 + k] = idx & 255
        sh = 2 * (k % 4)
        blk[66 + k // 4] = (blk[66 + k // 4] & ~(3 << sh)) | ((idx >> 8) << sh)
        return
    if name == "iq3_xxs":
        blk[2 + k] = idx
        return
    if name == "iq3_s":
        blk[2 + k] = idx & 255
        sh = k % 8
        blk[66 + k // 8] = (blk[66 + k // 8] & ~(1 << sh)) | ((idx >> 8) << sh)
        return
    if name == "iq1_s":
        blk[2 + k] = idx & 255
        at, sh = 34 + 2 * (k // 4), 3 * (k % 4)
        qh = struct.unpack_from("<H", blk, at)[0]
        struct.pack_into("<H", blk, at, (qh & ~(7 << sh)) | ((idx >> 8) << sh))
        return
    if name == "iq1_m":
        blk[k] = idx & 255
        at, sh = 32 + k // 2, 4 * (k % 2)
        blk[at] = (blk[at] & ~(7 << sh)) | ((idx >> 8) << sh)
        return
    raise ValueError(name)


def finite_scale(name, rng, blk):
    """Makes the f16 super-block scale of `blk` finite (IQ1_M: spread over four nibbles)."""
    h = finite_half(rng)
    if name == "iq1_m":
        for k in range(4):
            at = 48 + 2 * k
            sc = struct.unpack_from("<H", blk, at)[0]
            struct.pack_into("<H", blk, at, (sc & 0x0FFF) | (((h >> (4 * k)) & 15) << 12))
    else:
        struct.pack_into("<H", blk, 0, h)


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def dequantize(lib, name, raw):
    n = len(raw) // dict((t[0], t[1]) for t in GRID_TYPES)[name] * QK_K
    deq = getattr(lib, "dequantize_row_%s" % name)
    deq.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    deq.restype = None
    inp = (ctypes.c_uint8 * len(raw)).from_buffer_copy(bytes(raw))
    out = (ctypes.c_float * n)()
    deq(inp, out, n)
    return bytes(out)


def grid_goldens(lib, out_dir):
    rng = random.Random(11)
    for name, size, ngrid, per_block in GRID_TYPES:
        raw = bytearray()
        for b in range(DEQ_BLOCKS):
            blk = bytearray(rng.getrandbits(8) for _ in range(size))
            finite_scale(name, rng, blk)
            raw += blk
        with open(os.path.join(out_dir, "deq_" + name + ".bin"), "wb") as f:
            f.write(bytes(raw) + dequantize(lib, name, raw))
        raw = bytearray()
        for b in range(ngrid // per_block):
            blk = bytearray(rng.getrandbits(8) for _ in range(size))
            finite_scale(name, rng, blk)
            for k in range(per_block):
                set_grid_index(name, blk, k, b * per_block + k)
            raw += blk
        digest = fnv1a64(dequantize(lib, name, raw))
        with open(os.path.join(out_dir, "grid_" + name + ".bin"), "wb") as f:
            f.write(bytes(raw) + struct.pack("<Q", digest))


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
    ext = ext_rows()
    with open(os.path.join(args.out, "input_ext.f32"), "wb") as f:
        f.write(struct.pack("<%df" % (len(ext) * QK_K), *[v for r in ext for v in r]))
    allrows = data + ext
    flat = [v for r in allrows for v in r]
    src = (ctypes.c_float * len(flat))(*flat)
    rng = random.Random(7)
    for name, short, size, block, halves in EXT_TYPES:
        func = getattr(lib, "quantize_row_%s_ref" % short)
        func.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        func.restype = None
        dst = (ctypes.c_uint8 * (size * len(allrows)))()
        func(src, dst, len(flat))
        with open(os.path.join(args.out, name + ".bin"), "wb") as f:
            f.write(bytes(dst))
        # dequantization of random blocks
        raw = bytearray(rng.getrandbits(8) for _ in range(block * DEQ_BLOCKS))
        for b in range(DEQ_BLOCKS):
            for off in halves:
                struct.pack_into("<H", raw, b * block + off, finite_half(rng))
        n = DEQ_BLOCKS * (QK_K * block // size)
        deq = getattr(lib, "dequantize_row_%s" % short)
        deq.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        deq.restype = None
        inp = (ctypes.c_uint8 * len(raw)).from_buffer_copy(bytes(raw))
        out = (ctypes.c_float * n)()
        deq(inp, out, n)
        with open(os.path.join(args.out, "deq_" + name + ".bin"), "wb") as f:
            f.write(bytes(raw) + bytes(out))
    grid_goldens(lib, args.out)
    print("%d + %d rows of %d into %s" % (len(data), len(ext), QK_K, args.out))


if __name__ == "__main__":
    main()
