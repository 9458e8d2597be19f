#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python, CPU) as the independent reference: tokens, logits and MTP logits of a GGUF file.

Run with the project venv's python (scripts/setup-llama.sh installs llama-cpp-python there).

    llama_ref.py tokenize MODEL
        stdin: a JSON list of strings; stdout: a JSON list with each string's token ids
        (no BOS added, special tokens parsed).
    llama_ref.py logits MODEL --ids 1,2,3 --out FILE [--ctx N] [--threads N]
        evaluates the ids as one batch and writes the logits of every position to FILE as
        little-endian f32, one row of n_vocab per position (row j: the logits after ids[j]);
        stdout: {"n_vocab": V, "rows": len(ids)}.
    llama_ref.py mtp MODEL --ids 1,2,3 --out FILE [--hidden-out FILE] [--hidden-in FILE] [--ctx N] [--threads N]
        a model with an MTP block (qwen35moe): evaluates the ids with the trunk, then llama.cpp's
        MTP block over positions p = 0..len(ids)-2, each fed the token ids[p+1] and the trunk's
        output-normed hidden state h_p; writes its logits to FILE as little-endian f32, one row of
        n_vocab per position (row p: the MTP's logits for the token at p+2). --hidden-out: the
        trunk's h_p of every position, len(ids) rows of n_embd f32. --hidden-in: feed the MTP block
        these h_p instead (at least len(ids)-1 rows of n_embd little-endian f32; another
        implementation's trunk), so that the block alone is compared.
        stdout: {"n_vocab": V, "n_embd": E, "rows": len(ids)-1}.

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


def mtp(args):
    """llama.cpp's MTP block over a sequence, as this llama.cpp (0c1e570) runs it:

    1. the model loaded with llama_model_params.load_mtp (else the MTP block's tensors are skipped);
    2. a default (trunk) context with llama_set_embeddings_nextn(ctx, true, false), the ids
       decoded as one llama_batch with every position an output, and h_p =
       llama_get_embeddings_nextn_ith(ctx, p): the trunk's output-normed hidden state t_h_nextn;
    3. a second context with ctx_type LLAMA_CONTEXT_TYPE_MTP (its memory: a KV cache of the MTP
       block's attention only), fed one llama_batch_ext through llama_process(DECODE): per
       position p an entry with llama_batch_ext_add_token(seq 0, ids[p+1]),
       llama_batch_ext_set_pos(p), llama_batch_ext_set_embd_token(h_p) (the MTP context's input
       embedding width is n_embd_out, the hidden state's) and llama_batch_ext_set_output_logits;
       the logits by llama_get_logits_ith.
    Both contexts without flash attention, as `logits` (the Llama class's default): this trunk's
    logits are `logits`'s to the bit (with flash attention, MTP rows differ by NMSE 2e-4 to 5e-4).

    llama_batch_ext_set_embd_state ("MTP: state from N layers of the target model") is a stub in
    this build that returns false, and ctx_other does not carry h over: an MTP entry without an
    embedding runs with h = 0.
    """
    try:
        ids = [int(t) for t in args.ids.split(",") if t.strip()]
    except ValueError as e:
        raise Refused(f"--ids must be comma-separated integers: {e}") from e
    if len(ids) < 2:
        raise Refused("--ids needs at least two ids (the MTP at p reads the token at p+1)")
    n_ctx = args.ctx or max(len(ids), 256)
    if n_ctx < len(ids):
        raise Refused(f"--ctx {n_ctx} is shorter than the {len(ids)} ids")
    llama_cpp, log = load_llama()
    try:
        from llama_cpp import llama_cpp_ext as ext
    except (ImportError, AttributeError) as e:
        raise Refused(f"this llama-cpp-python has no MTP bindings (llama_cpp_ext): {e}") from e
    if not os.path.isfile(args.model):
        raise Refused(f"model file not found: {args.model}")

    def said():
        detail = "\n  ".join("".join(log).strip().splitlines()[-12:])
        return f"\n  llama.cpp said:\n  {detail}" if detail else ""

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.load_mtp = True
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        raise Refused(f"llama.cpp refused {args.model}" + said())
    contexts, batches = [], []
    try:
        if llama_cpp.llama_model_n_layer_nextn(model) < 1:
            raise Refused(f"{args.model} has no MTP block (nextn_predict_layers is 0)")
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        n_embd = llama_cpp.llama_model_n_embd(model)
        bad = [t for t in ids if not 0 <= t < n_vocab]
        if bad:
            raise Refused(f"ids {bad[:8]} outside the vocabulary of {n_vocab}")

        def context(ctx_type):
            p = llama_cpp.llama_context_default_params()
            # One batch (n_batch = n_ubatch = n_ctx): every position from one graph evaluation.
            p.n_ctx = p.n_batch = p.n_ubatch = n_ctx
            p.n_threads = p.n_threads_batch = args.threads
            p.ctx_type = ctx_type
            # As `logits` (the Llama class's default): its trunk logits are these, to the bit.
            p.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            ctx = llama_cpp.llama_init_from_model(model, p)
            if not ctx:
                kind = "an MTP" if ctx_type == llama_cpp.LLAMA_CONTEXT_TYPE_MTP else "a"
                raise Refused(f"llama.cpp cannot make {kind} context for {args.model}" + said())
            contexts.append(ctx)
            return ctx

        def rows(ptr, i, n, what):
            if not ptr:
                raise Refused(f"llama.cpp has no {what} for row {i}" + said())
            return np.ctypeslib.as_array(ptr, (n,)).copy()

        # The trunk, every position an output, with its nextn hidden states.
        trunk = context(llama_cpp.LLAMA_CONTEXT_TYPE_DEFAULT)
        ext.llama_set_embeddings_nextn(trunk, True, False)
        batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
        try:
            for i, t in enumerate(ids):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, True
                batch.seq_id[i][0] = 0
            batch.n_tokens = len(ids)
            rc = llama_cpp.llama_decode(trunk, batch)
        finally:
            llama_cpp.llama_batch_free(batch)
        if rc != 0:
            raise Refused(f"llama.cpp failed to evaluate the {len(ids)} ids with the trunk (llama_decode {rc})" + said())
        hidden = np.stack([rows(ext.llama_get_embeddings_nextn_ith(trunk, i), i, n_embd, "nextn hidden state") for i in range(len(ids))])
        hidden = np.ascontiguousarray(hidden, dtype="<f4")
        fed = hidden
        if args.hidden_in:
            fed = np.fromfile(args.hidden_in, dtype="<f4")
            if fed.size % n_embd or fed.size // n_embd < len(ids) - 1:
                raise Refused(f"--hidden-in {args.hidden_in}: {fed.size} f32 are not at least {len(ids) - 1} rows of {n_embd}")
            fed = np.ascontiguousarray(fed.reshape(-1, n_embd))
            if not np.isfinite(fed).all():
                raise Refused(f"--hidden-in {args.hidden_in} holds non-finite values")

        # The MTP block: position p reads ids[p+1] and h_p.
        mctx = context(llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
        b = llama_cpp.llama_batch_ext_init(mctx)
        if not b:
            raise Refused("llama_batch_ext_init failed for the MTP context" + said())
        batches.append(b)
        f32p = ctypes.POINTER(ctypes.c_float)
        for p in range(len(ids) - 1):
            idx = llama_cpp.llama_batch_ext_add_token(b, 0, ids[p + 1])
            if idx < 0:
                raise Refused(f"llama_batch_ext_add_token refused position {p} ({idx})" + said())
            pos = llama_cpp.llama_pos(p)
            h = llama_cpp.llama_embd(fed[p].ctypes.data_as(f32p), 1, n_embd)
            for name, ok in [
                ("llama_batch_ext_set_pos", llama_cpp.llama_batch_ext_set_pos(b, idx, ctypes.byref(pos))),
                ("llama_batch_ext_set_embd_token", llama_cpp.llama_batch_ext_set_embd_token(b, idx, h)),
                ("llama_batch_ext_set_output_logits", llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)),
            ]:
                if not ok:
                    raise Refused(f"{name} refused position {p}" + said())
        rc = llama_cpp.llama_process(mctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b)
        if rc != 0:
            raise Refused(f"llama.cpp failed to run the MTP block over {len(ids) - 1} positions (llama_process {rc})" + said())
        out = np.ascontiguousarray(
            np.stack([rows(llama_cpp.llama_get_logits_ith(mctx, i), i, n_vocab, "MTP logits") for i in range(len(ids) - 1)]),
            dtype="<f4",
        )
    finally:
        for b in batches:
            llama_cpp.llama_batch_ext_free(b)
        for ctx in reversed(contexts):
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    if not np.isfinite(out).all() or not np.isfinite(hidden).all():
        raise Refused("llama.cpp produced non-finite MTP logits or hidden states")
    out.tofile(args.out)
    if args.hidden_out:
        hidden.tofile(args.hidden_out)
    json.dump({"n_vocab": n_vocab, "n_embd": n_embd, "rows": len(ids) - 1}, sys.stdout)
    sys.stdout.write("\n")


def main():
    p = argparse.ArgumentParser(description="llama.cpp as the reference: tokens, logits and MTP logits of a GGUF file.")
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
    m = sub.add_parser("mtp", help="write llama.cpp's MTP logits of positions 0..len(ids)-2 as little-endian f32 rows")
    m.add_argument("model")
    m.add_argument("--ids", required=True, help="token ids, comma-separated (at least two)")
    m.add_argument("--out", required=True, help="output file: len(ids)-1 rows of n_vocab f32")
    m.add_argument("--hidden-out", help="also write the trunk's hidden states: len(ids) rows of n_embd f32")
    m.add_argument("--hidden-in", help="feed the MTP these hidden states (rows of n_embd f32) instead of the trunk's")
    m.add_argument("--ctx", type=int, default=0, help="context size (default: max(len(ids), 256))")
    m.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    m.set_defaults(run=mtp)
    args = p.parse_args()
    try:
        args.run(args)
    except Refused as e:
        print(f"llama_ref.py {args.command}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
