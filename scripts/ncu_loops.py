#!/usr/bin/env python3
"""Where one kernel's instructions and stalls go, loop by loop, from an ncu SASS page.

Input: the CSV that `ncu --import REPORT.ncu-rep --page source --csv --print-source sass`
prints for a report collected with `--section SourceCounters` (and `WarpStateStats` for the
stall columns). Its first line names the kernel, its second is the header, then one row per
SASS instruction in address order.

Output: the stall reasons over the whole kernel; then each innermost loop (a backward branch
and the instructions from its target to it, loops nested inside another counted with the
innermost) and the straight code between them, with their share of the executed warp
instructions and of the stall samples, their fused multiply-adds and shared loads; then the
instructions with the most samples and their main reasons. Offsets are from the kernel's first
instruction, as `cuobjdump -sass` prints them.

    python3 scripts/ncu_loops.py page.csv [--top 20]
"""
import argparse
import csv
import re
import signal
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
STALL = re.compile(r"^stall_[a-z_]+$")


def number(text):
    try:
        return float(text)
    except ValueError:
        return 0.0


def opcode(sass):
    """The instruction's opcode without its predicate and modifiers (`@P0 LDS.128 R4, [R2]` ->
    `LDS`)."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def read_page(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        sys.exit(f"{path}: {e}")
    if len(rows) < 3 or len(rows[0]) < 2:
        sys.exit(f"{path}: not an ncu source page (a kernel line, a header, instruction rows)")
    kernel, header = rows[0][1], rows[1]
    for column in ("Address", "Source", SAMPLES, EXECUTED):
        if column not in header:
            sys.exit(f"{path}: no column {column!r} (collect --section SourceCounters)")
    at = {name: i for i, name in enumerate(header)}
    stalls = [name for name in header if STALL.match(name)]
    code = []
    for line, row in enumerate(rows[2:], start=3):
        if len(row) < len(header):
            sys.exit(f"{path}:{line}: {len(row)} columns where the header has {len(header)}")
        try:
            address = int(row[at["Address"]], 16)
        except ValueError:
            sys.exit(f"{path}:{line}: no instruction address in {row[:2]}")
        code.append({
            "address": address,
            "sass": row[at["Source"]].strip(),
            "samples": number(row[at[SAMPLES]]),
            "executed": number(row[at[EXECUTED]]),
            "stalls": {name: number(row[at[name]]) for name in stalls},
        })
    return kernel, stalls, code


def loops(code):
    """(first, last) instruction indices of each innermost loop: a branch to its own or an
    earlier address (ncu prints branch targets as addresses) closes a loop from its target; a
    loop that holds another is dropped."""
    index = {ins["address"]: i for i, ins in enumerate(code)}
    found = set()
    for i, ins in enumerate(code):
        target = re.search(r"0x([0-9a-f]+)\s*$", ins["sass"]) if opcode(ins["sass"]) == "BRA" else None
        j = index.get(int(target.group(1), 16)) if target else None
        if j is not None and j <= i:
            found.add((j, i))
    return sorted((a, b) for a, b in found if not any((c, d) != (a, b) and a <= c and d <= b for c, d in found))


def regions(code):
    """The innermost loops and the straight runs between them, in address order."""
    spans, at = [], 0
    for a, b in loops(code):
        if a < at:
            continue
        if a > at:
            spans.append(("code", at, a - 1))
        spans.append(("loop", a, b))
        at = b + 1
    if at < len(code):
        spans.append(("code", at, len(code) - 1))
    return spans


def report(kernel, stalls, code, top):
    offset = lambda ins: ins["address"] - code[0]["address"]
    samples = sum(ins["samples"] for ins in code) or 1.0
    executed = sum(ins["executed"] for ins in code) or 1.0
    ffma = sum(ins["executed"] for ins in code if opcode(ins["sass"]) == "FFMA")
    print(f"{kernel}: {executed / 1e6:.3f} M warp instructions executed, {ffma / 1e6:.3f} M of them FFMA "
          f"({executed / max(ffma, 1):.2f} a FFMA); {samples:.0f} stall samples")
    totals = sorted(((sum(ins["stalls"][s] for ins in code), s) for s in stalls), reverse=True)
    print("stall reasons: " + ", ".join(f"{s[6:]} {100 * v / samples:.1f} %" for v, s in totals if v))
    print(f"{'kind':4} {'from':>6} {'to':>6} {'instr':>5} {'% executed':>10} {'% samples':>9} {'FFMA':>5} {'LDS':>4}")
    for kind, a, b in regions(code):
        part = code[a:b + 1]
        ex = sum(ins["executed"] for ins in part)
        sa = sum(ins["samples"] for ins in part)
        if ex == 0 and sa == 0:
            continue
        count = lambda op: sum(1 for ins in part if opcode(ins["sass"]) == op)
        print(f"{kind:4} {offset(part[0]):6x} {offset(part[-1]):6x} {len(part):5} {100 * ex / executed:10.1f} "
              f"{100 * sa / samples:9.1f} {count('FFMA'):5} {count('LDS'):4}")
    print(f"the {top} instructions with the most samples:")
    for ins in sorted(code, key=lambda ins: -ins["samples"])[:top]:
        reasons = sorted(((v, s[6:]) for s, v in ins["stalls"].items() if v), reverse=True)[:3]
        print(f"  {offset(ins):6x} {ins['sass'][:52]:52} {ins['samples']:6.0f} samples, executed {ins['executed']:9.0f}  "
              + " ".join(f"{s} {v:.0f}" for v, s in reasons))


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into `head`
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=20, help="instructions listed by samples (default 20)")
    args = parser.parse_args()
    kernel, stalls, code = read_page(args.page)
    report(kernel, stalls, code, args.top)


if __name__ == "__main__":
    main()
