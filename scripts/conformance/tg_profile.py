#!/usr/bin/env python3
"""Per-token server instructions from two `callgrind_annotate --inclusive=yes` outputs.

usage: tg_profile.py FEWER.txt MORE.txt TOKENS   (MORE generated TOKENS more tokens)

Inlining puts a kernel's code inside its caller; callgrind_annotate names such code by its
source file and the function it was inlined into, so MUL_MAT is the code of
`compute/ops/mul_mat.rs` inside the graph runner, or the function `ops::mul_mat::mul_mat` where
the compiler kept it out of line (whichever the build has), and the rest of the runner is
everything else a node does.
"""

from __future__ import annotations

import re
import sys

LINE = re.compile(r"\s*([\d,]+) \([^)]*\)\s+([^:\s]+):(.+?)(?: \[.*\])?$")
TOTAL = re.compile(r"\s*([\d,]+) \([^)]*\)\s+PROGRAM TOTALS")


def load(path: str) -> dict:
    costs: dict = {}
    with open(path) as f:
        for line in f:
            total = TOTAL.match(line)
            if total:
                costs["TOTAL"] = int(total.group(1).replace(",", ""))
                continue
            m = LINE.match(line)
            if not m:
                continue
            file = "/".join(m.group(2).split("/")[-2:])
            func = m.group(3).strip().replace("compute::run_stored", "compute::run")
            costs.setdefault((file, func), int(m.group(1).replace(",", "")))
    return costs


def main() -> int:
    fewer, more, tokens = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])

    def per_token(key) -> float:
        return (more.get(key, 0) - fewer.get(key, 0)) / tokens

    run = ("compute/mod.rs", "backend_cpu::compute::run")
    rows = [
        ("server total", per_token("TOTAL")),
        ("  the graph runner (compute::run)", per_token(run)),
        ("    MUL_MAT", max(per_token(("ops/mul_mat.rs", "backend_cpu::compute::run")),
                          per_token(("ops/mul_mat.rs", "backend_cpu::compute::ops::mul_mat::mul_mat")))),
        ("    planning (plan::build)", per_token(("plan/mod.rs", "backend_cpu::compute::plan::build"))),
        ("  the dispatcher (Dispatcher::handle)", per_token(("dispatch/mod.rs", "proto_core::dispatch::Dispatcher<B>::handle"))),
    ]
    for name, value in rows:
        print(f"{name:<40} {value / 1e3:10.1f} k instructions per token")
    rest = rows[0][1] - rows[2][1]
    print(f"{'everything but MUL_MAT':<40} {rest / 1e3:10.1f} k instructions per token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
