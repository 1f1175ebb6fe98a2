# SPDX-License-Identifier: MIT
"""python3 -m kvdmabuf preload-path: the libkvdmabuf-preload.so installed
with this package, for LD_PRELOAD (exit status 1, and why on stderr, where
it has none). The admin's command is the C `kvdmabuf` (kvdmabuf(1))."""
import sys

USAGE = "usage: python3 -m kvdmabuf preload-path"


def main(argv):
    if argv != ["preload-path"]:
        print(USAGE, file=sys.stderr)
        return 2
    import kvdmabuf
    path = kvdmabuf.preload_path()
    if path is None:
        print("kvdmabuf: no libkvdmabuf-preload.so installed with this "
              "package (%s): use the system's (make install)"
              % kvdmabuf.__file__, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
