#!/usr/bin/env python3
"""End-to-end generation check: llama.cpp (b11434 or b12032+1) against RPC servers and CPU only.

Driven by scripts/conformance/e2e.sh. For every model and flash-attention setting it runs,
for each target (cpu = no --rpc; reference = llama.cpp's ggml-rpc-server; ours = our
server, both with --rpc 127.0.0.1:PORT -ngl 99):

  * llama-completion with a fixed prompt and greedy sampling (--temp 0 --top-k 1 --seed 1
    -n N -no-cnv -fa on|off --no-repack); the generated text (stdout) is compared, and
  * tests/conformance/llama_probe (same settings, libllama directly; the RPC device comes
    from rpc_shim.so), which prints the token ids and writes the logits; token ids are
    compared, and the largest logit difference is reported (compare_probe.py).

--no-repack matters: without it the CPU-only run moves quantized weights into CPU_REPACK
buffers and uses other kernels (e.g. q4_K_8x8) than an RPC server does, so CPU-only
logits differ from RPC logits by up to ~0.3 on these models and greedy picks can flip.

Every target is compared with the baseline (cpu when it is among the targets). A pair
passes when the token ids match (MATCH) or first differ at a near tie (NEAR_TIE: the
baseline's top-2 logit margin < --tie-margin there) and the text is the same or the
difference is explained by that near tie; with --strict only identical token ids and text
pass (CI). Exit 0 when every pair passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import compare_probe
import conflib
from conflib import Server, log, run

conflib.LOG_TAG = "e2e"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--completion", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--models", required=True, help="comma list of GGUF paths")
    ap.add_argument("--fa", default="off,on")
    ap.add_argument("--targets", default="cpu,reference,ours")
    ap.add_argument("--our-cmd", help="our server; {port} replaced, else -p PORT appended")
    ap.add_argument("--ref-cmd", help="reference server command")
    ap.add_argument("--our-endpoint", help="a running server instead of --our-cmd")
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog. Once upon a time")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--tie-margin", type=float, default=0.02)
    ap.add_argument("--strict", action="store_true", help="near ties fail too: same ids and text only")
    ap.add_argument("--no-probe", action="store_true", help="llama-completion text only")
    ap.add_argument("--logdir", default="target/conformance/e2e")
    ap.add_argument("--note", default="", help="printed under the table title (e.g. our server build)")
    ap.add_argument("--peer", default="b11434", help="the llama.cpp build whose programs run (for the title)")
    args = ap.parse_args()

    os.makedirs(args.logdir, exist_ok=True)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    for t in targets:
        if t not in ("cpu", "reference", "ours"):
            ap.error(f"unknown target {t}")
    baseline = "cpu" if "cpu" in targets else targets[0]
    servers: dict[str, Server] = {}
    if "reference" in targets:
        if not args.ref_cmd:
            ap.error("--ref-cmd needed for target reference")
        servers["reference"] = Server(args.ref_cmd, None, args.logdir, "reference-server")
    if "ours" in targets:
        if not (args.our_cmd or args.our_endpoint):
            ap.error("--our-cmd or --our-endpoint needed for target ours")
        servers["ours"] = Server(args.our_cmd, args.our_endpoint, args.logdir, "our-server")

    rows = []
    failed = 0
    try:
        for s in servers.values():
            s.start()
        for model in [m for m in args.models.split(",") if m]:
            mname = os.path.basename(model).removesuffix(".gguf")
            for fa in [f.strip() for f in args.fa.split(",") if f.strip()]:
                res = {}
                for t in targets:
                    tag = f"{mname}.fa-{fa}.{t}"
                    base = os.path.join(args.logdir, tag)
                    rpc = t in servers
                    restarted = False
                    if rpc:
                        restarted = servers[t].ensure()
                    env = dict(os.environ, GGML_NO_BACKTRACE="1")
                    cmd = [args.completion, "-m", model, "-p", args.prompt, "-n", str(args.n),
                           "--temp", "0", "--top-k", "1", "--seed", "1", "-no-cnv", "-fa", fa,
                           "-c", str(args.ctx), "-t", str(args.threads), "--no-warmup", "--no-repack"]
                    if rpc:
                        cmd += ["--rpc", servers[t].endpoint, "-ngl", "99"]
                    # llama-completion prints through common_log's worker thread, which is not
                    # flushed at exit (b11434, see common/log.cpp): under load the tail of the
                    # text can be lost with exit status 0. The perf summary is the last thing
                    # logged, so a run is complete only if it is there; else run it again.
                    for attempt in range(1, 4):
                        rc, secs = run(cmd, env, args.timeout, base + ".completion.txt", base + ".completion.log")
                        with open(base + ".completion.txt", "rb") as f:
                            text = f.read()
                        with open(base + ".completion.log", "rb") as f:
                            complete = b"total time =" in f.read()
                        if rc != 0 or complete:
                            break
                        log(f"{tag}: llama-completion output truncated (log not flushed), run {attempt}")
                    if rc == 0 and not complete:
                        rc = "truncated"
                    r = {"rc": rc, "text": text, "secs": secs, "restarted": restarted}
                    if not args.no_probe:
                        penv = dict(env)
                        if rpc:
                            penv.update(LD_PRELOAD=args.shim, GGML_RPC_SHIM_ENDPOINT=servers[t].endpoint,
                                        GGML_RPC_SHIM_QUIET="1")
                            if servers[t].ensure():
                                r["restarted"] = True
                        pcmd = [args.probe, "-m", model, "-p", args.prompt, "-n", str(args.n), "--fa", fa,
                                "-c", str(args.ctx), "-t", str(args.threads), "--repack", "off",
                                "--ngl", "99" if rpc else "0", "--logits", base + ".logits.bin"]
                        prc, _ = run(pcmd, penv, args.timeout, base + ".probe.txt", base + ".probe.log")
                        r["probe_rc"] = prc
                    if rpc and not servers[t].alive():
                        r["server_died"] = True
                        log(f"{t} server died during {tag}")
                    res[t] = r
                    log(f"{tag}: completion rc {rc} ({secs:.1f} s)"
                        + (f", probe rc {r.get('probe_rc')}" if not args.no_probe else ""))
                # compare every target with the baseline
                cmp = {}
                b = res[baseline]
                bbase = os.path.join(args.logdir, f"{mname}.fa-{fa}.{baseline}")
                for t in targets:
                    if t == baseline:
                        continue
                    r = res[t]
                    tbase = os.path.join(args.logdir, f"{mname}.fa-{fa}.{t}")
                    if r["rc"] != 0 or b["rc"] != 0:
                        text = f"ERR(rc {r['rc'] if r['rc'] != 0 else 'base ' + str(b['rc'])})"
                    else:
                        text = "SAME" if r["text"] == b["text"] else "DIFF"
                    probe, detail, ok_probe = "-", "", True
                    if not args.no_probe:
                        if r.get("probe_rc") != 0 or b.get("probe_rc") != 0:
                            probe, ok_probe = f"ERR(rc {r.get('probe_rc')})", False
                        else:
                            out = subprocess.run(
                                [sys.executable, compare_probe.__file__, bbase + ".probe.txt", tbase + ".probe.txt",
                                 "--logits", bbase + ".logits.bin", tbase + ".logits.bin",
                                 "--tie-margin", str(args.tie_margin)],
                                stdout=subprocess.PIPE, text=True)
                            detail = out.stdout.strip()
                            probe = detail.split()[0] if detail else "ERR"
                            ok_probe = probe == "MATCH" or (probe == "NEAR_TIE" and not args.strict)
                    ok_text = text == "SAME" or (
                        text == "DIFF" and probe == "NEAR_TIE" and not args.strict)
                    ok = ok_text and ok_probe
                    if r.get("server_died"):
                        detail = (detail + "; " if detail else "") + "server died"
                    if not ok:
                        failed += 1
                    cmp[t] = (ok, text, probe, detail)
                rows.append((mname, fa, cmp, res))
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        for s in servers.values():
            s.stop()

    print(f"\nend-to-end greedy generation, llama.cpp {args.peer} (-n {args.n}, prompt {args.prompt!r}), "
          f"baseline: {baseline}")
    if args.note:
        print(args.note)
    others = [t for t in targets if t != baseline]
    hdr = f"{'model':<18} {'fa':<4}" + "".join(f" | {t + ' vs ' + baseline:<44}" for t in others)
    print(hdr)
    print("-" * len(hdr))
    for mname, fa, cmp, res in rows:
        line = f"{mname:<18} {fa:<4}"
        for t in others:
            ok, text, probe, detail = cmp[t]
            extra = ""
            if "max|dlogit|" in detail:
                extra = " dlogit " + detail.split("max|dlogit|")[1].strip()
            if probe in ("NEAR_TIE", "MISMATCH"):
                extra += " @step " + detail.split("at step ")[1].split()[0]
            cell = f"{'PASS' if ok else 'FAIL'} text {text} ids {probe}{extra}"
            line += f" | {cell:<44}"
        print(line)
    print(f"\nlogs and outputs: {args.logdir}")
    for mname, fa, cmp, res in rows:
        for t in others:
            ok, text, probe, detail = cmp[t]
            if not ok or "server died" in detail:
                print(f"  {mname} fa={fa} {t}: {detail or text}")
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
