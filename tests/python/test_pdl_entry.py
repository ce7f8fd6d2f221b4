"""Every CUDA kernel launched through DG_LAUNCH begins with DG_PDL_ENTRY().

With programmatic dependent launch (on unless DGEMMA_PDL=0, src/cuda/common.cuh) each launch may be placed while the kernel before it in the
stream is still running; a kernel is correct then only if griddepcontrol.wait (inside DG_PDL_ENTRY)
runs before its first global read or write. This test parses every __global__ function of src/cuda
and of the dev/cuda labs that include the backend's headers and fails, naming file, line and kernel,
when the body's first statement is not DG_PDL_ENTRY() (or DG_PDL_LAUNCH(), calls of *_prewait functions only,
then DG_PDL_WAIT(): common.cuh's split entry for qr_kernel's QR_PREWAIT, whose reads before the wait only choose
L2 prefetch addresses, never a result). A prewait call's arguments must be plain names (no expression that loads,
stores or calls), and each *_prewait function called must be defined in these sources with no store in its own
body (an element, pointer or member assignment, an atomic, asm, a store intrinsic): by the text, so a store in a
function the prewait calls is not seen, nor is whether its reads before the wait may be stale (qr_prewait's comment
argues that for its own). It also checks that the parser finds the
kernels it must (a parser that found none would pass everything).

plain python3:  python3 -m unittest discover -s tests/python -v
"""

