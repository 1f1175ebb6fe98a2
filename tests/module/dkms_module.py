#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""dkms_module - the helper module as DKMS built and installed it (module/
dkms.conf, tests/vm/dkms.sh: in the Debian 13 root for its lanes, Debian
12's dkms on the host for 6.1) loads with modprobe on this kernel and
answers the version ioctl; then the lane's own build is loaded back.
modprobe only finds modules under /lib/modules/RELEASE, where the DKMS file
is the only kvdmabuf (the lane's is insmodded from its build tree), so a
module loaded by modprobe is the DKMS one; modinfo names it.

On 6.1 the guest runs the host's own root, where DKMS did not install: its
files (the module and depmod's indexes) are in a folder of the cache
(KVDMABUF_DKMS_MODULES), laid over /lib/modules/RELEASE here by a
read-only overlay in this test's own mount namespace."""
import ctypes
import fcntl
import glob
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap
from ktap import Skip, check

TOP = ktap.use_build_tree()
LANE_KO = os.path.join(os.environ.get("KVDMABUF_BUILD", TOP), "module",
                       "kvdmabuf.ko")


def sh(*cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    for line in (p.stdout + p.stderr).splitlines():
        print("# %s: %s" % (cmd[0], line))
    return p


def api_version():
    fd = os.open("/dev/kvdmabuf", os.O_RDWR)
    try:
        arg = bytearray(struct.pack("=IIIIQQ", 32, 0, 0, 0, 0, 0))
        fcntl.ioctl(fd, (3 << 30) | (32 << 16) | (0xC9 << 8) | 0, arg)
        return struct.unpack("=IIIIQQ", arg)[2]
    finally:
        os.close(fd)


def lay_over_modules(layer, mods):
    """The DKMS layer over the kernel's module folder, for this process and
    its children only (a private mount namespace)."""
    CLONE_NEWNS = 0x00020000
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNS):
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    check(sh("mount", "--make-rprivate", "/").returncode == 0)
    check(sh("mount", "-t", "overlay", "overlay", "-o",
             "ro,lowerdir=%s:%s" % (layer, mods), mods).returncode == 0,
          "cannot lay %s over %s" % (layer, mods))


def dkms_module_loads_with_modprobe():
    rel = os.uname().release
    mods = "/lib/modules/%s" % rel
    layer = os.environ.get("KVDMABUF_DKMS_MODULES")
    if layer:
        check(os.path.isdir(layer), "no DKMS folder %s" % layer)
        if os.geteuid():
            raise Skip("needs root")
        lay_over_modules(layer, mods)
    found = glob.glob("%s/updates/dkms/kvdmabuf.ko*" % mods)
    if not found:
        raise Skip("no DKMS build for %s (tests/vm/dkms.sh builds for the "
                   "Debian 13 lanes and 6.1)" % rel)
    if os.geteuid():
        raise Skip("needs root")
    check(sh("modinfo", "-F", "filename", "kvdmabuf").stdout.strip() ==
          found[0], "modprobe would not pick the DKMS build")
    check(sh("rmmod", "kvdmabuf").returncode == 0, "rmmod failed")
    check(not os.path.exists("/sys/module/kvdmabuf"))
    try:
        check(sh("modprobe", "kvdmabuf").returncode == 0, "modprobe failed")
        check(os.path.exists("/sys/module/kvdmabuf"))
        check(api_version() >> 16 == 3, "API %x" % api_version())  # uapi major
    finally:
        sh("rmmod", "kvdmabuf")
        check(sh("insmod", LANE_KO,
                 *os.environ.get("KVDMABUF_KO_PARAMS", "").split()
                 ).returncode == 0,
              "the lane's module did not load again")
    check(api_version() >> 16 == 3)


if __name__ == "__main__":
    raise SystemExit(ktap.main([dkms_module_loads_with_modprobe]))
