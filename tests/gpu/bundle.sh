#!/usr/bin/env bash
# tests/gpu/bundle.sh: run HERE, on a build machine (nvcc, cuDNN headers and
# the -dev packages; no GPU needed), before a session on a lent GPU machine.
# That machine starts bare: no libzmq / protobuf-c / OpenBLAS / cJSON, no
# Fashion-MNIST, and no package registry to fetch them from. So this script
# builds everything with CUDA into $BUILD (default build-gpu) and packs what
# tests/gpu/run.sh needs into build-gpu-bundle/bundle.tar.gz:
#   build/                 the three binaries, lib/downpour-cuda.so (the CUDA
#                          backend they load) and tests/test_gpu_ops
#   lib/                   shared libraries they load beyond glibc, libstdc++
#                          and CUDA's own (the GPU machine brings those)
#   data/fashion-mnist/    the default data set
#   BUNDLE_INFO            when and from which commit it was made
# Then carry it: run(command="bash tests/gpu/run.sh", carry=["build-gpu-bundle"]).
# run.sh prefers the bundle when it finds one (DP_GPU_BUILD=1 builds instead).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-2}
DEST=build-gpu-bundle
DATA_DIR=${DP_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}

echo "bundle: building into $BUILD (make -j$JOBS tests)"
make --no-print-directory BUILD="$BUILD" -j"$JOBS" tests
if [ ! -x "$BUILD/tests/test_gpu_ops" ]; then
    echo "bundle: $BUILD/tests/test_gpu_ops was not built: the build found no CUDA (see the CUDA: line above)" >&2
    exit 1
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/tests" "$stage/lib" "$stage/data"
# Only what run.sh runs (the three daemons, test_gpu_ops and
# test_gpu_devregion), without their
# debug sections: every test program with symbols is over 50 MiB, and the
# bundle must travel inside the working tree's 64 MiB.
# The CUDA backend is a module the programs load from their lib/
# (kernels/backend.h): it goes along in the same place.
mkdir -p "$stage/build/lib"
cp "$BUILD/downpour" "$BUILD/downpour-ps" "$BUILD/downpour-worker" "$stage/build/"
cp "$BUILD/lib/downpour-cuda.so" "$stage/build/lib/"
cp "$BUILD/tests/test_gpu_ops" "$BUILD/tests/test_gpu_optim_dev" "$stage/build/tests/"
[ -x "$BUILD/tests/test_gpu_devregion" ] && cp "$BUILD/tests/test_gpu_devregion" "$stage/build/tests/"
strip --strip-debug "$stage"/build/downpour* "$stage"/build/lib/* "$stage"/build/tests/*

# Libraries: everything ldd resolves except the C runtime, the compiler's
# runtime (a newer system has newer ones; an older copy would shadow them)
# and CUDA's (the GPU machine's driver-matched ones must be used).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libgcc_s\.so|libstdc\+\+\.so|libcuda|libcudart|libcublas|libcudnn|libnv)'
# OpenBLAS is not linked but loaded by the kernels at start (dlopen of
# kernels/cpu/blas.h's DP_CPU_BLAS_SONAME, its core pinned per ISA path), so
# ldd does not see it: it goes along by name, with what it links.
# (awk reads to the end: an early exit would kill ldconfig with SIGPIPE,
# which pipefail turns into this script's failure)
blas=$(ldconfig -p | awk '$1 == "libopenblas.so.0" && /x86-64/ && !seen {print $NF; seen = 1}')
if [ -n "$blas" ]; then
    cp -L "$blas" "$stage/lib/libopenblas.so.0"
else
    echo "bundle: warning: no libopenblas.so.0 here: every binary will refuse to start there" >&2
fi
ldd "$stage"/build/downpour* "$stage"/build/lib/* "$stage"/build/tests/* ${blas:+"$stage/lib/libopenblas.so.0"} 2>/dev/null |
    awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
    while read -r name path; do
        if echo "$name" | grep -Eq "$skip"; then continue; fi
        cp -L "$path" "$stage/lib/$name"
    done

if [ -d "$DATA_DIR" ]; then
    mkdir -p "$stage/data/fashion-mnist"
    cp "$DATA_DIR"/*-ubyte* "$stage/data/fashion-mnist/"
else
    echo "bundle: warning: no Fashion-MNIST at $DATA_DIR: run.sh will need it on the GPU machine" >&2
fi

{
    echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) (plus the working tree's changes, if any)"
    echo "libs: $(ls "$stage/lib" | tr '\n' ' ')"
} >"$stage/BUNDLE_INFO"

mkdir -p "$DEST"
tar czf "$DEST/bundle.tar.gz" -C "$stage" .
size=$(stat -c %s "$DEST/bundle.tar.gz")
cat "$stage/BUNDLE_INFO"
echo "bundle: $DEST/bundle.tar.gz, $((size / 1048576)) MiB"
if [ "$size" -gt $((56 * 1048576)) ]; then
    echo "bundle: too large to carry with the working tree (64 MiB in all)" >&2
    exit 1
fi
