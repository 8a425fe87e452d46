#!/usr/bin/env bash
# kv_quant.sh - what the quantized KV types buy (docs/kv-quant.md,
# docs/benchmarks.md): a benchmark, never a test; it prints the figures and
# fails only when a run fails.
#
# capacity: `llmd batch` on dummy-100m (6 layers, 4 kv heads x 64) with a
#   KV budget of KV_BUDGET (default 1G) and N_* distinct prompts of 2,000
#   tokens (the dummy tokenizer is one token a byte, plus BOS and the dummy
#   prefix), GEN tokens each (default 48: 2,048 tokens a sequence, whole
#   pages of every type), greedy, no prefix sharing (each prompt differs
#   from its first byte). Steps of up to 16,384 tokens, so that eight
#   prompts are admitted a step and the pool, not the prefill rate, limits
#   how many run at once. Per type: the most sequences running at once
#   (batch's summary), total tokens/s (prefill + decode over the wall time),
#   and a check that every line ran to its end (no error, no kv_budget
#   finish, 2,000 prompt tokens). N_F16, N_Q8, N_Q4 default to a little
#   above what 1 GiB holds (85, 160 and 303 sequences of 2,048 tokens).
# decode: `llmd generate` with a prompt of CTX_LONG tokens (default 8,000),
#   then DECODE_N tokens (default 64): decode tok/s at that context, per
#   type (the summary's figure), f16 f32 q8_0 q4_0 fp8.
# ROUNDS (default 1) repeats both, the types interleaved within a round;
# THREADS (default 2); BUILD (default build/release). Parts: PARTS
# (default "capacity decode").
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build/release}
llmd=$build/llmd
budget=${KV_BUDGET:-1G}
gen=${GEN:-48}
threads=${THREADS:-2}
rounds=${ROUNDS:-1}
parts=${PARTS:-capacity decode}
ctx_long=${CTX_LONG:-8000}
decode_n=${DECODE_N:-64}
declare -A n_req=([f16]=${N_F16:-96} [q8_0]=${N_Q8:-176} [q4_0]=${N_Q4:-320})
dir=$(mktemp -d /tmp/llmd-kvq-XXXXXX)
trap 'rm -rf "$dir"' EXIT
[ -x "$llmd" ] || { echo "kv_quant: build $llmd first (make)" >&2; exit 1; }

# 400 prompts of 1,998 bytes (2,000 tokens), distinct from their first byte
# on, and a text of ctx_long - 2 bytes
python3 - "$dir" 400 1998 "$ctx_long" <<'PY'
import json, random, sys
d, n, size, long = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
words = "the a cat dog ran sat big small red blue tree park ball girl boy happy sad mom dad sun".split()
with open(f"{d}/prompts.jsonl", "w") as f:
    for i in range(n):
        r = random.Random(i)
        s = f"{i:04d} " + " ".join(r.choice(words) for _ in range(size))
        f.write(json.dumps({"prompt": s[:size], "max_tokens": 0}) + "\n")
r = random.Random(7)
with open(f"{d}/long.txt", "w") as f:
    f.write(" ".join(r.choice(words) for _ in range(long))[: long - 2])
PY

capacity() { # type
    local t=$1 n=${n_req[$1]}
    head -n "$n" "$dir/prompts.jsonl" | sed "s/\"max_tokens\": 0/\"max_tokens\": $gen/" >"$dir/in.jsonl"
    "$llmd" batch -m dummy:dummy-100m -i "$dir/in.jsonl" -o "$dir/out.jsonl" --kv-budget "$budget" \
        --kv-type "$t" --max-seqs 400 --max-batched-tokens 16384 --ctx 2048 -t "$threads" \
        2>"$dir/err.txt" || { cat "$dir/err.txt" >&2; exit 1; }
    python3 - "$dir/out.jsonl" "$n" "$gen" <<'PY' || { cat "$dir/err.txt" >&2; exit 1; }
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
n, gen = int(sys.argv[2]), int(sys.argv[3])
assert len(lines) == n, f"{len(lines)} lines, want {n}"
for i, l in enumerate(lines):
    assert "error" not in l, f"line {i}: {l['error']}"
    assert l["prompt_tokens"] == 2000, f"line {i}: {l['prompt_tokens']} prompt tokens"
    assert l["finish_reason"] in ("length", "stop"), f"line {i}: {l['finish_reason']}"
    assert l["finish_reason"] == "stop" or l["completion_tokens"] == gen, f"line {i}"
PY
    local peak tps kv pre
    kv=$(grep -o 'KV [a-z0-9_]*, [0-9]* B a token, [0-9]* pages of [0-9]* B' "$dir/err.txt")
    peak=$(sed -n 's/.*at most \([0-9]*\) sequences* running at once.*/\1/p' "$dir/err.txt")
    tps=$(sed -n 's/.*running at once (\([0-9.]*\) tok\/s in all).*/\1/p' "$dir/err.txt")
    pre=$(sed -n 's/.*, \([0-9]*\) preemptions$/\1/p' "$dir/err.txt")
    printf 'capacity %-5s %4d requests: %s; peak %s running, %s tok/s in all, %s preemptions\n' \
        "$t" "$n" "$kv" "$peak" "$tps" "$pre"
}

decode() { # type
    local t=$1 line
    line=$("$llmd" generate -m dummy:dummy-100m -f "$dir/long.txt" -n "$decode_n" --temp 0 \
        --ctx $((ctx_long + decode_n + 64)) --kv-type "$t" -t "$threads" --no-echo 2>&1 >/dev/null |
        grep 'decode .* tok/s')
    printf 'decode   %-5s %s\n' "$t" "$(sed -n 's/.*prompt \([0-9]*\) tokens, prefill \([0-9.]*\) tok\/s; generated \([0-9]*\) tokens, decode \([0-9.]*\) tok\/s.*/prompt \1 tokens (prefill \2 tok\/s), decode \4 tok\/s over \3 tokens/p' <<<"$line")"
}

printf "kv_quant: %s\n" "$(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, isa $("$llmd" generate -m dummy:tiny -p x -n 1 2>&1 | sed -n 's/.*isa \([a-z0-9-]*\).*/\1/p'), threads $threads"
for r in $(seq "$rounds"); do
    for p in $parts; do
        case $p in
        capacity) for t in f16 q8_0 q4_0; do capacity "$t"; done ;;
        decode) for t in f16 f32 q8_0 q4_0 fp8; do decode "$t"; done ;;
        esac
    done
done
