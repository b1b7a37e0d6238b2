#!/usr/bin/env python3
"""rpc_client_check.py: drives an RPC server with llama.cpp's OWN RPC client of b11739
(protocol 8.0.0) and checks every byte it reads back.

Runs INSIDE the b11739 Debian 13 chroot (the libraries need glibc >= 2.38); the interop test
copies it in at test time and runs

    chroot $ROOT/b11739/chroot /usr/bin/python3 /opt/interop-.../rpc_client_check.py HOST:PORT

The chroot shares the host's network namespace, so 127.0.0.1 reaches a server on the host.

It is the protocol-8 twin of rpc_client_check.c (same checks, through ctypes and the public
ggml API) plus SET_TENSOR_2D / GET_TENSOR_2D (ggml_backend_tensor_set_2d / _get_2d with more
than one copy). Lines starting with "fact " must not depend on the server implementation; the
test compares them between llama.cpp's server and ours. Any mismatch exits with status 1.

Options:
  --big MIB        also round-trip one tensor of MIB MiB
  --weights MIB    size of the weight uploaded through SET_TENSOR_HASH (default 16)
  --lib-dir DIR    b11739's libraries (default /opt/llama/lib)
  --no-uid         do not give the graph a uid (no GRAPH_RECOMPUTE)
  --compute CASE   instead: compute one small real graph (CASE from COMPUTE_CASES, or "list")
                   on the RPC backend and on the local CPU backend (b11739's libggml-cpu, as
                   test-backend-ops does) and compare the outputs (nmse <= 5e-4)
"""
import argparse
import ctypes as C
import os
import random
import sys

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_Q8_0 = 8
GGML_TYPE_I32 = 26
GGML_TYPE_I8 = 24
GGML_OP_MUL_MAT = 29
GGML_STATUS_SUCCESS = 0
USAGE_WEIGHTS = 1

# struct ggml_cgraph (ggml-impl.h): int size, n_nodes, n_leafs; 5 pointers; struct ggml_hash_set
# (size_t + 2 pointers); enum order; uint64_t uid.
CGRAPH_N_NODES = 4
CGRAPH_ORDER = 80
CGRAPH_UID = 88
# struct ggml_tensor: enum type (4, padded to 8), buffer pointer, int64 ne[4], size_t nb[4],
# enum op at 80.
TENSOR_OP = 80

ENDPOINT = ""


