#!/usr/bin/env bash
# tools/gpu-bundle.sh: packs what a GPU window needs into .gpu/bundle.tar.xz, for a GPU
# machine that cannot install packages or reach a network (the device tool's machines):
#   build/    a CUDA build of varent and of every test program (x86-64-v3, sm_90), and
#             build/COMMIT
#   base/     the A/B baseline: varent built the same way at BASE_COMMIT, and base/COMMIT
#   lib/      the shared libraries a bare GPU machine lacks (cJSON, PCRE2, utf8proc,
#             libmicrohttpd and what they pull in), the tracer libvarent_trace.so
#             (tools/trace/cupti_trace.c) and the libcupti it was linked against
#   llamacpp/ llama.cpp's llama-bench, a CUDA build for sm_90 only (LLAMACPP=1; built
#             from the llama-cpp-python sdist, as tools/bench-llamacpp.py does for the CPU:
#             144 nvcc compilations, hours on this 2-core machine), or by default
#   llamacpp-src/ the sources llama-bench needs (7 MiB of xz): the GPU machine (16 cores,
#             nvcc, cmake, ninja) builds it there while the window's first stages run
# and checks that the bundle and the working tree together stay under LIMIT_MB (64 MiB,
# what the device tool carries), leaving llama.cpp out first and saying so. Run it here,
# where the build dependencies are; then on the GPU machine, from the repository root:
#   tools/gpu-window.sh          the whole window (docs/cuda.md, "A GPU window")
#   tools/gpu-verify.sh STAGE    the older staged checks
# glibc here (Debian 12, 2.36) is older than the GPU image's, so the binaries load there.
# .gpu/ is git-ignored.
# Env: OUT_DIR (.gpu), JOBS (nproc), BASE_COMMIT (d13cfbc, the last commit timed on a GPU;
#      "none": no baseline), LLAMACPP (0; 1 builds llama-bench, tens of minutes on 2 cores,
#      kept in OUT_DIR/llamacpp-build for the next bundle; src, the default: the sources;
#      0: no llama.cpp), LIMIT_MB (64), SUITE (0; 1 packs
#      every test program, for `tools/gpu-verify.sh suite`: about 70 MiB more).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
out=${OUT_DIR:-.gpu}
mkdir -p "$out"
out=$(cd "$out" && pwd)
jobs=${JOBS:-$(nproc)}
base_commit=${BASE_COMMIT:-d13cfbc}
limit_mb=${LIMIT_MB:-64}
command -v nvcc >/dev/null || test -x /usr/local/cuda/bin/nvcc || { echo "gpu-bundle: no nvcc: the bundle needs a CUDA build" >&2; exit 1; }
bash tools/install-deps.sh
rm -rf "$out/lib"  # only what this run copies: an old bundle's libraries could be anything
mkdir -p "$out/lib" "$out/base"
say() { echo "gpu-bundle: $*" >&2; }

# The current tree (its uncommitted changes included: COMMIT says so).
say "building the current tree"
make -j"$jobs" ARCH=-march=x86-64-v3 BUILD="$out/build" BIN="$out/build/varent" "$out/build/varent" tests \
    "$out/build/tools/libvarent_trace.so" >/dev/null
{ git rev-parse --short HEAD; git diff --quiet HEAD || echo "+uncommitted changes"; } | paste -sd ' ' >"$out/build/COMMIT"

# The baseline, from git archive (no worktree left behind), rebuilt only when it changes.
if [ "$base_commit" != none ]; then
    want=$(git rev-parse --short "$base_commit")
    if [ "$(cat "$out/base/COMMIT" 2>/dev/null)" != "$want" ]; then
        say "building the baseline $want"
        rm -rf "$out/base-src"
        mkdir -p "$out/base-src"
        git archive "$want" | tar -x -C "$out/base-src"
        make -C "$out/base-src" -j"$jobs" ARCH=-march=x86-64-v3 BUILD="$out/base-build" BIN="$out/base/varent" \
            "$out/base/varent" >/dev/null
        echo "$want" >"$out/base/COMMIT"
    fi
fi

# Libraries of the binaries that are not part of glibc, gcc's runtime or CUDA (those are
# on the GPU image), with their sonames; the tracer and its libcupti.
for bin in "$out/build/varent" "$out/base/varent"; do
    [ -x "$bin" ] || continue
    ldd "$bin" | awk '$3 ~ /^\// { print $1, $3 }' | while read -r soname path; do
        case $soname in
        # NCCL (218 MB) is on the GPU image too, in PyTorch's nvidia-nccl package: the
        # window's scripts put its folder on the library path.
        libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libgcc_s.so* | libstdc++.so* | libgomp.so* | libcu* | libnccl*) ;;
        *) cp -L "$path" "$out/lib/$soname" ;;
        esac
    done
done
cp "$out/build/tools/libvarent_trace.so" "$out/lib/"
cupti=$(ldd "$out/lib/libvarent_trace.so" | awk '$1 ~ /^libcupti/ { print $3 }')
[ -n "$cupti" ] && cp -L "$cupti" "$out/lib/"

