"""`make test` leaves the CUDA objects of `make` / `make run` alone (README: "so that `make test` and `make` /
`make run` never rebuild each other's CUDA objects").

Before the fix, `make test` on a machine without a GPU set NVDEV=-G in the top-level make too, whose BUILD is
build/: parsing the Makefile rewrote build/.nvflags with the -G flags, so the next `make run` recompiled every CUDA
source of build/ (20 minutes on a loaded 2-core machine). The test runs make with -n in scratch build folders
(CUDA=1 with a dummy CUDA_LIBDIR: nothing is compiled, no nvcc needed; the flag stamps are written at parse time):
    python3 -m unittest tests/python/test_make_nvstamp.py -v
"""

import os
import shutil
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_n(args):
    # -n prints the recipes, but runs the $(MAKE) lines (the test build's sub-make): its stamp is written too
    return subprocess.run(["make", "-n", "--no-print-directory", "-C", ROOT, "CUDA=1", "CUDA_LIBDIR=/nonexistent",
                           "TEST_NVDEV=-G"] + args, capture_output=True, text=True, timeout=120)


@unittest.skipUnless(shutil.which("make"), "make not found")
class MakeTestStamp(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dg_nvstamp_")
        self.main = os.path.join(self.tmp, "main")
        self.test = os.path.join(self.tmp, "test")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def stamp(self, build):
        with open(os.path.join(build, ".nvflags")) as f:
            return f.read()

    def test_make_test_keeps_the_main_stamp(self):
        r = make_n(["BUILD=" + self.main, "all"])
        self.assertEqual(r.returncode, 0, r.stderr)
        before = self.stamp(self.main)
        self.assertNotIn(" -G ", before)
        r = make_n(["BUILD=" + self.main, "TEST_BUILD=" + self.test, "test"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.stamp(self.main), before, "make test rewrote the main build's nvcc flags")
        # the test build itself compiles with -G (TEST_NVDEV) into its own folder
        self.assertIn(" -G ", self.stamp(self.test))
        self.assertIn("BUILD=" + self.test, r.stdout)

    def test_nvdev_given_still_reaches_the_test_build(self):
        r = make_n(["BUILD=" + self.main, "TEST_BUILD=" + self.test, "NVDEV=-lineinfo", "test"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(" -lineinfo ", self.stamp(self.test))
        self.assertNotIn(" -G ", self.stamp(self.test))


if __name__ == "__main__":
    unittest.main()
