#!/usr/bin/env python3
"""qr_src_counts.py: where a kernel's instructions and stalls go, from Nsight Compute's source page (issue 11).

    ncu --set full --import-source no -k regex:qr_kernel ... -f -o /tmp/r APP ...
    ncu -i /tmp/r.ncu-rep --page source --csv --print-source sass | gzip > src.csv.gz
    python3 scripts/qr_src_counts.py src.csv.gz [--json]

For every profiled kernel in the file (a kernel profiled twice is counted once), prints:
  - the executed warp instructions ("Instructions Executed", summed over the SASS lines), the HMMA among them, and
    per HMMA the executed instructions of each class (CLASSES below: decode, fold, uniform/predicate bookkeeping,
    integer and address arithmetic, loads, branches, synchronisation, the HMMA itself; anything else by opcode);
  - the warp-stall samples ("Warp Stall Sampling (All Samples)") by reason (the stall_* columns) and by class.
  - with --top N: the N SASS lines with the most stall samples, each with its share of the kernel's samples, its
    offset in the function, its executed count, its three largest stall reasons and the line itself (where the warps
    wait: a line of the stage loop or of the prologue / epilogue, by its offset against the loop's, qr_sass_loop.py).
The executed counts are exact (ncu counts every executed instruction); the stall samples are samples.
Session 20 read docs/results/h100-s20/call2_qr_src.csv.gz this way: 11.0 instructions per HMMA for the 26B gate/up.
"""
import argparse
import csv
import gzip
import io
import json
import re
import sys
from collections import Counter

# opcode (the mnemonic before the first dot) -> class; the order of CLASSES is the order printed
CLASSES = [
    ("tensor", {"HMMA"}),
    ("decode", {"LOP3", "SHF", "PRMT", "HADD2", "HFMA2", "HMUL2", "I2F", "F2FP"}),
    ("fold", {"FFMA", "FMUL", "FADD"}),
    ("uniform/predicate", {"PLOP3", "UISETP", "UIADD3", "ULEA", "UMOV", "R2UR", "ISETP", "USEL", "ULOP3", "USHF",
                           "UIMAD", "S2UR", "S2R", "UPRMT", "USHL", "USHR", "UFLO", "UPOPC"}),
    ("integer", {"IMAD", "IADD3", "LEA", "MOV", "SEL", "IMNMX", "IABS", "VIADD", "VIMNMX", "VIADDMNMX", "CS2R"}),
    ("loads", {"LDG", "LDS", "LDGSTS", "LDSM", "CCTL", "STS", "LDL", "STL", "LDC", "ULDC", "STG"}),
    ("branch", {"BRA", "EXIT", "BSSY", "BSYNC", "CALL", "RET", "PREEXIT"}),
    ("sync", {"BAR", "DEPBAR", "LDGDEPBAR", "WARPSYNC", "MEMBAR", "SYNCS"}),
]
EXEC = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"
PRED = re.compile(r"^@!?U?P[0-9T]+\s+")


def opcode(source):
    """The mnemonic of a SASS line ("@P3 BRA 0x..." -> "BRA", "HMMA.16816.F32.BF16 ..." -> "HMMA")."""
    return PRED.sub("", source.strip()).split(" ")[0].split(".")[0]


def klass(op):
    for name, ops in CLASSES:
        if op in ops:
            return name
    return "other:" + op


def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def kernels(text):
    """[(kernel name, header, rows)] of a source-page CSV (each kernel's table starts with a "Kernel Name" line)."""
    out, seen = [], set()
    for block in text.split('"Kernel Name"')[1:]:
        lines = block.split("\n")
        name = next((f for f in next(csv.reader([lines[0]])) if f.strip()), "?")
        rd = csv.reader(io.StringIO("\n".join(lines[1:])))
        try:
            hdr = next(rd)
        except StopIteration:
            continue
        rows = [r for r in rd if len(r) == len(hdr)]
        key = (name, len(rows), sum(num(r[hdr.index(EXEC)]) for r in rows) if EXEC in hdr else 0)
        if key in seen or not rows:
            continue
        seen.add(key)
        out.append((name, hdr, rows))
    return out


