#!/usr/bin/env python3
"""Compare two llama_probe runs (tests/conformance/llama_probe.c).

usage: compare_probe.py A.txt B.txt [--logits A.bin B.bin --n-vocab N] [--tie-margin M]

Prints one line: MATCH, NEAR_TIE (the runs first pick different tokens at a step where run
A's top-2 margin is below --tie-margin, so a rounding difference may flip it) or MISMATCH,
the first differing step, and with the logit files the largest |logit difference| over the
steps before the first token difference (after it the runs see different inputs).
Exit status 0 for MATCH, 1 for NEAR_TIE, 2 for MISMATCH, 3 when a run is incomplete.
"""

from __future__ import annotations

import argparse
import re
import struct
import sys

STEP = re.compile(r"^step (\d+) token (\d+) logit (\S+) margin (\S+)")


def read_probe(path: str):
    steps = []
    done = False
    with open(path, errors="replace") as f:
        for line in f:
            m = STEP.match(line)
            if m:
                steps.append((int(m.group(2)), float(m.group(3)), float(m.group(4))))
            elif line.startswith("tokens"):
                done = True
    return steps, done


def read_logits(path: str, n_vocab: int, n_steps: int):
    rows = []
    with open(path, "rb") as f:
        for _ in range(n_steps):
            b = f.read(4 * n_vocab)
            if len(b) < 4 * n_vocab:
                break
            rows.append(struct.unpack(f"<{n_vocab}f", b))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--logits", nargs=2, metavar=("A_BIN", "B_BIN"))
    ap.add_argument("--n-vocab", type=int, default=32000)
    ap.add_argument("--tie-margin", type=float, default=0.02)
    args = ap.parse_args()
    sa, da = read_probe(args.a)
    sb, db = read_probe(args.b)
    if not da or not db:
        print(f"INCOMPLETE a={len(sa)} steps{'' if da else ' (no end)'} b={len(sb)} steps{'' if db else ' (no end)'}")
        return 3
    first = next((i for i, (x, y) in enumerate(zip(sa, sb)) if x[0] != y[0]), None)
    if first is None and len(sa) != len(sb):
        first = min(len(sa), len(sb))
    maxdiff = None
    if args.logits:
        upto = first if first is not None else min(len(sa), len(sb))
        la = read_logits(args.logits[0], args.n_vocab, upto + 1)
        lb = read_logits(args.logits[1], args.n_vocab, upto + 1)
        per_step = [max(abs(x - y) for x, y in zip(ra, rb)) for ra, rb in zip(la, lb)]
        maxdiff = max(per_step[:upto] or per_step[:1] or [0.0])
    md = f" max|dlogit| {maxdiff:.3g}" if maxdiff is not None else ""
    if first is None:
        print(f"MATCH {len(sa)} tokens{md}")
        return 0
    margin = sa[first][2] if first < len(sa) else 0.0
    kind = "NEAR_TIE" if margin < args.tie_margin else "MISMATCH"
    print(f"{kind} first difference at step {first} (A margin {margin:.4g}){md}")
    return 1 if kind == "NEAR_TIE" else 2


if __name__ == "__main__":
    sys.exit(main())
