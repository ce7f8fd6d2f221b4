"""`make run PROMPT=...`: the prompt reaches dgemma as typed (the Makefile's comment: "any text is safe").

A variable given on make's command line is expanded by make when it is exported, so before the fix
`make run PROMPT='It costs $5'` asked "It costs " ($5 is an empty make variable) and `$(shell ...)` in
a prompt ran. The test adds a target of its own with --eval that prints the exported PROMPT, so nothing
is built; plain python3 and make:
    python3 -m unittest tests/python/test_make_prompt.py -v
"""

import os
import shutil
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHOW = 'brk_show_prompt: ; @printf "%s" "$$PROMPT"'


def exported_prompt(args, env=None):
    # BUILD in a scratch folder: parsing the Makefile writes its stamps (.cuda_backend, .nvflags) into BUILD
    with tempfile.TemporaryDirectory(prefix="dg_prompt_") as build:
        out = subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, "BUILD=" + build, "--eval", SHOW,
                              "brk_show_prompt"] + args, capture_output=True, text=True, env=env, check=True)
    return out.stdout


@unittest.skipUnless(shutil.which("make"), "make not found")
class MakePrompt(unittest.TestCase):
    TEXT = "It costs $5 (or $$6) in $(shell echo cash), 100% `date` \"q\" 'a' \\n"

    def test_command_line_prompt_verbatim(self):
        self.assertEqual(exported_prompt(["PROMPT=" + self.TEXT]), self.TEXT)

    def test_environment_prompt_verbatim(self):
        env = dict(os.environ, PROMPT=self.TEXT)
        self.assertEqual(exported_prompt([], env=env), self.TEXT)

    def test_default_prompt(self):
        env = {k: v for k, v in os.environ.items() if k != "PROMPT"}
        self.assertEqual(exported_prompt([], env=env),
                         "Sam has 23 apples. He buys 14 more apples. How many apples does Sam have now?")


if __name__ == "__main__":
    unittest.main()
