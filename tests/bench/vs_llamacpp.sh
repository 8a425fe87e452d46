#!/usr/bin/env bash
# vs_llamacpp.sh - llmd's CPU forward pass next to llama.cpp's, on the same
# GGUF files, the same thread counts, in one interleaved run (`make
# bench-llamacpp`). A benchmark, never a test: it prints a table and writes
# build/vs_llamacpp.json; it fails only when it cannot run.
#
# llama.cpp is the baseline, built outside this repository at a pinned
# commit and never vendored or copied from:
#   LLAMACPP_BIN  a folder holding a built llama-bench (use it as it is), or
#   LLAMACPP_SRC  a git checkout or mirror of ggerganov/llama.cpp: the script
#                 checks out LLAMACPP_COMMIT (default c392e50...) into
#                 LLAMACPP_BUILD (default ${XDG_CACHE_HOME:-~/.cache}/llmd/
#                 llama.cpp) and builds llama-bench with cmake (Release,
#                 GGML_NATIVE=ON, LLAMA_CURL=OFF; about 6 minutes on 2 cores).
# The models are written by `llmd dummy` (fixed seeds: the same bytes every
# time) into BENCH_MODELS (default build/bench-models): BENCH_SHAPES (default
# "dummy-100m dummy-1g") x BENCH_TYPES (default "f16 q8_0 q4_0", plus any
# type the build's `llmd dummy --help` lists among q4_k_m). Each (model,
# threads) pair runs llama-bench -r BENCH_REPS -p 512 -n 128 and llmd's
# bench_generate twice (median of BENCH_REPS each), alternating, at
# BENCH_THREADS (default "1 2"): prefill as a 512-token prompt (pp512), and
# decode as 128 tokens after a 1-token prompt, because llama-bench's tg128
# clears the KV cache and decodes 128 tokens from position 0 (its test_gen);
# decode after the 512-token prompt would make llmd attend over 512-640
# keys a token to llama.cpp's 0-128. bench_generate measures the read
# bandwidth with the same threads in the same run: the roofline is that
# bandwidth over the bytes one decoded token reads. llmd's tok/s are
# medians of its runs, llama.cpp's the means (avg_ts) of its -r runs. The
# llama.cpp commit reported is the one llama-bench says it was built from
# (its JSON's build_commit), whatever LLAMACPP_COMMIT says.
# BENCH_ROUNDS (default 1) repeats the whole sweep that many times, so that
# a row's engines alternate over minutes, not seconds, on a host whose
# speed drifts: each figure is then the median of the rounds', each ratio
# the ratio of those medians, and the table adds the range of the rounds'
# own ratios.
set -euo pipefail
cd "$(dirname "$0")/../.."

commit=${LLAMACPP_COMMIT:-c392e5094deaf2d1a7c18683214f007fad3fe42b}
build=${BUILD:-build/release}
models=${BENCH_MODELS:-build/bench-models}
shapes=${BENCH_SHAPES:-dummy-100m dummy-1g}
types=${BENCH_TYPES:-}
threads=${BENCH_THREADS:-1 2}
reps=${BENCH_REPS:-3}
rounds=${BENCH_ROUNDS:-1}
out=build/vs_llamacpp.json

