#!/usr/bin/env bash
# tools/gpu-bundle.sh: packs a CUDA build of varent and of every test program, with the
# shared libraries a bare GPU machine lacks (cJSON, PCRE2, utf8proc, libmicrohttpd and
# what they pull in), into .gpu/bundle.tar.xz, for a GPU machine that cannot install
# packages or reach a network (the device tool's machines). Run it here, where the build
# dependencies are installed; then on the GPU machine, from the repository root:
#   tools/gpu-verify.sh check|suite|sanitize|bench
# which unpacks the bundle on first use. The build targets x86-64-v3 (AVX2) rather than
# this machine's -march=native, so it runs on the GPU host's CPU; glibc here (Debian 12,
# 2.36) is older than the GPU image's, so the binaries load there. .gpu/ is git-ignored.
# Env: OUT_DIR (.gpu), JOBS (nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT_DIR:-.gpu}
jobs=${JOBS:-$(nproc)}
command -v nvcc >/dev/null || test -x /usr/local/cuda/bin/nvcc || { echo "gpu-bundle: no nvcc: the bundle needs a CUDA build" >&2; exit 1; }
bash tools/install-deps.sh
mkdir -p "$out/lib"
make -j"$jobs" ARCH=-march=x86-64-v3 BUILD="$out/build" BIN="$out/build/varent" "$out/build/varent" tests >/dev/null

# The libraries of the binary that are not part of glibc, gcc's runtime or CUDA (those
# are on the GPU image): copied with their sonames.
ldd "$out/build/varent" | awk '$3 ~ /^\// { print $1, $3 }' | while read -r soname path; do
    case $soname in
    libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libgcc_s.so* | libstdc++.so* | libgomp.so* | libcu*) ;;
    *) cp -L "$path" "$out/lib/$soname" ;;
    esac
done
tar -cJf "$out/bundle.tar.xz" -C "$out" build/varent build/tests build/fuzz-replay lib
echo "gpu-bundle: $out/bundle.tar.xz ($(du -h "$out/bundle.tar.xz" | cut -f1)): $(ls "$out/lib" | tr '\n' ' ')"
