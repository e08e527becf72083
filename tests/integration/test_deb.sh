#!/usr/bin/env bash
# test_deb: `make install` and `make deb` from the tests' build.
#  - make install with PREFIX and DESTDIR: everything lands under
#    DESTDIR/PREFIX, and the units name PREFIX's binaries (not DESTDIR's);
#  - install and deb install their tools as run does (help2man; dpkg-dev):
#    as root by apt-get, otherwise stopping with the apt-get line (a package
#    list naming a missing package, a stand-in id and apt-get);
#  - make deb: the control fields; Depends is exactly the packages that own
#    the libraries the binaries link directly (readelf NEEDED, dpkg -S) or
#    dlopen (OpenBLAS, kernels/cpu/blas.h), CUDA ones left out; apt-get
#    resolves it (--simulate: nothing is installed);
#  - the package unpacked into a scratch root (dpkg -x): every library is
#    found, the man pages read, the units name /usr/bin, and `downpour local`
#    from it runs a short job with the installed downpour-ps and
#    downpour-worker (the launcher's children are the unpacked binaries);
#  - the client library: libdownpour.so.1 (its soname) with its links, the
#    header and downpour.pc (a C program built with pkg-config from the
#    staged install runs and gets the library's version), the Python package
#    where Debian's python3 finds it, loading the installed library (make
#    install: the LIBDIR it recorded; make deb: the loader's path, shlibs
#    and the ldconfig trigger in the package);
#  - lintian, when installed, finds no error (a CUDA build: but the RUNPATH
#    to NVIDIA's libraries).
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"

for t in dpkg-deb dpkg-shlibdeps help2man; do
    if ! command -v $t >/dev/null; then
        skip deb "$t is not installed (make deps-test: dpkg-dev, help2man)"
        finish; exit
    fi
done
scale=${DP_TEST_TIMEOUT_SCALE:-1}
# The same build as the tests': CPU-only unless it made the CUDA module.
cuda=CUDA=0
[ -e "$BUILD/lib/downpour-cuda.so" ] && cuda=
mk() { make --no-print-directory BUILD="$BUILD" $cuda "$@"; }

# ---- make install, PREFIX and DESTDIR ---------------------------------------------
D=$TMP/stage
mk install PREFIX=/opt/dp DESTDIR="$D" >"$TMP/install.log" 2>&1
check "make install PREFIX=/opt/dp DESTDIR=..." test $? = 0
check "... the three binaries in DESTDIR/PREFIX/bin" \
    test -x "$D/opt/dp/bin/downpour" -a -x "$D/opt/dp/bin/downpour-ps" -a -x "$D/opt/dp/bin/downpour-worker"
check "... a man page each" test -s "$D/opt/dp/share/man/man1/downpour-ps.1.gz" \
    -a -s "$D/opt/dp/share/man/man1/downpour-worker.1.gz" -a -s "$D/opt/dp/share/man/man1/downpour.1.gz"
# downpour(1)'s NAME line is written from the launcher's command table
# (downpour --summary), as its usage is: every command, the lab's included.
check "... downpour(1) names every command, sweep, replay and gen-libsvm too" \
    sh -c "zcat '$D/opt/dp/share/man/man1/downpour.1.gz' | sed -n '/^\.SH NAME/,/^\.SH/p' | grep -q 'bench scale, sim, replay, sweep, gen-libsvm'"
check "... the units, naming PREFIX's binaries" \
    grep -q '^ExecStart=/opt/dp/bin/downpour-worker ' "$D/opt/dp/lib/systemd/system/downpour-worker@.service"
check "... nothing outside DESTDIR/PREFIX" test "$(ls "$D")" = opt -a "$(ls "$D/opt")" = dp
if [ -z "$cuda" ]; then
    # the installed worker finds the CUDA module from its own place: its
    # error on a machine without a GPU is the backend's, not the loader's
    "$D/opt/dp/bin/downpour-worker" --standalone --device cuda:0 --steps 1 --no-progress \
        >"$TMP/cuda.log" 2>&1
    check "... the CUDA backend in PREFIX/lib/downpour, loaded from there ($(tail -1 "$TMP/cuda.log"))" \
        bash -c "test -f '$D/opt/dp/lib/downpour/downpour-cuda.so' && ! grep -q 'not where it belongs' '$TMP/cuda.log'"
