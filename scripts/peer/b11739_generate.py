#!/usr/bin/env python3
"""Greedy generation with llama.cpp b11739's libllama (the b11739 peer's client).

Runs INSIDE the b11739 chroot (setup-b11739.sh), which has no llama-completion and no
python3-cffi; scripts/conformance/tp.sh copies this file in at run time:

    chroot "$LLAMA_B11739_CHROOT" python3 /tmp/.../b11739_generate.py -m MODEL \
        [--rpc HOST:PORT,HOST:PORT] [--split none|layer|row|tensor] [-n N] [-p PROMPT]

Without --rpc the model stays on the CPU (model params devices = an empty, NULL-terminated
list, n_gpu_layers 0). With --rpc every endpoint is registered as llama.cpp's --rpc does
(ggml_backend_rpc_add_server, then ggml_backend_register) and the model is loaded with
n_gpu_layers 99 and the given split mode. Flash attention is on, the prompt is decoded in one
batch, then N tokens are picked greedily (argmax of the logits, lowest id on ties, as
llama.cpp's greedy sampler). Prints one line: the generated token ids, space-separated.

The struct layouts (llama_model_params, llama_context_params, llama_batch) are not written
by hand: they are built with ctypes from the C declarations of b11739's llama.h that the
wheel ships as text in /opt/llama/_cffi_bindings.py (cffi itself is not in the chroot).
"""
import argparse
import ctypes
import os
import re
import sys

LIB_DIR = os.environ.get("LLAMA_B11739_LIB_DIR", "/opt/llama/lib")
CDEF_FILE = os.environ.get("LLAMA_B11739_CDEF", "/opt/llama/_cffi_bindings.py")
SPLIT = {"none": 0, "layer": 1, "row": 2, "tensor": 3}

SCALARS = {
    "bool": ctypes.c_bool, "float": ctypes.c_float, "double": ctypes.c_double,
    "int8_t": ctypes.c_int8, "uint8_t": ctypes.c_uint8, "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t, "int": ctypes.c_int, "llama_pos": ctypes.c_int32,
    "llama_token": ctypes.c_int32, "llama_seq_id": ctypes.c_int32,
}


