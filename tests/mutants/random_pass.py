#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""make mutants-random: breakages that nobody chose for their test. From a
seed, picks COUNT sites in lib/*.c, lib/preload/*.c and module/*.c and
applies one mechanical mutation at each:

  cmp      a comparison flipped (== and !=, < and >=, > and <=)
  logic    && and || swapped
  not      an if condition negated
  call     a call statement whose result is not used, deleted
  const    an integer constant changed (0 and 1 swapped, N to N + 1)
  lock     a lock/unlock pair deleted (pthread mutex; kernel mutex,
           spinlock, dma_resv)

then writes them as a tests/mutants list and runs tests/mutants/run.py on
it: a lib or preload breakage against the host programs of its part, a
module breakage against the whole list of lane LANE (6.1: this machine's
headers), in one guest with the others (run.py's batches). A module
breakage whose object code for that lane is the unbroken one's (a site in
code the lane does not compile, or one the compiler folds away) is not
run: another site is taken instead, and the list says how many were.
A SURVIVED row is a breakage that every program passed: a missing test,
or an equivalent mutation (one that changes nothing observable); the
table says which it is only after someone looked.

    random_pass.py [--seed N] [--count K] [--parts lib,preload,module]
                   [--lane LANE] [--list-only] [--out FILE]
"""
import argparse
import glob
import os
import random
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import run as mutants  # noqa: E402  (its scratch copies and edits)

# The test lines of each part: for lib and preload the host programs that
# must catch a breakage (unit.list; the C ones in their ASan and UBSan
# builds, which also see memory errors and leaks); for the module the
# lane's first program, after which run.py's batch runs the lane's list.
TESTS = {
    "lib": ["unit asan/lib/lib_roundtrip", "unit asan/lib/lib_rollback",
            "unit asan/lib/lib_drain", "unit asan/lib/lib_api",
            "unit asan/lib/lib_cuda", "unit asan/lib/lib_config",
            "unit asan/preload/preload_lib", "unit python/py_binding.py"],
    "preload": ["unit asan/preload/preload_cuda",
                "unit asan/preload/preload_lib",
                "unit preload/preload_symver.py"],
    "module": ["LANE module/smoke_module"],
}

CMP = [("==", "!="), ("!=", "=="), ("<=", ">"), (">=", "<"), ("<", ">="),
       (">", "<=")]
SKIP_LINE = re.compile(r"^\s*(#|/?\*|//)|\bfprintf\b|\bsnprintf\b|"
                       r"\bkvd_err\w*\(|\bfail\(|\bmsg\(|\bTH_LOG\b|"
                       r"\bpr_\w+\(|\bdev_(err|warn|info|dbg)\w*\(")
# lock call -> the unlock that closes it (its first argument)
LOCKS = {"pthread_mutex_lock": "pthread_mutex_unlock",
         "mutex_lock": "mutex_unlock", "spin_lock": "spin_unlock",
         "spin_lock_irq": "spin_unlock_irq", "dma_resv_lock": "dma_resv_unlock"}


def lane_kdir(lane):
    """The kernel build tree a lane's module is built against, as
    tests/vm/check.sh picks it (6.1: this machine's Debian 12 headers;
    6.12 and 7.3: the Debian 13 root's)."""
    cache = os.environ.get("KVDMABUF_CACHE", "/var/cache/kvdmabuf")
    pattern = {"6.1": "/lib/modules/6.1.*-amd64/build",
               "6.12": cache + "/trixie-root/lib/modules/6.12.*/build",
               "7.3": cache + "/trixie-root/lib/modules/7.*-amd64/build"}
    if lane not in pattern:
        raise SystemExit("random_pass: --lane is 6.1, 6.12 or 7.3")
    found = sorted(glob.glob(pattern[lane]))
    if not found:
        raise SystemExit("random_pass: no kernel build tree for lane %s "
                         "(make deps)" % lane)
    return found[-1]


def sources(parts):
    out = []
    for part, pattern in (("lib", "lib"), ("preload", "lib/preload"),
                          ("module", "module")):
        if part not in parts:
            continue
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
    m = re.match(r"^\s*(%s)\(([^,]*)(, NULL)?\);$" % "|".join(LOCKS), line)
    if m:
        for j in range(i + 1, min(i + 80, len(lines))):
            if lines[j].strip() == "%s(%s);" % (LOCKS[m.group(1)], m.group(2)):
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


