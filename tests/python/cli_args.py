#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The kvdmabuf command's arguments, on the host (no module needed): each
command takes its own options (getopt_long), --help prints the usage
without running anything, --version the library's version, and anything
unknown (command, option, argument) is named on stderr with exit status 2,
nothing run."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap  # noqa: E402
from ktap import check  # noqa: E402

TOP = ktap.use_build_tree()
CLI = os.path.join(TOP, "lib", "cli", "kvdmabuf")


def run(*args):
    # selftest would run what a folder lists: point it at an empty one
    env = dict(os.environ, KVDMABUF_SELFTEST_DIR="/nonexistent")
    return subprocess.run([CLI] + list(args), capture_output=True,
                          text=True, timeout=ktap.scaled(30), env=env)


def version_is_the_librarys():
    p = run("--version")
    check(p.returncode == 0, p.stderr)
    with open(os.path.join(TOP, "lib", "kvdmabuf.h")) as f:
        h = f.read()
    want = ".".join(re.search(r"#define KVDMABUF_VERSION_%s (\d+)" % k,
                              h).group(1)
                    for k in ("MAJOR", "MINOR", "PATCH"))
    check(p.stdout == "kvdmabuf %s\n" % want, p.stdout)


def help_of_a_command_runs_nothing():
    for cmd in ("check", "status", "selftest"):
        p = run(cmd, "--help")
        check(p.returncode == 0 and p.stdout.startswith("usage:") and
              not p.stderr, "%s --help: %d %r %r" %
              (cmd, p.returncode, p.stdout[:80], p.stderr))
    # after another option too: still only the usage
    p = run("check", "--json", "--help")
    check(p.returncode == 0 and p.stdout.startswith("usage:"), p.stdout)


def unknown_words_are_named_and_nothing_runs():
    cases = [(("selftest", "--lsit"), "kvdmabuf: selftest: unknown option "
              "'--lsit'"),
             (("check", "--preload"), "kvdmabuf: check: unknown option "
              "'--preload'"),
             (("frobnicate",), "kvdmabuf: unknown command 'frobnicate'"),
             (("--frob",), "kvdmabuf: unknown option '--frob'"),
             (("status", "--json", "extra"), "kvdmabuf: status: unexpected "
              "argument 'extra'"),
             (("--version", "x"), "kvdmabuf: unexpected argument 'x'")]
    for args, msg in cases:
        p = run(*args)
        check(p.returncode == 2, "%s: exit %d" % (args, p.returncode))
        check(p.stderr.startswith(msg + "\n"), "%s: %r" % (args, p.stderr))
        check(not p.stdout, "%s ran something: %r" % (args, p.stdout))


def no_command_is_a_usage_error():
    p = run()
    check(p.returncode == 2 and p.stderr.startswith("usage:"), p.stderr)


if __name__ == "__main__":
    sys.exit(ktap.main([
        version_is_the_librarys,
        help_of_a_command_runs_nothing,
        unknown_words_are_named_and_nothing_runs,
        no_command_is_a_usage_error,
    ]))
