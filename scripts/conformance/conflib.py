"""Shared helpers for the conformance drivers (tbo_run.py, e2e_run.py, bench_run.py, fidelity_run.py)."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOG_TAG = "conf"


def log(msg: str) -> None:
    print(f"[{LOG_TAG} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, env, timeout, out_path, err_path):
    """Run cmd with stdout/stderr to files; (exit status or "timeout", seconds)."""
    t0 = time.time()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            p = subprocess.run(cmd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                               timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, time.time() - t0


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """A server process we started (or an external endpoint when cmd is None)."""

    def __init__(self, cmd: str | None, endpoint: str | None, logdir: str, name: str = "server",
                 cpus: set[int] | None = None):
        self.cmd = cmd
        self.cpus = cpus  # CPU affinity of the process and all its threads, when set
        self.name = name
        self.logdir = logdir
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.endpoint = endpoint or ""
        self.logf = None
        self.log_path = ""

    def log_mark(self) -> int:
        try:
            return os.path.getsize(self.log_path) if self.log_path else 0
        except OSError:
            return 0

    def last_log_line(self, since: int) -> str:
        """The last warning/error the server logged after offset `since` (or its last line)."""
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(since)
                text = ANSI.sub("", f.read().decode(errors="replace"))
        except OSError:
            return ""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        pick = [ln for ln in lines if re.search(r"WARN|ERROR|error|panic|abort|fail", ln)]
        line = (pick or lines or [""])[-1]
        k = line.find("error=")
        if k >= 0:
            line = line[k:]
        return line[-240:]

    def start(self) -> None:
        if self.cmd is None:
            return
        port = free_port()
        cmd = self.cmd.replace("{port}", str(port)) if "{port}" in self.cmd \
            else f"{self.cmd} -p {port}"
        self.endpoint = f"127.0.0.1:{port}"
        self.starts += 1
        path = os.path.join(self.logdir, f"{self.name}.{self.starts}.log")
        self.logf = open(path, "wb")
        self.log_path = path
        log(f"starting {self.name}: {cmd}  (log {path})")
        cpus = self.cpus
        self.proc = subprocess.Popen(shlex.split(cmd), stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited at start (rc {self.proc.returncode}), see {path}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"server did not listen on {port} within 30 s, see {path}")

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def ensure(self) -> bool:
        """Restart the server if it died; True when it had died."""
        if self.alive():
            return False
        log(f"{self.name} died (rc {self.proc.returncode}); restarting")
        self.start()
        return True

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
