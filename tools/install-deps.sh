#!/usr/bin/env bash
# Install the Debian packages varent builds and tests with, only when missing.
#   install-deps.sh run     what `make run` needs: the libraries the build links, xz-utils
#                           and pip (the demo's model download), libedit-dev (optional:
#                           line editing in `varent chat`; plain lines without it)
#   install-deps.sh build   the same and Open MPI (tensor parallelism and agents across
#                           processes): `make`, the default
#   install-deps.sh test    the same and what the tests use: numpy and jinja2 (the
#                           reference model, the chat templates), and, optional, the
#                           browser test (chromium + selenium), PNG plots (rsvg-convert),
#                           fuzzing (clang's libFuzzer), leak checks (valgrind) and the
#                           chat's terminal test (tmux): `make test`
# Required packages that fail to install stop make. Optional ones only warn (their tests
# SKIP without them), and are not retried until the stamp file is removed.
set -euo pipefail
set_name=${1:-build}
case "$set_name" in
run | build | test) ;;
*) echo "install-deps: unknown set '$set_name' (run, build or test)" >&2; exit 2 ;;
esac
required=(libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev xz-utils python3-pip)
optional=(libedit-dev)
if [ "$set_name" != run ]; then required+=(libopenmpi-dev openmpi-bin); fi
if [ "$set_name" = test ]; then
    required+=(python3-numpy python3-jinja2)
    optional+=(chromium chromium-driver python3-selenium librsvg2-bin clang libclang-rt-dev valgrind tmux)
fi
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
# a package that failed before is not retried (the stamp lists them)
if [ -e "$stamp" ]; then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | grep -vxF -f <(tr ' ' '\n' <"$stamp") || true)
fi
if [ ${#missing[@]} -gt 0 ] && [ -n "${missing[0]}" ]; then
    echo "install-deps: installing optional ${missing[*]}" >&2
    if ! apt_install "${missing[@]}"; then
        mkdir -p "$(dirname "$stamp")"
        echo "${missing[*]}" >>"$stamp"
        echo "install-deps: warning: could not install ${missing[*]}; their tests will SKIP (rm $stamp to retry)" >&2
    fi
fi
exit 0