fi
L=$D/opt/dp/lib
check "... libdownpour.so.1 (its soname) and the links" \
    test -f "$L/libdownpour.so.1.0.0" -a "$(readlink "$L/libdownpour.so.1")" = libdownpour.so.1.0.0 \
    -a "$(readlink "$L/libdownpour.so")" = libdownpour.so.1 \
    -a -n "$(readelf -d "$L/libdownpour.so.1.0.0" | grep 'SONAME.*\[libdownpour.so.1\]')"
check "... exporting downpour_* only" \
    test -z "$(nm -D --defined-only "$L/libdownpour.so.1.0.0" | awk '$2 == "T" && $3 !~ /^downpour_[a-z]/')"
cat >"$TMP/v.c" <<'C'
#include <downpour.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
    printf("%s %d\n", downpour_version(), downpour_api_version());
    return strcmp(downpour_version(), DOWNPOUR_VERSION) != 0 || downpour_api_version() != DOWNPOUR_API_VERSION;
}
C
flags=$(PKG_CONFIG_PATH=$L/pkgconfig PKG_CONFIG_SYSROOT_DIR=$D pkg-config --cflags --libs downpour)
check "... downpour.pc: a C program builds with pkg-config ($flags)" \
    cc -o "$TMP/v" "$TMP/v.c" $flags
