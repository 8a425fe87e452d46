#!/usr/bin/env bash
# jemalloc_private.sh OUT.o - build the copy of jemalloc that only the host
# tier (offload/ofl_host.c) uses, as one relocatable object for libllmd.
#
# Why not libjemalloc.so.2: linking it (-ljemalloc) would make jemalloc the
# malloc of every program that links libllmd, whenever it comes before libc
# in the link order. Loading it privately with dlopen(RTLD_LOCAL) fails:
# Debian's libjemalloc.so.2 keeps its per-thread state in initial-exec TLS
# (2.6 KiB, DF_STATIC_TLS), and glibc can place that only in objects loaded
# at start-up ("cannot allocate memory in static TLS block" after it).
#
# So: the objects of Debian's libjemalloc_pic.a (libjemalloc-dev; the C++
# operator new/delete object left out) are linked into one relocatable
# object in which mallocx, dallocx, sallocx, nallocx and mallctl are renamed
# ofl_je_* and every other symbol (malloc, free, ...) is made local. The
# process's malloc is untouched, a process may also use its own jemalloc,
# and linked into an executable the TLS becomes local-exec. The copy reads
# MALLOC_CONF as any jemalloc does. It goes into libllmd.a only: in
# libllmd.so its TLS would make every late dlopen of libllmd.so fail, so
# there offload/ofl_host.c dlopens libjemalloc.so.2 instead (see the Makefile).
set -euo pipefail
out=${1:?usage: jemalloc_private.sh OUT.o}
libdir=$(pkg-config --variable=libdir jemalloc 2>/dev/null || true)
ar_file=${libdir:-/usr/lib/x86_64-linux-gnu}/libjemalloc_pic.a
if [ ! -f "$ar_file" ]; then
    echo "jemalloc_private.sh: $ar_file not found: install libjemalloc-dev (make deps-run)" >&2
    exit 1
fi
tmp=$(mktemp -d "${out}.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && ar x "$ar_file" && rm -f jemalloc_cpp.pic.o)
${LD:-ld} -r -o "$tmp/all.o" "$tmp"/*.pic.o
args=()
for s in mallocx dallocx sallocx nallocx mallctl; do
    args+=(--redefine-sym "$s=ofl_je_$s" --keep-global-symbol "ofl_je_$s")
done
${OBJCOPY:-objcopy} "${args[@]}" "$tmp/all.o" "$out"
