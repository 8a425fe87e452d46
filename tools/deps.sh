#!/usr/bin/env bash
# deps.sh {run|test} - make sure the Debian packages llmd needs are present.
# As root it installs what is missing with apt-get; otherwise it prints the
# exact command to run and fails, so `make run`/`make test` stop early with a
# clear message instead of a compiler error.
set -euo pipefail
what=${1:-run}
pkgs=(gcc make pkg-config libpcre2-dev libssl-dev libxxhash-dev libjemalloc-dev libhwloc-dev liburing-dev libjansson-dev libmicrohttpd-dev)
if [ "$what" = test ]; then
    pkgs+=(libcriterion-dev clang libclang-rt-14-dev)
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
    echo "llmd: installing missing packages: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    echo "llmd: missing Debian packages. Run:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
