#!/usr/bin/env bash
# run.sh - the device checks of vmm/. Builds `make cuda` and an ASan+UBSan
# libllmd.a with the CUDA backend (build/cuda-asan), then the programs
# tests/device/test_*.c against each, and runs them three ways:
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
# program runs under `timeout`; the whole script takes well under 2 minutes
# on an H200. Exits non-zero if anything failed. The last line is
# "N passed, N failed, N skipped" over every run.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=build/cuda
asan_build=build/cuda-asan
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
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
have_asan=1
if ! echo 'int main(void) { return 0; }' | cc $san -x c -o /dev/null - >/dev/null 2>&1; then
    have_asan=0
    echo "run.sh: ASan+UBSan unavailable here (cc cannot link -fsanitize=address,undefined)" |
        log summary.txt
elif ! make -j"$(nproc)" WITH_CUDA=1 MODE=asan BUILD="$asan_build" "$asan_build/libllmd.a" \
    >"$asan_build.log" 2>&1; then
    tail -n 30 "$asan_build.log" | log build.txt
    echo "run.sh: the ASan build of libllmd.a failed" | log build.txt; exit 1
fi
mkdir -p "$build/tests/device" "$build/fake" "$asan_build/tests/device"
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

    # 2. The fake driver under ASan+UBSan: as 1, and no sanitizer report.
    asan_bin="$asan_build/tests/device/$name"
    if [ "$have_asan" -eq 0 ]; then
        skipped=$((skipped + 1))
    elif ! cc $flags $san -o "$asan_bin" "$src" "$asan_build/libllmd.a" -ldl -lm -pthread 2>&1 |
        log "$name.txt"; then
        bad "$name did not build with ASan"
    else
        echo "== $name (fake libcuda, ASan+UBSan)" | log "$name.txt"
        out=$(LD_LIBRARY_PATH="$build/fake" ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
            timeout 90 "$asan_bin" 2>&1); rc=$?
        printf '%s\n' "$out" | log "$name.txt"
        count "$out"
        [ "$rc" -eq 0 ] || bad "$name under ASan on the fake driver exited $rc"
        grep -q 'fake libcuda: leak' <<<"$out" && bad "$name under ASan leaked driver objects"
        grep -qE 'Sanitizer|runtime error' <<<"$out" && bad "$name: sanitizer report"
    fi

    # 3. The real driver, if any.
    echo "== $name (libcuda.so.1)" | log "$name.txt"
    out=$(timeout 100 "$bin" 2>&1); rc=$?
    printf '%s\n' "$out" | log "$name.txt"
    count "$out"
    [ "$rc" -eq 0 ] || bad "$name exited $rc"
done

echo "$passed passed, $failed failed, $skipped skipped" | log summary.txt
[ "$failed" -eq 0 ]
