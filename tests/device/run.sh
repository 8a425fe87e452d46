#!/usr/bin/env bash
# run.sh - the device checks (issue 7). Builds `make cuda` and an ASan+UBSan
# libllmd.a with the CUDA backend (build/cuda-asan), then:
#
# A. the vmm programs tests/device/test_vmm_*.c against each, run three ways
#    (below);
# B. the GPU programs, on the real driver only (each skips cleanly, counted,
#    where there is no GPU):
#  - test_kern_cuda: every CUDA kernel against the CPU kernels, the
#    quantized KV store (q8_0/q4_0/fp8 rows byte-equal to the CPU's), the
#    E4M3 conversion and attention over the quantized caches (issue 15);
#  - test_model_cuda: greedy references (f32, f16 GGUF) on the GPU against the
#    CPU, top-5 logits within 1e-3, batch invariance, a forced-spill engine
#    run, zero decode steps waiting on a map, speculative decoding's greedy
#    ids against speculation off (issue 16), greedy ids with --kv-type
#    q8_0/fp8/q4_0 against the CPU's with the same type (issue 15);
#  - the CLI: `llmd generate --device cuda` prints the CPU's greedy text;
#  - bench_decode_cuda: decode tok/s and the HBM roofline fraction (batch 1,
#    batch 64), spill/restore GB/s against cudaMemcpy;
#  - bench_att_cuda: decode attention bandwidth over token-major KV in VMM
#    pages against a contiguous per-layer layout, 8k and 32k tokens
#    (DESIGN.md §2's TLB question);
#  and the vmm map/unmap/setaccess latencies come from test_vmm_pool_cuda.
#  Set LLMD_BENCH_MODEL=dummy:llama3-8b for the full 32-layer model (its
#  random weights take a minute or more to build on the host).
#
# A's programs:
#  - test_vmm_cuda: the CUDA backend alone, through its vtable;
#  - test_vmm_pin_cuda: host memory registered with the driver as the host
#    tier's pin hook, a spill into it and a restore from it;
#  - test_vmm_pool_cuda: the vmm pool (vmm.h) over that backend, the host
#    suite's behaviours (ranges, sharing, copy-on-write, zero_pages, fault
#    injection, a model-checked random run, a map-ahead thread) with bytes
#    checked through device copies, plus the "vmm over cuda" latencies.
#
#  1. against tests/device/fake_libcuda.c (host memory behind the subset of
#     the driver API the backend uses), on any machine: the backend's logic,
#     error paths and cleanup, plus the "no device" / "old driver" /
#     "no VMM" refusals. A leak reported by the fake fails the run.
#  2. against the fake again, with the library (vmm.c, the backend) and the
#     program built with ASan+UBSan (build/cuda-asan, MODE=asan): memory
#     errors, undefined behaviour and leaks on the backend's error and
#     rollback paths, which the counts of 1 cannot see. Not on the real
#     driver: libcuda maps memory in ASan's shadow gap. Skipped (counted)
#     where the compiler cannot link a sanitized program.
#  3. against the real driver: on a machine without a GPU each program says
#     "cuda backend unavailable: <reason>", counts itself skipped, exits 0.
#
# Output goes to stdout and, when $OUT is set, to $OUT/device/*.txt. Each
# program runs under `timeout`; the whole script is meant to take under 6
# minutes on an H200. Exits non-zero if anything failed. The last line is
# "N passed, N failed, N skipped" over every run.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=build/cuda
asan_build=build/cuda-asan
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
out_dir=${OUT:+$OUT/device}
[ -n "$out_dir" ] && mkdir -p "$out_dir"
passed=0 failed=0 skipped=0

# Everything goes to $OUT/device/run.txt (the device tool brings back at most
# 8 files); failures and the last line also to summary.txt. The benchmark
# programs write their own tables (bench_decode.txt, bench_att.txt).
log() {
    if [ -n "$out_dir" ]; then tee -a "$out_dir/run.txt"; else cat; fi
}
bad() {
    echo "run.sh: FAIL: $*" | log
    [ -n "$out_dir" ] && echo "run.sh: FAIL: $*" >>"$out_dir/summary.txt"
    failed=$((failed + 1))
}

# Add the "N passed, N failed, N skipped" line of one run's output to the totals.
count() {
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$1" | tail -n 1)
    [ -n "$line" ] || { bad "no summary line"; return; }
    read -r p _ f _ s _ <<<"${line//,/}"
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + ${s:-0}))
}

