#!/usr/bin/env bash
# Install the Debian packages varent builds and tests with, only when missing.
# Required: the build and the CPU test suite need them (Open MPI: tensor parallelism and
# agents across processes, tested with mpirun); failure stops make.
# Optional: the browser test (chromium + selenium), PNG plots (rsvg-convert), fuzzing
# (clang's libFuzzer), leak checks (valgrind), line editing in `varent chat` (libedit-dev;
# plain lines without it) and the chat's terminal test (tmux). Their tests SKIP without
# them, so a failed install only warns, and is not retried until the stamp file is removed.
set -euo pipefail
required=(libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev python3-numpy python3-jinja2 python3-pip xz-utils
          libopenmpi-dev openmpi-bin)
optional=(chromium chromium-driver python3-selenium librsvg2-bin clang libclang-rt-dev valgrind libedit-dev tmux)
stamp=${DEPS_STAMP:-build/.deps-optional-failed}

missing_of() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
    done
}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
updated=0
apt_install() {  # packages...
    if [ $updated -eq 0 ]; then $sudo apt-get update -qq || return 1; updated=1; fi
    $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

mapfile -t missing < <(missing_of "${required[@]}")
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}" >&2
    apt_install "${missing[@]}" || { echo "install-deps: apt-get install ${missing[*]} failed (network?)" >&2; exit 1; }
fi

mapfile -t missing < <(missing_of "${optional[@]}")
if [ ${#missing[@]} -gt 0 ] && [ ! -e "$stamp" ]; then
    echo "install-deps: installing optional ${missing[*]}" >&2
    if ! apt_install "${missing[@]}"; then
        mkdir -p "$(dirname "$stamp")"
        echo "${missing[*]}" >"$stamp"
        echo "install-deps: warning: could not install ${missing[*]}; their tests will SKIP (rm $stamp to retry)" >&2
    fi
fi
exit 0
