#!/usr/bin/env python3
"""Write tiny random-weight llama-architecture GGUF models for the RPC conformance runs.

The tokenizer (SentencePiece "llama" vocabulary, 32000 tokens) is borrowed from
llama.cpp's `models/ggml-vocab-llama-spm.gguf`; every other tensor is random with a fixed
seed, so the same command always writes byte-identical files.

Types: f32, f16, q8_0, q4_0, q4_k, and the grid formats iq2_xxs, iq2_xs, iq2_s, iq3_xxs,
iq3_s, iq1_s, iq1_m (quantized with an all-ones importance matrix). Quantized models store every 2-D weight (token_embd
and output included) in that type and the norms in F32. Quantization uses ggml's own
ggml_quantize_chunk() from the peer's libggml-base.so through ctypes (the same code
llama-quantize runs; the b11434 peer install has no llama-quantize binary), so all types
are quantized exactly as llama.cpp would. `--quantizer gguf-py` uses gguf-py's numpy
quantizers instead (Q8_0 and Q4_0 only: gguf-py cannot quantize Q4_K).

Presets:
  tiny   2 layers, n_embd 256, 4 heads (2 KV heads: GQA), n_ff 256, ctx 512  (~16.6M params,
         almost all in token_embd/output; n_embd 256 so that Q4_K's 256-wide blocks fit)
  small  4 layers, n_embd 512, 8 heads (4 KV heads), n_ff 1024, ctx 512  (~43M params; the
         second size of scripts/conformance/fidelity.sh)
  tp     2 layers, n_embd 384, 12 heads (12 KV heads), n_ff 768, ctx 512: heads and n_ff split
         evenly over 2, 3 and 4 devices, so llama.cpp's -sm tensor gives every device a slice
         (with tiny's 2 KV heads, 3 or 4 devices get empty slices and the client reduces
         without COMM_ALLREDUCE); scripts/conformance/tp.sh
  bench  12 layers, n_embd 768, 12 heads, n_ff 2048, ctx 2048, output tied to token_embd
         (~110M params)

Needs numpy and pyyaml; gguf is imported from the installed package or else from the
peer's source tree ($GGML_RPC_PEER_CACHE/b11434/src/gguf-py).

Usage: make-models.py [--out DIR] [--preset tiny|small|tp|bench] [--types f32,f16,q8_0,q4_0,q4_k]
                      [--seed N] [--quantizer ggml|gguf-py] [--force]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import zlib

PEER = os.path.join(os.environ.get("GGML_RPC_PEER_CACHE", "/var/cache/ggml-rpc-peer"), "b11434")

try:
    import numpy as np
except ImportError:
    sys.exit("make-models.py needs numpy (scripts/conformance/e2e.sh sets up a venv with it)")
try:
    import gguf
except ImportError:
    sys.path.insert(0, os.path.join(PEER, "src", "gguf-py"))
    import gguf  # noqa: E402

GQT = gguf.GGMLQuantizationType
TYPES = {
    # name: (ggml type, LlamaFileType)
    "f32": (GQT.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (GQT.F16, gguf.LlamaFileType.MOSTLY_F16),
    "q8_0": (GQT.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (GQT.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "q4_k": (GQT.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_S),
    # the grid formats (quantized with an all-ones importance matrix, which ggml requires for
    # IQ2_XXS, IQ2_XS and IQ1_S)
    "iq2_xxs": (GQT.IQ2_XXS, gguf.LlamaFileType.MOSTLY_IQ2_XXS),
    "iq2_xs": (GQT.IQ2_XS, gguf.LlamaFileType.MOSTLY_IQ2_XS),
    "iq2_s": (GQT.IQ2_S, gguf.LlamaFileType.MOSTLY_IQ2_S),
    "iq3_xxs": (GQT.IQ3_XXS, gguf.LlamaFileType.MOSTLY_IQ3_XXS),
    "iq3_s": (GQT.IQ3_S, gguf.LlamaFileType.MOSTLY_IQ3_S),
    "iq1_s": (GQT.IQ1_S, gguf.LlamaFileType.MOSTLY_IQ1_S),
    "iq1_m": (GQT.IQ1_M, gguf.LlamaFileType.MOSTLY_IQ1_M),
}
GRID_TYPES = {GQT.IQ2_XXS, GQT.IQ2_XS, GQT.IQ2_S, GQT.IQ3_XXS, GQT.IQ3_S, GQT.IQ1_S, GQT.IQ1_M}
PRESETS = {
    "tiny": dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=256, n_ctx=512, tied=False),
    "small": dict(n_layer=4, n_embd=512, n_head=8, n_head_kv=4, n_ff=1024, n_ctx=512, tied=False),
    "tp": dict(n_layer=2, n_embd=384, n_head=12, n_head_kv=12, n_ff=768, n_ctx=512, tied=False),
    "bench": dict(n_layer=12, n_embd=768, n_head=12, n_head_kv=12, n_ff=2048, n_ctx=2048, tied=True),
}
VOCAB_FILE = os.path.join(PEER, "src", "models", "ggml-vocab-llama-spm.gguf")


class GgmlQuantizer:
    """ggml_quantize_chunk() from libggml-base.so."""

    def __init__(self):
        path = os.path.join(PEER, "lib", "libggml-base.so")
        self.lib = ctypes.CDLL(path)
        f = self.lib.ggml_quantize_chunk
        f.restype = ctypes.c_size_t
        f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                      ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self.lib.ggml_row_size.restype = ctypes.c_size_t
        self.lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]

    def quantize(self, data: np.ndarray, qtype: GQT) -> np.ndarray:
        data = np.ascontiguousarray(data, dtype=np.float32)
        nrows, n_per_row = data.shape
        row_size = self.lib.ggml_row_size(int(qtype), n_per_row)
        out = np.zeros((nrows, row_size), dtype=np.uint8)
        imatrix = np.ones(n_per_row, dtype=np.float32) if qtype in GRID_TYPES else None
        n = self.lib.ggml_quantize_chunk(int(qtype), data.ctypes.data, out.ctypes.data, 0,
                                         nrows, n_per_row,
                                         None if imatrix is None else imatrix.ctypes.data)
        assert n == out.nbytes, (n, out.nbytes)
        return out


class GgufPyQuantizer:
    def quantize(self, data: np.ndarray, qtype: GQT) -> np.ndarray:
        if qtype not in (GQT.Q8_0, GQT.Q4_0):
            raise SystemExit(f"gguf-py cannot quantize {qtype.name}; use --quantizer ggml")
        return gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), qtype)


def rng_for(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def tensor_specs(hp: dict, n_vocab: int):
    """(name, numpy shape (rows, cols) = ggml (ne1, ne0), init std, is_norm)."""
    e, ff = hp["n_embd"], hp["n_ff"]
    hd = e // hp["n_head"]
    kv = hd * hp["n_head_kv"]
    specs = [("token_embd.weight", (n_vocab, e), 1.0, False)]
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        specs += [
            (b + "attn_norm.weight", (e,), 0.0, True),
            (b + "attn_q.weight", (e, e), 1.0 / np.sqrt(e), False),
            (b + "attn_k.weight", (kv, e), 1.0 / np.sqrt(e), False),
            (b + "attn_v.weight", (kv, e), 1.0 / np.sqrt(e), False),
            (b + "attn_output.weight", (e, e), 1.0 / np.sqrt(e), False),
            (b + "ffn_norm.weight", (e,), 0.0, True),
            (b + "ffn_gate.weight", (ff, e), 1.0 / np.sqrt(e), False),
            (b + "ffn_up.weight", (ff, e), 1.0 / np.sqrt(e), False),
            (b + "ffn_down.weight", (e, ff), 1.0 / np.sqrt(ff), False),
        ]
    specs.append(("output_norm.weight", (e,), 0.0, True))
    if not hp["tied"]:
        # logits with a spread of ~4 so that greedy picks are far from ties
        specs.append(("output.weight", (n_vocab, e), 4.0 / np.sqrt(e), False))
    return specs


def copy_tokenizer(w: gguf.GGUFWriter, vocab_path: str) -> int:
    r = gguf.GGUFReader(vocab_path)
    n_vocab = 0
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        val = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = gguf.GGUFValueType(field.types[1])
            w.add_key_value(key, val, vtype, sub_type=sub)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(val)
        else:
            w.add_key_value(key, val, vtype)
    if n_vocab == 0:
        raise SystemExit(f"{vocab_path}: no tokenizer.ggml.tokens")
    return n_vocab


def write_model(path: str, preset: str, tname: str, seed: int, quantizer, vocab_path: str) -> None:
    hp = PRESETS[preset]
    qtype, ftype = TYPES[tname]
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name(f"conformance-{preset}-llama-{tname}")
    w.add_file_type(int(ftype))
    w.add_context_length(hp["n_ctx"])
    w.add_embedding_length(hp["n_embd"])
    w.add_block_count(hp["n_layer"])
    w.add_feed_forward_length(hp["n_ff"])
    w.add_head_count(hp["n_head"])
    w.add_head_count_kv(hp["n_head_kv"])
    w.add_rope_dimension_count(hp["n_embd"] // hp["n_head"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    n_vocab = copy_tokenizer(w, vocab_path)
    w.add_vocab_size(n_vocab)
    n_params = 0
    for name, shape, std, is_norm in tensor_specs(hp, n_vocab):
        rng = rng_for(seed, name)
        if is_norm:
            data = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            data = (std * rng.standard_normal(shape)).astype(np.float32)
        n_params += data.size
        if is_norm or qtype == GQT.F32:
            w.add_tensor(name, data)
        elif qtype == GQT.F16:
            w.add_tensor(name, data.astype(np.float16))
        else:
            q = quantizer.quantize(data, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    print(f"wrote {path}  ({n_params / 1e6:.1f}M params, {os.path.getsize(path) / 2**20:.1f} MiB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="target/conformance/models")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--types", default="f32,f16,q8_0,q4_0,q4_k")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--quantizer", choices=["ggml", "gguf-py"], default="ggml")
    ap.add_argument("--vocab", default=VOCAB_FILE, help="GGUF to take tokenizer.* from")
    ap.add_argument("--force", action="store_true", help="rewrite models that exist")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    quantizer = GgmlQuantizer() if args.quantizer == "ggml" else GgufPyQuantizer()
    for tname in [t.strip().lower() for t in args.types.split(",") if t.strip()]:
        if tname not in TYPES:
            ap.error(f"unknown type {tname} (have {', '.join(TYPES)})")
        path = os.path.join(args.out, f"{args.preset}-llama-{tname}.gguf")
        if os.path.exists(path) and not args.force:
            print(f"exists  {path}")
            continue
        write_model(path, args.preset, tname, args.seed, quantizer, args.vocab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
