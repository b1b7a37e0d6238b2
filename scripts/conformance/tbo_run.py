#!/usr/bin/env python3
"""Run llama.cpp's test-backend-ops (b11434) against an RPC server, one op per process.

Driven by scripts/conformance/test-backend-ops.sh (which builds the shims and picks the
server); it can also be run directly. For every op:

 1. The case list, in test-mode order, is taken from test-backend-ops itself with
    tests/conformance/list_shim.c preloaded (every case reports "not supported" at once).
 2. test-backend-ops `test -b RPC0 -o OP` runs with tests/conformance/rpc_shim.c preloaded,
    which adds the server as device RPC0. Each result line `  OP(params): OK|FAIL|not
    supported` is matched to the list.
 3. If the process dies (the RPC client aborts when the server closes the connection or
    crashes) or prints no result for --case-timeout seconds, the case it was on is
    recorded as CRASH or HANG, the server is restarted if it died, and the rest of the
    op's cases run in new processes, named one by one with -o (full case strings).
    After --max-crashes such events the op's remaining cases are NOT_RUN.

With --scope listed, only cases whose every type parameter (type=, type_a=, type_K=,
...) is one of LISTED_TYPES run; the others are counted as "out of scope" and not run
(CI uses this: the refused formats would otherwise only add client crashes).

Prints a table (cases / passed / failed / not supported / crashed / hung / not run / out
of scope) and writes per-case results to LOGDIR/results.tsv. Exit status: 0 when every
case that ran passed, was not supported by the CPU reference, or is one of REFERENCE_BUGS
(cases where the CPU reference does not compute the op); 1 otherwise, 2 on a harness error.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import conflib
from conflib import ANSI, Server, log

conflib.LOG_TAG = "tbo"

# "  OP(params): OK" - a failure message may precede it on the same line.
RESULT = re.compile(r"(?:^|\s)([A-Z][A-Z0-9_]*)\((.*)\): (OK|FAIL|not supported)")
MAX_ARG = 100_000          # Linux limits one argv string to 128 KiB
MAX_CASES_PER_CHUNK = 400  # -o entries are compared linearly for each of ~24k cases

# Ops that a llama / qwen2 / qwen3 / gemma model sends at b11434 (flash attention on and
# off). UNARY and GLU are not -o names: test-backend-ops names those cases by the unary /
# glu op (ggml_op_desc), so they expand to the ones these models use.
DEFAULT_OPS = (
    "GET_ROWS,SET_ROWS,CPY,DUP,CONT,RESHAPE,VIEW,PERMUTE,TRANSPOSE,ADD,ADD1,SUB,MUL,DIV,"
    "SCALE,SQR,SQRT,SUM_ROWS,MEAN,RMS_NORM,NORM,MUL_MAT,MUL_MAT_ID,ROPE,SOFT_MAX,"
    "FLASH_ATTN_EXT,GLU,UNARY,CONCAT,ARGMAX,CLAMP"
)
# Cases where b11434's CPU backend (the reference test-backend-ops compares against) computes
# something other than the op: a FAIL of these is counted as REF_BUG, not as a failure. Our
# kernels compute the op itself (and are tested against naive references for these layouts).
REFERENCE_BUGS = {
    # ggml_compute_forward_sum_f32 reads each row as ne00 packed floats (its nb0 == 4 check is
    # an assert compiled out of release builds): with the rows transposed it adds overlapping
    # windows of memory instead of the tensor's elements.
    "SUM(type=f32,ne=[33,256,1,1],permute=[1,0,2,3])":
        "ggml-cpu SUM ignores nb0 of a transposed source",
}

GROUPS = {
    "default": DEFAULT_OPS,
    "UNARY": "SILU,GELU,TANH",
    "GLU": "SWIGLU,GEGLU",
    # whole-graph ("fused") cases built from the ops above, as llama.cpp graphs chain them
    "fused": "ADD_RMS_NORM,RMS_NORM_MUL_ADD,RMS_NORM_MUL_ROPE,ROPE_SET_ROWS,MUL_MAT_ADD,"
             "SILU_MUL,GELU_MUL,SOFTCAP",
    # ops beyond that list which the CPU backend implements: the other unary / GLU variants and
    # reductions, the state-space and linear-attention layers (Mamba, RWKV, Qwen3-Next), and
    # generic tensor ops; with the whole-graph cases built from them
    "extra": "SUM,LOG,SIN,COS,REPEAT,DIAG_MASK_INF,L2_NORM,ADD_ID,ARGSORT,TOP_K,LEAKY_RELU,"
             "ABS,SGN,NEG,STEP,ELU,RELU,SIGMOID,GELU_QUICK,HARDSWISH,HARDSIGMOID,EXP,EXPM1,"
             "SOFTPLUS,GELU_ERF,XIELU,FLOOR,CEIL,ROUND,TRUNC,REGLU,SWIGLU_OAI,GEGLU_ERF,"
             "GEGLU_QUICK,SWIGLU_CLAMP,SSM_CONV,SSM_SCAN,RWKV_WKV6,RWKV_WKV7,GATED_LINEAR_ATTN,"
             "SSM_CONV_BIAS_SILU,SSM_SCAN_ROLLBACK,CUMSUM,TRI,FILL,SOLVE_TRI,GATED_DELTA_NET,"
             "GATED_DELTA_NET_CACHE_FUSION,PAD,ROLL,ARANGE,TIMESTEP_EMBEDDING,"
             # vision and audio encoders (llama.cpp's mtmd)
             "IM2COL,IM2COL_3D,CONV_2D,CONV_2D_DW,CONV_3D,CONV_TRANSPOSE_1D,CONV_TRANSPOSE_2D,"
             "COL2IM_1D,CONV_1D_DW,POOL_1D,POOL_2D,UPSCALE,PAD_REFLECT_1D,"
             # training: backward passes, losses, optimizer steps
             "OUT_PROD,ROPE_BACK,SILU_BACK,RMS_NORM_BACK,SOFT_MAX_BACK,GET_ROWS_BACK,REPEAT_BACK,"
             "ACC,SET,COUNT_EQUAL,DIAG,GROUP_NORM,CROSS_ENTROPY_LOSS,CROSS_ENTROPY_LOSS_BACK,"
             "OPT_STEP_ADAMW,OPT_STEP_SGD,"
             # DeepSeek-V4-style graphs
             "LIGHTNING_INDEXER,DSV4_HC_COMB,DSV4_HC_PRE,DSV4_HC_POST,"
             # further whole-graph cases (MoE routing, fused norms and activations, ggml_cast)
             "ADD_ADD,GROUP_NORM_MUL_ADD,L2_NORM_BATCH,MOE_REDUCE,MUL_MAT_HADAMARD,"
             "MUL_MAT_ID_FUSION,MUL_MAT_ID_SHARED,MUL_MAT_ID_W4A4,MUL_MAT_ID_W4A8,"
             "MUL_MAT_VEC_FUSION,MUL_MAT_W4A4,MUL_MAT_W4A8,NORM_MUL_ADD,NORM_SCALE,RELU_SQR,"
             "RMS_NORM_SCALE,SIGMOID_MUL,SNAKE_FUSE,SOFTPLUS_MUL,TOPK_MOE,TOPK_QSA",
}


# The element types the compute issue lists (F32/F16/BF16, the classic and K quants), the
# integer types, and the further formats our CPU backend implements; a case with any other
# type parameter is out of scope for --scope listed.
LISTED_TYPES = {
    "f32", "f16", "bf16", "i8", "i16", "i32", "i64",
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
    "q2_K", "q3_K", "q4_K", "q5_K", "q6_K",
    "iq4_nl", "iq4_xs", "mxfp4", "nvfp4", "tq1_0", "tq2_0", "q1_0", "q2_0",
    "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m",
}
# Every ggml type name test-backend-ops prints (b11434), to recognise type parameters.
ALL_TYPES = LISTED_TYPES | {
    "q8_1", "q8_K", "f64",
}
PARAM = re.compile(r"(\w+)=(\w+)")


def in_scope(case: str) -> bool:
    """Whether every type parameter of a case string is one of LISTED_TYPES."""
    return all(v in LISTED_TYPES for _, v in PARAM.findall(case) if v in ALL_TYPES)


def expand_ops(spec: str) -> list[str]:
    out: list[str] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if item in GROUPS:
            for sub in expand_ops(GROUPS[item]):
                if sub not in out:
                    out.append(sub)
        elif item not in out:
            out.append(item)
    return out


@dataclass
class OpResult:
    op: str
    names: list[str] = field(default_factory=list)       # case strings, test order
    status: list[str | None] = field(default_factory=list)
    detail: list[str] = field(default_factory=list)
    processes: int = 0
    server_restarts: int = 0
    seconds: float = 0.0
    note: str = ""

    def count(self, s: str) -> int:
        return sum(1 for x in self.status if x == s)


def list_cases(args, op: str) -> list[str]:
    cmd = [args.tbo, "test", "-b", "CPU", "-o", op]
    if args.params:
        cmd += ["-p", args.params]
    env = dict(os.environ, LD_PRELOAD=args.list_shim, GGML_NO_BACKTRACE="1")
    env.pop("GGML_RPC_SHIM_ENDPOINT", None)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    names = []
    for line in ANSI.sub("", p.stdout.decode(errors="replace")).splitlines():
        m = RESULT.search(line)
        if m:
            names.append(f"{m.group(1)}({m.group(2)})")
    if p.returncode != 0:
        raise SystemExit(f"listing the cases of {op} failed (rc {p.returncode}):\n"
                         + p.stdout.decode(errors="replace")[-2000:])
    return names


def chunks(names: list[str]) -> list[list[str]]:
    out, cur, size = [], [], 0
    for n in names:
        if cur and (size + len(n) + 1 > MAX_ARG or len(cur) >= MAX_CASES_PER_CHUNK):
            out.append(cur)
            cur, size = [], 0
        cur.append(n)
        size += len(n) + 1
    if cur:
        out.append(cur)
    return out


def run_process(args, server: Server, res: OpResult, filt: str, expected: list[int], outf) -> tuple[int, str]:
    """Run one test-backend-ops process. `expected` = indices into res.names that it will
    run, in order. Returns (position reached in expected, how it ended: ok|crash|hang|startup)."""
    cmd = [args.tbo, "test", "-b", args.backend, "-o", filt]
    if args.params:
        cmd += ["-p", args.params]
    env = dict(os.environ, LD_PRELOAD=args.shim, GGML_RPC_SHIM_ENDPOINT=server.endpoint,
               GGML_RPC_SHIM_QUIET="1", GGML_NO_BACKTRACE="1")
    outf.write(f"\n### {' '.join(shlex.quote(c) for c in cmd[:4])} -o <{len(expected)} cases>\n".encode())
    outf.flush()
    res.processes += 1
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    pos = 0
    started = False
    finished = False
    buf = b""
    last_progress = time.time()
    hung = False
    fd = proc.stdout.fileno()
    while True:
        r, _, _ = select.select([fd], [], [], 1.0)
        if r:
            data = os.read(fd, 65536)
            if not data:
                break
            outf.write(data)
            buf += data
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = ANSI.sub("", raw.decode(errors="replace"))
                if line.startswith("Backend ") and args.backend in line:
                    started = True
                if re.match(r"^\s*\d+/\d+ tests passed", line):
                    finished = True
                m = RESULT.search(line)
                if not m:
                    continue
                name = f"{m.group(1)}({m.group(2)})"
                # match to the expected order (search forward, robust to surprises)
                j = pos
                while j < len(expected) and res.names[expected[j]] != name:
                    j += 1
                if j == len(expected):
                    log(f"warning: unexpected result line for {name}")
                    continue
                pos = j + 1
                idx = expected[j]
                st = {"OK": "OK", "FAIL": "FAIL", "not supported": "UNSUPPORTED"}[m.group(3)]
                if st == "FAIL" and name in REFERENCE_BUGS:
                    st = "REF_BUG"
                if res.status[idx] is None:
                    res.status[idx] = st
                    pre = line[: m.start()].strip()
                    res.detail[idx] = pre[:300] if st in ("FAIL", "REF_BUG") else ""
                last_progress = time.time()
        elif time.time() - last_progress > args.case_timeout:
            hung = True
            log(f"{res.op}: no result for {args.case_timeout} s, killing test-backend-ops")
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    rc = proc.returncode
    outf.write(f"### exit {rc}\n".encode())
    if hung:
        return pos, "hang"
    if not started:
        return pos, "startup"
    if finished and pos >= len(expected) and rc in (0, 1):
        return pos, "ok"
    if rc in (0, 1) and finished:
        # ended normally but some cases never reported: should not happen
        log(f"{res.op}: {len(expected) - pos} cases ended without a result line")
        return pos, "ok"
    return pos, "crash"


def run_op(args, server: Server, op: str, outf) -> OpResult:
    res = OpResult(op)
    res.names = list_cases(args, op)
    n = len(res.names)
    res.status = [None] * n
    res.detail = [""] * n
    if n == 0:
        res.note = "no test-backend-ops cases"
        return res
    todo = list(range(n))
    if args.scope == "listed":
        for i in todo:
            if not in_scope(res.names[i]):
                res.status[i] = "OUT_OF_SCOPE"
        todo = [i for i in todo if res.status[i] is None]
    limit = args.sample_limits.get(op, args.sample)
    if limit and len(todo) > limit:
        step = len(todo) / limit
        keep = {todo[int(i * step)] for i in range(limit)}
        for i in todo:
            if i not in keep:
                res.status[i] = "SAMPLED_OUT"
        todo = sorted(keep)
    t0 = time.time()
    events = 0
    whole = len(todo) == n  # first process may use the plain op name
    name_to_idx: dict[str, list[int]] = {}
    for i, nm in enumerate(res.names):
        name_to_idx.setdefault(nm, []).append(i)

    while todo:
        if server.ensure():
            res.server_restarts += 1
        if whole:
            batches = [(op, list(todo))]
        else:
            batches = []
            for ch in chunks(list(dict.fromkeys(res.names[i] for i in todo))):
                exp = sorted(i for nm in ch for i in name_to_idx[nm])
                batches.append((",".join(ch), exp))
        whole = False
        broke = False
        for filt, exp in batches:
            if server.ensure():
                res.server_restarts += 1
            mark = server.log_mark()
            pos, how = run_process(args, server, res, filt, exp, outf)
            if how == "ok":
                continue
            # The case the process was on is exactly the next one in its expected order
            # (test-backend-ops runs them in order, one at a time). Some case strings occur
            # more than once (identical parameters); -o NAME runs every occurrence, so an
            # earlier occurrence may be re-run and die again. Identical cases are one case:
            # the crash is recorded on every occurrence of the name that has no result yet.
            culprit = exp[pos] if pos < len(exp) else None
            died = not server.alive()
            if how == "startup":
                what = "startup failed" + (" (server died)" if died else "")
            else:
                what = ("server died" if died else "client aborted") if how == "crash" \
                    else f"no result in {args.case_timeout} s"
            time.sleep(0.05)
            srv = server.last_log_line(mark)
            if srv:
                what += f" | server: {srv}"
            events += 1
            if culprit is not None:
                st = "HANG" if how == "hang" else "CRASH"
                for i in name_to_idx[res.names[culprit]]:
                    if res.status[i] is None or i == culprit:
                        res.status[i] = st
                        res.detail[i] = what
                log(f"{op}: {st} in {res.names[culprit]}: {what}")
            if how == "hang" and server.cmd is not None:
                # a hung server may still hold the connection state: restart it
                server.stop()
            broke = True
            break
        todo = [i for i in todo if res.status[i] is None]
        if not broke:
            break
        if events >= args.max_crashes and todo:
            for i in todo:
                res.status[i] = "NOT_RUN"
                res.detail[i] = f"stopped after {events} crashes/hangs"
            res.note = f"gave up after {events} crashes/hangs"
            break
    res.seconds = time.time() - t0
    return res


COLS = ["OK", "FAIL", "UNSUPPORTED", "CRASH", "HANG", "NOT_RUN", "OUT_OF_SCOPE", "REF_BUG"]


def print_table(results: list[OpResult], title: str) -> None:
    print(f"\n{title}")
    hdr = f"{'op':<18} {'cases':>6} {'passed':>7} {'failed':>7} {'unsupp':>7} {'crash':>6} " \
          f"{'hang':>5} {'notrun':>7} {'scope':>6} {'procs':>6} {'time':>7}  note"
    print(hdr)
    print("-" * len(hdr))
    tot = {c: 0 for c in COLS}
    ncases = 0
    for r in results:
        run = sum(1 for s in r.status if s != "SAMPLED_OUT")  # includes out of scope
        ncases += run
        cnt = {c: r.count(c) for c in COLS}
        for c in COLS:
            tot[c] += cnt[c]
        note = r.note
        if r.server_restarts:
            note = (note + "; " if note else "") + f"server restarted {r.server_restarts}x"
        if len(r.names) != run:
            note = (note + "; " if note else "") + f"sampled {run}/{len(r.names)}"
        if cnt["REF_BUG"]:
            note = (note + "; " if note else "") + \
                f"{cnt['REF_BUG']} differ where the reference is wrong (REFERENCE_BUGS)"
        print(f"{r.op:<18} {run:>6} {cnt['OK']:>7} {cnt['FAIL']:>7} {cnt['UNSUPPORTED']:>7} "
              f"{cnt['CRASH']:>6} {cnt['HANG']:>5} {cnt['NOT_RUN']:>7} {cnt['OUT_OF_SCOPE']:>6} "
              f"{r.processes:>6} "
              f"{r.seconds:>6.0f}s  {note}")
    print("-" * len(hdr))
    print(f"{'TOTAL':<18} {ncases:>6} {tot['OK']:>7} {tot['FAIL']:>7} {tot['UNSUPPORTED']:>7} "
          f"{tot['CRASH']:>6} {tot['HANG']:>5} {tot['NOT_RUN']:>7} {tot['OUT_OF_SCOPE']:>6}")
    if tot["REF_BUG"]:
        print(f"({tot['REF_BUG']} cases differ from the CPU reference where it does not compute "
              "the op; see REFERENCE_BUGS in tbo_run.py)")
    if tot["OUT_OF_SCOPE"]:
        print(f"(scope: {tot['OUT_OF_SCOPE']} cases with a type outside the listed types were "
              "not run)")


def print_reasons(results: list[OpResult], top: int = 3) -> None:
    lines = []
    for r in results:
        groups: dict[str, int] = {}
        for st, de in zip(r.status, r.detail):
            if st in ("FAIL", "CRASH", "HANG"):
                key = f"{st}: " + re.sub(r"\d+(\.\d+)?", "#", de or "(no message)")[:160]
                groups[key] = groups.get(key, 0) + 1
        for key, n in sorted(groups.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {r.op:<18} {n:>5}x  {key}")
    if lines:
        print("\nmost common failure reasons (digits shown as #):")
        print("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tbo", required=True, help="test-backend-ops binary")
    ap.add_argument("--shim", required=True, help="librpc_shim.so")
    ap.add_argument("--list-shim", required=True, help="liblist_shim.so")
    ap.add_argument("--server-cmd", help="server command; {port} is replaced, else '-p PORT' is appended")
    ap.add_argument("--endpoint", help="use a running server at HOST:PORT instead of --server-cmd")
    ap.add_argument("--backend", default="RPC0")
    ap.add_argument("--ops", default="default", help="comma list of -o op names and groups "
                    f"({', '.join(GROUPS)}); default: %(default)s")
    ap.add_argument("--params", help="-p regex passed to test-backend-ops")
    ap.add_argument("--scope", choices=["all", "listed"], default="all",
                    help="listed: run only cases whose types are all in LISTED_TYPES")
    ap.add_argument("--sample", type=int, default=0, help="run at most N evenly spread cases per op")
    ap.add_argument("--sample-op", action="append", default=[], metavar="OP=N",
                    help="run at most N evenly spread cases of OP (instead of --sample; repeatable)")
    ap.add_argument("--case-timeout", type=float, default=120.0, help="seconds without a result = hang")
    ap.add_argument("--max-crashes", type=int, default=200, help="crashes/hangs per op before giving up on it")
    ap.add_argument("--logdir", default="target/conformance/test-backend-ops")
    ap.add_argument("--title", default="test-backend-ops through RPC")
    args = ap.parse_args()
    if bool(args.server_cmd) == bool(args.endpoint):
        ap.error("give exactly one of --server-cmd and --endpoint")
    args.sample_limits = {}
    for spec in args.sample_op:
        op, _, count = spec.partition("=")
        if not op or not count.isdigit():
            ap.error(f"--sample-op wants OP=N, not {spec!r}")
        args.sample_limits[op] = int(count)
    os.makedirs(args.logdir, exist_ok=True)
    ops = expand_ops(args.ops)
    server = Server(args.server_cmd, args.endpoint, args.logdir)
    results: list[OpResult] = []
    try:
        server.start()
        with open(os.path.join(args.logdir, "test-backend-ops.log"), "wb") as outf:
            for op in ops:
                log(f"{op}: listing cases")
                r = run_op(args, server, op, outf)
                log(f"{op}: {len(r.names)} cases, ok {r.count('OK')}, fail {r.count('FAIL')}, "
                    f"crash {r.count('CRASH')}, hang {r.count('HANG')}, {r.seconds:.0f} s")
                results.append(r)
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        server.stop()
    with open(os.path.join(args.logdir, "results.tsv"), "w") as f:
        f.write("op\tcase\tstatus\tdetail\n")
        for r in results:
            for nm, st, de in zip(r.names, r.status, r.detail):
                f.write(f"{r.op}\t{nm}\t{st}\t{de}\n")
    print_table(results, args.title)
    print_reasons(results)
    print(f"\nper-case results: {os.path.join(args.logdir, 'results.tsv')}; "
          f"raw output: {os.path.join(args.logdir, 'test-backend-ops.log')}")
    bad = sum(r.count(c) for r in results for c in ("FAIL", "CRASH", "HANG", "NOT_RUN"))
    if len(results) < len(ops):
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