import glob
import os
import re
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def strip_comments(src):
    """The source with comments replaced by spaces (line numbers kept)."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"/\*.*?\*/|//[^\n]*", blank, src, flags=re.S)


def close_paren(src, i):
    """The index of the ")" that closes the "(" at i."""
    depth = 0
    while True:
        if src[i] == "(":
            depth += 1
        elif src[i] == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1


def kernels(path):
    """(line, name, first statement) of each __global__ function defined in path."""
    with open(path, encoding="utf-8") as f:
        src = strip_comments(f.read())
    out = []
    for m in re.finditer(r"\b__global__\b", src):
        if src[: m.start()].rstrip().endswith("#define"):
            continue
        pos = m.end()
        while True:  # the parameter list: the first "(" not of __launch_bounds__
            i = src.index("(", pos)
            name = re.findall(r"(\w+)\s*$", src[m.end():i])
            j = close_paren(src, i)
            if not name or name[0] != "__launch_bounds__":
                break
            pos = j + 1
        brace, semi = src.find("{", j), src.find(";", j)
        if brace == -1 or (semi != -1 and semi < brace):
            continue  # a declaration
        first = entry(src[brace + 1:])
        out.append((src.count("\n", 0, m.start()) + 1, name[0] if name else "?", first))
    return out


# a call of a *_prewait function whose template and call arguments are plain names or numbers: no expression that
# could load, store or call anything before the wait (`k_prewait(p), (p[0] = 1)`, `k_prewait(atomicAdd(p, 1))`)
PREWAIT = re.compile(r"(\w+_prewait)\s*(<[\w\s,]*>)?\s*\(\s*(\w+(\s*,\s*\w+)*)?\s*\)")

# what a *_prewait function's own body may not contain (prewait_stores): an assignment to an element, through a
# pointer or to a member of one, an increment of an element, an atomic, inline asm, a store intrinsic, memset/memcpy
STORE = re.compile(r"\]\s*(\+\+|--|([-+*/%&|^]|<<|>>)?=(?!=))|(\+\+|--)\s*[\w.]+\s*\[|->\s*\w+\s*([-+*/%&|^]|<<|>>)?=(?!=)"
                   r"|\batomic\w*\s*\(|\basm\b|\b__st\w*\s*\(|\bmem(set|cpy)\w*\s*\(")


def entry(body):
    """The body's first statement; "DG_PDL_ENTRY()" also for DG_PDL_LAUNCH(), then only calls of *_prewait
    functions with plain-name arguments (work that needs nothing of the grids before: common.cuh), then
    DG_PDL_WAIT()."""
    stmts = [x.strip() for x in body.split(";", 8)[:8]]
    if stmts[0] == "DG_PDL_LAUNCH()":
        for i, x in enumerate(stmts[1:], 1):
            if x == "DG_PDL_WAIT()":
                return "DG_PDL_ENTRY()" if i > 1 else "DG_PDL_LAUNCH(); DG_PDL_WAIT()"
            if not PREWAIT.fullmatch(x):
                break
    return stmts[0]


def prewait_defs(path):
    """{name: body} of each *_prewait function defined in path (comments stripped)."""
    with open(path, encoding="utf-8") as f:
        src = strip_comments(f.read())
    out = {}
    for m in re.finditer(r"\b(\w+_prewait)\s*\([^;{}]*\)\s*\{", src):
        i, depth = m.end() - 1, 0
        for j in range(i, len(src)):
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            if depth == 0:
                out[m.group(1)] = src[i + 1:j]
                break
    return out


def prewait_stores(body):
    """The statements of a *_prewait body that may write memory (STORE; by the text of the body itself: a store
    inside a function it calls is not seen), or a statement starting with a dereference that assigns."""
    stmts = [x.strip() for x in re.split(r"[;{}]", body)]
    return [x for x in stmts if STORE.search(x) or re.match(r"\*.*[^=!<>]=(?!=)", x)]


def sources():
    files = sorted(glob.glob(os.path.join(ROOT, "src", "cuda", "*.cu")) + glob.glob(os.path.join(ROOT, "src", "cuda", "*.cuh")))
    for p in sorted(glob.glob(os.path.join(ROOT, "dev", "cuda", "*.cu")) + glob.glob(os.path.join(ROOT, "dev", "cuda", "*.cuh"))):
        with open(p, encoding="utf-8") as f:
            text = f.read()
        if re.search(r'#include "cuda/(common|qmoe|kernels|attention)', text):
            files.append(p)
    return files


class PdlEntry(unittest.TestCase):
    def test_every_kernel_waits_first(self):
        found = {}
        bad = []
        for p in sources():
            for line, name, first in kernels(p):
                found[name] = p
                if first != "DG_PDL_ENTRY()":
                    bad.append("%s:%d: kernel %s begins with %r, not DG_PDL_ENTRY()" % (os.path.relpath(p, ROOT), line, name, first[:60]))
        self.assertEqual(bad, [], "\n".join(bad))
        # each *_prewait function a kernel calls before DG_PDL_WAIT() is defined in these sources and stores nothing
        defs, called = {}, set()
        for p in sources():
            defs.update(prewait_defs(p))
            with open(p, encoding="utf-8") as f:
                called.update(m.group(1) for m in PREWAIT.finditer(strip_comments(f.read())))
        for name in sorted(called):
            self.assertIn(name, defs, "%s is called before DG_PDL_WAIT() but not defined in src/cuda or dev/cuda" % name)
            self.assertEqual(prewait_stores(defs[name]), [], "%s may write memory before DG_PDL_WAIT()" % name)
        self.assertIn("qr_prewait", called)
        # the parser sees the kernels of the pass (not an empty list that passes trivially)
        for k in ("qr_kernel", "flash_kernel", "group_scan_kernel", "rmsnorm_kernel", "topk_kernel"):
            self.assertIn(k, found, "kernel %s not found by the parser" % k)
        self.assertGreaterEqual(len(found), 40)

    def test_parser_flags_a_missing_entry(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".cu", delete=False) as f:
            f.write("/* __global__ in a comment */\n__global__ void ok_kernel(int *p) {\n  DG_PDL_ENTRY();\n  p[0] = 1;\n}\n"
                    "template <int N> __global__ void __launch_bounds__(128) bad_kernel(int *p, int (*q)(int)) {\n  p[0] = N;\n}\n"
                    "__global__ void declared_kernel(int *p);\n"
                    "__global__ void split_kernel(int *p) {\n  DG_PDL_LAUNCH();\n  k_prewait<1, 2>(p);\n  DG_PDL_WAIT();\n}\n"
                    "__global__ void early_kernel(int *p) {\n  DG_PDL_LAUNCH();\n  p[0] = 1;\n  DG_PDL_WAIT();\n}\n"
                    "__global__ void nowait_kernel(int *p) {\n  DG_PDL_LAUNCH();\n  k_prewait(p);\n  p[0] = 1;\n}\n"
                    "__global__ void comma_kernel(int *p) {\n  DG_PDL_LAUNCH();\n  k_prewait(p), (p[0] = 1);\n  DG_PDL_WAIT();\n}\n"
                    "__global__ void arg_kernel(int *p) {\n  DG_PDL_LAUNCH();\n  k_prewait(atomicAdd(p, 1));\n  DG_PDL_WAIT();\n}\n")
        try:
            ks = kernels(f.name)
        finally:
            os.unlink(f.name)
        self.assertEqual([(n, fs) for _, n, fs in ks], [("ok_kernel", "DG_PDL_ENTRY()"), ("bad_kernel", "p[0] = N"),
                                                        ("split_kernel", "DG_PDL_ENTRY()"),
                                                        ("early_kernel", "DG_PDL_LAUNCH()"),
                                                        ("nowait_kernel", "DG_PDL_LAUNCH()"),
                                                        ("comma_kernel", "DG_PDL_LAUNCH()"),
                                                        ("arg_kernel", "DG_PDL_LAUNCH()")])

    def test_prewait_store_flagged(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".cuh", delete=False) as f:
            f.write("template <int N> __device__ void ok_prewait(const int *p) {\n  const int *q = p + N; /* p[0] = 1; */\n"
                    "  for (int i = 0; i < N; i += 2) dg_prefetch_l2(q + i, 16);\n}\n"
                    "__device__ void a_prewait(int *p) { if (p) p[1] = 0; }\n"
                    "__device__ void b_prewait(int *p) { *p = 1; }\n"
                    "__device__ void c_prewait(S *s) { s->n += 1; }\n"
                    "__device__ void d_prewait(int *p) { atomicAdd(p, 1); }\n"
                    "__device__ void e_prewait(int *p) { p[2]++; }\n")
        try:
            d = prewait_defs(f.name)
        finally:
            os.unlink(f.name)
        self.assertEqual(sorted(d), ["a_prewait", "b_prewait", "c_prewait", "d_prewait", "e_prewait", "ok_prewait"])
        self.assertEqual(prewait_stores(d["ok_prewait"]), [])
        for k in "abcde":
            self.assertNotEqual(prewait_stores(d[k + "_prewait"]), [], k)


if __name__ == "__main__":
    unittest.main()
