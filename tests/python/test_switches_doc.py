"""Every DGEMMA_* switch is parsed in one place and documented once.

- The library reads its switches through the table of src/backend/switches.c (dg_sw_get; base/envsw.c parses):
  no getenv("DGEMMA_...") in src/ but the four with parsers of their own (OWN below) and DGEMMA_CUBLAS_POOL's echo
  in the memory log's first line (upload.cu: prints the raw value, parses nothing; the table's entry refused a bad
  one before).
- README.md's "Environment switches" table has one row per switch: every name of switches.c's table and of OWN,
  none twice, no other, in alphabetical order; a row of OWN is marked * and a table switch's is not.
- The table's names and the enum's comments in switches.h agree (DG_SW_X names DGEMMA_X).
It also checks that the parsers find what they must (a parser that found nothing would pass everything).

plain python3:  python3 -m unittest discover -s tests/python -v
"""

import glob
import os
import re
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The switches with parsers of their own (backend/switches.h says why).
OWN = {"DGEMMA_KERNELS", "DGEMMA_CPU_PACK", "DGEMMA_CUDA_MEM_LIMIT", "DGEMMA_CUDA_LIB"}
# getenv calls that parse nothing: file -> names.
ECHO = {"src/cuda/upload.cu": {"DGEMMA_CUBLAS_POOL"}}


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def table_names():
    """id -> variable of switches.c's table entries ("[DG_SW_X] = KIND("DGEMMA_X", ..." or "= {"DGEMMA_X", ...")."""
    src = read("src/backend/switches.c")
    return dict(re.findall(r'\[(DG_SW_\w+)\]\s*=\s*(?:\w+\(|\{)\s*"(DGEMMA_\w+)"', src))


def readme_rows():
    """(name, starred) of the README table's rows, in order."""
    rows = []
    for line in read("README.md").splitlines():
        m = re.match(r"\| `(DGEMMA_\w+)`(\*?) \|", line)
        if m:
            rows.append((m.group(1), m.group(2) == "*"))
    return rows


class SwitchesDoc(unittest.TestCase):
    def test_table_parsed(self):
        t = table_names()
        self.assertGreaterEqual(len(t), 30, t)
        for sid, name in t.items():
            self.assertEqual(sid, "DG_SW_" + name[len("DGEMMA_"):], (sid, name))
        enum = re.findall(r"^\s*(DG_SW_\w+)(?:\s*=\s*DG_SW_CUDA_FIRST)?,\s*/\* (DGEMMA_\w+) \*/",
                          read("src/backend/switches.h"), flags=re.M)
        self.assertEqual(dict(enum), t)

    def test_getenv_only_through_the_table(self):
        found = 0
        for path in sorted(glob.glob(os.path.join(ROOT, "src", "**", "*.*"), recursive=True)):
            if not path.endswith((".c", ".h", ".cu", ".cuh")):
                continue
            rel = os.path.relpath(path, ROOT)
            with open(path, encoding="utf-8") as f:
                src = f.read()
            for m in re.finditer(r'getenv\("(DGEMMA_\w+)"\)', src):
                found += 1
                name = m.group(1)
                line = src.count("\n", 0, m.start()) + 1
                self.assertTrue(name in OWN or name in ECHO.get(rel, set()),
                                f"{rel}:{line}: getenv(\"{name}\") outside backend/switches.c's table "
                                f"(read it with dg_sw_get)")
        self.assertGreaterEqual(found, len(OWN))

    def test_readme_one_row_each(self):
        rows = readme_rows()
        names = [n for n, _ in rows]
        self.assertGreaterEqual(len(rows), 34, rows)
        dup = sorted({n for n in names if names.count(n) > 1})
        self.assertEqual(dup, [], f"README rows twice: {dup}")
        want = set(table_names().values()) | OWN
        self.assertEqual(sorted(want - set(names)), [], "switches without a README row")
        self.assertEqual(sorted(set(names) - want), [], "README rows of no switch")
        self.assertEqual(names, sorted(names), "README rows not in alphabetical order")
        for n, star in rows:
            self.assertEqual(star, n in OWN, f"{n}: the * marks exactly the switches with parsers of their own")


if __name__ == "__main__":
    unittest.main()