def fail(msg):
    print(f"rpc_client_check.py: FAIL ({ENDPOINT}): {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


class InitParams(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]


def load(lib_dir):
    libs = {}
    for name in ("libggml-base.so.0", "libggml-cpu.so.0", "libggml-rpc.so.0", "libggml.so.0"):
        libs[name] = C.CDLL(os.path.join(lib_dir, name), mode=C.RTLD_GLOBAL)
    g = libs["libggml-base.so.0"]
    cpu = libs["libggml-cpu.so.0"]
    ggml = libs["libggml.so.0"]
    rpc = libs["libggml-rpc.so.0"]
    vp, sz, i64, u8, u32, cp = C.c_void_p, C.c_size_t, C.c_int64, C.c_uint8, C.c_uint32, C.c_char_p

    def fn(lib, name, res, *args):
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = list(args)
        return f

    api = argparse.Namespace()
    api.init = fn(g, "ggml_init", vp, InitParams)
    api.free = fn(g, "ggml_free", None, vp)
    api.tensor_overhead = fn(g, "ggml_tensor_overhead", sz)
    api.graph_overhead = fn(g, "ggml_graph_overhead", sz)
    api.new_1d = fn(g, "ggml_new_tensor_1d", vp, vp, C.c_int, i64)
    api.new_2d = fn(g, "ggml_new_tensor_2d", vp, vp, C.c_int, i64, i64)
    api.view_1d = fn(g, "ggml_view_1d", vp, vp, vp, i64, sz)
    api.set_name = fn(g, "ggml_set_name", vp, vp, cp)
    api.nbytes = fn(g, "ggml_nbytes", sz, vp)
    api.new_graph = fn(g, "ggml_new_graph", vp, vp)
    api.build_forward_expand = fn(g, "ggml_build_forward_expand", None, vp, vp)
    api.graph_n_nodes = fn(g, "ggml_graph_n_nodes", C.c_int, vp)
    api.buft_alignment = fn(g, "ggml_backend_buft_get_alignment", sz, vp)
    api.buft_max_size = fn(g, "ggml_backend_buft_get_max_size", sz, vp)
    api.buft_alloc_size = fn(g, "ggml_backend_buft_get_alloc_size", sz, vp, vp)
    api.alloc_ctx_tensors = fn(g, "ggml_backend_alloc_ctx_tensors_from_buft", vp, vp, vp)
    api.buffer_base = fn(g, "ggml_backend_buffer_get_base", vp, vp)
    api.buffer_size = fn(g, "ggml_backend_buffer_get_size", sz, vp)
    api.buffer_clear = fn(g, "ggml_backend_buffer_clear", None, vp, u8)
    api.buffer_set_usage = fn(g, "ggml_backend_buffer_set_usage", None, vp, C.c_int)
    api.buffer_free = fn(g, "ggml_backend_buffer_free", None, vp)
    api.tensor_set = fn(g, "ggml_backend_tensor_set", None, vp, vp, sz, sz)
    api.tensor_get = fn(g, "ggml_backend_tensor_get", None, vp, vp, sz, sz)
    api.tensor_set_2d = fn(g, "ggml_backend_tensor_set_2d", None, vp, vp, sz, sz, sz, sz, sz)
    api.tensor_get_2d = fn(g, "ggml_backend_tensor_get_2d", None, vp, vp, sz, sz, sz, sz, sz)
    api.tensor_memset = fn(g, "ggml_backend_tensor_memset", None, vp, u8, sz, sz)
    api.tensor_copy = fn(g, "ggml_backend_tensor_copy", None, vp, vp)
    api.graph_compute = fn(g, "ggml_backend_graph_compute", C.c_int, vp, vp)
    api.backend_free = fn(g, "ggml_backend_free", None, vp)
    api.new_3d = fn(g, "ggml_new_tensor_3d", vp, vp, C.c_int, i64, i64, i64)
    api.nelements = fn(g, "ggml_nelements", i64, vp)
    api.nrows = fn(g, "ggml_nrows", i64, vp)
    api.set_input = fn(g, "ggml_set_input", None, vp)
    api.set_output = fn(g, "ggml_set_output", None, vp)
    api.mul_mat = fn(g, "ggml_mul_mat", vp, vp, vp, vp)
    api.add = fn(g, "ggml_add", vp, vp, vp, vp)
    api.mul = fn(g, "ggml_mul", vp, vp, vp, vp)
    api.rms_norm = fn(g, "ggml_rms_norm", vp, vp, vp, C.c_float)
    api.silu = fn(g, "ggml_silu", vp, vp, vp)
    api.soft_max = fn(g, "ggml_soft_max", vp, vp, vp)
    api.get_rows = fn(g, "ggml_get_rows", vp, vp, vp, vp)
    api.rope = fn(g, "ggml_rope", vp, vp, vp, vp, C.c_int, C.c_int)
    api.fp32_to_fp16_row = fn(g, "ggml_fp32_to_fp16_row", None, vp, vp, i64)
    api.quantize_chunk = fn(g, "ggml_quantize_chunk", sz, C.c_int, vp, vp, i64, i64, i64, vp)
    api.cpu_buffer_type = fn(g, "ggml_backend_cpu_buffer_type", vp)
    api.cpu_init = fn(cpu, "ggml_backend_cpu_init", vp)
    api.cpu_set_n_threads = fn(cpu, "ggml_backend_cpu_set_n_threads", None, vp, C.c_int)
    api.rpc_init = fn(rpc, "ggml_backend_rpc_init", vp, cp, u32)
    api.rpc_buffer_type = fn(rpc, "ggml_backend_rpc_buffer_type", vp, cp, u32)
    api.rpc_device_memory = fn(rpc, "ggml_backend_rpc_get_device_memory", None, cp, u32,
                               C.POINTER(sz), C.POINTER(sz))
    del ggml
    return api


class Checked:
    """A tensor and the model of its bytes."""

    def __init__(self, api, name, t):
        self.api, self.name, self.t = api, name, t
        self.n = api.nbytes(t)
        self.model = bytearray(self.n)

    def read(self, offset, size):
        buf = C.create_string_buffer(size)
        C.memset(buf, 0xEE, size)
        self.api.tensor_get(self.t, buf, offset, size)
        return buf.raw

    def verify(self, after, offset=0, size=None):
        size = self.n - offset if size is None else size
        got = self.read(offset, size)
        want = bytes(self.model[offset:offset + size])
        if got != want:
            i = next(i for i in range(size) if got[i] != want[i])
            fail(f"{after}: tensor {self.name} ({self.n} bytes), byte {offset + i}: "
                 f"got 0x{got[i]:02x}, want 0x{want[i]:02x}")

    def set(self, offset, size, rng):
        data = rng.randbytes(size)
        self.api.tensor_set(self.t, data, offset, size)
        self.model[offset:offset + size] = data

    def set_value(self, value, offset=0, size=None):
        size = self.n - offset if size is None else size
        self.model[offset:offset + size] = bytes([value]) * size


# --compute: real graphs, RPC backend against the local CPU backend

def _inp(api, ctx, ins, typ, ne0, ne1):
    t = api.new_2d(ctx, typ, ne0, ne1)
    api.set_input(t)
    ins.append(t)
    return t


def _mul_mat(typ, k, m, n):
    def build(api, ctx, ins):
        w = _inp(api, ctx, ins, typ, k, m)
        x = _inp(api, ctx, ins, GGML_TYPE_F32, k, n)
        return api.mul_mat(ctx, w, x)
    return build


def _add(api, ctx, ins):
    return api.add(ctx, _inp(api, ctx, ins, GGML_TYPE_F32, 33, 7), _inp(api, ctx, ins, GGML_TYPE_F32, 33, 7))


def _rms_norm(api, ctx, ins):
    return api.rms_norm(ctx, _inp(api, ctx, ins, GGML_TYPE_F32, 96, 5), 1e-5)


def _soft_max(api, ctx, ins):
    return api.soft_max(ctx, _inp(api, ctx, ins, GGML_TYPE_F32, 40, 6))


def _get_rows(api, ctx, ins):
    src = _inp(api, ctx, ins, GGML_TYPE_F32, 24, 16)
    rows = api.new_1d(ctx, GGML_TYPE_I32, 5)
    api.set_input(rows)
    ins.append(rows)
    return api.get_rows(ctx, src, rows)


def _rope_neox(api, ctx, ins):
    x = api.new_3d(ctx, GGML_TYPE_F32, 32, 2, 3)
    api.set_input(x)
    ins.append(x)
    pos = api.new_1d(ctx, GGML_TYPE_I32, 3)
    api.set_input(pos)
    ins.append(pos)
    return api.rope(ctx, x, pos, 32, 2)


def _ffn(api, ctx, ins):
    x = _inp(api, ctx, ins, GGML_TYPE_F32, 64, 3)
    g = _inp(api, ctx, ins, GGML_TYPE_F32, 64, 1)
    w = _inp(api, ctx, ins, GGML_TYPE_F16, 64, 48)
    b = _inp(api, ctx, ins, GGML_TYPE_F32, 48, 3)
    h = api.mul(ctx, api.rms_norm(ctx, x, 1e-6), g)
    return api.add(ctx, api.silu(ctx, api.mul_mat(ctx, w, h)), b)


COMPUTE_CASES = {
    "mul_mat_f32": _mul_mat(GGML_TYPE_F32, 64, 32, 4),
    "mul_mat_f16": _mul_mat(GGML_TYPE_F16, 128, 16, 3),
    "mul_mat_q8_0": _mul_mat(GGML_TYPE_Q8_0, 256, 8, 5),
    "add": _add,
    "rms_norm": _rms_norm,
    "soft_max": _soft_max,
    "get_rows": _get_rows,
    "rope_neox": _rope_neox,
    "ffn_chain": _ffn,
}


def _input_bytes(api, t, seed):
    typ = C.c_int.from_address(t).value
    n = api.nelements(t)
    if typ == GGML_TYPE_I32:
        return b"".join(((i * 7 + seed) % 16).to_bytes(4, "little") for i in range(n))
    rng = random.Random(seed)
    floats = (C.c_float * n)(*[rng.uniform(-1.0, 1.0) for _ in range(n)])
    if typ == GGML_TYPE_F32:
        return bytes(floats)
    out = C.create_string_buffer(api.nbytes(t))
    if typ == GGML_TYPE_F16:
        api.fp32_to_fp16_row(floats, out, n)
    else:
        ne0 = C.c_int64.from_address(t + 16).value
        api.quantize_chunk(typ, floats, out, 0, api.nrows(t), ne0, None)
    return out.raw


def _compute_on(api, name, backend, buft, where):
    params = InitParams(64 * api.tensor_overhead() + api.graph_overhead(), None, True)
    ctx = api.init(params)
    ins = []
    out = COMPUTE_CASES[name](api, ctx, ins)
    api.set_output(out)
    graph = api.new_graph(ctx)
    api.build_forward_expand(graph, out)
    buf = api.alloc_ctx_tensors(ctx, buft)
    if not buf:
        fail(f"compute {name}: allocation on {where} failed")
    for i, t in enumerate(ins):
        data = _input_bytes(api, t, i + 1)
        api.tensor_set(t, data, 0, len(data))
    status = api.graph_compute(backend, graph)
    if status != GGML_STATUS_SUCCESS:
        fail(f"compute {name}: status {status} on {where}")
    n = api.nelements(out)
    if C.c_int.from_address(out).value != GGML_TYPE_F32:
        fail(f"compute {name}: output is not F32")
    res = (C.c_float * n)()
    api.tensor_get(out, res, 0, n * 4)
    api.buffer_free(buf)
    api.free(ctx)
    return list(res)


def run_compute(api, name, ep):
    if name not in COMPUTE_CASES:
        fail(f"unknown compute case {name}")
    backend = api.rpc_init(ep, 0)
    buft = api.rpc_buffer_type(ep, 0)
    if not backend or not buft:
        fail("ggml_backend_rpc_init / _buffer_type returned NULL")
    cpu = api.cpu_init()
    api.cpu_set_n_threads(cpu, 1)
    want = _compute_on(api, name, cpu, api.cpu_buffer_type(), "the local CPU backend")
    got = _compute_on(api, name, backend, buft, "the RPC server")
    if len(got) != len(want):
        fail(f"compute {name}: {len(got)} outputs, want {len(want)}")
    err = sum((a - b) ** 2 for a, b in zip(got, want))
    norm = sum(b * b for b in want)
    nmse = err / norm if norm > 0 else err
    print(f"compute {name} nmse={nmse:.3g} ({len(want)} outputs; first: got {got[0]:g} want {want[0]:g})")
    if any(v != v for v in got) or not nmse <= 5e-4:
        fail(f"compute {name}: nmse {nmse:.3g} above 5e-4")
    api.backend_free(cpu)
    api.backend_free(backend)
    print("rpc_client_check.py: OK", flush=True)
    return 0


def main():
    global ENDPOINT
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("--big", type=int, default=0)
    ap.add_argument("--weights", type=int, default=16)
    ap.add_argument("--lib-dir", default="/opt/llama/lib")
    ap.add_argument("--no-uid", action="store_true")
    ap.add_argument("--compute", default=None)
    args = ap.parse_args()
    ENDPOINT = args.endpoint
    ep = ENDPOINT.encode()
    if args.compute == "list":
        print("\n".join(COMPUTE_CASES))
        return 0
    api = load(args.lib_dir)
    if args.compute:
        return run_compute(api, args.compute, ep)
    rng = random.Random(0x5eed)

    # HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY
    free_mem, total_mem = C.c_size_t(), C.c_size_t()
    api.rpc_device_memory(ep, 0, C.byref(free_mem), C.byref(total_mem))
    print(f"device memory: {free_mem.value} free of {total_mem.value}")
    if total_mem.value == 0 or free_mem.value > total_mem.value:
        fail(f"GET_DEVICE_MEMORY: free {free_mem.value}, total {total_mem.value}")

    backend = api.rpc_init(ep, 0)
    if not backend:
        fail("ggml_backend_rpc_init returned NULL")
    buft = api.rpc_buffer_type(ep, 0)
    if not buft:
        fail("ggml_backend_rpc_buffer_type returned NULL")

    # GET_ALIGNMENT, GET_MAX_SIZE
    alignment = api.buft_alignment(buft)
    print(f"fact alignment {alignment}")
    print(f"fact max_size {api.buft_max_size(buft)}")
    if alignment == 0 or alignment & (alignment - 1):
        fail(f"GET_ALIGNMENT: {alignment} is not a power of two")

    params = InitParams(64 * api.tensor_overhead() + api.graph_overhead(), None, True)
    ctx = api.init(params)
    if not ctx:
        fail("ggml_init")
    t_one = api.new_1d(ctx, GGML_TYPE_I8, 1)
    t_odd = api.new_1d(ctx, GGML_TYPE_I8, 1001)
    t_f32 = api.new_1d(ctx, GGML_TYPE_F32, 4097)
    t_src = api.new_2d(ctx, GGML_TYPE_F32, 257, 255)
    t_dst = api.new_2d(ctx, GGML_TYPE_F32, 257, 255)
    t_mib = api.new_1d(ctx, GGML_TYPE_I8, (1 << 20) + 5)
    t_q8 = api.new_2d(ctx, GGML_TYPE_Q8_0, 96, 3)
    t_mm = api.new_2d(ctx, GGML_TYPE_F32, 64, 64)
    C.c_uint32.from_address(t_mm + TENSOR_OP).value = GGML_OP_MUL_MAT
    t_rows = api.new_2d(ctx, GGML_TYPE_I8, 64, 16)
    t_view = api.view_1d(ctx, t_f32, 50, 100 * 4)
    for t, name in ((t_one, "one"), (t_odd, "odd"), (t_f32, "f32"), (t_src, "src"),
                    (t_dst, "dst"), (t_mib, "mib"), (t_q8, "q8"), (t_mm, "mm"),
                    (t_rows, "rows"), (t_view, "view")):
        api.set_name(t, name.encode())

    print(f"fact alloc_size q8_0[96,3] {api.buft_alloc_size(buft, t_q8)}")
    print(f"fact alloc_size mul_mat f32[64,64] {api.buft_alloc_size(buft, t_mm)}")
    print(f"fact alloc_size f32[4097] {api.buft_alloc_size(buft, t_f32)}")

    buf = api.alloc_ctx_tensors(ctx, buft)
    if not buf:
        fail("ALLOC_BUFFER: ggml_backend_alloc_ctx_tensors_from_buft returned NULL")
    base = api.buffer_base(buf) or 0
    print(f"buffer: {api.buffer_size(buf)} bytes at 0x{base:x}")
    print(f"fact buffer_size {api.buffer_size(buf)}")
    print(f"fact base_aligned {int(base % alignment == 0)}")
    if base == 0:
        fail("BUFFER_GET_BASE: base 0 for a non-empty buffer")

    one, odd, f32, src, dst, mib, q8, mm, rows = (
        Checked(api, n, t) for n, t in (("one", t_one), ("odd", t_odd), ("f32", t_f32),
                                        ("src", t_src), ("dst", t_dst), ("mib", t_mib),
                                        ("q8", t_q8), ("mm", t_mm), ("rows", t_rows)))
    everything = [one, odd, f32, src, dst, mib, q8, mm, rows]

    # BUFFER_CLEAR
    api.buffer_clear(buf, 0x5A)
    for c in everything:
        c.set_value(0x5A)
        c.verify("BUFFER_CLEAR 0x5a")

    # SET_TENSOR / GET_TENSOR
    for c in everything:
        c.set(0, c.n, rng)
        c.verify("SET_TENSOR of the whole tensor")
    odd.set(3, 7, rng)
    odd.set(1000, 1, rng)
    odd.set(123, 501, rng)
    mib.set(1, (1 << 20) + 3, rng)
    mib.set(77777, 33333, rng)
    f32.set(4 * 4096 + 3, 1, rng)
    for c in everything:
        c.verify("SET_TENSOR at odd offsets")
    odd.verify("GET_TENSOR of a sub-range", 17, 13)
    mib.verify("GET_TENSOR of one byte", 999999, 1)
    mib.verify("GET_TENSOR at an odd offset", 1, (1 << 20) + 1)

    # SET_TENSOR_2D / GET_TENSOR_2D: 5 rows of 10 bytes, 70 bytes apart in the tensor, 12 apart
    # in host memory; then 4 rows of 20 bytes read back 64 apart into host rows 25 apart
    rows.set_value(0)
    api.tensor_set(rows.t, bytes(rows.n), 0, rows.n)
    host = bytearray(rng.randbytes(5 * 12))
    api.tensor_set_2d(rows.t, bytes(host), 3, 10, 5, 70, 12)
    for i in range(5):
        rows.model[3 + 70 * i:3 + 70 * i + 10] = host[12 * i:12 * i + 10]
    rows.verify("SET_TENSOR_2D")
    out = C.create_string_buffer(4 * 25)
    C.memset(out, 0xEE, 4 * 25)
    api.tensor_get_2d(rows.t, out, 1, 20, 4, 64, 25)
    for i in range(4):
        got = out.raw[25 * i:25 * i + 20]
        want = bytes(rows.model[1 + 64 * i:1 + 64 * i + 20])
        if got != want:
            fail(f"GET_TENSOR_2D: row {i}: got {got.hex()}, want {want.hex()}")
        if out.raw[25 * i + 20:25 * i + 25] != b"\xee" * 5:
            fail(f"GET_TENSOR_2D: row {i} wrote past its 20 bytes in host memory")
    # a full-width 2D upload (stride = row size)
    host = rng.randbytes(64 * 16)
    api.tensor_set_2d(rows.t, host, 0, 64, 16, 64, 64)
    rows.model[:] = host
    rows.verify("SET_TENSOR_2D of every row")

    # COPY_TENSOR
    src.set(0, src.n, rng)
    api.tensor_copy(t_src, t_dst)
    dst.model[:] = src.model
    dst.verify("COPY_TENSOR (ggml_backend_tensor_copy)")
    src.verify("COPY_TENSOR (source unchanged)")
    print("fact copy_tensor ok")

    # MEMSET_TENSOR
    api.tensor_memset(t_odd, 0xC3, 5, 101)
    odd.set_value(0xC3, 5, 101)
    api.tensor_memset(t_one, 0x00, 0, 1)
    one.set_value(0x00, 0, 1)
    api.tensor_memset(t_mib, 0x11, 3, mib.n - 3)
    mib.set_value(0x11, 3)
    for c in everything:
        c.verify("MEMSET_TENSOR")

    # GRAPH_COMPUTE / GRAPH_RECOMPUTE of a view-only graph
    f32.set(0, f32.n, rng)
    graph = api.new_graph(ctx)
    api.build_forward_expand(graph, t_view)
    if api.graph_n_nodes(graph) != 1:
        fail(f"the view-only graph has {api.graph_n_nodes(graph)} nodes")
    if not args.no_uid:
        # sanity of the assumed struct layout before writing into it
        n_nodes = C.c_int.from_address(graph + CGRAPH_N_NODES).value
        order = C.c_int.from_address(graph + CGRAPH_ORDER).value
        uid = C.c_uint64.from_address(graph + CGRAPH_UID)
        if n_nodes != 1 or order not in (0, 1, 2) or uid.value != 0:
            fail(f"unexpected ggml_cgraph layout (n_nodes {n_nodes}, order {order}, "
                 f"uid {uid.value}); run with --no-uid")
        uid.value = 0x7001_0000_0000_0001 + os.getpid()
    for rnd in range(2):
        status = api.graph_compute(backend, graph)
        if status != GGML_STATUS_SUCCESS:
            fail(f"ggml_backend_graph_compute (round {rnd}): status {status}")
        f32.verify("GRAPH_COMPUTE of a view" if rnd == 0 else "GRAPH_RECOMPUTE of a view")
    view_bytes = C.create_string_buffer(200)
    api.tensor_get(t_view, view_bytes, 0, 200)
    if view_bytes.raw != bytes(f32.model[400:600]):
        fail("GET_TENSOR through the view: wrong bytes")

    # BUFFER_CLEAR over everything
    api.buffer_clear(buf, 0xA5)
    for c in everything:
        c.set_value(0xA5)
        c.verify("BUFFER_CLEAR 0xa5")

    # weights buffer: SET_TENSOR_HASH, then SET_TENSOR with cache_flag 1
    wctx = api.init(params)
    t_w = api.new_1d(wctx, GGML_TYPE_I8, (args.weights << 20) + 1)
    api.set_name(t_w, b"weights")
    wbuf = api.alloc_ctx_tensors(wctx, buft)
    if not wbuf:
        fail("ALLOC_BUFFER of the weights buffer failed")
    api.buffer_set_usage(wbuf, USAGE_WEIGHTS)
    w = Checked(api, "weights", t_w)
    for attempt in range(2):
        w.set(0, w.n, random.Random(0x1234567887654321))
        w.verify("SET_TENSOR_HASH + SET_TENSOR of a weight" if attempt == 0
                 else "SET_TENSOR_HASH (second upload of the same weight)")
    w.set(12345, 777, rng)
    w.verify("SET_TENSOR into a weight")

    if args.big:
        bctx = api.init(params)
        t_big = api.new_1d(bctx, GGML_TYPE_I8, args.big << 20)
        bbuf = api.alloc_ctx_tensors(bctx, buft)
        if not bbuf:
            fail(f"ALLOC_BUFFER of {args.big} MiB failed")
        b = Checked(api, "big", t_big)
        b.set(0, b.n, rng)
        b.verify("SET_TENSOR of the big tensor")
        b.set(1, b.n - 2, rng)
        b.verify("SET_TENSOR of the big tensor at offset 1")
        api.buffer_free(bbuf)
        api.free(bctx)
        print(f"big: {b.n} bytes round trip ok")

    # FREE_BUFFER, then the connection must still work
    api.buffer_free(wbuf)
    api.buffer_free(buf)
    api.rpc_device_memory(ep, 0, C.byref(free_mem), C.byref(total_mem))
    if total_mem.value == 0:
        fail("GET_DEVICE_MEMORY after FREE_BUFFER: total 0")
    api.free(wctx)
    api.free(ctx)
    api.backend_free(backend)
    print("rpc_client_check.py: OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
