#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""cdi_container - /dev/kvdmabuf in a container through its CDI spec, with
a real OCI runtime (podman 5 and crun, from Debian 13): the spec of
`kvdmabuf cdi` in a folder every CDI runtime reads (/var/run/cdi: the
guest's /etc is read-only), a container of an unprivileged user (uid 1000) whose root
holds the VM's /usr and the build tree, and in it the Python binding
opening a context that requires the module (proxy-only: registrations:
engine, under libkvdmabuf-preload.so) on the module of the VM's kernel. With the CDI device the context opens (the
user reaches the device through the group the spec adds); without the
device it fails with ENODEV (no device in the container); with a spec made
without the group, EACCES (the device is 0660, the user not in its group).
The device's group stands for what the udev rule gives it on a node
(the guest has no udev): an existing group of the root, `disk`.
Skips where podman is not installed (the 6.1 lane runs the host's root)
and where the kernel has no cgroup2 (the debug lane's)."""
import grp
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # ktap
import ktap
from ktap import Skip, check

TOP = ktap.use_build_tree()
CLI = os.path.join(TOP, "lib", "cli", "kvdmabuf")
DEV = "/dev/kvdmabuf"
GROUP = "disk"
SPEC = "/var/run/cdi/kvdmabuf.json"
# what the container runs: the library through the binding, proxy-only
# (registrations: engine: the module required, no verbs device opened),
# under the preload as an engine would be
CODE = ("import errno, os, kvdmabuf\n"
        "try:\n"
        "    with kvdmabuf.Context(config={'protocol': 'rdma',\n"
        "                                  'registrations': 'engine'}) as c:\n"
        "        print('opened', c.query().module, os.getgroups())\n"
        "except kvdmabuf.Error as e:\n"
        "    print('failed', errno.errorcode[e.errno], os.getgroups())\n")


def podman(tmp, args):
    cmd = ["podman", "--root", tmp + "/storage", "--runroot", tmp + "/run",
           "--storage-driver", "vfs", "--events-backend", "none",
           "--cgroup-manager", "cgroupfs"] + args
    p = subprocess.run(cmd, capture_output=True, text=True,
                       timeout=ktap.scaled(300))
    for line in (p.stdout + p.stderr).splitlines():
        print("# " + line)
    return p


def rootfs(tmp):
    """A root of mount points: /usr and the build tree come from the VM
    (read-only), the usual links to /usr beside them."""
    r = os.path.join(tmp, "rootfs")
    if os.path.isdir(r):
        return r
    for d in ("usr", "etc", "tmp", "dev", "proc", "sys", "run"):
        os.makedirs(os.path.join(r, d), exist_ok=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        if os.path.islink("/" + link):
            os.symlink(os.readlink("/" + link), os.path.join(r, link))
    os.makedirs(r + TOP, exist_ok=True)
    return r


def run_in_container(tmp, spec_group, with_device):
    with open(SPEC, "w") as f:
        subprocess.run([CLI, "cdi", "--group", spec_group], stdout=f,
                       stderr=subprocess.PIPE, text=True, check=True)
    args = ["run", "--rm", "--network", "none", "--cgroups", "disabled",
            "--user", "1000:1000", "-v", "/usr:/usr:ro",
            "-v", "%s:%s:ro" % (TOP, TOP),
            "-e", "PYTHONPATH=" + os.path.join(TOP, "lib", "python"),
            "-e", "LD_PRELOAD=" + os.path.join(TOP, "lib",
                                               "libkvdmabuf-preload.so"),
            "-e", "KVDMABUF_LIBRARY=" + os.path.join(TOP, "lib",
                                                     "libkvdmabuf.so.0")]
    if with_device:
        args += ["--device", "kvdmabuf/proxy=kvdmabuf"]
    p = podman(tmp, args + ["--rootfs", rootfs(tmp), "python3", "-c",
                            CODE])
    check(p.returncode == 0, "podman run failed (%d)" % p.returncode)
    return p.stdout.split()


def device_reaches_a_container_through_its_cdi_spec():
    if not shutil.which("podman"):
        raise Skip("no podman in this lane's root")
    if os.geteuid():
        raise Skip("needs root (podman, the device's group)")
    with open("/proc/filesystems") as f:
        if "cgroup2" not in f.read():
            raise Skip("no cgroup2 in this kernel (crun needs it)")
    check(os.path.exists(DEV), "module not loaded")
    gid = grp.getgrnam(GROUP).gr_gid
    st = os.stat(DEV)
    # crun wants the cgroup2 hierarchy (the guest's init mounts none)
    cgroup = "/sys/fs/cgroup"
    mounted = not os.path.ismount(cgroup)
    if mounted:
        subprocess.run(["mount", "-t", "cgroup2", "none", cgroup],
                       check=True)
    tmp = tempfile.mkdtemp(prefix="kvd-cdi.")
    os.makedirs(os.path.dirname(SPEC), exist_ok=True)
    check(not os.path.exists(SPEC), "%s is there already" % SPEC)
    try:
        os.chown(DEV, 0, gid)
        os.chmod(DEV, 0o660)
        got = run_in_container(tmp, GROUP, True)
        check(got[:2] == ["opened", "1"] and str(gid) in " ".join(got[2:]),
              "with the CDI device: %s" % got)
        got = run_in_container(tmp, GROUP, False)
        check(got[:2] == ["failed", "ENODEV"], "without it: %s" % got)
        got = run_in_container(tmp, "", True)
        check(got[:2] == ["failed", "EACCES"], "spec without the group: %s"
              % got)
    finally:
        os.chown(DEV, st.st_uid, st.st_gid)
        os.chmod(DEV, stat.S_IMODE(st.st_mode))
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.exists(SPEC):
            os.unlink(SPEC)
        if mounted:
            subprocess.run(["umount", cgroup])


if __name__ == "__main__":
    sys.exit(ktap.main([device_reaches_a_container_through_its_cdi_spec]))
