#!/usr/bin/env python3
"""llama-bench (b11434) through RPC: server A (ours) against server B (reference) in one run.

Driven by scripts/conformance/bench-llama.sh. Both servers are started with the same
thread count and registered in one llama-bench process (`--rpc A,B`), which names their
devices RPC0 (A) and RPC1 (B); `-dev RPC0,RPC1` then runs every test on each device in
turn, with every layer offloaded (-ngl 99). Results come as JSONL.

Each model runs for `--rounds` rounds, the device order swapped every round (RPC0 first,
then RPC1 first), and the table shows the median of every repetition's tokens/s for both
servers, their middle half (25th-75th percentile), and the ratio of the medians A/B
(above 1 = A faster). Why medians over swapped rounds: the t/s of the first repetitions
of a run climb for either server, and a mean over one block of repetitions per server
measures where that block fell more than the server.

With `--pin` (the default when the machine has two CPUs or more), llama-bench runs on the
first CPU it may use and both servers on the others (they take turns, so they never
compete). Unpinned on a 2-vCPU VM, the tiny models' generation jumps between two levels
2x apart (about 600 and 1300-1700 t/s) for whole series of repetitions, for either server,
as the scheduler moves the client and the server between the vCPUs; pinned, both servers
hold the fast level.

With `--membw-cmd` (backend-cpu's `membw` example, run on the servers' CPUs before the
rounds), each tg row also shows the weight bytes a token streams (gguf_weights.py) and each
server's t/s x those bytes as a % of the measured read bandwidth: the roofline of a decode
step, which reads every weight once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import conflib
import gguf_weights
from conflib import Server, log

conflib.LOG_TAG = "bench"


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty list."""
    v = sorted(xs)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def median(xs: list[float]) -> float:
    return quantile(xs, 0.5)


def spread(xs: list[float] | None, rc) -> str:
    """`median (p25-p75)` of one server's samples, or the error when it has none."""
    if not xs:
        return f"ERR {rc}"
    return f"{median(xs):.1f} ({quantile(xs, 0.25):.0f}-{quantile(xs, 0.75):.0f})"


def weight_bytes(model: str) -> int | None:
    """Weight bytes one token streams, or None when the file cannot be read as GGUF."""
    try:
        return gguf_weights.bytes_per_token(model)
    except (OSError, ValueError) as e:
        log(f"{model}: no weight bytes for the roofline ({e})")
        return None


