# SPDX-License-Identifier: MIT
"""Build step of the kvdmabuf package (metadata: pyproject.toml): copy the
C library of this tree (lib/libkvdmabuf.so.0, built by `make lib`, or the
file KVDMABUF_LIBRARY_FILE names) into the package, so that the installed
package loads its own library without the environment, and the preload
(lib/libkvdmabuf-preload.so, or KVDMABUF_PRELOAD_FILE) beside it, for
LD_PRELOAD=$(python3 -m kvdmabuf preload-path)."""
import os
import shutil

import setuptools
from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SONAME = "libkvdmabuf.so.0"
PRELOAD = "libkvdmabuf-preload.so"


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        for name, var in ((SONAME, "KVDMABUF_LIBRARY_FILE"),
                          (PRELOAD, "KVDMABUF_PRELOAD_FILE")):
            src = os.environ.get(var) or os.path.join(HERE, "..", name)
            if not os.path.exists(src):
                raise SystemExit("kvdmabuf: %s not found: run `make lib` in "
                                 "the source tree first (or set %s)"
                                 % (src, var))
            # the file itself, not the symlink
            shutil.copyfile(os.path.realpath(src),
                            os.path.join(self.build_lib, "kvdmabuf", name))


def _platform_wheel():
    """bdist_wheel that tags the wheel for this platform (py3-none-<plat>):
    it carries an x86-64 (or whatever was built) shared library, so it is
    not py3-none-any. Where wheel's command is not there, None."""
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:
        try:
            from wheel.bdist_wheel import bdist_wheel
        except ImportError:
            return None

    class PlatformWheel(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return ("py3", "none") + tuple(super().get_tag()[2:])

    return PlatformWheel


def _licence(spdx):
    """The licence as this setuptools takes it: an SPDX expression from 77
    on (License-Expression; the older table form is deprecated there), the
    text form before."""
    major_minor = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
    if major_minor >= (77, 0):
        return {"license_expression": spdx}
    return {"license": spdx}


_cmds = {"build_py": BuildWithLibrary}
if _platform_wheel() is not None:
    _cmds["bdist_wheel"] = _platform_wheel()
setup(cmdclass=_cmds, **_licence("MIT"))
