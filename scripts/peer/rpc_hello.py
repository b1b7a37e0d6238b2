#!/usr/bin/env python3
"""Send a ggml RPC HELLO to a server and print the protocol version it answers.

Usage: rpc_hello.py HOST PORT [--expect-major N] [--expect-version X.Y.Z] [--wait SECONDS]

Request:  cmd 0x0E (HELLO), u64 LE input size 24, 24 zero bytes (conn caps).
Reply:    u64 LE size 28, then major, minor, patch, padding, 24 bytes conn caps.

Exit status: 0 on a well-formed reply (and matching major / full version when asked),
1 otherwise. Used by the peer setup scripts as a smoke test.
"""
import argparse
import socket
import struct
import sys
import time

HELLO_CMD = 14
CAPS_SIZE = 24


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def hello(host, port, wait):
    deadline = time.monotonic() + wait
    last_err = None
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=10)
            break
        except OSError as err:  # server not listening yet
            last_err = err
            if time.monotonic() >= deadline:
                raise ConnectionError(f"cannot connect to {host}:{port}: {last_err}")
            time.sleep(0.1)
    with sock:
        req = bytes([HELLO_CMD]) + struct.pack("<Q", CAPS_SIZE) + bytes(CAPS_SIZE)
        sock.sendall(req)
        head = recv_exact(sock, 8)
        (size,) = struct.unpack("<Q", head)
        if size != 4 + CAPS_SIZE:
            raise ValueError(f"unexpected HELLO reply size {size} (raw {head.hex(' ')})")
        body = recv_exact(sock, size)
        return head + body


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--expect-major", type=int)
    ap.add_argument("--expect-version",
                    help="exact major.minor.patch the reply must carry, e.g. 8.0.1")
    ap.add_argument("--wait", type=float, default=30.0,
                    help="seconds to keep retrying the connection")
    args = ap.parse_args()
    try:
        raw = hello(args.host, args.port, args.wait)
    except Exception as err:  # noqa: BLE001 - report any failure plainly
        print(f"rpc_hello: {err}", file=sys.stderr)
        return 1
    major, minor, patch = raw[8], raw[9], raw[10]
    print(f"version={major}.{minor}.{patch} reply={raw.hex(' ')}")
    if args.expect_major is not None and major != args.expect_major:
        print(f"rpc_hello: expected major {args.expect_major}, got {major}", file=sys.stderr)
        return 1
    got = f"{major}.{minor}.{patch}"
    if args.expect_version is not None and got != args.expect_version:
        print(f"rpc_hello: expected version {args.expect_version}, got {got}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
