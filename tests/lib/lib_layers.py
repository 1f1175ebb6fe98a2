#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""lib/ reads bottom-up, as lib/README.md's "Reading the code" table
says: each lib/*.c file is on one floor of the table, calls (and data
references) between files, read from the built objects with nm, go to a
file on the same floor or below, and no files reach each other round a
circle. A call that climbs, a circle, or a file the table does not place
fails, naming the symbols.

    lib_layers.py --walk FUNCTION...   (needs cflow; not a test)
prints the walk of a reader through lib/ from FUNCTION (cflow's call tree,
each function read once, calls into lib/*.c only): the stays (runs of
reading in one file, coming back from a call included), the calls that
climb to a higher floor, and the stays in a file already left; then the
same without floors 0 and 1 (messages, counts, busy checks)."""
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap  # noqa: E402
from ktap import check  # noqa: E402

TOP = ktap.use_build_tree()
LIB = os.path.join(TOP, "lib")


def floors():
    """{file stem: floor} from the README's table."""
    out = {}
    with open(os.path.join(LIB, "README.md")) as f:
        for line in f:
            m = re.match(r"\| (\d+) \| ([^|]+) \|", line)
            if m:
                for name in re.findall(r"`(\w+)\.c`", m.group(2)):
                    check(name not in out, "%s.c is on two floors" % name)
                    out[name] = int(m.group(1))
    check(out, "no floor table in lib/README.md")
    return out


def references():
    """{(from, to): symbols}: lib/X.o's undefined symbols that lib/Y.o
    defines."""
    defs, undefs = {}, {}
    objs = sorted(glob.glob(os.path.join(LIB, "*.o")))
    srcs = sorted(glob.glob(os.path.join(LIB, "*.c")))
    check(len(objs) == len(srcs), "lib/ is not built: %d objects for %d "
          "sources (make lib)" % (len(objs), len(srcs)))
    for o in objs:
        name = os.path.basename(o)[:-2]
        p = subprocess.run(["nm", o], capture_output=True, text=True,
                           check=True)
        defs[name], undefs[name] = set(), set()
        for line in p.stdout.splitlines():
            w = line.split()
            if len(w) == 3 and w[1] in "TDRB":
                defs[name].add(w[2])
            elif len(w) == 2 and w[0] == "U":
                undefs[name].add(w[1])
    owner = {s: n for n in defs for s in defs[n]}
    refs = {}
    for n in undefs:
        for s in undefs[n]:
            if s in owner and owner[s] != n:
                refs.setdefault((n, owner[s]), set()).add(s)
    return refs, sorted(defs)


def every_file_has_a_floor():
    fl = floors()
    _, files = references()
    missing = [f + ".c" for f in files if f not in fl]
    gone = [f + ".c" for f in fl if f not in files]
    check(not missing, "not in the table: %s" % " ".join(missing))
    check(not gone, "in the table, not in lib/: %s" % " ".join(gone))


def no_file_calls_up():
    fl = floors()
    refs, _ = references()
    up = ["%s.c (floor %d) -> %s.c (floor %d): %s" %
          (a, fl[a], b, fl[b], " ".join(sorted(s)))
          for (a, b), s in sorted(refs.items())
          if a in fl and b in fl and fl[b] > fl[a]]
    check(not up, "calls up a floor: " + "; ".join(up))


def no_circle():
    refs, files = references()
    graph = {f: set() for f in files}
    for a, b in refs:
        graph[a].add(b)

    def path(a, b, seen):
        """a call path from a to b, or None."""
        for c in sorted(graph[a]):
            if c == b:
                return [a, b]
            if c not in seen:
                seen.add(c)
                p = path(c, b, seen)
                if p:
                    return [a] + p
        return None

    for a in files:
        for b in sorted(graph[a]):
            back = path(b, a, set())
            if back:
                check(False, "circle: %s.c -> %s" % (
                    a, " -> ".join(f + ".c" for f in back)))


def walk(entry):
    fl = floors()
    srcs = sorted(glob.glob(os.path.join(LIB, "*.c")))
    out = subprocess.run(["cflow", "--main=" + entry, "-I", LIB, "-I",
                          os.path.join(TOP, "uapi")] + srcs,
                         capture_output=True, text=True, check=True).stdout
    seq, climbs, seen, stack, skip = [], [], set(), [], None
    for line in out.splitlines():
        depth = len(line) - len(line.lstrip())
        m = re.match(r"\s*(\w+)\(\) <.* at (\S+\.c):\d+>", line)
        if skip is not None and depth > skip:
            continue
        skip = None
        while stack and stack[-1][0] >= depth:
            stack.pop()
            if stack:
                seq.append(stack[-1][1])
        if not m or os.path.dirname(os.path.abspath(m.group(2))) != LIB:
            skip = depth            # outside lib/: not followed
            continue
        f = os.path.basename(m.group(2))[:-2]
        if stack and fl[f] > fl[stack[-1][1]]:
            climbs.append("%s.c -> %s.c: %s" % (stack[-1][1], f, m.group(1)))
        stack.append((depth, f))
        seq.append(f)
        if m.group(1) in seen:
            skip = depth            # read before
        seen.add(m.group(1))
    while stack:
        stack.pop()
        if stack:
            seq.append(stack[-1][1])
    for label, s in (("", seq),
                     (" without floors 0-1", [f for f in seq if fl[f] > 1])):
        stays = [f for i, f in enumerate(s) if not i or s[i - 1] != f]
        print("%s%s: %d stays in %d files, %d climbs, %d returns to a file "
              "already left" % (entry, label, len(stays), len(set(stays)),
                                len(climbs), len(stays) - len(set(stays))))
        print("  " + " > ".join(stays))
    for c in climbs:
        print("  climbs: " + c)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--walk"]:
        for e in sys.argv[2:]:
            walk(e)
        sys.exit(0)
    sys.exit(ktap.main([
        every_file_has_a_floor,
        no_file_calls_up,
        no_circle,
    ]))
