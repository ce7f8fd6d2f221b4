"""scripts/qr_src_counts.py: executed instructions per HMMA and stall samples by class from ncu's source page.

On a small hand-written source page (every number follows from its rows) and on session 20's real one
(docs/results/h100-s20/call2_qr_src.csv.gz: the 26B gate/up and down launches).
plain python3:  python3 -m unittest discover -s tests/python -v
"""

import gzip
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import qr_src_counts as q  # noqa: E402

HDR = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
       '"Instructions Executed","stall_wait","stall_barrier","stall_wait (Not Issued)"')


def table(name, rows):
    return f',"{name}",\n{HDR}\n' + "\n".join(rows) + "\n"


ROWS = [
    '"0x10","      HMMA.16816.F32.BF16 R4, R8, R12, R4","6","5","100","6","0","5"',
    '"0x20","      LOP3.LUT R1, R2, 0xf000f, RZ, 0xc0, !PT","2","2","300","2","0","2"',
    '"0x30","@P3   BRA 0x40","4","4","50","0","4","0"',
    '"0x40","      FFMA R4, R5, R6, R4","0","0","200","0","0","0"',
    '"0x50","      WEIRDOP R1","0","0","10","0","0","0"',
]


class Counts(unittest.TestCase):
    def test_opcode(self):
        self.assertEqual(q.opcode("@!P3   BRA 0x7f"), "BRA")
        self.assertEqual(q.opcode("      HMMA.16816.F32.BF16 R4, R8"), "HMMA")
        self.assertEqual(q.opcode("@UPT  UISETP.NE.AND UP0"), "UISETP")
        self.assertEqual(q.klass("NEWOP"), "other:NEWOP")

    def test_small_page(self):
        text = '"Kernel Name"' + table("void k<1>(args)", ROWS) + '"Kernel Name"' + table("void k<1>(args)", ROWS)
        ks = q.kernels(text)
        self.assertEqual(len(ks), 1)  # the same kernel twice (ncu prints a profiled kernel's page again): counted once
        s = q.summarize(*ks[0])
        self.assertEqual(s["kernel"], "void k<1>(args)")
        self.assertEqual(s["executed"], 660)
        self.assertEqual(s["hmma"], 100)
        self.assertAlmostEqual(s["executed_per_hmma"], 6.6)
        self.assertEqual(s["per_hmma"], {"decode": 3.0, "fold": 2.0, "tensor": 1.0, "branch": 0.5, "other:WEIRDOP": 0.1})
        self.assertEqual(s["samples"], 12)
        self.assertAlmostEqual(s["stall_reasons_pct"]["wait"], 100 * 8 / 12)
        self.assertAlmostEqual(s["stall_reasons_pct"]["barrier"], 100 * 4 / 12)
        self.assertNotIn("wait (Not Issued)", s["stall_reasons_pct"])
        self.assertAlmostEqual(s["stall_classes_pct"]["tensor"], 50.0)

    def test_not_a_source_page(self):
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("a,b\n1,2\n")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "qr_src_counts.py"), f.name],
                           capture_output=True, text=True)
        os.unlink(f.name)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no kernel table", r.stderr)

    def test_session20_page(self):
        path = os.path.join(ROOT, "docs", "results", "h100-s20", "call2_qr_src.csv.gz")
        with gzip.open(path, "rt") as f:
            ks = q.kernels(f.read())
        self.assertEqual(len(ks), 2)
        gu, dn = (q.summarize(*k) for k in ks)
        self.assertIn("qr_kernel<(int)4, (int)1,", gu["kernel"])  # GATEUP 1
        self.assertIn("qr_kernel<(int)4, (int)0,", dn["kernel"])
        # docs/cuda.md, session 20: 63.4 M executed, 5.78 M HMMA, 11.0 per HMMA; down 12.2
        self.assertEqual((gu["executed"], gu["hmma"]), (63373233, 5777024))
        self.assertAlmostEqual(gu["executed_per_hmma"], 10.97, places=2)
        self.assertAlmostEqual(dn["executed_per_hmma"], 12.16, places=2)
        self.assertAlmostEqual(gu["per_hmma"]["decode"], 3.37, places=2)
        self.assertAlmostEqual(gu["per_hmma"]["fold"], 2.36, places=2)
        self.assertEqual(gu["samples"], 13040)
        self.assertAlmostEqual(gu["stall_reasons_pct"]["wait"], 30.0, places=1)


if __name__ == "__main__":
    unittest.main()
