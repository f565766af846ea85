#!/usr/bin/env python3
"""Write golden dequantization fixtures for crates/quant into tests/fixtures/quant/.

For every ggml type the CPU decoders support, this draws a few random but valid blocks
and dequantizes them with the numpy decoders of llama.cpp's own `gguf` package
(`gguf.quants.dequantize`), an implementation independent of ours. Per type it writes

    <TYPE>.blocks   raw block bytes, exactly as they sit in a GGUF file
    <TYPE>.f32      the expected weights, little-endian f32

The Rust tests (crates/quant/tests/golden.rs) compare our decoders against them bit for
bit. Q8_1 and Q8_K have no decoder in `gguf`; their expected values are computed here
from ggml's one-line definition (w = d·q) and are marked as such below.

Valid blocks: every f16/f32 scale field is written explicitly from a log-uniform draw
(|d| in 1e-3..1e-1, random sign where ggml's quantizers produce both signs), so no
scale is NaN, Inf or zero; the quant bytes are uniform random. The first block of each
type has all quant bytes 0x00 and the second all 0xFF, to pin the extreme indices.

Deterministic: each type draws from its own generator seeded with SEED + type id, so
adding a type leaves the other fixtures unchanged.

Usage (from the repository root):
    python3 scripts/gen-quant-fixtures.py          # rewrite the fixtures
    python3 scripts/gen-quant-fixtures.py --check  # exit 1 if any fixture would change
Needs: pip install gguf numpy   (written against gguf 0.19)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quant"
SEED = 0x1A417A

# Fields of each block type that are scales, as (byte offset, kind, signed).
# kind: "f16" half, "f32" float, "e8m0" MXFP4 exponent, "ue4m3x4" four NVFP4 scales,
# "iq1m" the half assembled from the top nibbles of IQ1_M's scale words.
SCALES: dict[T, list[tuple[int, str, bool]]] = {
    T.Q4_0: [(0, "f16", True)],
    T.Q4_1: [(0, "f16", True), (2, "f16", True)],
    T.Q5_0: [(0, "f16", True)],
    T.Q5_1: [(0, "f16", True), (2, "f16", True)],
    T.Q8_0: [(0, "f16", True)],
    T.Q8_1: [(0, "f16", True), (2, "f16", True)],
    T.Q2_K: [(80, "f16", False), (82, "f16", False)],
    T.Q3_K: [(108, "f16", True)],
    T.Q4_K: [(0, "f16", False), (2, "f16", False)],
    T.Q5_K: [(0, "f16", False), (2, "f16", False)],
    T.Q6_K: [(208, "f16", True)],
    T.Q8_K: [(0, "f32", True)],
    T.IQ2_XXS: [(0, "f16", False)],
    T.IQ2_XS: [(0, "f16", False)],
    T.IQ2_S: [(0, "f16", False)],
    T.IQ3_XXS: [(0, "f16", False)],
    T.IQ3_S: [(0, "f16", False)],
    T.IQ1_S: [(0, "f16", False)],
    T.IQ1_M: [(48, "iq1m", False)],
    T.IQ4_NL: [(0, "f16", True)],
    T.IQ4_XS: [(0, "f16", False)],
    T.TQ1_0: [(52, "f16", False)],
    T.TQ2_0: [(64, "f16", False)],
    T.MXFP4: [(0, "e8m0", False)],
    T.NVFP4: [(0, "ue4m3x4", False)],
}

FLOATS = [T.F32, T.F16, T.BF16]

# Enough weights per type to exercise every field a few times; keeps the whole set small.
WEIGHTS_PER_TYPE = 1024


def draw_scale(rng: np.random.Generator, signed: bool) -> float:
    mag = 10.0 ** rng.uniform(-3.0, -1.0)
    return -mag if signed and rng.random() < 0.5 else mag


def random_floats(rng: np.random.Generator, qtype: T, n: int) -> np.ndarray:
    """Random finite values over the whole range of the format (subnormals and -0 included)."""
    if qtype == T.F32:
        bits = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
        exp_all_ones = (bits >> 23) & 0xFF == 0xFF
        bits[exp_all_ones] &= np.uint32(0xBFFFFFFF)
        bits[0] = 0x80000000  # -0
        return bits.view(np.uint8)
    bits = rng.integers(0, 2**16, size=n, dtype=np.uint32).astype(np.uint16)
    if qtype == T.F16:
        inf_nan = (bits >> 10) & 0x1F == 0x1F
        bits[inf_nan] &= np.uint16(0xBFFF)
    else:  # BF16
        inf_nan = (bits >> 7) & 0xFF == 0xFF
        bits[inf_nan] &= np.uint16(0xBFFF)
    bits[0] = 0x8000
    return bits.view(np.uint8)


def geometry(qtype: T) -> tuple[int, int]:
    # gguf 0.19 still lists Q8_1 at 40 bytes (its old f32 d and s); ggml's block_q8_1
    # has held two halves, 36 bytes, for years.
    if qtype == T.Q8_1:
        return (32, 36)
    return GGML_QUANT_SIZES[qtype]


def random_blocks(rng: np.random.Generator, qtype: T) -> np.ndarray:
    block_size, type_size = geometry(qtype)
    n_blocks = WEIGHTS_PER_TYPE // block_size
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint16).astype(np.uint8)
    blocks[0, :] = 0x00
    blocks[1, :] = 0xFF
    for i in range(n_blocks):
        for off, kind, signed in SCALES[qtype]:
            write_scale(rng, blocks[i], off, kind, signed)
    if qtype == T.Q8_1:
        # s = d·Σq, as quantize_row_q8_1 stores it (unused by dequantization).
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        qsum = blocks[:, 4:36].view(np.int8).astype(np.float32).sum(axis=1, keepdims=True)
        blocks[:, 2:4] = (d * qsum).astype(np.float16).view(np.uint8)
    return blocks


def write_scale(rng: np.random.Generator, block: np.ndarray, off: int, kind: str, signed: bool) -> None:
    if kind == "f16":
        block[off : off + 2] = np.array([draw_scale(rng, signed)], dtype=np.float16).view(np.uint8)
    elif kind == "f32":
        block[off : off + 4] = np.array([draw_scale(rng, signed)], dtype=np.float32).view(np.uint8)
    elif kind == "e8m0":
        # 2^(e-128)·12 must stay finite; real tensors sit near e = 127 - 7 … 127 + 2.
        block[off] = rng.integers(100, 150)
    elif kind == "ue4m3x4":
        # Bit 7 of an unsigned E4M3 scale is never set by ggml's quantizer; keep it clear.
        block[off : off + 4] = rng.integers(0, 0x80, size=4)
    elif kind == "iq1m":
        d_bits = int(np.array([draw_scale(rng, signed)], dtype=np.float16).view(np.uint16)[0])
        words = block[off : off + 8].copy().view(np.uint16)
        for k in range(4):
            words[k] = (int(words[k]) & 0x0FFF) | (((d_bits >> (4 * k)) & 0xF) << 12)
        block[off : off + 8] = words.view(np.uint8)
    else:
        raise ValueError(kind)


def expected(qtype: T, data: np.ndarray) -> np.ndarray:
    if qtype == T.Q8_1:
        # Not in gguf.quants: ggml's rule w = d·q (the stored s is ignored).
        blocks = data.reshape((-1, 36))
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        return (blocks[:, 4:36].view(np.int8).astype(np.float32) * d).reshape(-1)
    if qtype == T.Q8_K:
        # Not in gguf.quants: ggml dequantize_row_q8_K, w = d·q with d an f32.
        blocks = data.reshape((-1, 292))
        d = blocks[:, 0:4].copy().view(np.float32)
        return (d * blocks[:, 4:260].view(np.int8).astype(np.float32)).reshape(-1)
    return np.asarray(quants.dequantize(data, qtype), dtype=np.float32).reshape(-1)


def render() -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for qtype in FLOATS + list(SCALES):
        rng = np.random.default_rng(SEED + int(qtype))
        if qtype in FLOATS:
            data = random_floats(rng, qtype, WEIGHTS_PER_TYPE)
        else:
            data = random_blocks(rng, qtype).reshape(-1)
        values = expected(qtype, data)
        assert values.dtype == np.float32 and values.size == WEIGHTS_PER_TYPE, qtype.name
        assert np.isfinite(values).all(), f"{qtype.name}: non-finite expected value"
        files[f"{qtype.name}.blocks"] = data.tobytes()
        files[f"{qtype.name}.f32"] = values.astype("<f4").tobytes()
    return files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    files = render()
    if args.check:
        stale = [n for n, b in files.items() if not (OUT / n).is_file() or (OUT / n).read_bytes() != b]
        for n in stale:
            print(f"stale fixture: {n}", file=sys.stderr)
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (OUT / name).write_bytes(data)
    total = sum(len(b) for b in files.values())
    print(f"wrote {len(files)} files, {total} bytes, to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
