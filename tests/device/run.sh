#!/usr/bin/env bash
# run.sh - the device checks of vmm/. Builds `make cuda`, then the programs
# tests/device/test_*.c against build/cuda/libllmd.a, and runs them twice:
#
#  - test_vmm_cuda: the CUDA backend alone, through its vtable;
#  - test_vmm_pool_cuda: the vmm pool (vmm.h) over that backend, the host
#    suite's behaviours (ranges, sharing, copy-on-write, zero_pages, fault
#    injection, a model-checked random run, a map-ahead thread) with bytes
#    checked through device copies, plus the "vmm over cuda" latencies.
#
#  1. against tests/device/fake_libcuda.c (host memory behind the subset of
#     the driver API the backend uses), on any machine: the backend's logic,
#     error paths and cleanup, plus the "no device" / "old driver" /
#     "no VMM" refusals. A leak reported by the fake fails the run.
#  2. against the real driver: on a machine without a GPU each program says
#     "cuda backend unavailable: <reason>", counts itself skipped, exits 0.
#
# Output goes to stdout and, when $OUT is set, to $OUT/device/*.txt. Each
# program runs under `timeout`; the whole script takes well under 2 minutes
# on an H200. Exits non-zero if anything failed. The last line is
# "N passed, N failed, N skipped" over every run.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=build/cuda
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
out_dir=${OUT:+$OUT/device}
[ -n "$out_dir" ] && mkdir -p "$out_dir"
passed=0 failed=0 skipped=0

log() { if [ -n "$out_dir" ]; then tee -a "$out_dir/$1"; else cat; fi; }
bad() { echo "run.sh: FAIL: $*" | log summary.txt; failed=$((failed + 1)); }

# Add the "N passed, N failed, N skipped" line of one run's output to the totals.
count() {
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' <<<"$1" | tail -n 1)
    [ -n "$line" ] || { bad "no summary line"; return; }
    read -r p _ f _ s _ <<<"${line//,/}"
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + ${s:-0}))
}

mkdir -p build # for $build.log on a fresh checkout
if ! make -j"$(nproc)" cuda >"$build.log" 2>&1; then
    tail -n 30 "$build.log" | log build.txt; echo "run.sh: make cuda failed" | log build.txt; exit 1
fi
mkdir -p "$build/tests/device" "$build/fake"
flags="-std=c17 -D_GNU_SOURCE -I. -Iinclude -Wall -Wextra -Wshadow -Werror -O1 -g -pthread"
cc $flags -I"$cuda_inc" -shared -fPIC -o "$build/fake/libcuda.so.1" tests/device/fake_libcuda.c \
    2>&1 | log build.txt || { echo "run.sh: fake libcuda did not build" | log build.txt; exit 1; }

for src in tests/device/test_*.c; do
    name=$(basename "$src" .c)
    bin="$build/tests/device/$name"
    if ! cc $flags -o "$bin" "$src" "$build/libllmd.a" -ldl -lm -pthread 2>&1 | log "$name.txt"; then
        bad "$name did not build"; continue
    fi

    # 1. Fake driver: must pass and leave nothing behind.
    echo "== $name (fake libcuda)" | log "$name.txt"
    out=$(LD_LIBRARY_PATH="$build/fake" timeout 60 "$bin" 2>&1); rc=$?
    printf '%s\n' "$out" | log "$name.txt"
    count "$out"
    [ "$rc" -eq 0 ] || bad "$name on the fake driver exited $rc"
    grep -q 'fake libcuda: leak' <<<"$out" && bad "$name leaked driver objects"
    grep -q '0 passed, 0 failed, 1 skipped' <<<"$out" && bad "$name skipped on the fake driver"
    # Refusals: each must skip cleanly, naming its reason.
    for m in "nodevice:no CUDA device" "nosym:lacks cuMemSetAccess" \
             "novmm:no virtual memory management"; do
        out=$(FAKE_CUDA=${m%%:*} LD_LIBRARY_PATH="$build/fake" timeout 20 "$bin" 2>&1); rc=$?
        printf '== %s (fake libcuda, %s)\n%s\n' "$name" "${m%%:*}" "$out" | log "$name.txt"
        { [ "$rc" -eq 0 ] && grep -q "cuda backend unavailable: .*${m#*:}" <<<"$out" &&
          grep -q '0 passed, 0 failed, 1 skipped' <<<"$out"; } ||
            bad "$name with FAKE_CUDA=${m%%:*}: rc $rc, expected a clean skip naming '${m#*:}'"
    done

    # 2. The real driver, if any.
    echo "== $name (libcuda.so.1)" | log "$name.txt"
    out=$(timeout 100 "$bin" 2>&1); rc=$?
    printf '%s\n' "$out" | log "$name.txt"
    count "$out"
    [ "$rc" -eq 0 ] || bad "$name exited $rc"
done

echo "$passed passed, $failed failed, $skipped skipped" | log summary.txt
[ "$failed" -eq 0 ]
