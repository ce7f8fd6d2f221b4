"""The call scripts' shared helpers in scripts/gpu_env.sh: left, guard, lim, bench and one.

dev/gpu/s28_mem12.sh, s29_m3b12.sh and s28_pp12.sh take them from scripts/gpu_env.sh (session 29, helper cln; each
had its own copy before). This test sources gpu_env.sh in bash in a temporary folder, with `date +%s` answered
from a file (a fake clock the test moves) and fake build/dgemma and build/tests/test_cuda scripts, and checks each
helper's answers, log lines and files, word for word as the scripts wrote them before. It also runs `bash -n` on
gpu_env.sh and the scripts that use it. No GPU and no build needed: bash and coreutils' timeout.

plain python3:  python3 -m unittest discover -s tests/python -v
"""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV_SH = os.path.join(ROOT, "scripts", "gpu_env.sh")
USERS = ["dev/gpu/s28_mem12.sh", "dev/gpu/s29_m3b12.sh", "dev/gpu/s28_pp12.sh", "dev/gpu/s30_pe12.sh", "dev/gpu/s30_mm12.sh",
         "dev/gpu/s31_cs14.sh"]

# A fake dgemma: prints its arguments, writes one JSON row to the file after -o, "err" on stderr, exits $FAKE_RC.
FAKE_DGEMMA = """#!/bin/bash
echo "dgemma $*"
echo "err" >&2
while [ $# -gt 0 ]; do [ "$1" = -o ] && echo '{"kind": "row", "x": 1}' > "$2"; shift; done
exit ${FAKE_RC:-0}
"""
# A fake test_cuda: prints its filter and X, exits $FAKE_RC.
FAKE_TEST = """#!/bin/bash
echo "test_cuda DG_TEST_FILTER=$DG_TEST_FILTER X=${X:-unset}"
exit ${FAKE_RC:-0}
"""


