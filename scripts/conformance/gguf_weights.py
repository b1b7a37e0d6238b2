#!/usr/bin/env python3
"""The weight bytes one generated token streams, from a GGUF file's tensor table.

usage: gguf_weights.py MODEL.gguf   (prints bytes per token and the tensors left out)

Token generation reads every weight once per token, except the token embeddings: the
client's GET_ROWS reads one row of token_embd.weight (and keeps it on the host). When the
model has no output.weight, the output layer reuses token_embd, which then is read whole.
A tensor's size is the distance to the next tensor's data (the file's alignment padding
included, under 32 bytes a tensor), so no type table is needed. The KV cache a token also
reads is not counted: it grows with the context, the weights do not.
"""

from __future__ import annotations

import os
import struct
import sys

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class _Reader:
    def __init__(self, f):
        self.f = f

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise ValueError("truncated GGUF")
        return struct.unpack("<" + fmt, data)[0]

    def string(self) -> str:
        n = self.take("Q")
        return self.f.read(n).decode("utf-8", "replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.take("I"), self.take("Q")
            return [self.value(etype) for _ in range(count)]
        raise ValueError(f"unknown GGUF value type {vtype}")


def tensor_sizes(path: str) -> dict[str, int]:
    """Name -> bytes of every tensor in a GGUF (v2/v3) file."""
    with open(path, "rb") as f:
        r = _Reader(f)
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = r.take("I")
        if version < 2:
            raise ValueError(f"{path}: GGUF v{version} is not supported")
        n_tensors, n_kv = r.take("Q"), r.take("Q")
        alignment = 32
        for _ in range(n_kv):
            key = r.string()
            value = r.value(r.take("I"))
            if key == "general.alignment" and isinstance(value, int):
                alignment = value
        offsets = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.take("I")
            for _ in range(n_dims):
                r.take("Q")
            r.take("I")  # type
            offsets.append((r.take("Q"), name))
        data_start = -(-f.tell() // alignment) * alignment
    end = os.path.getsize(path) - data_start
    offsets.sort()
    return {name: (offsets[i + 1][0] if i + 1 < len(offsets) else end) - off
            for i, (off, name) in enumerate(offsets)}


def bytes_per_token(path: str) -> int:
    sizes = tensor_sizes(path)
    total = sum(sizes.values())
    if "output.weight" in sizes:
        total -= sizes.get("token_embd.weight", 0)
    return total


if __name__ == "__main__":
    for model in sys.argv[1:]:
        print(f"{model}: {bytes_per_token(model)} bytes per token")