# llama.cpp's llama-bench for sm_90, from the llama-cpp-python sdist (the version
# tools/bench-llamacpp.py pins), statically linked against ggml.
llamacpp_ver() { sed -n 's/^LLAMA_CPP_PYTHON = "\(.*\)"/\1/p' tools/bench-llamacpp.py; }
llamacpp_fetch() {  # the sdist, unpacked once into build/llamacpp-src
    local ver src=$ROOT/build/llamacpp-src
    ver=$(llamacpp_ver)
    [ -d "$src/vendor/llama.cpp" ] && return 0
    mkdir -p "$ROOT/build/llamacpp-dl"
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$ROOT/build/llamacpp-dl" >/dev/null || return 1
    rm -rf "$src"
    mkdir -p "$src"
    tar -xzf "$ROOT"/build/llamacpp-dl/llama_cpp_python-"$ver".tar.gz -C "$src" --strip-components 1
}
# What cmake needs to configure llama.cpp and build llama-bench (no docs, models or tests).
llamacpp_src() {
    local src=$ROOT/build/llamacpp-src/vendor/llama.cpp
    llamacpp_fetch || return 1
    rm -rf "$out/llamacpp-src"
    mkdir -p "$out/llamacpp-src"
    tar -cf - -C "$src" --exclude='*.md' CMakeLists.txt cmake common ggml include src tools vendor app pocs LICENSE licenses |
        xz -6 >"$out/llamacpp-src/llamacpp-src.tar.xz" || return 1
    echo "llama-cpp-python $(llamacpp_ver) (llama.cpp vendored), sources: built on the GPU machine for sm_90" \
        >"$out/llamacpp-src/VERSION"
}
llamacpp() {
    local ver src=$ROOT/build/llamacpp-src
    ver=$(llamacpp_ver)
    llamacpp_fetch || return 1
    cmake -S "$src/vendor/llama.cpp" -B "$out/llamacpp-build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$out/llamacpp-build" --target llama-bench -j"$jobs" >/dev/null
    mkdir -p "$out/llamacpp"
    cp "$out/llamacpp-build/bin/llama-bench" "$out/llamacpp/"
    echo "llama-cpp-python $ver (llama.cpp vendored), CUDA sm_90, static ggml" >"$out/llamacpp/VERSION"
}
rm -f "$out/llamacpp.why"
rm -rf "$out/llamacpp-src"
if [ "${LLAMACPP:-src}" = 1 ] || [ -x "$out/llamacpp/llama-bench" ]; then
    [ -x "$out/llamacpp/llama-bench" ] || { say "building llama.cpp (CUDA, sm_90)"; llamacpp || echo "the llama.cpp build failed (tools/gpu-bundle.sh)" >"$out/llamacpp.why"; }
elif [ "${LLAMACPP:-src}" = src ]; then
    say "packing llama.cpp's sources (the GPU machine builds llama-bench)"
    llamacpp_src || echo "could not fetch llama.cpp's sources (the llama-cpp-python sdist from PyPI)" >"$out/llamacpp.why"
else
    echo "not built: LLAMACPP=1 tools/gpu-bundle.sh builds it" >"$out/llamacpp.why"
fi

# The bundle, within what the device tool carries beside the working tree.
tree_bytes() {  # tracked and untracked-but-not-ignored files: what travels
    git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'
}
pack() {
    local parts=(build/varent build/COMMIT lib)
    if [ "${SUITE:-0}" = 1 ]; then
        parts+=(build/tests build/fuzz-replay)
    else  # the CUDA programs only: what the window and gpu-verify's check, sanitize and bench run
        # (test_gpu_watchdog: the guard's hardware-only check of the persistent kernel's waits)
        parts+=($(cd "$out" && ls -d build/tests/test_cuda_* build/tests/test_sample build/tests/test_gpu_watchdog))
    fi
    [ -x "$out/base/varent" ] && parts+=(base/varent base/COMMIT)
    [ "$1" = with-llamacpp ] && [ -x "$out/llamacpp/llama-bench" ] && parts+=(llamacpp)
    [ "$1" = with-llamacpp ] && [ -f "$out/llamacpp-src/llamacpp-src.tar.xz" ] && parts+=(llamacpp-src)
    [ -f "$out/llamacpp.why" ] && parts+=(llamacpp.why)
    XZ_OPT=-9 tar -cJf "$out/bundle.tar.xz" -C "$out" "${parts[@]}"
}
pack with-llamacpp
tree=$(tree_bytes)
total=$(($(stat -c %s "$out/bundle.tar.xz") + tree))
if [ "$total" -gt $((limit_mb << 20)) ] && [ -x "$out/llamacpp/llama-bench" -o -d "$out/llamacpp-src" ]; then
    echo "left out: the bundle with it would carry $((total >> 20)) MiB, over the $limit_mb MiB limit" >"$out/llamacpp.why"
    pack without
    total=$(($(stat -c %s "$out/bundle.tar.xz") + tree))
fi
mb() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
say "$out/bundle.tar.xz: $(mb "$(stat -c %s "$out/bundle.tar.xz")"), with the working tree $(mb "$total") of $limit_mb MiB"
lc=$(cat "$out/llamacpp/VERSION" "$out/llamacpp-src/VERSION" 2>/dev/null | head -1 || true)
[ -n "$lc" ] || lc=$(cat "$out/llamacpp.why" 2>/dev/null || true)
say "current $(cat "$out/build/COMMIT"); baseline $(cat "$out/base/COMMIT" 2>/dev/null || echo none); llama.cpp: $lc"
say "libraries: $(ls "$out/lib" | tr '\n' ' ')"
if [ "$total" -gt $((limit_mb << 20)) ]; then
    say "over the limit: the device tool will refuse to carry it"
    exit 1
fi
