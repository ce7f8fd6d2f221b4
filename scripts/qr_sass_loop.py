#!/usr/bin/env python3
"""qr_sass_loop.py: the static instruction mix of the stage loops of one kernel in a SASS dump (issue 11).

    cuobjdump -sass OBJ > dump.sass
    python3 scripts/qr_sass_loop.py dump.sass FUNCTION-PREFIX [--d 2] [--hot]

Finds the function (the first whose mangled name starts with FUNCTION-PREFIX), then its loops (a branch to a
lower address closes a loop from its target to the branch), and for every loop that holds HMMA prints its
address range, its instruction count, the count per weight stage (the loop's instructions / D, the weight
stages one iteration computes: qr_body's register stages QR_D) and the opcodes (the mnemonic before the first
dot) per stage, grouped: tensor products, the fold's FFMA, code unpacking (LOP3, SHF, PRMT), loads and copies,
synchronisation, and the rest (address and index arithmetic, predicates, branches). NT = HMMA / (8 D) is the
loop's n-tile count for 4-bit g64 (8 HMMA per n-tile and 64-code stage). --hot also prints the instructions on
the path that takes no forward branch out of a block guarded by `@P BRA` (a rough "fall-through" path; the
loop's static count is what the targets of issue 11 are written in).

cuobjdump is the CUDA toolkit's; where nvcc came without it (this project's CPU machines), the cuobjdump of Debian's
non-free nvidia-cuda-toolkit package (12.4) reads nvcc 13's sm_90 objects: download that one package and unpack it
(`apt-get download nvidia-cuda-toolkit`, `dpkg -x`) with a sources list that has the non-free component; nothing
needs installing. The SASS text is parsed with regular expressions.
"""
import argparse
import re
import sys
from collections import Counter

LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
GROUPS = [
    ("tensor", {"HMMA"}),
    ("fold", {"FFMA", "FMUL", "FADD"}),
    ("unpack", {"LOP3", "SHF", "PRMT"}),
    ("loads", {"LDG", "LDS", "LDGSTS", "LDSM", "CCTL", "STS", "LDL", "STL"}),
    ("sync", {"BAR", "DEPBAR", "LDGDEPBAR", "BSSY", "BSYNC", "WARPSYNC"}),
]


def parse(path, prefix):
    insts, on, done = [], False, False
    with open(path) as f:
        for line in f:
            if "Function :" in line:
                if on:
                    break
                on = line.split("Function :")[1].strip().startswith(prefix) and not done
                done = done or on
                name = line.split("Function :")[1].strip() if on else None
                if on:
                    fname = name
                continue
            if not on:
                continue
            m = LINE.match(line)
            if m:
                addr = int(m.group(1), 16)
                op = m.group(3)
                insts.append((addr, (m.group(2) or "").strip(), op, m.group(4).strip()))
    if not insts:
        sys.exit("no function starting with %s in %s" % (prefix, path))
    return fname, insts


def branch_target(inst):
    if inst[2].split(".")[0] == "BRA":
        m = re.search(r"0x([0-9a-f]+)", inst[3])
        if m:
            return int(m.group(1), 16)
    return None


def group_of(op):
    base = op.split(".")[0]
    for g, ops in GROUPS:
        if base in ops:
            return g
    return "other"


def main():
    ap = argparse.ArgumentParser(description="static instruction mix of a kernel's stage loops in a SASS dump")
    ap.add_argument("sass")
    ap.add_argument("prefix")
    ap.add_argument("--d", type=int, default=2, help="weight stages per loop iteration (QR_D)")
    ap.add_argument("--hot", action="store_true", help="also the fall-through path")
    o = ap.parse_args()
    path, prefix, d, hot = o.sass, o.prefix, o.d, o.hot
    fname, insts = parse(path, prefix)
    print("# %s: %d instructions (whole function)" % (fname, len(insts)))
    idx = {a: i for i, (a, _, _, _) in enumerate(insts)}
    loops = []
    for i, ins in enumerate(insts):
        t = branch_target(ins)
        if t is not None and t <= ins[0] and t in idx:
            body = insts[idx[t]:i + 1]
            nh = sum(1 for x in body if x[2].startswith("HMMA"))
            if nh:
                loops.append((t, ins[0], body, nh))
    # innermost loops only (a loop holding another HMMA loop is reported once, without double counting)
    inner = [l for l in loops if not any(o is not l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]
    for t, end, body, nh in inner:
        n = len(body)
        print("\n## loop 0x%x-0x%x: %d instructions, %d HMMA (NT %.3g at D %d): %.1f per weight stage"
              % (t, end, n, nh, nh / (8.0 * d), d, n / d))
        c = Counter(x[2].split(".")[0] for x in body)
        g = Counter()
        for op, k in c.items():
            g[group_of(op)] += k
        print("groups per stage: " + ", ".join("%s %.1f" % (k, g[k] / d) for k, _ in GROUPS + [("other", 0)]))
        print("opcodes per stage: " + ", ".join("%s %.1f" % (op, k / d) for op, k in c.most_common()))
        if hot:
            path_n, j = 0, 0
            hc = Counter()
            while j < len(body):
                a, pred, op, rest = body[j]
                path_n += 1
                hc[op.split(".")[0]] += 1
                tgt = branch_target(body[j])
                if tgt is not None and not pred and tgt > a and tgt <= end:  # unconditional forward jump
                    j = next((k for k in range(j, len(body)) if body[k][0] >= tgt), len(body))
                    continue
                j += 1
            print("fall-through path: %d instructions (%.1f per stage): " % (path_n, path_n / d)
                  + ", ".join("%s %d" % (op, k) for op, k in hc.most_common()))


if __name__ == "__main__":
    main()