def measure_bandwidth(cmd: str, cpus: set[int] | None) -> float | None:
    """Bytes/s the probe reports (`read_gb_s=X`), run with the servers' CPU affinity."""
    log(f"memory bandwidth probe: {cmd}")
    try:
        p = subprocess.run(cmd.split(), capture_output=True, text=True, timeout=600,
                           preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"membw failed: {e}")
        return None
    for field in p.stdout.split():
        if field.startswith("read_gb_s="):
            log(p.stdout.strip())
            return float(field.split("=", 1)[1]) * 1e9
    log(f"membw printed no read_gb_s (exit {p.returncode}): {p.stdout.strip()} {p.stderr.strip()}")
    return None


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
    ap.add_argument("--rounds", type=int, default=3, help="llama-bench runs per model, device order swapped each")
    ap.add_argument("--fa", default="off")
    ap.add_argument("--client-threads", default="2")
    ap.add_argument("--pin", choices=["auto", "on", "off"], default="auto",
                    help="client on the first CPU, servers on the rest (auto: when there are 2 CPUs or more)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--logdir", default="target/conformance/bench")
    ap.add_argument("--note", default="", help="printed under the table title (e.g. our server build)")
    ap.add_argument("--membw-cmd", default="", help="memory read bandwidth probe (prints read_gb_s=X)")
    args = ap.parse_args()
    os.makedirs(args.logdir, exist_ok=True)

    usable = sorted(os.sched_getaffinity(0))
    pin = args.pin == "on" or (args.pin == "auto" and len(usable) >= 2)
    if pin and len(usable) < 2:
        log("--pin on needs two CPUs or more")
        return 2
    client_cpus = {usable[0]} if pin else None
    server_cpus = set(usable[1:]) if pin else None
    if pin:
        log(f"pinned: llama-bench on CPU {usable[0]}, servers on CPUs {','.join(map(str, usable[1:]))}")
    bandwidth = measure_bandwidth(args.membw_cmd, server_cpus) if args.membw_cmd else None
    a = Server(args.a_cmd, None, args.logdir, f"{args.a_name}-server", cpus=server_cpus)
    b = Server(args.b_cmd, None, args.logdir, f"{args.b_name}-server", cpus=server_cpus)
    rows = []
    rc_all = 0
    try:
        a.start()
        b.start()
        for model in [m for m in args.models.split(",") if m]:
            mname = os.path.basename(model).removesuffix(".gguf")
            samples: dict[tuple[str, str], list[float]] = {}
            params = 0
            rc = 0
            for rnd in range(max(1, args.rounds)):
                order = "RPC0,RPC1" if rnd % 2 == 0 else "RPC1,RPC0"
                cmd = [args.bench, "--rpc", f"{a.endpoint},{b.endpoint}", "-dev", order, "-ngl", "99",
                       "-m", model, "-p", args.p, "-n", args.n, "-r", args.r, "-fa", args.fa,
                       "-t", args.client_threads, "-o", "jsonl"]
                log(f"{mname} round {rnd + 1}/{args.rounds}: {' '.join(cmd)}")
                out_path = os.path.join(args.logdir, f"{mname}.{rnd + 1}.jsonl")
                err_path = os.path.join(args.logdir, f"{mname}.{rnd + 1}.log")
                with open(out_path, "wb") as out, open(err_path, "wb") as err:
                    try:
                        p = subprocess.run(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                           timeout=args.timeout, env=dict(os.environ, GGML_NO_BACKTRACE="1"),
                                           preexec_fn=(lambda: os.sched_setaffinity(0, client_cpus))
                                           if client_cpus else None)
                        rc_round = p.returncode
                    except subprocess.TimeoutExpired:
                        rc_round = "timeout"
                with open(out_path) as f:
                    for line in f:
                        line = line.strip()
                        if not line.startswith("{"):
                            continue
                        j = json.loads(line)
                        test = f"pp{j['n_prompt']}" if j["n_prompt"] else f"tg{j['n_gen']}"
                        server = "a" if j.get("devices", "").startswith("RPC0") else "b"
                        samples.setdefault((test, server), []).extend(j.get("samples_ts") or [j["avg_ts"]])
                        params = j.get("model_n_params", 0) or params
                if rc_round != 0:
                    rc = rc_round
                    rc_all = 1
                    log(f"{mname}: llama-bench exit {rc_round}, see {err_path}")
                for died, s in ((not a.alive(), a), (not b.alive(), b)):
                    if died:
                        log(f"{s.name} died during {mname}")
                        rc_all = 1
                        s.ensure()
            tests = []
            for (test, _server) in samples:
                if test not in tests:
                    tests.append(test)
            for test in tests:
                rows.append((mname, test, params, samples.get((test, "a")), samples.get((test, "b")), rc,
                             weight_bytes(model) if test.startswith("tg") else None))
            if not tests:
                rows.append((mname, "-", 0, None, None, rc, None))
    finally:
        a.stop()
        b.stop()

    print(f"\nllama-bench via RPC: {args.a_name} (A) vs {args.b_name} (B), {args.rounds} rounds of -r {args.r}, "
          f"-fa {args.fa}{', pinned (client CPU ' + str(usable[0]) + ')' if pin else ''}; "
          f"tokens/s, median of every repetition (middle half in brackets)")
    if args.note:
        print(args.note)
    roof = bandwidth is not None
    if roof:
        print(f"roofline: memory read bandwidth {bandwidth / 1e9:.1f} GB/s (membw on the servers' CPUs); "
              "tg rows: weight MB a token streams, and t/s x those bytes as % of the bandwidth (A / B)")
    hdr = (f"{'model':<24} {'params':>8} {'test':<6} {args.a_name + ' t/s':>24} "
           f"{args.b_name + ' t/s':>24} {'A/B':>6}" + (f" {'MB/tok':>7} {'% of bound A / B':>17}" if roof else ""))
    print(hdr)
    print("-" * len(hdr))
    for mname, test, params, sa, sb, rc, wbytes in rows:
        ptxt = f"{params / 1e6:.0f}M" if params else "-"
        ma, mb = (median(sa) if sa else None), (median(sb) if sb else None)
        ratio = f"{ma / mb:6.2f}" if ma and mb else "     -"
        line = f"{mname:<24} {ptxt:>8} {test:<6} {spread(sa, rc):>24} {spread(sb, rc):>24} {ratio}"
        if roof and wbytes:
            pct = " / ".join(f"{m * wbytes / bandwidth * 100:.0f}%" if m else "-" for m in (ma, mb))
            line += f" {wbytes / 1e6:7.1f} {pct:>17}"
        print(line)
    print(f"\nraw results: {args.logdir}/*.jsonl")
    return rc_all


if __name__ == "__main__":
    sys.exit(main())
