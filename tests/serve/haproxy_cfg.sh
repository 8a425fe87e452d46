#!/bin/sh
# haproxy_cfg.sh DIR PORT BACKEND... - an HAProxy configuration, on stdout,
# for several `llmd serve` replicas behind one port (docs/serving.md,
# "Several replicas"); tests/test_serve_haproxy.c runs it. Each BACKEND is
# HOST:PORT. DIR holds the stats socket (DIR/haproxy.sock).
#
# - balance hdr(X-Prefix-Key) with hash-type consistent: every request that
#   carries one key (a document's id) goes to one replica, which then has
#   that prefix in its cache; adding or losing a replica moves only the keys
#   that hashed to it.
# - option httpchk GET /health every 200 ms (fall 1): a draining replica
#   answers 503 "draining" and leaves the pool at its next check.
# - retry-on conn-failure empty-response 503 with option redispatch 1 and
#   retries 3: a request a draining replica refuses (503) or that finds it
#   gone is sent to another replica instead of failing (the requests are
#   buffered whole, option http-buffer-request, so they can be replayed).
set -eu
[ $# -ge 3 ] || { echo "usage: $0 DIR PORT HOST:PORT..." >&2; exit 2; }
dir=$1 port=$2
shift 2
cat <<CFG
global
    stats socket $dir/haproxy.sock mode 600 level admin
    maxconn 256

defaults
    mode http
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    option http-buffer-request
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response 503

frontend llmd_front
    bind 127.0.0.1:$port
    default_backend llmd

backend llmd
    balance hdr(X-Prefix-Key)
    hash-type consistent
    option httpchk GET /health
    http-check expect status 200
    default-server inter 200ms fall 1 rise 1
    http-response set-header X-Served-By %s
CFG
i=0
for b in "$@"; do
    echo "    server r$i $b check"
    i=$((i + 1))
done
