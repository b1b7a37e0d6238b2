#!/usr/bin/env python3
"""Checks tensor-parallel runs with BF16 on the comm wire against the upstream bound (tp.sh).

Input: llama_probe --pair outputs (one file per run), named TYPE-KIND-WORLD.probe, KIND being
`reference` (b12032+1's own servers: the pairwise link, own + bf16(peer)) or `ours` (the
ring: a chunk's running sum is rounded to bf16 at each of the world - 1 hops and once more
when finished). For every type the reference run gives B, the largest |logit difference| to
CPU-only over the steps where both picked the same tokens. Our run at world n passes when
  * its own largest |logit difference| is at most n * B (the ring rounds up to n times where
    the pairwise link rounds once), and
  * every divergence from CPU-only happens where the CPU-only run's top-2 margin is at most
    2 * n * B: flipping two tokens needs the perturbation of their difference to reach the
    margin, and that perturbation is at most twice the largest logit change.
Prints one line per run; exit status 1 if any run fails.
"""

import re
import sys
from collections import defaultdict

END = re.compile(r"^end (\d+) steps (\d+) first_diff (-?\d+) ref_margin (\S+) dlogit_before (\S+) dlogit_at (\S+)")


def parse(path):
    prompts = []
    with open(path) as f:
        for line in f:
            m = END.match(line)
            if m:
                prompts.append(dict(first_diff=int(m[3]), margin=float(m[4]), dlogit=float(m[5])))
    return prompts


def main(paths):
    runs = defaultdict(dict)
    for p in paths:
        name = p.rsplit("/", 1)[-1].removesuffix(".probe")
        ty, kind, world = name.rsplit("-", 2)
        runs[ty][(kind, int(world))] = parse(p)
    failed = 0
    for ty, by_run in sorted(runs.items()):
        ref = by_run.get(("reference", 2))
        if not ref:
            print(f"FAIL {ty}: no reference run")
            failed += 1
            continue
        bound = max(p["dlogit"] for p in ref)
        ref_div = sum(p["first_diff"] >= 0 for p in ref)
        print(f"     {ty}: reference (b12032+1 pairwise, BF16 wire): largest |dlogit| B = {bound:.4f}, "
              f"{ref_div}/{len(ref)} prompts diverge from CPU-only")
        for (kind, world), prompts in sorted(by_run.items()):
            if kind != "ours":
                continue
            limit = world * bound
            worst = max(p["dlogit"] for p in prompts)
            divs = [p for p in prompts if p["first_diff"] >= 0]
            bad = [p for p in divs if p["margin"] > 2 * limit]
            ok = worst <= limit and not bad and len(prompts) == len(ref)
            margins = ", ".join(f"{p['margin']:.4f}" for p in divs) or "-"
            print(f"{'ok  ' if ok else 'FAIL'} {ty} ours world {world}: largest |dlogit| {worst:.4f} "
                  f"(limit {world} x B = {limit:.4f}); {len(divs)}/{len(prompts)} prompts diverge, "
                  f"at CPU-only margins {margins} (limit {2 * limit:.4f})")
            failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
