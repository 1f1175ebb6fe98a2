#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Every breakage of tests/mutants/mutants.list still means something on
this tree: its replace text occurs exactly once in its file (a refactor
that moved the text leaves the entry unable to apply), and every test its
test: lines name by -t still exists in that program (a renamed test would
make the breakage's run fail with "no test named", counted as caught).
Each failing entry is named; no build of the breakage, no VM (make mutants runs
them)."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # ktap
import ktap  # noqa: E402
from ktap import check  # noqa: E402

sys.path.insert(0, HERE)
import run as mutants  # noqa: E402

TOP = ktap.use_build_tree()
ENTRIES = mutants.parse(os.path.join(HERE, "mutants.list"))
_names = {}


def test_names(prog):
    """The names -t selects in PROG (C harness and Python tests alike)."""
    if prog not in _names:
        path = os.path.join(TOP, "tests", prog)
        check(os.path.exists(path), "no program tests/%s (make tests)" % prog)
        cmd = [sys.executable, path] if prog.endswith(".py") else [path]
        p = subprocess.run(cmd + ["-l"], capture_output=True, text=True,
                           timeout=ktap.scaled(30))
        check(p.returncode == 0, "tests/%s -l: status %d %s" %
              (prog, p.returncode, p.stderr[-300:]))
        # -t takes a full name (fixture.variant.test) or the test's own
        names = set(p.stdout.split())
        _names[prog] = names | {n.rsplit(".", 1)[-1] for n in names}
    return _names[prog]


def every_breakage_applies():
    bad = []
    for e in ENTRIES:
        for path, old, _new in e["edits"]:
            p = os.path.join(TOP, path)
            n = 0
            if os.path.exists(p):
                with open(p) as f:
                    n = f.read().count("\n".join(old) + "\n")
            if n != 1:
                bad.append("%s: %s: the replace text occurs %d times" %
                           (e["name"], path, n))
    for b in bad:
        print("# " + b)
    check(not bad, "%d of %d breakages do not apply" % (len(bad), len(ENTRIES)))


def every_named_test_exists():
    bad = []
    for e in ENTRIES:
        for words in e["tests"]:
            prog, args = words[1], words[2:]
            for i, a in enumerate(args[:-1]):
                if a == "-t" and args[i + 1] not in test_names(prog):
                    bad.append("%s: tests/%s has no test %s" %
                               (e["name"], prog, args[i + 1]))
    for b in bad:
        print("# " + b)
    check(not bad, "%d test names of the list select nothing" % len(bad))


if __name__ == "__main__":
    sys.exit(ktap.main([every_breakage_applies, every_named_test_exists]))
