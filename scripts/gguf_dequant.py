#!/usr/bin/env python3
"""Dequantizes raw GGUF blocks with the reference `gguf` package (pinned in
scripts/requirements.txt): the independent check of Strata's own block decoding. Q2_0, which the
package lacks, is decoded from FORMATS.md's formula, written here independently.

usage: gguf_dequant.py TYPE IN.bin OUT.f32   (TYPE as ggml names it: Q8_0, IQ4_NL, ...)
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize


def dequantize_q2_0(raw: np.ndarray) -> np.ndarray:
    """Q2_0, which the gguf package lacks, from the formula in FORMATS.md: 18-byte blocks of
    fp16 d and 16 bytes of 2-bit codes (four per byte, least significant first); y = d * (code - 1)."""
    blocks = raw.reshape(-1, 18)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 2:]
    codes = np.stack([(qs >> (2 * i)) & 3 for i in range(4)], axis=-1).reshape(-1, 64)
    return (d * (codes.astype(np.float32) - 1.0)).reshape(-1)


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    raw = np.fromfile(sys.argv[2], dtype=np.uint8)
    if sys.argv[1] == "Q2_0":
        values = dequantize_q2_0(raw)
    else:
        values = dequantize(raw, GGMLQuantizationType[sys.argv[1]]).astype(np.float32, copy=False)
    values.tofile(sys.argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
