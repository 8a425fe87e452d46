#!/usr/bin/env bash
# run.sh TEST_BIN... - run each Criterion test binary, show its output,
# and close with one summary line "N passed, N failed" over all of them.
# Exits non-zero if any test failed or crashed, or if no test ran.
#
# Every binary runs under a time limit, LLMD_TEST_TIMEOUT seconds (default
# 300: the slowest binary takes about 60 s under ASan on a 2-vCPU machine),
# so a hang fails its binary instead of stalling CI; it is killed 10 s
# after the limit if SIGTERM does not end it. Each binary's line shows its
# wall time, the figure to watch when the limit is tuned. The limit must be
# a positive integer (timeout(1) would take 0 as no limit at all): anything
# else is a usage error (exit 2) before any test runs.
set -u
limit=${LLMD_TEST_TIMEOUT:-300}
if ! [[ $limit =~ ^[0-9]+$ ]] || [ "$((10#$limit))" -eq 0 ]; then
    echo "run.sh: LLMD_TEST_TIMEOUT must be a positive whole number of seconds, not '$limit'" >&2
    exit 2
fi
limit=$((10#$limit))
# Criterion's own runner leaks a block under LSan; see tests/lsan.supp.
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")/.." && pwd)/tests/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
passed=0; failed=0; bad_bins=()
for t in "$@"; do
    t0=$(date +%s.%N)
    out=$(timeout -k 10 "$limit" "$t" --jobs 2 2>&1); rc=$?
    echo "== $t ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f s", b - a}'))"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        # Criterion reports a binary's tests at its end, so one killed at the
        # limit has often printed nothing at all
        echo "$t: timed out after ${limit} s (LLMD_TEST_TIMEOUT); the end of its output:"
        if [ -n "$out" ]; then printf '%s\n' "$out" | tail -n 20; else echo "(no output before the limit)"; fi
        failed=$((failed + 1)); bad_bins+=("$t (timed out after ${limit} s)"); continue
    fi
    # a test that skips prints a "SKIP: suite::test: why" line (Criterion's
    # own skip is silent), shown even when its binary passed
    if [ "$rc" -ne 0 ]; then printf '%s\n' "$out"; else printf '%s\n' "$out" | grep -E '^SKIP: |Synthesis:'; fi
    syn=$(printf '%s\n' "$out" | grep 'Synthesis:' | tail -n 1)
    if [ -z "$syn" ]; then
        failed=$((failed + 1)); bad_bins+=("$t (no synthesis, rc=$rc)"); continue
    fi
    # "[====] Synthesis: Tested: 5 | Passing: 5 | Failing: 0 | Crashing: 0"
    p=$(sed -n 's/.*Passing: \([0-9]*\).*/\1/p' <<<"$syn")
    f=$(sed -n 's/.*Failing: \([0-9]*\).*/\1/p' <<<"$syn")
    c=$(sed -n 's/.*Crashing: \([0-9]*\).*/\1/p' <<<"$syn")
    passed=$((passed + p)); failed=$((failed + f + c))
    if [ "$rc" -ne 0 ] && [ $((f + c)) -eq 0 ]; then
        failed=$((failed + 1)); bad_bins+=("$t (rc=$rc)")
    fi
done
for b in "${bad_bins[@]+"${bad_bins[@]}"}"; do echo "bad: $b"; done
echo "$passed passed, $failed failed"
# the caller may ask for the counts, to sum several runs (make test)
[ -n "${LLMD_TEST_COUNTS:-}" ] && echo "$passed $failed" >>"$LLMD_TEST_COUNTS"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
