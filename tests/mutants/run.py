#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""make mutants: each breakage of tests/mutants/mutants.list, applied to
HEAD's files, built, and run against the tests that must catch it; a table
of what was caught.

    run.py [--list FILE] [--only NAME]... [--lane LANE]... [--baseline]
           [--table FILE] [--single] [--jobs N] [--named-only]

A breakage whose tests are all on one VM lane runs in a batch with the
lane's others: one scratch tree holds each one's copy of what it changes
(mutants/NAME: a module breakage's module/, any other's edited files), built
for the lane with the tree (make MUTANT_TREES; tests/mutants/build_tree.sh),
and one guest takes them in turn, each against its own tests first and then
the lane's whole list, up to the first failure (tests/mutants/guest_batch.sh);
a breakage that leaves the kernel unfit (a report, a stuck program, a module
that does not unload) ends the guest and the rest go on in a fresh one.
--single runs them one guest each (tests/vm/check.sh run LANE PROGRAM
ARGS), against their own tests only. A host breakage runs its unit
programs on this machine, --jobs N side by side (after the guests, whose
tests time things on the same cores); one its own tests miss runs against
the host's whole unit.list unless --named-only: a survivor is one the whole
suite misses.

The scratch trees are kept in the cache (KVDMABUF_CACHE/mutants/), made
equal to HEAD by content at each run, so that a file that did not change
keeps its time and the lanes' build trees rebuild only what changed: a
second run builds the breakages' files and little else. One run at a time
(a lock there).

