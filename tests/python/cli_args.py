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
    for cmd in ("check", "status", "selftest", "cdi"):
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
             (("--version", "x"), "kvdmabuf: unexpected argument 'x'"),
             (("cdi", "--group"), "kvdmabuf: cdi: option needs an "
              "argument '--group'")]
    for args, msg in cases:
        p = run(*args)
        check(p.returncode == 2, "%s: exit %d" % (args, p.returncode))
        check(p.stderr.startswith(msg + "\n"), "%s: %r" % (args, p.stderr))
        check(not p.stdout, "%s ran something: %r" % (args, p.stdout))


def cdi_spec_names_the_device_and_its_group():
    """kvdmabuf cdi: a CDI spec (JSON a runtime reads from /etc/cdi) of
    /dev/kvdmabuf, kind kvdmabuf/proxy, device kvdmabuf: the node 0660 in
    the group the udev rule gives the device, that group added to the
    container's processes, where the node has the group (--group: another
    name; here root, which every node has), else a node for root alone;
    what is missing on the node (the device, the group) said on stderr,
    the spec still made."""
    import grp
    import json
    p = run("cdi", "--group", "root")
    check(p.returncode == 0, p.stderr)
    spec = json.loads(p.stdout)
    # the lowest version with what it uses: 0.7.0 added additionalGids
    check(spec["cdiVersion"] == "0.7.0" and spec["kind"] == "kvdmabuf/proxy",
          str(spec))
    dev = spec["devices"]
    check(len(dev) == 1 and dev[0]["name"] == "kvdmabuf", str(dev))
    edits = dev[0]["containerEdits"]
    gid = grp.getgrnam("root").gr_gid
    check(edits["deviceNodes"] == [{"path": "/dev/kvdmabuf",
                                    "permissions": "rw", "fileMode": 0o660,
                                    "uid": 0, "gid": gid}], str(edits))
    check(edits["additionalGids"] == [gid], str(edits))
    check(("/dev/kvdmabuf is not here" in p.stderr) !=
          os.path.exists("/dev/kvdmabuf"), p.stderr)
    p = run("cdi", "--group", "no-such-group-kvd")
    check(p.returncode == 0 and "no group 'no-such-group-kvd'" in p.stderr,
          p.stderr)
    spec = json.loads(p.stdout)
    edits = spec["devices"][0]["containerEdits"]
    check("additionalGids" not in edits and spec["cdiVersion"] == "0.6.0",
          p.stdout)
    # no group: a node only the container's root may open
    check(edits["deviceNodes"][0]["fileMode"] == 0o600 and
          edits["deviceNodes"][0]["gid"] == 0, p.stdout)


def no_command_is_a_usage_error():
    p = run()
    check(p.returncode == 2 and p.stderr.startswith("usage:"), p.stderr)


if __name__ == "__main__":
    sys.exit(ktap.main([
        version_is_the_librarys,
        help_of_a_command_runs_nothing,
        unknown_words_are_named_and_nothing_runs,
        no_command_is_a_usage_error,
        cdi_spec_names_the_device_and_its_group,
    ]))