class ObjectCheck:
    """Whether a module breakage changes the object code built for KDIR:
    one scratch build of HEAD's module, each breakage's file rebuilt in
    place (the same path: the same strings and debug paths) and its
    disassembly, relocations included, compared with the unbroken one."""

    def __init__(self, kdir):
        self.kdir = kdir
        self.tree = mutants.scratch_copy("HEAD")
        self.base = {}
        if self.make():
            self.close()
            raise RuntimeError("HEAD's module does not build for " + kdir)

    def make(self, *targets):
        return subprocess.run(["make", "-s", "-C", self.kdir,
                               "-j" + mutants.JOBS,
                               "M=" + self.tree] + (list(targets) or
                                                    ["modules"]),
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode

    def dump(self, obj):
        out = subprocess.run(["objdump", "-dr", "--no-show-raw-insn",
                              os.path.join(self.tree, obj)],
                             stdout=subprocess.PIPE, check=True).stdout
        return out.split(b"\n", 3)[-1]

    def changes(self, path, old, new):
        """True when the breakage builds and changes the code."""
        obj = path[:-2] + ".o"
        if obj not in self.base:
            self.base[obj] = self.dump(obj)
        p = os.path.join(self.tree, path)
        with open(p) as f:
            text = f.read()
        try:
            return (not mutants.apply(self.tree, {"edits": [(path, old, new)]})
                    and not self.make(obj)
                    and self.dump(obj) != self.base[obj])
        finally:
            with open(p, "w") as f:
                f.write(text)

    def close(self):
        shutil.rmtree(self.tree, ignore_errors=True)


def pick(seed, count, parts, check):
    """COUNT breakages; module ones only where check.changes() (their
    number of sites passed over is the second value)."""
    rnd = random.Random(seed)
    cands = []
    for part, path in sources(parts):
        with open(os.path.join(REPO, path)) as f:
            text = f.read()
        lines, ok = code_lines(text)
        for i in ok:
            for kind, new, n in mutations(lines, i):
                cands.append((part, path, i, kind, new, n))
    rnd.shuffle(cands)
    chosen, used, folded = [], set(), 0
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
        old, repl = lines[i - k:i + n], lines[i - k:i] + new
        if part == "module" and not check.changes(path, old, repl):
            folded += 1
            continue
        chosen.append((part, path, i, kind, old, repl))
        if len(chosen) == count:
            break
    return chosen, folded


def write_list(chosen, folded, seed, lane, out):
    with open(out, "w") as f:
        f.write("# tests/mutants/random_pass.py --seed %d: %d mechanical "
                "breakages (%d module sites passed over: the same object "
                "code on lane %s)\n\n" % (seed, len(chosen), folded, lane))
        for n, (part, path, i, kind, old, new) in enumerate(chosen, 1):
            f.write("== r%d-%s-%s-%d: %s at %s:%d\n" % (
                seed, kind, os.path.basename(path)[:-2], i + 1, kind,
                path, i + 1))
            f.write("file: %s\nreplace:\n%s\nwith:\n%s\n" % (
                path, "\n".join(old), "\n".join(new)))
            for t in TESTS[part]:
                f.write("test: %s\n" % t.replace("LANE", lane))
            f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--out", default=os.path.join(REPO, "build/mutants/"
                                                  "random.list"))
    ap.add_argument("--list-only", action="store_true")
    ap.add_argument("--parts", default="lib,preload,module")
    ap.add_argument("--lane", default="6.1",
                    help="the VM lane of the module's breakages")
    a = ap.parse_args()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    parts = a.parts.split(",")
    check = None
    if "module" in parts:
        check = ObjectCheck(lane_kdir(a.lane))
    try:
        chosen, folded = pick(a.seed, a.count, parts, check)
    finally:
        if check:
            check.close()
    write_list(chosen, folded, a.seed, a.lane, a.out)
    print("# %d breakages (seed %d) in %s; %d module sites passed over "
          "(the same object code)" % (len(chosen), a.seed, a.out, folded))
    if a.list_only:
        return 0
    # --baseline: every named program passes on the unmutated copy first
    return subprocess.call([sys.executable, os.path.join(HERE, "run.py"),
                            "--list", a.out, "--baseline", "--table",
                            os.path.join(os.path.dirname(a.out),
                                         "random-table.md")])


if __name__ == "__main__":
    sys.exit(main())
