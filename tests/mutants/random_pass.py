#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""make mutants-random: breakages that nobody chose for their test. From a
seed, picks COUNT sites in lib/*.c and lib/preload/*.c and applies one
mechanical mutation at each:

  cmp      a comparison flipped (== and !=, < and >=, > and <=)
  logic    && and || swapped
  not      an if condition negated
  call     a call statement whose result is not used, deleted
  const    an integer constant changed (0 and 1 swapped, N to N + 1)
  lock     a pthread_mutex_lock/unlock pair deleted

then writes them as a tests/mutants list (each with the host programs of
its part as the tests that must catch it) and runs tests/mutants/run.py on
it. The module is left out: each of its breakages needs a guest boot (use
the chosen list, make mutants, for it). A SURVIVED row is a breakage that
every listed program passed: a missing test, or an equivalent mutation
(one that changes nothing observable); the table says which it is only
after someone looked.

    random_pass.py [--seed N] [--count K] [--list-only] [--out FILE]
"""
import argparse
import os
import random
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# The host programs that must catch a breakage of each part (unit.list;
# the C ones in their ASan and UBSan builds, which also see memory errors
# and leaks).
TESTS = {
    "lib": ["asan/lib/lib_roundtrip", "asan/lib/lib_rollback",
            "asan/lib/lib_drain", "asan/lib/lib_api", "asan/lib/lib_cuda",
            "asan/lib/lib_config", "asan/preload/preload_lib",
            "python/py_binding.py"],
    "preload": ["asan/preload/preload_cuda", "asan/preload/preload_lib",
                "preload/preload_symver.py"],
}

CMP = [("==", "!="), ("!=", "=="), ("<=", ">"), (">=", "<"), ("<", ">="),
       (">", "<=")]
SKIP_LINE = re.compile(r"^\s*(#|/?\*|//)|\bfprintf\b|\bsnprintf\b|"
                       r"\bkvd_err\w*\(|\bfail\(|\bmsg\(|\bTH_LOG\b")


def sources():
    out = []
    for part, pattern in (("lib", "lib"), ("preload", "lib/preload")):
        d = os.path.join(REPO, pattern)
        for f in sorted(os.listdir(d)):
            if f.endswith(".c"):
                out.append((part, os.path.join(pattern, f)))
    return out


def code_lines(text):
    """Line numbers (0-based) of code inside function bodies, not in
    comments or strings' continuation lines."""
    lines, ok, in_comment, depth = text.split("\n"), [], False, 0
    for i, line in enumerate(lines):
        s = line.strip()
        if in_comment:
            if "*/" in s:
                in_comment = False
            continue
        if s.startswith("/*") and "*/" not in s:
            in_comment = True
            continue
        if depth > 0 and s and not SKIP_LINE.search(line) and \
                not s.startswith('"'):
            ok.append(i)
        depth += line.count("{") - line.count("}")
    return lines, ok


def outside_strings(line, pos):
    return line[:pos].count('"') % 2 == 0


def mutations(lines, i):
    """(kind, new lines for lines[i:i+n], n) candidates at line i."""
    line, out = lines[i], []
    for old, new in CMP:
        for m in re.finditer(r"(?<![<>=!&|-])%s(?![<>=])" % re.escape(old),
                             line):
            if old in ("<", ">") and re.search(r"->|<<|>>|#include",
                                               line[m.start() - 1:m.end() + 1]):
                continue
            if outside_strings(line, m.start()):
                out.append(("cmp", [line[:m.start()] + new +
                                    line[m.end():]], 1))
    for old, new in (("&&", "||"), ("||", "&&")):
        for m in re.finditer(re.escape(old), line):
            if outside_strings(line, m.start()):
                out.append(("logic", [line[:m.start()] + new +
                                      line[m.end():]], 1))
    m = re.match(r"^(\s*)if \((.*)\)$", line)
    if m and m.group(2).count("(") == m.group(2).count(")"):
        out.append(("not", ["%sif (!(%s))" % (m.group(1), m.group(2))], 1))
    if re.match(r"^\s*[a-z_][\w>.-]*\(.*\);$", line) and \
            not re.match(r"^\s*(return|if|while|for|switch)\b", line):
        out.append(("call", [], 1))
    for m in re.finditer(r"(?<![\w.])(\d+)(?![\w.])", line):
        if not outside_strings(line, m.start()):
            continue
        n = int(m.group(1))
        out.append(("const", [line[:m.start()] + str(1 if n == 0 else
                                                      0 if n == 1 else n + 1)
                              + line[m.end():]], 1))
    m = re.match(r"^\s*pthread_mutex_lock\((.*)\);$", line)
    if m:
        for j in range(i + 1, min(i + 80, len(lines))):
            if lines[j].strip() == "pthread_mutex_unlock(%s);" % m.group(1):
                body = lines[i + 1:j]
                out.append(("lock", body, j - i + 1))
                break
            if lines[j].startswith("}"):
                break
    return out


def unique_block(lines, i, n, text):
    """lines[i - k:i + n] for the smallest k that occurs once in text."""
    for k in range(0, 6):
        if i - k < 0:
            break
        block = "\n".join(lines[i - k:i + n]) + "\n"
        if text.count(block) == 1:
            return k
    return None


def pick(seed, count):
    rnd = random.Random(seed)
    cands = []
    for part, path in sources():
        with open(os.path.join(REPO, path)) as f:
            text = f.read()
        lines, ok = code_lines(text)
        for i in ok:
            for kind, new, n in mutations(lines, i):
                cands.append((part, path, i, kind, new, n))
    rnd.shuffle(cands)
    chosen, used = [], set()
    for part, path, i, kind, new, n in cands:
        if (path, i) in used:
            continue
        with open(os.path.join(REPO, path)) as f:
            text = f.read()
        lines = text.split("\n")
        k = unique_block(lines, i, n, text)
        if k is None:
            continue
        used.add((path, i))
        chosen.append((part, path, i, kind, lines[i - k:i + n],
                       lines[i - k:i] + new))
        if len(chosen) == count:
            break
    return chosen


def write_list(chosen, seed, out):
    with open(out, "w") as f:
        f.write("# tests/mutants/random_pass.py --seed %d: %d mechanical "
                "breakages\n\n" % (seed, len(chosen)))
        for n, (part, path, i, kind, old, new) in enumerate(chosen, 1):
            f.write("== r%d-%s-%s-%d: %s at %s:%d\n" % (
                seed, kind, os.path.basename(path)[:-2], i + 1, kind,
                path, i + 1))
            f.write("file: %s\nreplace:\n%s\nwith:\n%s\n" % (
                path, "\n".join(old), "\n".join(new)))
            for t in TESTS[part]:
                f.write("test: unit %s\n" % t)
            f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--out", default=os.path.join(REPO, "build/mutants/"
                                                  "random.list"))
    ap.add_argument("--list-only", action="store_true")
    a = ap.parse_args()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    chosen = pick(a.seed, a.count)
    write_list(chosen, a.seed, a.out)
    print("# %d breakages (seed %d) in %s" % (len(chosen), a.seed, a.out))
    if a.list_only:
        return 0
    # --baseline: every named program passes on the unmutated copy first
    return subprocess.call([sys.executable, os.path.join(HERE, "run.py"),
                            "--list", a.out, "--baseline", "--table",
                            os.path.join(os.path.dirname(a.out),
                                         "random-table.md")])


if __name__ == "__main__":
    sys.exit(main())
