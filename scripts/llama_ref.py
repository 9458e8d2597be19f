#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python, CPU) as the independent reference: tokens and logits of a GGUF file.

Run with the project venv's python (scripts/setup-llama.sh installs llama-cpp-python there).

    llama_ref.py tokenize MODEL
        stdin: a JSON list of strings; stdout: a JSON list with each string's token ids
        (no BOS added, special tokens parsed).
    llama_ref.py logits MODEL --ids 1,2,3 --out FILE [--ctx N] [--threads N]
        evaluates the ids as one batch and writes the logits of every position to FILE as
        little-endian f32, one row of n_vocab per position (row j: the logits after ids[j]);
        stdout: {"n_vocab": V, "rows": len(ids)}.

Errors (missing file, llama.cpp refusing the model, ids out of range) go to stderr with what
llama.cpp logged, and the exit status is 1 (2 for bad arguments).
"""
import argparse
import ctypes
import json
import os
import sys

import numpy as np


# ggml_log_level in this llama.cpp (llama_cpp/_logger.py still names the older numbering).
GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT = 3, 4, 5


class Refused(Exception):
    """What went wrong, said for the person running the test."""


def load_llama():
    """Imports llama_cpp and keeps llama.cpp's warnings and errors in a list, so a refusal can say
    why (with verbose=False llama-cpp-python sends llama.cpp's stderr to /dev/null)."""
    try:
        import llama_cpp
    except ImportError as e:
        raise Refused(f"cannot import llama_cpp ({e}): run scripts/setup-llama.sh") from e
    log, last = [], [0]

    @llama_cpp.llama_log_callback
    def keep(level, text, user_data):
        if level != GGML_LOG_LEVEL_CONT:
            last[0] = level
        if last[0] in (GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR):
            log.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
    load_llama.keep = keep  # the C side holds only a pointer: keep the callback alive
    return llama_cpp, log


def open_model(path, log, **params):
    if not os.path.isfile(path):
        raise Refused(f"model file not found: {path}")
    import llama_cpp

    try:
        return llama_cpp.Llama(model_path=path, verbose=False, **params)
    except (ValueError, RuntimeError) as e:
        detail = "\n  ".join("".join(log).strip().splitlines()[-12:])
        raise Refused(f"llama.cpp refused {path}: {e}" + (f"\n  llama.cpp said:\n  {detail}" if detail else "")) from e


def tokenize(args):
    llama_cpp, log = load_llama()
    try:
        texts = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        raise Refused(f"stdin is not JSON: {e}") from e
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise Refused("stdin must be a JSON list of strings")
    model = open_model(args.model, log, vocab_only=True)
    # llama.cpp aborts the process when asked to tokenize without a tokenizer.
    if llama_cpp.llama_vocab_type(model._model.vocab) == llama_cpp.LLAMA_VOCAB_TYPE_NONE:
        raise Refused(f"{args.model} has no tokenizer (llama.cpp's vocab type is none)")
    json.dump([model.tokenize(t.encode(), add_bos=False, special=True) for t in texts], sys.stdout)
    sys.stdout.write("\n")


def logits(args):
    try:
        ids = [int(t) for t in args.ids.split(",") if t.strip()]
    except ValueError as e:
        raise Refused(f"--ids must be comma-separated integers: {e}") from e
    if not ids:
        raise Refused("--ids is empty")
    n_ctx = args.ctx or max(len(ids), 256)
    if n_ctx < len(ids):
        raise Refused(f"--ctx {n_ctx} is shorter than the {len(ids)} ids")
    _, log = load_llama()
    # One batch (n_batch = n_ubatch = n_ctx): every position's logits from one graph evaluation.
    model = open_model(args.model, log, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                       n_threads=args.threads, n_threads_batch=args.threads)
    n_vocab = model.n_vocab()
    bad = [t for t in ids if not 0 <= t < n_vocab]
    if bad:
        raise Refused(f"ids {bad[:8]} outside the vocabulary of {n_vocab}")
    try:
        model.eval(ids)
    except RuntimeError as e:
        raise Refused(f"llama.cpp failed to evaluate the {len(ids)} ids: {e}") from e
    rows = np.ascontiguousarray(model.scores[: len(ids)], dtype="<f4")
    if not np.isfinite(rows).all():
        raise Refused("llama.cpp produced non-finite logits")
    rows.tofile(args.out)
    json.dump({"n_vocab": n_vocab, "rows": len(ids)}, sys.stdout)
    sys.stdout.write("\n")


def main():
    p = argparse.ArgumentParser(description="llama.cpp as the reference: tokens and logits of a GGUF file.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tokenize", help="stdin: JSON list of strings; stdout: JSON list of id lists")
    t.add_argument("model")
    t.set_defaults(run=tokenize)
    g = sub.add_parser("logits", help="write every position's logits as little-endian f32 rows")
    g.add_argument("model")
    g.add_argument("--ids", required=True, help="token ids, comma-separated")
    g.add_argument("--out", required=True, help="output file: len(ids) rows of n_vocab f32")
    g.add_argument("--ctx", type=int, default=0, help="context size (default: max(len(ids), 256))")
    g.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    g.set_defaults(run=logits)
    args = p.parse_args()
    try:
        args.run(args)
    except Refused as e:
        print(f"llama_ref.py {args.command}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
