#!/bin/sh
# SPDX-License-Identifier: MIT
# make deb: Debian packages of this tree, made with dpkg-deb from what
# `make install` puts in a staging folder (no debhelper), one package per
# audience:
#   libkvdmabuf0         the library (Recommends what it loads at first use)
#   libkvdmabuf-dev      headers, uapi header, static library, pkg-config, man 3
#   libkvdmabuf-preload  LD_PRELOAD interposer, its tmpfiles.d entry
#   kvdmabuf-tools       the kvdmabuf command, man 1 and 7, node selftests
#   kvdmabuf-dkms        the module's source for DKMS, the udev rule, the group
#   python3-kvdmabuf     the Python binding (finds the packaged library)
# Every staged file lands in exactly one package (lib_install checks it).
#
#   lib/deb.sh TOP OUT VERSION   (make deb passes them)
set -eu
top=$1 out=$2 version=$3
rev=1 full=$version-$rev
arch=$(dpkg --print-architecture)
multiarch=$(${CC:-cc} -print-multiarch)
libdir=/usr/lib/$multiarch
work=$(mktemp -d "${TMPDIR:-/tmp}/kvd-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/stage
mkdir -p "$out"

make -s -C "$top" install dkms-src DESTDIR="$stage" PREFIX=/usr \
	LIBDIR="$libdir" UDEVRULESDIR=/usr/lib/udev/rules.d
# test modules built for this machine's kernel are no package's business
find "$stage" -name '*.ko' -delete

# pkg NAME ARCH DEPENDS RECOMMENDS DESCRIPTION PATH... (paths in the stage)
pkg() {
	name=$1 parch=$2 depends=$3 recommends=$4 descr=$5
	shift 5
	root=$work/$name
	mkdir -p "$root/DEBIAN"
	for p in "$@"; do
		[ -e "$stage$p" ] || [ -L "$stage$p" ] || {
			echo "deb.sh: $name: $p not staged" >&2
			exit 1
		}
		mkdir -p "$root$(dirname "$p")"
		mv "$stage$p" "$root$p"
	done
	{
		echo "Package: $name"
		echo "Version: $full"
		echo "Architecture: $parch"
		echo "Maintainer: kvdmabuf developers <kvdmabuf@localhost>"
		case $name in
		python3-*) echo "Section: python" ;;
		*-dkms) echo "Section: kernel" ;;
		*-tools) echo "Section: admin" ;;
		*-dev) echo "Section: libdevel" ;;
		*) echo "Section: libs" ;;
		esac
		echo "Priority: optional"
		[ -z "$depends" ] || echo "Depends: $depends"
		[ -z "$recommends" ] || echo "Recommends: $recommends"
		echo "Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)"
		echo "Description: $descr"
		echo " kvdmabuf carries the RDMA registrations of an LLM engine's KV"
		echo " cache through sleep and wake (docs/ in its source)."
	} >"$root/DEBIAN/control"
}

pkg libkvdmabuf0 "$arch" "libc6, libibverbs1" "libyaml-0-2, libdrm2" \
	"KV-cache RDMA registrations through sleep and wake (library)" \
	"$libdir/libkvdmabuf.so.0" "$libdir/libkvdmabuf.so.$version"
echo "activate-noawait ldconfig" >"$work/libkvdmabuf0/DEBIAN/triggers"

pkg libkvdmabuf-dev "$arch" "libkvdmabuf0 (= $full), libibverbs-dev" "" \
	"KV-cache RDMA registrations through sleep and wake (development)" \
	/usr/include "$libdir/libkvdmabuf.so" "$libdir/libkvdmabuf.a" \
	"$libdir/pkgconfig" /usr/share/man/man3

pkg libkvdmabuf-preload "$arch" "libc6" "libyaml-0-2" \
	"KV-cache RDMA registrations through sleep and wake (LD_PRELOAD)" \
	"$libdir/libkvdmabuf-preload.so" /usr/lib/tmpfiles.d/kvdmabuf.conf

pkg kvdmabuf-tools "$arch" "libc6, libibverbs1, libdrm2" \
	"libyaml-0-2, kvdmabuf-dkms" \
	"KV-cache RDMA registrations through sleep and wake (command)" \
	/usr/bin/kvdmabuf /usr/share/man/man1 /usr/share/man/man7 \
	/usr/libexec/kvdmabuf

pkg kvdmabuf-dkms all "dkms" "" \
	"KV-cache RDMA registrations through sleep and wake (module, DKMS)" \
	"/usr/src/kvdmabuf-$version" /usr/lib/udev/rules.d/70-kvdmabuf.rules
cat >"$work/kvdmabuf-dkms/DEBIAN/postinst" <<POSTINST
#!/bin/sh
set -e
if [ "\$1" = configure ]; then
	getent group kvdmabuf >/dev/null || addgroup --system kvdmabuf
	dkms install kvdmabuf/$version || echo "kvdmabuf-dkms: not built for this kernel (are its headers installed?): dkms install kvdmabuf/$version" >&2
fi
POSTINST
cat >"$work/kvdmabuf-dkms/DEBIAN/prerm" <<PRERM
#!/bin/sh
set -e
dkms remove kvdmabuf/$version --all >/dev/null 2>&1 || true
PRERM
chmod 0755 "$work/kvdmabuf-dkms/DEBIAN/postinst" \
	"$work/kvdmabuf-dkms/DEBIAN/prerm"

pkg python3-kvdmabuf "$arch" "python3, libkvdmabuf0 (= $full)" \
	"libkvdmabuf-preload" \
	"KV-cache RDMA registrations through sleep and wake (Python)" \
	/usr/lib/python3/dist-packages/kvdmabuf

left=$(find "$stage" ! -type d | sed "s|^$stage||")
if [ -n "$left" ]; then
	echo "deb.sh: staged but in no package:" $left >&2
	exit 1
fi
for root in "$work"/*/DEBIAN; do
	root=${root%/DEBIAN}
	name=${root##*/}
	[ "$name" = stage ] && continue
	dpkg-deb --root-owner-group -Zxz --build "$root" \
		"$out/${name}_${full}_$(sed -n 's/^Architecture: //p' \
		"$root/DEBIAN/control").deb" >/dev/null
done
ls "$out"/*_"$full"_*.deb