die() { echo "vs_llamacpp: $*" >&2; exit 1; }
[[ $rounds =~ ^[0-9]+$ ]] && ((10#$rounds >= 1)) || die "BENCH_ROUNDS=$rounds: a count of 1 or more"
rounds=$((10#$rounds))

# --- llama.cpp -----------------------------------------------------------------
if [ -n "${LLAMACPP_BIN:-}" ]; then
    bench="$LLAMACPP_BIN/llama-bench"
elif [ -n "${LLAMACPP_SRC:-}" ]; then
    dst=${LLAMACPP_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/llmd/llama.cpp}
    if [ ! -x "$dst/build/bin/llama-bench" ] ||
       [ "$(git -C "$dst" rev-parse HEAD 2>/dev/null)" != "$commit" ]; then
        echo "vs_llamacpp: building llama.cpp $commit in $dst (about 6 minutes)"
        mkdir -p "$(dirname "$dst")"
        [ -d "$dst/.git" ] || git clone -q --no-checkout "$LLAMACPP_SRC" "$dst"
        # the snapshot lacks some large vocab files: leave them out
        git -C "$dst" sparse-checkout set --no-cone '/*' '!/models/ggml-vocab-*'
        git -C "$dst" checkout -q "$commit"
        cmake -S "$dst" -B "$dst/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
            -DLLAMA_CURL=OFF >/dev/null
        cmake --build "$dst/build" -j"$(nproc)" --target llama-bench >/dev/null
    fi
    bench="$dst/build/bin/llama-bench"
else
    die "set LLAMACPP_BIN (a folder with a built llama-bench) or LLAMACPP_SRC (a checkout or
    mirror of https://github.com/ggerganov/llama.cpp to build commit $commit from)"
fi
[ -x "$bench" ] || die "no llama-bench at $bench"

# --- llmd and the models ----------------------------------------------------------
make -s "$build/llmd" "$build/bench/bench_generate" >/dev/null
if [ -z "$types" ]; then
    types="f16 q8_0 q4_0"
    "$build/llmd" dummy --help 2>&1 | grep -q 'q4_k_m' && types="$types q4_k_m"
fi
mkdir -p "$models"
files=()
for s in $shapes; do
    for t in $types; do
        f="$models/$s-$t.gguf"
        [ -s "$f" ] || "$build/llmd" dummy -s "$s" -t "$t" -o "$f" >/dev/null 2>&1 ||
            die "llmd dummy -s $s -t $t failed"
        files+=("$f")
    done
done

# --- the interleaved runs ------------------------------------------------------------
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
# llama.cpp's commit comes from llama-bench's own JSON, after the runs: LLAMACPP_BIN may be
# any build
echo "vs_llamacpp: $cpu, $(nproc) CPUs; llmd $(git rev-parse --short HEAD)"
i=0
for round in $(seq 1 "$rounds"); do
    [ "$rounds" -gt 1 ] && echo "vs_llamacpp: round $round of $rounds" >&2
    for f in "${files[@]}"; do
        for th in $threads; do
            i=$((i + 1))
            "$bench" -m "$f" -t "$th" -r "$reps" -p 512 -n 128 -o json >"$tmp/l$i.json" 2>/dev/null ||
                die "llama-bench failed on $f (does it load the file?)"
            BENCH_THREADS=$th BENCH_RUNS=$reps BENCH_PROMPT=512 BENCH_GEN=1 \
                BENCH_JSON="$tmp/p$i.json" "$build/bench/bench_generate" "$f" >"$tmp/p$i.txt"
            BENCH_THREADS=$th BENCH_RUNS=$reps BENCH_PROMPT=1 BENCH_GEN=128 \
                BENCH_JSON="$tmp/d$i.json" "$build/bench/bench_generate" "$f" >"$tmp/d$i.txt"
            echo "$f $th $tmp/l$i.json $tmp/p$i.json $tmp/d$i.json" >>"$tmp/index"
        done
    done
done

python3 - "$tmp/index" "$out" "$commit" <<'PY'
import json, statistics, sys
runs = []
builds = set()
for line in open(sys.argv[1]):
    f, th, lj, pj, dj = line.split()
    lr = json.load(open(lj))
    ll = {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in lr}
    builds.update(str(r.get("build_commit", "?")) for r in lr)
    p, m = json.load(open(pj))[0], json.load(open(dj))[0]
    runs.append(dict(model=f.rsplit("/", 1)[-1][:-5], threads=int(th), isa=m["isa"],
                     llama_commit=str(lr[0].get("build_commit", "?")) if lr else "?",
                     read_gbps=m["read_gbps"], roofline_tps=m["roofline_tps"],
                     llama_decode=ll.get("tg"), llama_prefill=ll.get("pp"),
                     llmd_decode=m["decode_tps"], llmd_prefill=p["prefill_tps"],
                     llmd_decode_after_prompt=m["prompt_tokens"],
                     llmd_prefill_tokens=p["prompt_tokens"]))
# one row a (model, threads): the median of each figure over the rounds
groups = {}  # in the sweep's order
for r in runs:
    groups.setdefault((r["model"], r["threads"]), []).append(r)
rows = []
for rs in groups.values():
    row = dict(rs[0])
    for f in ("read_gbps", "roofline_tps", "llama_decode", "llama_prefill", "llmd_decode",
              "llmd_prefill"):
        row[f] = statistics.median(r[f] for r in rs)
    row["rounds"] = len(rs)
    for w in ("decode", "prefill"):
        q = [r["llmd_" + w] / r["llama_" + w] for r in rs]
        row[w + "_ratio_range"] = [min(q), max(q)]
    rows.append(row)
multi = any(r["rounds"] > 1 for r in rows)
def rng(r, w):
    lo, hi = r[w + "_ratio_range"]
    return f" {lo:.2f}-{hi:.2f}" if multi else ""
built = ", ".join(sorted(builds)) or "?"
pinned = sys.argv[3]
print(f"llama.cpp {built} (llama-bench's build_commit)"
      + ("" if all(pinned.startswith(b) for b in builds) else f"; not the pinned {pinned[:9]}"))
rh = f" {'rounds':>9}" if multi else ""
print(f"{'model':<20} {'thr':>3} {'read GB/s':>9} | {'decode: llama.cpp':>17} {'llmd':>7} {'ratio':>6}"
      f"{rh} {'roof l/m':>10} | {'prefill 512: llama.cpp':>22} {'llmd':>7} {'ratio':>6}{rh}")
for r in rows:
    roof = r["roofline_tps"]
    print(f"{r['model']:<20} {r['threads']:>3} {r['read_gbps']:>9.1f} | {r['llama_decode']:>17.1f}"
          f" {r['llmd_decode']:>7.1f} {r['llmd_decode'] / r['llama_decode']:>6.2f}{rng(r, 'decode')}"
          f" {r['llama_decode'] / roof:>4.2f}/{r['llmd_decode'] / roof:<4.2f}  |"
          f" {r['llama_prefill']:>22.1f} {r['llmd_prefill']:>7.1f}"
          f" {r['llmd_prefill'] / r['llama_prefill']:>6.2f}{rng(r, 'prefill')}")
print(f"(llmd isa: {rows[0]['isa'] if rows else '?'}; tok/s: llmd's the median of its runs, "
      "llama.cpp's the mean (avg_ts) of its -r runs"
      + (f"; each the median of {rows[0]['rounds']} rounds, the ratio of those medians, and the"
         " range of the rounds' own ratios" if multi else "")
      + "; decode: tg128 from an empty KV cache, "
      "llmd after a 1-token prompt; roof = decode / (read bandwidth / bytes per token))")
json.dump(rows, open(sys.argv[2], "w"), indent=1)
PY