def summarize(name, hdr, rows):
    """The counts of one kernel (a dict: executed, hmma, per_hmma by class, stall reasons and classes in %)."""
    if EXEC not in hdr or "Source" not in hdr:
        raise ValueError(f"{name}: the source page has no '{EXEC}' or 'Source' column")
    H = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "(Not" not in h]
    ex, st_reason, st_class = Counter(), Counter(), Counter()
    for r in rows:
        k = klass(opcode(r[H["Source"]]))
        ex[k] += num(r[H[EXEC]])
        if SAMPLES in H:
            st_class[k] += num(r[H[SAMPLES]])
        for h in reasons:
            st_reason[h[len("stall_"):]] += num(r[H[h]])
    total, hmma = sum(ex.values()), ex["tensor"]
    samples = sum(st_class.values())
    return {
        "kernel": name, "instructions": len(rows), "executed": total, "hmma": hmma,
        "per_hmma": {k: v / hmma for k, v in ex.most_common()} if hmma else {},
        "executed_per_hmma": total / hmma if hmma else None,
        "samples": samples,
        "stall_reasons_pct": {k: 100 * v / samples for k, v in st_reason.most_common()} if samples else {},
        "stall_classes_pct": {k: 100 * v / samples for k, v in st_class.most_common()} if samples else {},
    }


def top_lines(hdr, rows, n):
    """The n lines with the most stall samples: [(share %, offset, executed, [(reason, share % of the line)], source)]."""
    H = {h: i for i, h in enumerate(hdr)}
    if SAMPLES not in H:
        return []
    reasons = [h for h in hdr if h.startswith("stall_") and "(Not" not in h]
    total = sum(num(r[H[SAMPLES]]) for r in rows) or 1.0
    base = None
    out = []
    for r in rows:
        try:
            addr = int(r[H["Address"]], 16) if "Address" in H else 0
        except ValueError:
            addr = 0
        base = addr if base is None else min(base, addr)
        sm = num(r[H[SAMPLES]])
        why = sorted(((h[len("stall_"):], num(r[H[h]])) for h in reasons), key=lambda x: -x[1])[:3]
        out.append((sm, addr, num(r[H[EXEC]]) if EXEC in H else 0.0, why, r[H["Source"]].strip()))
    out.sort(key=lambda x: -x[0])
    return [(100 * sm / total, addr - (base or 0), ex, [(k, 100 * v / sm) for k, v in why if v > 0] if sm else [], src)
            for sm, addr, ex, why, src in out[:n]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv output (.gz or plain)")
    ap.add_argument("--json", action="store_true", help="one JSON object per kernel instead of the text")
    ap.add_argument("--top", type=int, default=0, help="also the N SASS lines with the most stall samples")
    a = ap.parse_args(argv)
    opener = gzip.open if a.csv.endswith(".gz") else open
    with opener(a.csv, "rt") as f:
        text = f.read()
    ks = kernels(text)
    if not ks:
        print(f"qr_src_counts: {a.csv}: no kernel table (is it ncu's --page source --csv output?)", file=sys.stderr)
        return 1
    for name, hdr, rows in ks:
        s = summarize(name, hdr, rows)
        if a.json:
            print(json.dumps(s))
            continue
        print(f"== {name[:160]}")
        if s["hmma"]:
            print(f"   executed {s['executed']:.0f} warp instructions, {s['hmma']:.0f} HMMA: "
                  f"{s['executed_per_hmma']:.2f} per HMMA; per HMMA by class: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in s["per_hmma"].items()))
        else:
            print(f"   executed {s['executed']:.0f} warp instructions, no HMMA")
        if s["samples"]:
            print(f"   {s['samples']:.0f} stall samples, by reason: "
                  + ", ".join(f"{k} {v:.1f} %" for k, v in list(s["stall_reasons_pct"].items())[:10]))
            print("   by class: " + ", ".join(f"{k} {v:.1f} %" for k, v in list(s["stall_classes_pct"].items())[:10]))
        if a.top:
            print(f"   the {a.top} lines with the most samples (share of the kernel's samples, offset, executed, reasons):")
            for pct, off, ex, why, src in top_lines(hdr, rows, a.top):
                print(f"   {pct:5.1f} %  +0x{off:05x}  {ex:9.0f}  "
                      + ", ".join(f"{k} {v:.0f}%" for k, v in why).ljust(44) + "  " + src[:90])
    return 0


if __name__ == "__main__":
    sys.exit(main())
