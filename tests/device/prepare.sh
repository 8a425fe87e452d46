#!/usr/bin/env bash
# prepare.sh - run HERE (a Debian 12 machine with network, no GPU needed)
# before a device session: puts into .device/ (git-ignored) what
# tests/device/run.sh needs on a bare GPU machine, which has CUDA but not
# llmd's Debian libraries, cannot fetch anything, and does not get ../shared:
#
#   .device/debs/    the libraries' Debian packages (runtime and -dev), make
#                    and pkgconf; run.sh unpacks them into .device/sysroot
#                    there when the machine lacks them (never into /)
#   .device/models/  a copy of ../shared/models (the tests read it as
#                    ../shared/models; run.sh links it there)
#
# Then the device call is, e.g. (device tool; carry names .device):
#   run: command "tests/device/run.sh", carry [".device"], timeout_s 420
# About 12 MB; .gitignore keeps it out of the repository. Safe to rerun: it refreshes both folders.
set -euo pipefail
cd "$(dirname "$0")/../.."
dev=.device
rm -rf "$dev/debs" "$dev/models"
mkdir -p "$dev/debs" "$dev/models"
# runtime libraries and their -dev packages (the Makefile's PKGS, jemalloc's
# PIC archive for tools/jemalloc_private.sh), and the build tools a CUDA
# image may lack. GnuTLS (libmicrohttpd's) is left to the machine: its
# Debian package would drag libraries whose sonames differ there.
pkgs=(libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libpcre2-dev libssl3 libssl-dev
    libxxhash0 libxxhash-dev libjemalloc2 libjemalloc-dev libhwloc15 libhwloc-dev libnuma1
    libnuma-dev libltdl7 libltdl-dev liburing2 liburing-dev libjansson4 libjansson-dev
    libmicrohttpd12 libmicrohttpd-dev pkgconf pkgconf-bin libpkgconf3 make)
(cd "$dev/debs" && apt-get download "${pkgs[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
n=$(ls "$dev/debs"/*.deb | wc -l)
[ "$n" -eq "${#pkgs[@]}" ] || { echo "prepare.sh: got $n of ${#pkgs[@]} packages" >&2; exit 1; }
cp -L ../shared/models/*.gguf ../shared/models/reference.jsonl "$dev/models/"
echo "prepare.sh: $(du -sh "$dev" | cut -f1) in $dev ($n packages, $(ls "$dev/models" | wc -l) model files)"
