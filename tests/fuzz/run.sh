#!/usr/bin/env bash
# fuzz.sh SECONDS - build each libFuzzer target tests/fuzz/fuzz_*.c with clang
# (ASan+UBSan+fuzzer) against the library sources and run them for SECONDS in
# total, seeded with tests/fuzz/corpus_<name>/ and, when present, the real
# files in ../shared/models. A crash or leak fails the run. Longer runs by
# hand: tests/fuzz/run.sh 3600. A target may add libFuzzer flags, one per line
# ('#' starts a comment), in tests/fuzz/<name>.options; they come after the
# defaults and so override them.
#
# The library is compiled once for all targets (build/fuzz/obj), in parallel.
# kernels/cpu/ is compiled without the sanitizers and the fuzzer's coverage:
# the parsers are what is fuzzed, the kernels run under ASan+UBSan in `make
# test`'s asan suite, and clang's ASan+UBSan+coverage on the unrolled SIMD
# kernels took minutes a file (pack_k_avx512.c: about 5 on 2 cores).
set -euo pipefail
secs=${1:-60}
targets=(tests/fuzz/fuzz_*.c)
[ -e "${targets[0]}" ] || { echo "fuzz: no targets"; exit 0; }
per=$(( secs / ${#targets[@]} )); [ "$per" -ge 5 ] || per=5
out=build/fuzz; mkdir -p "$out"
lib=$(ls include/*.c vmm/*.c offload/*.c engine/*/*.c kernels/cpu/*.c 2>/dev/null || true)
# The library's pkg-config packages: the Makefile passes its PKGS.
pkgs=${PKGS:-libpcre2-8 libcrypto libxxhash hwloc liburing jansson libmicrohttpd}
# The host tier's private jemalloc (see tools/jemalloc_private.sh).
je="$out/jemalloc_private.o"
[ "$je" -nt tools/jemalloc_private.sh ] || tools/jemalloc_private.sh "$je"
base="-std=c17 -D_GNU_SOURCE -I. -Iinclude -g -O1 $(pkg-config --cflags $pkgs)"
san="-fsanitize=address,undefined -fno-sanitize-recover=all"
flags="$base -fsanitize=fuzzer $san"
export base san
mkdir -p "$out/obj"
# one object a source: name it after its path, a/b/c.c -> a_b_c.o
printf '%s\n' $lib | xargs -P "$(nproc)" -I{} bash -c '
    src={}; o="'"$out"'/obj/$(echo "${src%.c}" | tr / _).o"
    case $src in
    kernels/cpu/*) clang $base -c -o "$o" "$src" ;;
    *) clang $base -fsanitize=fuzzer-no-link $san -c -o "$o" "$src" ;;
    esac' || { echo "fuzz: compiling the library failed" >&2; exit 1; }
objs=$(printf '%s\n' $lib | sed -e 's/\.c$//' -e 's|/|_|g' -e "s|^|$out/obj/|" -e 's/$/.o/')
for t in "${targets[@]}"; do
    name=$(basename "$t" .c)
    clang $flags -o "$out/$name" "$t" $objs "$je" $(pkg-config --libs $pkgs) -lunistring -lm -ldl -pthread
    corpus="$out/corpus_$name"; mkdir -p "$corpus"
    seeds=("tests/fuzz/seeds_${name#fuzz_}")
    [ -d ../shared/models ] && seeds+=(../shared/models ../shared/models/vocab)
    existing=(); for s in "${seeds[@]}"; do [ -d "$s" ] && existing+=("$s"); done
    extra=()
    opts="tests/fuzz/$name.options"
    [ -f "$opts" ] && mapfile -t extra < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$opts" | grep -v '^$')
    echo "fuzz: $name for ${per}s ${extra[*]+"${extra[*]}"}"
    "$out/$name" -max_total_time="$per" -max_len=2000000 -rss_limit_mb=4096 \
        -print_final_stats=1 "${extra[@]+"${extra[@]}"}" "$corpus" "${existing[@]}" 2>&1 | tail -n 12
done
