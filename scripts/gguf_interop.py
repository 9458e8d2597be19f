#!/usr/bin/env python3
"""GGUF interoperability with the reference `gguf` package (pinned in scripts/requirements.txt).

    gguf_interop.py write OUT.gguf SEED   write a file with the package's own GGUFWriter: metadata
                                          of several types and one tensor of every type Strata
                                          reads; next to it OUT.gguf.<tensor>.f32, each tensor
                                          dequantized by the package, and OUT.gguf.json, the
                                          metadata and tensor table as the package sees them.
    gguf_interop.py read IN.gguf          load a file (written by Strata) with GGUFReader and write
                                          the same IN.gguf.json and IN.gguf.<tensor>.f32 files.

tests/gguf_files.rs compares both directions with Strata's reader, writer and `strata dump`.
"""
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize

# Q2_0 is not in the package: it can neither write nor read it, so the interop set leaves it out.
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS"]
BLOCK = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q8_0": (32, 34), "Q6_K": (256, 210), "IQ2_XXS": (256, 66),
         "IQ2_XS": (256, 74), "IQ2_S": (256, 82), "IQ3_XXS": (256, 98), "IQ3_S": (256, 110), "IQ4_NL": (32, 18),
         "IQ4_XS": (256, 136)}
SCALE_AT = {"Q6_K": 208}


def dump(path: str, name: str, values: np.ndarray) -> None:
    values.astype(np.float32).reshape(-1).tofile(f"{path}.{name}.f32")


def write(path: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, "strata-test")
    w.add_uint32("test.u32", 123456)
    w.add_float32("test.f32", 0.25)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo gguf")
    w.add_array("test.strings", ["a", "bc", "", "déf"])
    w.add_array("test.ints", [1, -2, 3])
    w.add_int64("test.i64", -(1 << 40))
    expected = {}
    for i, name in enumerate(TYPES):
        per, nbytes = BLOCK[name]
        rows, k = 3, 512
        tname = f"t{i}.{name.lower()}"
        if name == "F32":
            data = rng.standard_normal((rows, k)).astype(np.float32)
            w.add_tensor(tname, data)
            values = data
        elif name == "F16":
            data = rng.standard_normal((rows, k)).astype(np.float16)
            w.add_tensor(tname, data)
            values = data.astype(np.float32)
        else:
            raw = rng.integers(0, 256, size=(rows, k // per * nbytes), dtype=np.uint8)
            if per > 1:  # finite fp16 scales: exponent field below all-ones
                blocks = raw.reshape(-1, nbytes)
                at = SCALE_AT.get(name, 0)
                blocks[:, at + 1] &= 0x7B
            w.add_tensor(tname, raw, raw_dtype=T[name])
            values = dequantize(raw, T[name])
        dump(path, tname, values)
        expected[tname] = {"type": name, "dims": [k, rows]}
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(f"{path}.json", "w") as f:
        json.dump({"tensors": expected}, f)


def scalar(field):
    if field.types[0].name == "STRING":
        return bytes(field.parts[field.data[0]]).decode()
    return field.parts[field.data[0]].tolist()[0]


def read(path: str) -> None:
    r = GGUFReader(path)
    meta = {}
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            continue
        if field.types[0].name == "ARRAY":
            if field.types[-1].name == "STRING":
                meta[name] = [bytes(field.parts[i]).decode() for i in field.data]
            else:
                meta[name] = [field.parts[i].tolist()[0] for i in field.data]
        else:
            meta[name] = scalar(field)
    tensors = {}
    for t in r.tensors:
        tensors[t.name] = {"type": t.tensor_type.name, "dims": [int(d) for d in t.shape], "offset": int(t.data_offset)}
        dump(path, t.name, dequantize(t.data, t.tensor_type))
    with open(f"{path}.json", "w") as f:
        json.dump({"metadata": meta, "tensors": tensors}, f)


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    elif len(sys.argv) == 3 and sys.argv[1] == "read":
        read(sys.argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
