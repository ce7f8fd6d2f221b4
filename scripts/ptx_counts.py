#!/usr/bin/env python3
"""ptx_counts.py: per-kernel instruction counts of PTX files, and the difference between two builds.

  python3 scripts/ptx_counts.py A.ptx [A2.ptx ...]            the count of each .entry's instructions
  python3 scripts/ptx_counts.py --diff DIR_BEFORE DIR_AFTER   per file and kernel: before, after, difference,
                                                              and whether the instruction text is the same

An instruction is a line of a kernel's body that is not a directive (.reg, .loc, ...), a label, a brace or a
comment. "same text" compares the instruction lines themselves (register names included), so a refactoring that
the compiler sees through shows 0 and same. Used for issue 13's split of qr_body (docs/measurements.md)."""
import os
import re
import sys

ENTRY = re.compile(r"^\.(?:visible |weak )?\.entry\s+(\S+?)\(")


def kernels(path):
    """{mangled kernel name: [instruction lines]} of one PTX file."""
    out, name, body = {}, None, None
    with open(path) as f:
        for line in f:
            m = ENTRY.match(line)
            if m:
                name, body = m.group(1), []
                continue
            if name is None:
                continue
            if line.startswith("}"):
                out[name] = body
                name = None
                continue
            s = line.split("//")[0].strip()
            if not s or s[0] in ".{}" or s.endswith(":") or s.startswith("$"):
                continue
            body.append(s)
    return out


def main(argv):
    if len(argv) == 3 and argv[0] == "--diff":
        a_dir, b_dir = argv[1], argv[2]
        tot = [0, 0, 0, 0]
        for fn in sorted(os.listdir(a_dir)):
            if not fn.endswith(".ptx"):
                continue
            ka, kb = kernels(os.path.join(a_dir, fn)), kernels(os.path.join(b_dir, fn))
            for k in sorted(set(ka) | set(kb)):
                na, nb = len(ka.get(k, [])), len(kb.get(k, []))
                same = ka.get(k) == kb.get(k)
                tot[0] += na; tot[1] += nb; tot[2] += 1; tot[3] += same
                print(f"{fn}\t{k}\t{na}\t{nb}\t{nb - na:+d}\t{'same' if same else 'DIFFERENT'}")
        print(f"total: {tot[2]} kernels, {tot[0]} -> {tot[1]} instructions ({tot[1] - tot[0]:+d}), "
              f"{tot[3]} of {tot[2]} with the same instruction text")
        return 0 if tot[3] == tot[2] else 1
    if not argv:
        print(__doc__)
        return 2
    for p in argv:
        for k, body in kernels(p).items():
            print(f"{os.path.basename(p)}\t{k}\t{len(body)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
