"""scripts/run_tests.sh: the summary line counts skipped tests and says why each skipped.

The script runs in a scratch tree of its own (a copy of it under scripts/, a fake cmocka binary
under BUILD/tests/, and a tests/python with one passing, one skipped and, in the second case, one
failing test), so it does not run this repository's tests again; plain python3:
    python3 -m unittest tests/python/test_run_tests.py -v
"""

import os
import shutil
import stat
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "run_tests.sh")

# What a cmocka binary with one passing and one skipped test prints (tests/testutil.h's
# dg_test_skip writes the "# SKIP" line).
FAKE_CMOCKA = r"""#!/bin/sh
cat <<'OUT'
[==========] Running 2 test(s).
[ RUN      ] test_a
[       OK ] test_a
[ RUN      ] test_b
# SKIP test_b: no frobnicator on this machine
[  SKIPPED ] test_b
[==========] 2 test(s) run.
[  PASSED  ] 1 test(s).
[  SKIPPED ] 1 test(s), listed below:
[  SKIPPED ] test_b
OUT
"""

INNER = '''import unittest


class Inner(unittest.TestCase):
    def test_passes(self):
        self.assertEqual(1 + 1, 2)

    @unittest.skip("no shared data")
    def test_skipped(self):
        pass
'''

INNER_FAIL = '''
    def test_fails(self):
        self.assertEqual(1 + 1, 3, "the inner failure")
'''


class RunTests(unittest.TestCase):
    def tree(self, fail):
        d = tempfile.mkdtemp(prefix="dgemma-run-tests-")
        self.addCleanup(shutil.rmtree, d)
        os.makedirs(os.path.join(d, "scripts"))
        shutil.copy(SCRIPT, os.path.join(d, "scripts", "run_tests.sh"))
        os.makedirs(os.path.join(d, "b", "tests"))
        fake = os.path.join(d, "b", "tests", "test_fake")
        with open(fake, "w") as f:
            f.write(FAKE_CMOCKA)
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
        os.makedirs(os.path.join(d, "tests", "python"))
        with open(os.path.join(d, "tests", "python", "test_inner.py"), "w") as f:
            f.write(INNER + (INNER_FAIL if fail else ""))
        return d

    def run_script(self, d):
        env = dict(os.environ)
        env.pop("FUZZ_BUILD", None)
        p = subprocess.run(["bash", os.path.join(d, "scripts", "run_tests.sh"), "b"], cwd=d, env=env,
                           capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout

    def test_skips_counted_with_reasons(self):
        rc, out = self.run_script(self.tree(fail=False))
        self.assertEqual(rc, 0, out)
        last = out.strip().splitlines()[-1]
        self.assertTrue(last.startswith("dgemma tests: 2 passed, 0 failed, 2 skipped (2 binaries, 0 crashed; "), last)
        self.assertIn("1 in b/tests/test_fake: test_b: no frobnicator on this machine", last)
        # the Python skip's own reason, not a pointer to output that was not shown
        self.assertIn("1 in tests/python: test_skipped: no shared data", last)
        self.assertIn("skipped tests:\n  1 in b/tests/test_fake: test_b: no frobnicator on this machine\n"
                      "  1 in tests/python: test_skipped: no shared data\n", out)

    def test_python_failure_shown(self):
        rc, out = self.run_script(self.tree(fail=True))
        self.assertNotEqual(rc, 0)
        last = out.strip().splitlines()[-1]
        self.assertTrue(last.startswith("dgemma tests: 2 passed, 1 failed, 2 skipped "), last)
        # which test failed and why is printed, not only unittest's count line
        self.assertIn("FAIL: test_fails", out)
        self.assertIn("the inner failure", out)


if __name__ == "__main__":
    unittest.main()