out=$(LD_LIBRARY_PATH=$L "$TMP/v" 2>&1)
check "... and runs against the installed library ($out)" test $? = 0
py=$(find "$D/opt/dp/lib" -path '*dist-packages/downpour/__init__.py' | head -1)
check "... the Python package under PREFIX's dist-packages" test -n "$py"
# Staged, the library is not at /opt/dp/lib yet: the package records that
# path, and loads the staged one once DOWNPOUR_LIB names it.
out=$(cd "$TMP" && PYTHONPATH=$(dirname "$(dirname "$py")") DOWNPOUR_LIB=$L/libdownpour.so.1 "$TORCH_PY" -c '
import downpour, downpour._install as i, downpour._lib as l
print(i.LIBDIR, l.load().downpour_version().decode())' 2>&1)
check "... which records LIBDIR /opt/dp/lib for the library it loads ($out)" \
    test "$out" = "/opt/dp/lib 1.0.0"

# ---- install and deb install their own tools, as run does -----------------------
# The Makefile's install_missing, for real but for a package list naming one
# that is not installed, and with stand-ins on PATH: id (root or not) and
# apt-get (records what it is asked, installs nothing).
check "make install here: its tools are installed, nothing to say" test -z "$(grep '^deps:' "$TMP/install.log")"
F=$TMP/fake
mkdir -p "$F"
printf '#!/bin/sh\necho "$FAKE_UID"\n' >"$F/id"
printf '#!/bin/sh\necho "$*" >>"%s"\n' "$TMP/apt.log" >"$F/apt-get"
chmod +x "$F/id" "$F/apt-get"
absent=downpour-test-absent
as() { local uid=$1; shift; PATH=$F:$PATH FAKE_UID=$uid mk "$@"; }
out=$(as 1000 install DESTDIR="$TMP/d1" DEB_INSTALL="$absent help2man" 2>&1)
check "make install, not root, help2man's package missing: stops" test $? != 0 -a ! -e "$TMP/d1"
check "... printing the apt-get line for it only" grep -qx "deps: missing packages; run: sudo apt-get install $absent *" <<<"$out"
out=$(as 0 install DESTDIR="$TMP/d2" DEB_INSTALL="$absent help2man" 2>&1)
check "make install as root: installs it, then installs" test $? = 0 -a -x "$TMP/d2/usr/local/bin/downpour-ps"
check "... by apt-get" test "$(cat "$TMP/apt.log" 2>/dev/null)" = "update -qq
install -y -qq $absent"
check "... saying so" grep -qx "deps: installing $absent *" <<<"$out"
out=$(as 1000 deb DEB_DEB="$absent dpkg-dev" 2>&1)
check "make deb, not root, dpkg-dev's package missing: stops before it starts" \
    test $? != 0 -a -z "$(grep -F 'rm -rf' <<<"$out")"
check "... printing the apt-get line for it" grep -qx "deps: missing packages; run: sudo apt-get install $absent *" <<<"$out"
out=$(as 1000 deb DEB_INSTALL="$absent" 2>&1)
check "make deb needs what make install needs, before it starts" \
    test -z "$(grep -F 'rm -rf' <<<"$out")" -a -n "$(grep -x "deps: missing packages; run: sudo apt-get install $absent *" <<<"$out")"

# ---- make deb --------------------------------------------------------------------
mk deb >"$TMP/deb.log" 2>&1
check "make deb" test $? = 0 || tail -5 "$TMP/deb.log"
arch=$(dpkg --print-architecture)
deb=$(ls "$BUILD"/downpour_*_"$arch".deb 2>/dev/null)
check "one package, named downpour_VERSION_$arch.deb" test "$(echo "$deb" | grep -c .)" = 1
field() { dpkg-deb -f "$deb" "$1"; }
check "control: Package, Architecture, Version, Maintainer, Installed-Size" \
    test "$(field Package)" = downpour -a "$(field Architecture)" = "$arch" \
    -a -n "$(field Maintainer)" -a "$(field Installed-Size)" -gt 0
check "control: Version starts with a digit" grep -q '^[0-9]' <<<"$(field Version)"
dpkg-deb -I "$deb" | sed -n '/Package:/,$p'

# owner PATH: the installed package that owns a library file (bookworm
# registers some under /lib, some under /usr/lib; openblas is an alternative).
owner() {
    local p q o
    for p in "$1" "$(realpath "$1")"; do
        for q in "$p" "${p#/usr}" "/usr$p"; do
            o=$(dpkg -S "$q" 2>/dev/null | head -1 | cut -d: -f1)
            [ -n "$o" ] && { echo "$o"; return; }
        done
    done
}
# What the binaries (and the CUDA module, when built) link directly, and who owns it.
needed=() linked=(downpour downpour-ps downpour-worker)
[ -z "$cuda" ] && linked+=(lib/downpour-cuda.so)
for b in "${linked[@]}"; do
    for so in $(readelf -d "$BIN/$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        path=$(ldd "$BIN/$b" | awk -v so="$so" '$1 == so { print $3 }')
        pkg=$(owner "$path")
        case $so in libcud* | libcublas*) continue ;; esac  # NVIDIA's, not Debian's
        needed+=("${pkg:-?$so}")
    done
done
# ... and what the kernels dlopen in main (kernels/cpu/blas.h: OpenBLAS).
needed+=("$(owner "$(ldconfig -p | awk '$1 == "libopenblas.so.0" { print $NF; exit }')")")
mapfile -t needed < <(printf '%s\n' "${needed[@]}" | sort -u)
mapfile -t depends < <(field Depends | tr ',' '\n' | sed 's/ *(.*//; s/^ *//' | sort -u)
echo "linked: ${needed[*]}"
echo "Depends: ${depends[*]}"
# Each linked library's package is in Depends, under its name or the name
# of the shared library package it provides (libopenblas0-pthread: libopenblas0).
covered() {
    local n d miss=0
    for n in "${needed[@]}"; do
        for d in "${depends[@]}"; do [[ $n == "$d"* ]] && continue 2; done
        echo "not in Depends: $n"; miss=1
    done
    for d in "${depends[@]}"; do
        for n in "${needed[@]}"; do [[ $n == "$d"* ]] && continue 2; done
        echo "in Depends but not linked: $d"; miss=1
    done
    return $miss
}
check "Depends: exactly the packages of the linked libraries" covered
check "Depends: no CUDA library" test -z "$(field Depends | grep -iE 'cuda|cudnn|cublas')"
if apt-get --simulate install "$(realpath "$deb")" >"$TMP/apt.log" 2>&1; then
    check "apt-get --simulate install ./downpour_*.deb resolves" grep -q '^Inst downpour ' "$TMP/apt.log"
else
    fail "apt-get --simulate install ./downpour_*.deb" "$(grep '^E:' "$TMP/apt.log" | head -2)"
fi

# ---- the package, unpacked into a scratch root -----------------------------------
R=$TMP/root
dpkg -x "$deb" "$R"
check "installed: the binaries in /usr/bin" test -x "$R/usr/bin/downpour" -a -x "$R/usr/bin/downpour-ps" -a -x "$R/usr/bin/downpour-worker"
check "installed: every library found" test -z "$(ldd "$R"/usr/bin/* | grep 'not found')"
check "installed: the units name /usr/bin" grep -q '^ExecStart=/usr/bin/downpour-ps ' "$R/lib/systemd/system/downpour-ps@.service"
check "installed: downpour-ps(1) from its --help" \
    sh -c "zcat '$R/usr/share/man/man1/downpour-ps.1.gz' | grep -q '^\.SH NAME' && zcat '$R/usr/share/man/man1/downpour-ps.1.gz' | grep -q 'ps\\\\-hosts'"
# README.md links its pages by relative path, so they sit beside it as in the tree.
D=$R/usr/share/doc/downpour
check "installed: README.md and the pages it links" \
    test -s "$D/README.md" -a -s "$D/docs/OPERATIONS.md" -a -s "$D/docs/LAB.md" -a -s "$D/docs/SECURITY.md"
ML=$R/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
check "installed: libdownpour.so.1 in the multiarch libdir, every library it needs found" \
    test -f "$ML/libdownpour.so.1" -a -s "$R/usr/include/downpour.h" -a -s "$ML/pkgconfig/downpour.pc" \
    -a -z "$(ldd "$ML/libdownpour.so.1" | grep 'not found')"
dpkg-deb -e "$deb" "$TMP/control"
check "installed: the package's shlibs names libdownpour 1, and ldconfig is triggered" \
    bash -c "grep -q '^libdownpour 1 downpour' '$TMP/control/shlibs' && grep -q 'ldconfig' '$TMP/control/triggers'"
out=$(cd "$TMP" && PYTHONPATH=$R/usr/lib/python3/dist-packages LD_LIBRARY_PATH=$ML "$TORCH_PY" -c '
import downpour, downpour._lib as l
lib = l.load()
print(downpour.__file__, downpour.library_path(), lib.downpour_version().decode())' 2>&1)
check "installed: the Python package in /usr/lib/python3/dist-packages loads the loader's libdownpour.so.1 ($out)" \
    grep -q "^$R/usr/lib/python3/dist-packages/downpour/__init__.py libdownpour.so.1 1.0.0$" <<<"$out"
check "installed: copyright and changelog" test -s "$R/usr/share/doc/downpour/copyright" -a -s "$R/usr/share/doc/downpour/changelog.gz"
if [ -d /usr/share/datasets/fashion-mnist ]; then
    (cd "$TMP" && exec "$R/usr/bin/downpour" local --workers 2 --steps 4 --batch 32 --threads 1 \
        --no-progress --out "$TMP/run" >"$TMP/run.log" 2>&1) &
    launcher=$!
    # The launcher's children: the unpacked binaries, found beside it.
    exes="" t=0
    while kill -0 $launcher 2>/dev/null && [ $t -lt $((600 * scale)) ]; do
        for c in $(pgrep -P $launcher); do exes+=" $(readlink "/proc/$c/exe" 2>/dev/null)"; done
        sleep 0.2
        t=$((t + 1))
    done
    kill -TERM $launcher 2>/dev/null  # still running after 120 s (scaled): a failure
    wait $launcher
    check "installed: downpour local runs a short job" test $? = 0
    check "installed: ... with the unpacked downpour-ps and downpour-worker" \
        test -n "$(grep -o "$R/usr/bin/downpour-ps" <<<"$exes" | head -1)" -a -n "$(grep -o "$R/usr/bin/downpour-worker" <<<"$exes" | head -1)"
    check "installed: ... whose summary counts 2 x 4 updates" test "$(json "$TMP/run/summary.json" updates_applied 2>/dev/null)" = 8
else
    skip "installed job" "Debian's dataset-fashion-mnist is not installed (make deps)"
fi

if command -v lintian >/dev/null; then
    # The default Maintainer is a placeholder (DEB_MAINTAINER sets a real one).
    # A CUDA build keeps the RUNPATH of NVIDIA's libraries, which live
    # outside Debian's search path (/usr/local/cuda): lintian's
    # custom-library-search-path is then the design, not a defect.
    cuda_tags=; [ -z "$cuda" ] && cuda_tags='|custom-library-search-path'
    lintian --allow-root "$deb" 2>&1 | grep '^E:' | grep -Ev "bogus-mail-host$cuda_tags" >"$TMP/lintian.log"
    check "lintian: no error" test ! -s "$TMP/lintian.log"
    cat "$TMP/lintian.log"
else
    skip lintian "not installed"
fi

finish