def die(msg):
    print(f"b11739_generate: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def struct_from_cdef(cdef, name):
    """A ctypes Structure for `struct NAME { ... };` of the cdef text."""
    m = re.search(r"struct\s+" + name + r"\s*\{(.*?)\}", cdef, re.S)
    if not m:
        die(f"struct {name} not in {CDEF_FILE}")
    fields = []
    for decl in m.group(1).split(";"):
        decl = re.sub(r"//.*", "", decl).strip()
        if not decl:
            continue
        fm = re.fullmatch(r"(.*?)([A-Za-z_]\w*)", decl, re.S)
        if not fm:
            die(f"cannot parse field {decl!r} of struct {name}")
        ctype, field = " ".join(fm.group(1).replace("const ", "").split()), fm.group(2)
        if "*" in ctype:
            t = ctypes.c_void_p
        elif ctype.startswith("enum "):
            t = ctypes.c_int
        elif ctype in SCALARS:
            t = SCALARS[ctype]
        elif re.search(r"typedef\s+\w+\s*\(\s*\*\s*" + re.escape(ctype) + r"\s*\)", cdef) or \
                re.search(r"typedef\s+void\s*\*\s*" + re.escape(ctype) + r"\s*;", cdef):
            t = ctypes.c_void_p  # a function pointer or an opaque handle
        else:
            die(f"unknown type {ctype!r} of {name}.{field}")
        fields.append((field, t))
    return type(name, (ctypes.Structure,), {"_fields_": fields})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", "--prompt", default="Once upon a time")
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("--rpc", default="", help="comma-separated HOST:PORT (none: CPU only)")
    ap.add_argument("--split", choices=sorted(SPLIT), default="tensor")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--quiet", action="store_true", help="drop llama.cpp's log")
    args = ap.parse_args()

    with open(CDEF_FILE) as f:
        m = re.search(r'_LLAMA_H_CDEF\s*=\s*"""(.*?)"""', f.read(), re.S)
    if not m:
        die(f"no _LLAMA_H_CDEF in {CDEF_FILE}")
    cdef = m.group(1)
    ModelParams = struct_from_cdef(cdef, "llama_model_params")
    CtxParams = struct_from_cdef(cdef, "llama_context_params")
    Batch = struct_from_cdef(cdef, "llama_batch")

    libs = {}
    for name in ("libggml-base.so.0", "libggml-cpu.so.0", "libggml-rpc.so.0", "libggml.so.0",
                 "libllama.so.0"):
        libs[name] = ctypes.CDLL(os.path.join(LIB_DIR, name), mode=ctypes.RTLD_GLOBAL)
    ggml, rpc, llama = libs["libggml.so.0"], libs["libggml-rpc.so.0"], libs["libllama.so.0"]
    vp, i32 = ctypes.c_void_p, ctypes.c_int32

    def fn(lib, name, res, *argt):
        f = getattr(lib, name)
        f.restype, f.argtypes = res, list(argt)
        return f

    log_cb_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, vp)

    def log_text(level, text, user_data):
        if not args.quiet and text:
            sys.stderr.write(text.decode(errors="replace"))

    log_cb = log_cb_t(log_text)
    fn(llama, "llama_log_set", None, log_cb_t, vp)(log_cb, None)
    fn(llama, "llama_backend_init", None)()

    add_server = fn(rpc, "ggml_backend_rpc_add_server", vp, ctypes.c_char_p)
    register = fn(ggml, "ggml_backend_register", None, vp)
    endpoints = [e for e in args.rpc.split(",") if e]
    for ep in endpoints:
        reg = add_server(ep.encode())
        if not reg:
            die(f"ggml_backend_rpc_add_server({ep}) failed")
        register(reg)

    mp = fn(llama, "llama_model_default_params", ModelParams)()
    no_devices = (vp * 1)(None)
    if endpoints:
        mp.n_gpu_layers, mp.split_mode = 99, SPLIT[args.split]
    else:
        mp.n_gpu_layers, mp.devices = 0, ctypes.cast(no_devices, vp)
    model = fn(llama, "llama_model_load_from_file", vp, ctypes.c_char_p, ModelParams)(
        args.model.encode(), mp)
    if not model:
        die(f"cannot load {args.model}")

    cp = fn(llama, "llama_context_default_params", CtxParams)()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = args.ctx, args.ctx, args.ctx
    cp.n_threads = cp.n_threads_batch = args.threads
    cp.flash_attn_type = 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED
    cp.no_perf = True
    ctx = fn(llama, "llama_init_from_model", vp, vp, CtxParams)(model, cp)
    if not ctx:
        die("llama_init_from_model failed")

    vocab = fn(llama, "llama_model_get_vocab", vp, vp)(model)
    n_vocab = fn(llama, "llama_vocab_n_tokens", i32, vp)(vocab)
    tokenize = fn(llama, "llama_tokenize", i32, vp, ctypes.c_char_p, i32, vp, i32,
                  ctypes.c_bool, ctypes.c_bool)
    text = args.prompt.encode()
    toks = (i32 * (len(text) + 16))()
    n_prompt = tokenize(vocab, text, len(text), toks, len(toks), True, True)
    if n_prompt <= 0:
        die(f"llama_tokenize returned {n_prompt}")
    batch_get_one = fn(llama, "llama_batch_get_one", Batch, vp, i32)
    decode = fn(llama, "llama_decode", i32, vp, Batch)
    logits_ith = fn(llama, "llama_get_logits_ith", ctypes.POINTER(ctypes.c_float), vp, i32)
    is_eog = fn(llama, "llama_vocab_is_eog", ctypes.c_bool, vp, i32)

    out = []
    cur, n_cur = toks, n_prompt
    for _ in range(args.n):
        rc = decode(ctx, batch_get_one(ctypes.cast(cur, vp), n_cur))
        if rc != 0:
            die(f"llama_decode returned {rc}")
        lg = logits_ith(ctx, -1)
        row = lg[:n_vocab]
        tok = max(range(n_vocab), key=lambda i: (row[i], -i))
        out.append(tok)
        if is_eog(vocab, tok):
            break
        cur, n_cur = (i32 * 1)(tok), 1
    print(" ".join(map(str, out)), flush=True)
    fn(llama, "llama_free", None, vp)(ctx)
    fn(llama, "llama_model_free", None, vp)(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