# A bare GPU machine (tests/device/prepare.sh, run beforehand where there is
# a network, carried as .device): the libraries unpacked into a private
# sysroot, found through pkg-config and the loader's path; the models linked
# where the tests look for them.
if [ -d .device/debs ] && ! pkg-config --exists jansson liburing libmicrohttpd 2>/dev/null; then
    sys=$PWD/.device/sysroot
    if [ ! -d "$sys" ]; then
        for f in .device/debs/*.deb; do dpkg -x "$f" "$sys"; done
        # libmicrohttpd's GnuTLS stays the machine's: no .pc for it here
        sed -i '/^Requires.private:/d' "$sys"/usr/lib/x86_64-linux-gnu/pkgconfig/libmicrohttpd.pc
    fi
    mkdir -p .device/bin
    printf '#!/bin/sh\nexec "%s/usr/bin/pkgconf" "$@"\n' "$sys" >.device/bin/pkg-config
    chmod +x .device/bin/pkg-config
    command -v make >/dev/null || ln -sf "$sys/usr/bin/make" .device/bin/make
    export PATH=$PWD/.device/bin:$PATH
    export LD_LIBRARY_PATH=$sys/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PKG_CONFIG_SYSROOT_DIR=$sys
    export PKG_CONFIG_LIBDIR=$sys/usr/lib/x86_64-linux-gnu/pkgconfig:$sys/usr/share/pkgconfig
    export LIBRARY_PATH=$sys/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
    # multiarch headers (OpenSSL's configuration.h, hwloc's autogen/config.h):
    # pkg-config only names $sys/usr/include
    export C_INCLUDE_PATH=$sys/usr/include/x86_64-linux-gnu:$sys/usr/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}
    export libdir=$sys/usr/lib/x86_64-linux-gnu # tools/jemalloc_private.sh
    echo "run.sh: libraries from .device/sysroot" | log
fi
if [ ! -e ../shared/models/reference.jsonl ] && [ -d .device/models ]; then
    mkdir -p ../shared && ln -sfn "$PWD/.device/models" ../shared/models
fi

mkdir -p build # for $build.log on a fresh checkout
if ! make -j"$(nproc)" cuda >"$build.log" 2>&1; then
    tail -n 30 "$build.log" | log; echo "run.sh: make cuda failed" | log; exit 1
fi
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
have_asan=1
if ! echo 'int main(void) { return 0; }' | cc $san -x c -o /dev/null - >/dev/null 2>&1; then
    have_asan=0
    echo "run.sh: ASan+UBSan unavailable here (cc cannot link -fsanitize=address,undefined)" |
        log
elif ! make -j"$(nproc)" WITH_CUDA=1 MODE=asan BUILD="$asan_build" "$asan_build/libllmd.a" \
    >"$asan_build.log" 2>&1; then
    tail -n 30 "$asan_build.log" | log
    echo "run.sh: the ASan build of libllmd.a failed" | log; exit 1
fi
mkdir -p "$build/tests/device" "$build/fake" "$asan_build/tests/device"
flags="-std=c17 -D_GNU_SOURCE -I. -Iinclude -Wall -Wextra -Wshadow -Werror -O1 -g -pthread"
# the libraries libllmd.a's objects need (the host tier's hwloc, ...)
pkg_libs=$(pkg-config --libs $(sed -n 's/^PKGS *:= *//p' Makefile) 2>/dev/null)
cuda_lib=${CUDA_HOME:-/usr/local/cuda}/lib64
cc $flags -I"$cuda_inc" -shared -fPIC -o "$build/fake/libcuda.so.1" tests/device/fake_libcuda.c \
    2>&1 | log || { echo "run.sh: fake libcuda did not build" | log; exit 1; }

