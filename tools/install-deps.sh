#!/usr/bin/env bash
# Install the Debian packages varent builds and tests with, only when missing.
set -euo pipefail
pkgs=(libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev python3-numpy python3-jinja2 python3-pip xz-utils)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq || { echo "install-deps: apt-get update failed (network?)" >&2; exit 1; }
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null || { echo "install-deps: apt-get install ${missing[*]} failed" >&2; exit 1; }
