#!/usr/bin/env python3
"""ggml RPC server (protocol 8.0.0) on llama.cpp b11739's prebuilt libraries.

Runs INSIDE the Debian 13 chroot made by setup-b11739.sh (the libraries need
glibc >= 2.38), where it lives as /opt/llama/rpc_server.py:

    chroot "$LLAMA_B11739_CHROOT" python3 /opt/llama/rpc_server.py \
        --host 127.0.0.1 --port 50152 [--threads T] [--cache DIR] [--device CPU]

It loads libggml.so.0 (which links the CPU backend in: the wheel is not a
GGML_BACKEND_DL build) and libggml-rpc.so.0 with ctypes, picks the devices, and
calls the exported C function (same in the wheel's header and upstream):

    void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir,
                                       size_t n_threads, size_t n_devices,
                                       ggml_backend_dev_t * devices);

That call serves forever; stop the process with SIGTERM or SIGINT.
"""
import argparse
import ctypes
import os
import signal
import sys

DEFAULT_LIB_DIR = os.environ.get("LLAMA_B11739_LIB_DIR", "/opt/llama/lib")

# enum ggml_backend_dev_type (ggml-backend.h)
DEV_TYPE_NAMES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL", 4: "META"}


def log(msg):
    print(f"rpc_server: {msg}", file=sys.stderr, flush=True)


def load_libs(lib_dir):
    mode = ctypes.RTLD_GLOBAL
    libs = {}
    # dependency order; each has RUNPATH $ORIGIN, so the rest resolve by themselves
    for name in ("libggml-base.so.0", "libggml-cpu.so.0", "libggml-rpc.so.0", "libggml.so.0"):
        path = os.path.join(lib_dir, name)
        if not os.path.exists(path):
            raise SystemExit(f"rpc_server: missing {path}")
        libs[name] = ctypes.CDLL(path, mode=mode)
    base, ggml, rpc = libs["libggml-base.so.0"], libs["libggml.so.0"], libs["libggml-rpc.so.0"]

    vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    ggml.ggml_backend_load_all.argtypes = []
    ggml.ggml_backend_load_all.restype = None
    ggml.ggml_backend_dev_count.argtypes = []
    ggml.ggml_backend_dev_count.restype = sz
    ggml.ggml_backend_dev_get.argtypes = [sz]
    ggml.ggml_backend_dev_get.restype = vp
    ggml.ggml_backend_dev_by_name.argtypes = [cp]
    ggml.ggml_backend_dev_by_name.restype = vp
    base.ggml_backend_dev_name.argtypes = [vp]
    base.ggml_backend_dev_name.restype = cp
    base.ggml_backend_dev_description.argtypes = [vp]
    base.ggml_backend_dev_description.restype = cp
    base.ggml_backend_dev_type.argtypes = [vp]
    base.ggml_backend_dev_type.restype = ctypes.c_int
    base.ggml_backend_dev_memory.argtypes = [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]
    base.ggml_backend_dev_memory.restype = None
    rpc.ggml_backend_rpc_start_server.argtypes = [cp, cp, sz, sz, ctypes.POINTER(vp)]
    rpc.ggml_backend_rpc_start_server.restype = None
    return base, ggml, rpc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-H", "--host", default="127.0.0.1")
    ap.add_argument("-p", "--port", type=int, default=50052)
    ap.add_argument("-t", "--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("-c", "--cache", metavar="DIR", default=None,
                    help="directory for the tensor cache (off when not given)")
    ap.add_argument("-d", "--device", default=None,
                    help="comma-separated device names (default: every GPU/IGPU device, else CPU)")
    ap.add_argument("--lib-dir", default=DEFAULT_LIB_DIR)
    ap.add_argument("--no-load-all", action="store_true",
                    help="skip ggml_backend_load_all() (dynamic backend discovery)")
    ap.add_argument("--list-devices", action="store_true", help="print devices and exit")
    args = ap.parse_args()
    if args.threads <= 0:
        ap.error("--threads must be positive")
    if not 0 < args.port < 65536:
        ap.error("--port must be 1..65535")

    base, ggml, rpc = load_libs(args.lib_dir)
    if not args.no_load_all:
        ggml.ggml_backend_load_all()

    all_devs = [ggml.ggml_backend_dev_get(i) for i in range(ggml.ggml_backend_dev_count())]

    def describe(dev):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = DEV_TYPE_NAMES.get(base.ggml_backend_dev_type(dev), "?")
        return (f"{base.ggml_backend_dev_name(dev).decode()} ({kind}): "
                f"{base.ggml_backend_dev_description(dev).decode()}, "
                f"{free.value // 2**20} MiB free / {total.value // 2**20} MiB")

    if args.list_devices:
        for dev in all_devs:
            print(describe(dev))
        return 0

    if args.device:
        devices = []
        for name in args.device.split(","):
            dev = ggml.ggml_backend_dev_by_name(name.strip().encode())
            if not dev:
                raise SystemExit(f"rpc_server: unknown device {name!r}")
            devices.append(dev)
    else:
        devices = [d for d in all_devs if base.ggml_backend_dev_type(d) in (1, 2)]
        if not devices:
            cpu = next((d for d in all_devs if base.ggml_backend_dev_type(d) == 0), None)
            if not cpu:
                raise SystemExit("rpc_server: no CPU device found")
            devices = [cpu]

    cache_dir = None
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
        cache_dir = args.cache.encode()

    endpoint = f"{args.host}:{args.port}"
    for dev in devices:
        log(f"device {describe(dev)}")
    log(f"starting RPC server (protocol 8) on {endpoint}, threads {args.threads}, "
        f"cache {args.cache or 'off'}")

    # The C call never returns to the interpreter, so Python-level handlers would
    # never run: let SIGINT/SIGTERM terminate the process directly.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    arr = (ctypes.c_void_p * len(devices))(*devices)
    rpc.ggml_backend_rpc_start_server(endpoint.encode(), cache_dir, args.threads, len(devices), arr)
    log("ggml_backend_rpc_start_server returned (could not listen?)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