for src in tests/device/test_vmm_*.c; do
    name=$(basename "$src" .c)
    bin="$build/tests/device/$name"
    if ! cc $flags -o "$bin" "$src" "$build/libllmd.a" $pkg_libs -ldl -lm -pthread 2>&1 | log; then
        bad "$name did not build"; continue
    fi

    # 1. Fake driver: must pass and leave nothing behind.
    echo "== $name (fake libcuda)" | log
    out=$(LD_LIBRARY_PATH="$build/fake" timeout 60 "$bin" 2>&1); rc=$?
    printf '%s\n' "$out" | log
    count "$out"
    [ "$rc" -eq 0 ] || bad "$name on the fake driver exited $rc"
    grep -q 'fake libcuda: leak' <<<"$out" && bad "$name leaked driver objects"
    grep -q '0 passed, 0 failed, 1 skipped' <<<"$out" && bad "$name skipped on the fake driver"
    # Refusals: each must skip cleanly, naming its reason.
    for m in "nodevice:no CUDA device" "nosym:lacks cuMemSetAccess" \
             "novmm:no virtual memory management"; do
        out=$(FAKE_CUDA=${m%%:*} LD_LIBRARY_PATH="$build/fake" timeout 20 "$bin" 2>&1); rc=$?
        printf '== %s (fake libcuda, %s)\n%s\n' "$name" "${m%%:*}" "$out" | log
        { [ "$rc" -eq 0 ] && grep -q "cuda backend unavailable: .*${m#*:}" <<<"$out" &&
          grep -q '0 passed, 0 failed, 1 skipped' <<<"$out"; } ||
            bad "$name with FAKE_CUDA=${m%%:*}: rc $rc, expected a clean skip naming '${m#*:}'"
    done

    # 2. The fake driver under ASan+UBSan: as 1, and no sanitizer report.
    asan_bin="$asan_build/tests/device/$name"
    if [ "$have_asan" -eq 0 ]; then
        skipped=$((skipped + 1))
    elif ! cc $flags $san -o "$asan_bin" "$src" "$asan_build/libllmd.a" $pkg_libs -ldl -lm -pthread 2>&1 |
        log; then
        bad "$name did not build with ASan"
    else
        echo "== $name (fake libcuda, ASan+UBSan)" | log
        out=$(LD_LIBRARY_PATH="$build/fake" ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
            timeout 90 "$asan_bin" 2>&1); rc=$?
        printf '%s\n' "$out" | log
        count "$out"
        [ "$rc" -eq 0 ] || bad "$name under ASan on the fake driver exited $rc"
        grep -q 'fake libcuda: leak' <<<"$out" && bad "$name under ASan leaked driver objects"
        grep -qE 'Sanitizer|runtime error' <<<"$out" && bad "$name: sanitizer report"
    fi

    # 3. The real driver, if any.
    echo "== $name (libcuda.so.1)" | log
    out=$(timeout 100 "$bin" 2>&1); rc=$?
    printf '%s\n' "$out" | log
    count "$out"
    [ "$rc" -eq 0 ] || bad "$name exited $rc"
done

# B. GPU programs: linked like the engine (its libraries, cudart, cuBLAS).
libs="$pkg_libs -L$cuda_lib -lcudart -lcublas -lstdc++ -ldl -lm -pthread"
gpu_run() { # name timeout [args...]: build tests/device/NAME.c, run it, count it
    local name=$1 limit=$2 bin="$build/tests/device/$1" out rc
    shift 2
    if ! cc $flags -I"$cuda_inc" -o "$bin" "tests/device/$name.c" "$build/libllmd.a" $libs 2>&1 |
        log; then
        bad "$name did not build"; return
    fi
    echo "== $name $*" | log
    out=$(LD_LIBRARY_PATH="$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout "$limit" \
        "$bin" "$@" 2>&1); rc=$?
    printf '%s\n' "$out" | log
    count "$out"
    [ "$rc" -eq 0 ] || bad "$name exited $rc"
}
gpu_run test_kern_cuda 180
gpu_run test_model_cuda 180

# The CLI on the GPU: the same greedy text as on the CPU (stories260K f32).
gen=("$build/llmd" generate -m ../shared/models/stories260K-f32.gguf -p "Once upon a time"
    -n 48 --temp 0 --ctx 512 --kv-type f32 -q)
if timeout 60 "${gen[@]}" --device cuda >"$build/gen_gpu.txt" 2>"$build/gen_gpu.err"; then
    timeout 60 "${gen[@]}" >"$build/gen_cpu.txt" 2>/dev/null
    if cmp -s "$build/gen_cpu.txt" "$build/gen_gpu.txt"; then
        echo "ok: llmd generate --device cuda prints the CPU's greedy text" | log
        passed=$((passed + 1))
    else
        { echo "CPU: $(cat "$build/gen_cpu.txt")"; echo "GPU: $(cat "$build/gen_gpu.txt")"; } |
            log
        bad "llmd generate --device cuda differs from the CPU"
    fi
elif grep -qE 'no CUDA device|no usable CUDA|unavailable' "$build/gen_gpu.err"; then
    echo "llmd generate --device cuda: skipped: $(tail -n 1 "$build/gen_gpu.err")" | log
    skipped=$((skipped + 1))
else
    log <"$build/gen_gpu.err"
    bad "llmd generate --device cuda failed"
fi

gpu_run bench_decode_cuda 240 "${LLMD_BENCH_MODEL:-dummy:llama3-8b-2l}"
gpu_run bench_att_cuda 90

line="$passed passed, $failed failed, $skipped skipped"
echo "$line" | log
[ -n "$out_dir" ] && echo "$line" >>"$out_dir/summary.txt"
[ "$failed" -eq 0 ]
