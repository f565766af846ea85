#!/usr/bin/env python3
"""Prints what llama.cpp's own Python reader (`gguf` on PyPI) says about a GGUF
file, as JSON in the shape of `lamina inspect --json`, for the tests that
compare the two: counts, alignment, data offset, every tensor's name, shape
(ggml order), type and offset, and every key's type."""
import json
import sys

from gguf import GGUFReader, GGUFValueType


def main(path):
    r = GGUFReader(path)
    meta = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        t = f.types[0]
        entry = {"type": t.name}
        if t == GGUFValueType.ARRAY:
            entry = {"type": "array", "element_type": f.types[-1].name, "count": len(f.data)}
        meta[f.name] = entry
    out = {
        "version": int(r.fields["GGUF.version"].parts[-1][0]),
        "tensor_count": int(r.fields["GGUF.tensor_count"].parts[-1][0]),
        "kv_count": int(r.fields["GGUF.kv_count"].parts[-1][0]),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "metadata": meta,
        "tensors": [
            {
                "name": t.name,
                "shape": [int(x) for x in t.shape],
                "type": t.tensor_type.name,
                "offset": int(t.data_offset) - int(r.data_offset),
                "bytes": int(t.n_bytes),
            }
            for t in r.tensors
        ],
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