@unittest.skipUnless(shutil.which("bash") and shutil.which("timeout"), "needs bash and timeout")
class GpuEnvHelpers(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dg_gpu_env_")
        os.makedirs(os.path.join(self.dir, "build", "tests"))
        for rel, text in (("build/dgemma", FAKE_DGEMMA), ("build/tests/test_cuda", FAKE_TEST)):
            p = os.path.join(self.dir, rel)
            with open(p, "w") as f:
                f.write(text)
            os.chmod(p, 0o755)
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.out)
        self.clock = os.path.join(self.dir, "clock")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def sh(self, body, t0=1000, plan=100):
        """body run in bash after gpu_env.sh is sourced at time t0, with O = out/, T = plan and TP = a prefix in
        the temporary folder; `at S` sets the clock to t0 + S. Returns stdout (a failing bash fails the test)."""
        with open(self.clock, "w") as f:
            f.write(str(t0))
        script = f"""
date() {{ if [ "$1" = +%s ]; then cat "{self.clock}"; else command date "$@"; fi; }}
cc() {{ return 0; }} # gpu_env.sh's check for the cJSON header: found (nothing unpacked)
at() {{ echo $(( {t0} + $1 )) > "{self.clock}"; }}
. "{ENV_SH}"
O="{self.out}"; T={plan}; TP="{self.dir}/x_"
{body}
"""
        r = subprocess.run(["bash", "-c", script], cwd=self.dir, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, f"bash failed: {r.stderr}")
        return r.stdout

    def read(self, name):
        p = os.path.join(self.out, name)
        if not os.path.exists(p):
            return ""
        with open(p) as f:
            return f.read()

    def test_left_guard_lim(self):
        out = self.sh("""
echo "left $(left) lim90 $(lim 90) lim50 $(lim 50) el $(el)"
guard 60 "item a" && echo "a runs"
at 50
echo "left $(left) lim90 $(lim 90) lim30 $(lim 30) el $(el)"
guard 60 "item b" || echo "b skipped rc $?"
guard 50 "item c" && echo "c runs"
at 95
echo "lim90 $(lim 90)"
""")
        self.assertEqual(out.splitlines(), [
            "left 100 lim90 90 lim50 50 el (0 s)",
            "a runs",
            "left 50 lim90 40 lim30 30 el (50 s)",
            "skip item b: 50 s left, it needs 60 (50 s)",
            "b skipped rc 1",
            "c runs",
            "lim90 -5",  # past the plan: a guard comes first in the scripts
        ])
        self.assertEqual(self.read("log.txt"), "skip item b: 50 s left, it needs 60 (50 s)\n")

    def test_guard_plan_from_call_budget(self):
        # T=$(call_budget N): N, or DG_CALL_S - 20 where that is less (the scripts' plan)
        out = self.sh("""
echo "$(call_budget 560) $(DG_CALL_S=300 call_budget 560)"
T=$(DG_CALL_S=300 call_budget 560); at 200
guard 90 x || echo skipped
""")
        self.assertEqual(out.splitlines(), ["560 280", "skip x: 80 s left, it needs 90 (200 s)", "skipped"])

    def test_bench(self):
        out = self.sh("""
at 7
ENVS="A=1 B=2" FAKE_RC=3 bench n1 30 -m /tmp/ck --device cuda; echo "rc $?"
at 9
ENVS="" bench n2 30 --protocol vllm; echo "rc $?"
""")
        self.assertEqual(out.splitlines(), ["bench n1 rc 3 (7 s)", "rc 3", "bench n2 rc 0 (9 s)", "rc 0"])
        self.assertEqual(self.read("log.txt"), "bench n1 rc 3 (7 s)\nbench n2 rc 0 (9 s)\n")
        self.assertEqual(self.read("step.txt"),
                         "\n## n1: A=1 B=2 build/dgemma bench -m /tmp/ck --device cuda\n"
                         f"dgemma bench -m /tmp/ck --device cuda -o {self.dir}/x_n1.jsonl\nerr\n"
                         "\n## n2:  build/dgemma bench --protocol vllm\n"
                         f"dgemma bench --protocol vllm -o {self.dir}/x_n2.jsonl\nerr\n")
        rows = [json.loads(line) for line in self.read("bench.jsonl").splitlines()]
        self.assertEqual(rows, [
            {"kind": "run", "run": "n1", "env": "A=1 B=2", "args": "-m /tmp/ck --device cuda", "rc": 3},
            {"kind": "row", "x": 1},
            {"kind": "run", "run": "n2", "env": "", "args": "--protocol vllm", "rc": 0},
            {"kind": "row", "x": 1},
        ])
        # the files under the script's prefix, as the summaries read them
        self.assertTrue(os.path.exists(os.path.join(self.dir, "x_n1.txt")))
        self.assertTrue(os.path.exists(os.path.join(self.dir, "x_n2.jsonl")))

    def test_bench_timeout(self):
        with open(os.path.join(self.dir, "build", "dgemma"), "w") as f:
            f.write("#!/bin/bash\nsleep 5\n")
        with open(os.path.join(self.dir, "x_slow.jsonl"), "w") as f:  # an earlier run's rows: not this one's
            f.write('{"kind": "stale"}\n')
        out = self.sh("bench slow 1 -m x; echo \"rc $?\"")
        self.assertEqual(out.splitlines(), ["bench slow rc 124 (0 s)", "rc 124"])
        rows = [json.loads(line) for line in self.read("bench.jsonl").splitlines()]
        self.assertEqual(rows, [{"kind": "run", "run": "slow", "env": "", "args": "-m x", "rc": 124}])

    def test_one(self):
        out = self.sh("""
at 10
one first test_a X=7
FAKE_RC=1 one second test_b
at 80
one late test_c X=1; echo "late rc $?"
""")
        self.assertEqual(out.splitlines(), [
            "test first rc 0 (10 s)",
            "test second rc 1 (10 s)",
            "skip test late: 20 s left, it needs 25 (80 s)",
            "late rc 1",
        ])
        self.assertEqual(self.read("tests.txt"),
                         "\n## first: X=7 DG_TEST_FILTER=test_a build/tests/test_cuda\n"
                         "test_cuda DG_TEST_FILTER=test_a X=7\n"
                         "\n## second:  DG_TEST_FILTER=test_b build/tests/test_cuda\n"
                         "test_cuda DG_TEST_FILTER=test_b X=unset\n")
        self.assertEqual(self.read("log.txt"), "test first rc 0 (10 s)\ntest second rc 1 (10 s)\n"
                         "skip test late: 20 s left, it needs 25 (80 s)\n")

    def test_scripts_parse_and_use_the_helpers(self):
        for rel in ["scripts/gpu_env.sh"] + USERS:
            r = subprocess.run(["bash", "-n", os.path.join(ROOT, rel)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, f"bash -n {rel}: {r.stderr}")
        for rel in USERS:
            with open(os.path.join(ROOT, rel)) as f:
                src = f.read()
            self.assertIn(". scripts/gpu_env.sh\n", src, rel)
            for fn in ("left", "guard", "lim"):  # one copy only: gpu_env.sh's
                self.assertNotIn(f"\n{fn}() {{", src, f"{rel} defines {fn} again")


if __name__ == "__main__":
    unittest.main()