A breakage is caught when its test run fails: a failing TAP line, a kernel
log report, a test that crashed or timed out. It SURVIVED when the tests
passed. A breakage whose text is not found exactly once, a tree that does
not build, a run whose tests all skipped or whose VM setup failed, is an
ERROR: never a pass. --baseline first runs the unbroken module, and the
unbroken tree with the tests of the batch's other breakages, through each
batch's whole list, and every named test of the others on HEAD, which must
pass (else the table would mean nothing). Exit status 0 only when every
breakage was caught (and the baseline passed).
"""
import argparse
import concurrent.futures
import datetime
import fcntl
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
KEYWORDS = ("file:", "replace:", "with:", "test:")
JOBS = os.environ.get("KVDMABUF_JOBS", "2")


class ListError(Exception):
    pass


# The test run in progress (its own process group), ended on SIGINT/SIGTERM.
CHILD = []


def run_child(cmd, **kw):
    p = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, **kw)
    CHILD.append(p)
    try:
        out, _ = p.communicate()
    finally:
        CHILD.remove(p)
    return p.returncode, out.decode(errors="replace")


def on_signal(signum, frame):
    for p in CHILD:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    raise KeyboardInterrupt


def parse(path):
    """Entries: dict(name, what, edits=[(file, old, new)], tests=[[...]])."""
    entries, cur, block = [], None, None
    with open(path) as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        if line.startswith("== "):
            head = line[3:]
            name, _, what = head.partition(":")
            cur = {"name": name.strip(), "what": what.strip(), "edits": [],
                   "tests": [], "line": n}
            entries.append(cur)
            block = None
            continue
        if cur is None or (block is None and
                           (line.startswith("#") or not line.strip())):
            continue
        if line.startswith("file:"):
            cur["edits"].append([line[5:].strip(), [], []])
            block = None
        elif line.startswith("replace:") or line.startswith("with:"):
            if not cur["edits"]:
                raise ListError("%s:%d: %s before file:" % (path, n, line))
            block = cur["edits"][-1][1 if line.startswith("replace:") else 2]
        elif line.startswith("test:"):
            words = line[5:].split()
            if len(words) < 2:
                raise ListError("%s:%d: test: LANE PROGRAM [ARGS]" % (path, n))
            cur["tests"].append(words)
            block = None
        elif line.startswith("#") and block is None:
            continue
        elif block is not None:
            block.append(line)
        else:
            raise ListError("%s:%d: unexpected line: %s" % (path, n, line))
    for e in entries:
        if not e["edits"] or not e["tests"]:
            raise ListError("%s:%d: %s needs file/replace/with and test" %
                            (path, e["line"], e["name"]))
        for ed in e["edits"]:
            for blk in (ed[1], ed[2]):
                while blk and not blk[-1].strip():
                    blk.pop()
            if not ed[1]:
                raise ListError("%s: %s: empty replace block" %
                                (path, e["name"]))
    names = [e["name"] for e in entries]
    dup = {x for x in names if names.count(x) > 1}
    if dup:
        raise ListError("%s: names used twice: %s" % (path, ", ".join(dup)))
    return entries


def scratch_copy(commit):
    d = tempfile.mkdtemp(prefix="kvd-mutant.")
    # as a checkout's folder is: the guest's tests run programs of the tree
    # as an unprivileged user as well
    os.chmod(d, 0o755)
    ar = subprocess.Popen(["git", "-C", REPO, "archive", commit],
                          stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", d], stdin=ar.stdout, check=True)
    if ar.wait():
        raise RuntimeError("git archive failed")
    return d


def edited(tree, entry):
    """{path: the file's text with the breakage}, or an error string."""
    texts = {}
    for path, old, new in entry["edits"]:
        p = os.path.join(tree, path)
        if path not in texts:
            if not os.path.exists(p):
                return "%s: no such file" % path
            with open(p) as f:
                texts[path] = f.read()
        text = texts[path]
        o = "\n".join(old) + "\n"
        count = text.count(o)
        if count != 1:
            return "%s: the replace text occurs %d times" % (path, count)
        texts[path] = text.replace(o, "\n".join(new) + ("\n" if new else ""))
    return texts


def apply(tree, entry):
    """Apply the edits; an error string, or None."""
    texts = edited(tree, entry)
    if isinstance(texts, str):
        return texts
    for path, text in texts.items():
        with open(os.path.join(tree, path), "w") as f:
            f.write(text)
    return None


def write_if_changed(path, text):
    """Rewritten only when the text differs: an unchanged file keeps its
    time, and what was built from it stays built."""
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def cache_dir():
    return os.environ.get("KVDMABUF_CACHE", "/var/cache/kvdmabuf")


def kept_tree(pristine, name):
    """A scratch tree of the cache's, KVDMABUF_CACHE/mutants/NAME, made equal
    to PRISTINE by content: a file that did not change keeps its time, so
    the lane build trees made for it (named after its path) rebuild only
    what changed since the last run; build outputs, and mutants/ (batches
    rewrite it themselves), are kept."""
    tree = os.path.join(cache_dir(), "mutants", name)
    os.makedirs(tree, exist_ok=True)
    os.chmod(tree, 0o755)
    # (its folders that hold only build outputs stay: rsync says so, which
    # is no error)
    p = subprocess.run(["rsync", "-rlpc", "--delete", "--exclude=/mutants/",
                        "--filter=merge " + os.path.join(REPO, "tests/vm/sync-filter"),
                        pristine + "/", tree + "/"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if p.returncode:
        raise RuntimeError("rsync to %s: %s" % (tree, p.stdout.decode()))
    return tree


def run_unit(tree, words, log):
    prog, args = words[1], words[2:]
    target = "tests/" + prog
    # what the host programs load besides themselves: the fake drivers
    # (lib_cuda's old one too) and the CLI (lib_cuda runs `kvdmabuf check`)
    extra = ["lib/cli/kvdmabuf"]
    if os.path.exists(os.path.join(tree, "tests/fake_cuda")):
        extra += ["tests/fake_cuda/libcuda.so.1",
                  "tests/fake_cuda/old/libcuda.so.1"]
    b = subprocess.run(["make", "-C", tree, "-j" + JOBS, "lib", target] + extra,
                       stdout=log, stderr=subprocess.STDOUT)
    if b.returncode:
        return "build", ""
    t0 = time.time()
    rc, out = run_child([os.path.join(tree, target)] + args, cwd=tree)
    log.write(out.encode())
    log.write(("# %s: status %d after %ds\n" %
               (target, rc, time.time() - t0)).encode())
    return rc, out


def run_vm(tree, words, log):
    lane, prog, args = words[0], words[1], words[2:]
    env = dict(os.environ, KVDMABUF_JOBS=JOBS)
    rc, out = run_child([os.path.join(tree, "tests/vm/check.sh"), "run", lane,
                         "tests/" + prog] + args, cwd=tree, env=env)
    log.write(out.encode())
    if re.search(r"^# build for lane \S+ failed", out, re.M):
        return "build", out
    return rc, out


def judge(rc, out):
    """(verdict, detail) of one test run."""
    if rc == "build":
        return "ERROR", "does not build"
    fails = re.findall(r"^not ok \d+ (\S+)", out, re.M)
    if re.search(r"^not ok - vm setup", out, re.M):
        return "ERROR", "VM setup failed"
    if rc == 0:
        oks = re.findall(r"^ok \d+ ", out, re.M)
        skips = re.findall(r"^ok \d+ .*# SKIP", out, re.M)
        if oks and len(skips) == len(oks):
            return "ERROR", "skipped"
        if not oks:
            return "ERROR", "ran no test"
        return "SURVIVED", "%d passed" % len(oks)
    if rc == 4:
        return "ERROR", "skipped"
    if fails:
        fails = list(dict.fromkeys(fails))
        return "caught", "not ok: " + ", ".join(fails[:3]) + (
            " and %d more" % (len(fails) - 3) if len(fails) > 3 else "")
    if "the guest kernel log has reports" in out:
        m = re.search(r"(WARNING:.*|BUG:.*|KASAN.*|Oops.*)", out)
        return "caught", "kernel log: " + (m.group(1)[:60] if m else "report")
    if "did not finish" in out:
        return "caught", "guest did not finish"
    m = re.search(r"^not ok - (.*)", out, re.M)
    if m:
        return "caught", m.group(1)[:80]
    return "caught", "exit status %s" % rc


def run_whole(tree, lane, log):
    """(rc, output) of a lane's whole list: the host's unit.list (after
    building everything it runs), or a VM lane's suite (check.sh vm)."""
    log.write(("### the whole list of lane %s\n" % lane).encode())
    log.flush()
    if lane == "unit":
        b = subprocess.run(["make", "-C", tree, "-j" + JOBS, "lib", "tests",
                            "asan"], stdout=log, stderr=subprocess.STDOUT)
        if b.returncode:
            return "build", ""
        # without the check that every breakage applies: this tree has
        # one applied
        with open(os.path.join(tree, "tests/unit.list")) as f:
            progs = [x for x in f if not x.startswith("mutants/")]
        with open(os.path.join(tree, "tests/mutant-unit.list"), "w") as f:
            f.writelines(progs)
        cmd = [os.path.join(tree, "tests/vm/run-tests.sh"),
               os.path.join(tree, "tests/mutant-unit.list"),
               os.path.join(tree, "tests")]
    else:
        cmd = [os.path.join(tree, "tests/vm/check.sh"), "vm", lane]
    rc, out = run_child(cmd, cwd=tree, env=dict(os.environ, KVDMABUF_JOBS=JOBS))
    log.write(out.encode())
    return rc, out


def run_tests(tree, entry, log, whole):
    """The first test line that catches it; where none does and @whole,
    the whole list of each lane it names; else the last verdict."""
    verdict = ("ERROR", "no test")
    for words in entry["tests"]:
        log.write(("### test: %s\n" % " ".join(words)).encode())
        log.flush()
        if words[0] == "unit":
            rc, out = run_unit(tree, words, log)
        else:
            rc, out = run_vm(tree, words, log)
        verdict = judge(rc, out)
        if verdict[0] == "caught":
            return verdict
    if verdict[0] != "SURVIVED" or not whole:
        return verdict
    for lane in dict.fromkeys(w[0] for w in entry["tests"]):
        rc, out = run_whole(tree, lane, log)
        v, d = judge(rc, out)
        if v != "SURVIVED":
            return v, "lane %s's list: %s" % (lane, d)
    return "SURVIVED", "its tests and its lanes' whole lists passed"


def batchable(entry):
    """A breakage whose tests are all on one VM lane."""
    lanes = {w[0] for w in entry["tests"]}
    return len(lanes) == 1 and "unit" not in lanes


def kind(entry):
    """module: its edits all under module/ (the guest loads its module);
    tree: any other (the guest runs its tree)."""
    if "kind" in entry:
        return entry["kind"]
    return ("module" if all(ed[0].startswith("module/")
                            for ed in entry["edits"]) else "tree")


def batch_tree(pristine, lane, entries, baseline):
    """The lane's kept scratch tree with mutants/NAME/ per breakage: a
    module breakage's copy of module/ and uapi/ (with a Kbuild: make
    MUTANT_TREES builds its kvdmabuf.ko), any other's edited files under
    overlay/ (make MUTANT_TREES lays them over a copy of the built tree and
    builds it again: tests/mutants/build_tree.sh); when asked, the unbroken
    module as "baseline" first and, where the lane has other breakages, the
    unbroken tree as "baseline-tree" with their tests (each must pass the
    whole list). Every file written only where it changed. The breakages
    that apply, and {name: error} for those that do not."""
    tree = kept_tree(pristine, "batch-" + lane)
    errors, todo = {}, []
    pseudo = []
    if baseline:
        pseudo.append({"name": "baseline", "edits": [], "tests": [],
                       "kind": "module"})
        own = [tuple(w) for e in entries if kind(e) == "tree"
               for w in e["tests"]]
        if own:
            pseudo.append({"name": "baseline-tree", "edits": [],
                           "kind": "tree",
                           "tests": [list(w) for w in dict.fromkeys(own)]})
    for e in pseudo + entries:
        texts = edited(pristine, e)
        if isinstance(texts, str):
            errors[e["name"]] = "does not apply: " + texts
            continue
        d = os.path.join(tree, "mutants", e["name"])
        want = set()
        if kind(e) == "module":
            for part in ("module", "uapi"):
                src = os.path.join(pristine, part)
                for f in os.listdir(src):
                    rel = os.path.join(part, f)
                    if rel not in texts:
                        with open(os.path.join(src, f)) as fh:
                            texts[rel] = fh.read()
                    write_if_changed(os.path.join(d, rel), texts[rel])
                    want.add(rel)
            write_if_changed(os.path.join(d, "Kbuild"), "obj-m += module/\n")
            want.add("Kbuild")
        else:
            # the folder even with no file: make MUTANT_TREES finds it
            os.makedirs(os.path.join(d, "overlay"), exist_ok=True)
            for rel, text in texts.items():
                write_if_changed(os.path.join(d, "overlay", rel), text)
                want.add(os.path.join("overlay", rel))
        prune(d, want)
        todo.append(e)
    names = {e["name"] for e in todo}
    top = os.path.join(tree, "mutants")
    for n in os.listdir(top) if os.path.isdir(top) else []:
        if n not in names and n != "batch.list":
            shutil.rmtree(os.path.join(top, n))
    return tree, todo, errors


def prune(d, want):
    """Files under D that are not in WANT (paths relative to D) removed."""
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            if os.path.relpath(p, d) not in want:
                os.unlink(p)


def run_batch(pristine, lane, entries, baseline, logdir, table, done):
    """The breakages of one lane in as few guests as they allow;
    done(name, verdict, detail, secs) for each (the baseline too). The
    consoles go to logdir, named after the table (runs side by side)."""
    tree, todo, errors = batch_tree(pristine, lane, entries, baseline)
    for name, err in errors.items():
        done(name, "ERROR", err, 0)
    env = dict(os.environ, KVDMABUF_JOBS=JOBS,
               KVDMABUF_MAKE_ARGS="MUTANT_TREES=mutants")
    boot = 0
    while todo:
        boot += 1
        with open(os.path.join(tree, "mutants", "batch.list"), "w") as f:
            for e in todo:
                f.write("mutant %s %s\n" % (e["name"], kind(e)))
                for w in e["tests"]:
                    f.write("run %s\n" % " ".join(w[1:]))
        logpath = os.path.join(logdir, "%s.batch-%s-%d.log" % (
            os.path.splitext(os.path.basename(table))[0], lane, boot))
        print("# lane %s, guest %d: %d breakages (%s)" %
              (lane, boot, len(todo), logpath), flush=True)
        rc, out = run_child([os.path.join(tree, "tests/vm/check.sh"), "run",
                             lane, "tests/mutants/guest_batch.sh",
                             "mutants/batch.list"], cwd=tree, env=env)
        # the lane is built now: the next guests only sync the batch list
        env["KVDMABUF_VM_BUILT"] = "1"
        with open(logpath, "w") as log:
            log.write(out)
        if re.search(r"^# build for lane \S+ failed", out, re.M):
            for e in todo:
                done(e["name"], "ERROR", "the lane does not build", 0)
            break
        # the first of each (check.sh repeats the log around a report)
        seen, names = [], set()
        for m in re.finditer(r"^# mutant-verdict (\S+) (\S+) (\d+) (.*)$",
                             out, re.M):
            if m.group(1) not in names:
                names.add(m.group(1))
                seen.append(m.groups())
        for name, v, secs, detail in seen:
            done(name, v, detail, int(secs))
        rest = [e for e in todo if e["name"] not in names]
        if rest and not (seen and "# mutant-batch-stopped" in out):
            head = "# ===== mutant %s:" % rest[0]["name"]
            if head in out:
                # it ended the guest (a panic, a hang up to the time-out):
                # the first report of its part of the console (verdict.sh's
                # pattern; not one of a boot that check.sh gave up on)
                with tempfile.NamedTemporaryFile("w") as part:
                    part.write(out[out.index(head):])
                    part.flush()
                    report = subprocess.run(
                        [os.path.join(tree, "tests/vm/verdict.sh"),
                         "--reports", part.name],
                        stdout=subprocess.PIPE).stdout.decode(
                            errors="replace").strip()
                report = re.sub(r"^\[ *[0-9.]+\] ", "", report)
                done(rest[0]["name"], "caught",
                     "the guest ended during its run%s (see %s)" %
                     (": " + report[:80] if report else "", logpath), 0)
                rest = rest[1:]
            else:
                for e in rest:
                    done(e["name"], "ERROR",
                         "the guest ended before it ran (see %s)" % logpath, 0)
                rest = []
        todo = rest


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", default=os.path.join(HERE, "mutants.list"))
    ap.add_argument("--only", action="append", default=[],
                    help="run only this breakage (repeatable)")
    ap.add_argument("--baseline", action="store_true",
                    help="first run every named test on the unmutated tree")
    ap.add_argument("--table", default=os.path.join(REPO, "build/mutants/table.md"))
    ap.add_argument("--lane", action="append", default=[],
                    help="only breakages with a test on this lane "
                         "(repeatable; unit: the host's)")
    ap.add_argument("--jobs", type=int, default=int(JOBS),
                    help="host breakages run side by side (default "
                         "KVDMABUF_JOBS or 2)")
    ap.add_argument("--named-only", action="store_true",
                    help="a breakage its own tests miss is not run against "
                         "its lanes' whole lists")
    ap.add_argument("--single", action="store_true",
                    help="VM breakages one guest each, own tests only")
    ap.add_argument("--check-list", action="store_true",
                    help="only check that every breakage applies to HEAD")
    a = ap.parse_args()

    try:
        entries = parse(a.list)
    except ListError as e:
        print("mutants: %s" % e, file=sys.stderr)
        return 2
    unknown = set(a.only) - {e["name"] for e in entries}
    if unknown:
        print("mutants: no such breakage: %s" % ", ".join(sorted(unknown)),
              file=sys.stderr)
        return 2
    if a.only:
        entries = [e for e in entries if e["name"] in a.only]
    if a.lane:
        entries = [e for e in entries
                   if any(w[0] in a.lane for w in e["tests"])]
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"],
                            stdout=subprocess.PIPE, check=True
                            ).stdout.decode().strip()
    logdir = os.path.join(REPO, "build/mutants")
    os.makedirs(logdir, exist_ok=True)

    # HEAD's files, once; the kept trees are made equal to it by content
    pristine = scratch_copy(commit)
    try:
        if a.check_list:
            bad = 0
            for e in entries:
                err = edited(pristine, e)
                err = err if isinstance(err, str) else None
                print("%-32s %s" % (e["name"], err or "applies"))
                bad |= bool(err)
            return 1 if bad else 0
        # the kept trees are this run's alone
        os.makedirs(os.path.join(cache_dir(), "mutants"), exist_ok=True)
        lock = open(os.path.join(cache_dir(), "mutants", "lock"), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("mutants: waiting for another run (%s)" % lock.name,
                  flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        return run_all(a, entries, commit, pristine, logdir)
    finally:
        shutil.rmtree(pristine, ignore_errors=True)


def run_all(a, entries, commit, pristine, logdir):

    batches = {}
    if not a.single:
        for e in entries:
            if batchable(e):
                batches.setdefault(e["tests"][0][0], []).append(e)
    singles = [e for e in entries if not any(e in b for b in batches.values())]

    if a.baseline and singles:
        groups = {}
        for e in singles:
            for w in e["tests"]:
                key = tuple(w[:2])
                groups.setdefault(key, []).extend(w[2:])
        tree = kept_tree(pristine, "single")
        ok = True
        with open(os.path.join(logdir, "baseline.log"), "wb") as log:
            for key, args in groups.items():
                words = list(key) + args
                log.write(("### baseline: %s\n" % " ".join(words)).encode())
                if words[0] == "unit":
                    rc, out = run_unit(tree, words, log)
                else:
                    rc, out = run_vm(tree, words, log)
                v, d = judge(rc, out)
                print("# baseline %-28s %s (%s)" % (" ".join(key),
                      "passes" if v == "SURVIVED" else "FAILS", d), flush=True)
                ok &= v == "SURVIVED"
        if not ok:
            print("mutants: the unmutated tree fails a named test (see %s)" %
                  os.path.join(logdir, "baseline.log"), file=sys.stderr)
            return 2

    rows = []
    batched = [e for b in batches.values() for e in b]
    by_name = {e["name"]: e for e in entries}
    baseline_failed = []
    t_all = time.time()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def tests_of(e):
        t = "; ".join(" ".join(w) for w in e["tests"])
        return t + (", then the lane's list" if e in batched else "")

    def write_table():
        """The table so far (written after each breakage), not-run rows last."""
        ran = {r[0] for r in rows}
        pending = [e for e in entries if e["name"] not in ran]
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        out = ["Tree %s, %s, %d breakages, %ds:" %
               (commit[:12], date, len(rows) + len(pending),
                time.time() - t_all), "",
               "| breakage | expected catching test | result |",
               "|---|---|---|"]
        for name, what, tests, v, d, secs in rows:
            out.append("| `%s`: %s | `%s` | %s (%s, %ds) |" %
                       (name, what, tests, v, d, secs))
        for e in pending:
            out.append("| `%s`: %s | `%s` | not run |" %
                       (e["name"], e["what"], tests_of(e)))
        table = "\n".join(out) + "\n"
        os.makedirs(os.path.dirname(a.table), exist_ok=True)
        with open(a.table, "w") as f:
            f.write(table)
        return table

    interrupted = False
    table = write_table()

    def done(name, v, d, secs):
        nonlocal table
        print("# %-28s %-8s %4ds  %s" % (name, v, secs, d), flush=True)
        if name.startswith("baseline") and name not in by_name:
            if v != "SURVIVED":
                baseline_failed.append(d)
            return
        e = by_name[name]
        rows.append((name, e["what"], tests_of(e), v, d, secs))
        table = write_table()

    for lane, group in batches.items():
        try:
            run_batch(pristine, lane, group, a.baseline, logdir, a.table,
                      done)
        except KeyboardInterrupt:
            interrupted = True
            break
    # kept trees for the breakages that are not batched: one for those with
    # a guest (one at a time), one per host job
    slots = queue.Queue()
    for n in range(a.jobs):
        slots.put("unit-%d" % n)

    def one_single(e, slot="single"):
        """(verdict, seconds) of a breakage in a kept tree of its own."""
        t0 = time.time()
        tree = kept_tree(pristine, slot)
        with open(os.path.join(logdir, e["name"] + ".log"), "wb") as log:
            err = apply(tree, e)
            verdict = (("ERROR", "does not apply: " + err) if err else
                       run_tests(tree, e, log, not a.named_only))
        return verdict, int(time.time() - t0)

    def host_single(e):
        slot = slots.get()
        try:
            return one_single(e, slot)
        finally:
            slots.put(slot)

    # VM breakages one after the other (one guest at a time), then the
    # host's side by side: not during a guest's run, whose tests time
    # things on the same cores
    vm_singles = [e for e in singles
                  if any(w[0] != "unit" for w in e["tests"])]
    host_singles = [e for e in singles if e not in vm_singles]
    for e in [] if interrupted else vm_singles:
        try:
            verdict, secs = one_single(e)
        except KeyboardInterrupt:
            interrupted = True
            break
        done(e["name"], verdict[0], verdict[1], secs)
    if host_singles and not interrupted:
        pool = concurrent.futures.ThreadPoolExecutor(a.jobs)
        futures = {pool.submit(host_single, e): e for e in host_singles}
        try:
            for f in concurrent.futures.as_completed(futures):
                verdict, secs = f.result()
                done(futures[f]["name"], verdict[0], verdict[1], secs)
        except KeyboardInterrupt:
            interrupted = True
            pool.shutdown(wait=False, cancel_futures=True)
        else:
            pool.shutdown()

    table = write_table()
    print()
    print(table)
    for d in baseline_failed:
        print("mutants: the unbroken module fails in a batch: %s" % d)
    survived = sum(r[3] == "SURVIVED" for r in rows)
    errors = sum(r[3] == "ERROR" for r in rows)
    print("%d caught, %d survived, %d errors%s (logs in %s)" %
          (len(rows) - survived - errors, survived, errors,
           ", interrupted: %d not run" % (len(entries) - len(rows))
           if interrupted else "", logdir))
    return 0 if not (survived or errors or interrupted or
                     baseline_failed) else 1


if __name__ == "__main__":
    sys.exit(main())
