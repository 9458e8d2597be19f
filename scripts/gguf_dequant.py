#!/usr/bin/env python3
"""Dequantizes raw GGUF blocks with the reference `gguf` package (pinned in
scripts/requirements.txt): the independent check of Strata's own block decoding.

usage: gguf_dequant.py TYPE IN.bin OUT.f32   (TYPE as ggml names it: Q8_0, IQ4_NL, ...)
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    qtype = GGMLQuantizationType[sys.argv[1]]
    raw = np.fromfile(sys.argv[2], dtype=np.uint8)
    values = dequantize(raw, qtype).astype(np.float32, copy=False)
    values.tofile(sys.argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
