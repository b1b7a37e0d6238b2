#!/usr/bin/env python3
"""llama-bench (b11434) through RPC: server A (ours) against server B (reference) in one run.

Driven by scripts/conformance/bench-llama.sh. Both servers are started with the same
thread count and registered in one llama-bench process (`--rpc A,B`), which names their
devices RPC0 (A) and RPC1 (B); `-dev RPC0,RPC1` then runs every test on each device in
turn, with every layer offloaded (-ngl 99). Results come as JSONL; the table shows
tokens/s for both and the ratio A/B (above 1 = A faster).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import conflib
from conflib import Server, log

conflib.LOG_TAG = "bench"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, help="llama-bench binary")
    ap.add_argument("--a-cmd", required=True, help="server A ({port} replaced, else -p PORT appended)")
    ap.add_argument("--b-cmd", required=True, help="server B")
    ap.add_argument("--a-name", default="ours")
    ap.add_argument("--b-name", default="reference")
    ap.add_argument("--models", required=True, help="comma list of GGUF paths")
    ap.add_argument("-p", default="64")
    ap.add_argument("-n", default="32")
    ap.add_argument("-r", default="3")
    ap.add_argument("--fa", default="off")
    ap.add_argument("--client-threads", default="2")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--logdir", default="target/conformance/bench")
    ap.add_argument("--note", default="", help="printed under the table title (e.g. our server build)")
    args = ap.parse_args()
    os.makedirs(args.logdir, exist_ok=True)

    a = Server(args.a_cmd, None, args.logdir, f"{args.a_name}-server")
    b = Server(args.b_cmd, None, args.logdir, f"{args.b_name}-server")
    rows = []
    rc_all = 0
    try:
        a.start()
        b.start()
        for model in [m for m in args.models.split(",") if m]:
            mname = os.path.basename(model).removesuffix(".gguf")
            cmd = [args.bench, "--rpc", f"{a.endpoint},{b.endpoint}", "-dev", "RPC0,RPC1", "-ngl", "99",
                   "-m", model, "-p", args.p, "-n", args.n, "-r", args.r, "-fa", args.fa,
                   "-t", args.client_threads, "-o", "jsonl"]
            log(f"{mname}: {' '.join(cmd)}")
            out_path = os.path.join(args.logdir, f"{mname}.jsonl")
            err_path = os.path.join(args.logdir, f"{mname}.log")
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                try:
                    p = subprocess.run(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                       timeout=args.timeout, env=dict(os.environ, GGML_NO_BACKTRACE="1"))
                    rc = p.returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
            res = {}
            with open(out_path) as f:
                for line in f:
                    line = line.strip()
                    if not line.startswith("{"):
                        continue
                    j = json.loads(line)
                    test = f"pp{j['n_prompt']}" if j["n_prompt"] else f"tg{j['n_gen']}"
                    dev = j.get("devices", "")
                    res[(test, dev)] = (j["avg_ts"], j["stddev_ts"], j.get("model_n_params", 0))
            if rc != 0:
                rc_all = 1
                log(f"{mname}: llama-bench exit {rc}, see {err_path}")
            for died, s in ((not a.alive(), a), (not b.alive(), b)):
                if died:
                    log(f"{s.name} died during {mname}")
                    rc_all = 1
                    s.ensure()
            tests = []
            for (test, _dev) in res:
                if test not in tests:
                    tests.append(test)
            for test in tests:
                ra = next((v for (t, d), v in res.items() if t == test and d.startswith("RPC0")), None)
                rb = next((v for (t, d), v in res.items() if t == test and d.startswith("RPC1")), None)
                rows.append((mname, test, ra, rb, rc))
            if not tests:
                rows.append((mname, "-", None, None, rc))
    finally:
        a.stop()
        b.stop()

    print(f"\nllama-bench via RPC: {args.a_name} (A) vs {args.b_name} (B), -r {args.r}, -fa {args.fa}, tokens/s")
    if args.note:
        print(args.note)
    hdr = f"{'model':<24} {'params':>8} {'test':<6} {args.a_name + ' t/s':>16} {args.b_name + ' t/s':>16} {'A/B':>6}"
    print(hdr)
    print("-" * len(hdr))
    for mname, test, ra, rb, rc in rows:
        params = f"{(ra or rb)[2] / 1e6:.0f}M" if (ra or rb) else "-"
        fa_ = f"{ra[0]:8.1f} ±{ra[1]:5.1f}" if ra else f"{'ERR ' + str(rc):>16}"
        fb_ = f"{rb[0]:8.1f} ±{rb[1]:5.1f}" if rb else f"{'ERR ' + str(rc):>16}"
        ratio = f"{ra[0] / rb[0]:6.2f}" if ra and rb and rb[0] else "     -"
        print(f"{mname:<24} {params:>8} {test:<6} {fa_:>16} {fb_:>16} {ratio}")
    print(f"\nraw results: {args.logdir}/*.jsonl")
    return rc_all


if __name__ == "__main__":
    sys.exit(main())
