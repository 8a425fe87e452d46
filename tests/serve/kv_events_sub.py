#!/usr/bin/python3
"""kv_events_sub.py PUB_ENDPOINT REPLAY_ENDPOINT - an independent subscriber
to llmd's KV-cache events (docs/kv-events.md), for tests/test_kv_events.c.

It decodes every batch with Debian's python3-msgpack (not llmd's encoder) in
vLLM's layout: [ts, [event...], data_parallel_rank], each event a tagged
array ["BlockStored", hashes, parent, token_ids, block_size, lora_id,
medium, lora_name(, extra_keys)] | ["BlockRemoved", hashes, medium] |
["AllBlocksCleared"], and rebuilds the set of block hashes each medium
holds. A gap in the sequence numbers (a PUB/SUB join is asynchronous, so the
first batches may pass before it joined) is filled through the replay
socket, as a router would.

Commands on stdin, one a line, answers one JSON line on stdout:
  sync N     apply batches until sequence N-1 is applied, then report
             {"GPU": [hex...], "CPU": [...], "DISK": [...], "first": tag of
             the first event of batch 0, "batches": count applied,
             "stores_with_tokens": stores whose token_ids had block_size ids,
             "bad": [problems seen]}
  replay     ask for every batch from 0 again and compare each, byte for
             byte, with the one applied live: {"replayed": n, "same": bool}
"""
import json
import sys
import time

import msgpack
import zmq

TIMEOUT_MS = 20000


def main():
    pub_ep, replay_ep = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub_ep)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_ep)
    held = {"GPU": set(), "CPU": set(), "DISK": set()}
    state = {"next": 0, "first": None, "with_tokens": 0, "bad": [], "payloads": {}}

    def apply(seq, payload):
        if seq != state["next"]:
            state["bad"].append("applied %d, expected %d" % (seq, state["next"]))
        state["next"] = seq + 1
        state["payloads"][seq] = payload
        batch = msgpack.unpackb(payload, raw=False)
        if not (isinstance(batch, list) and len(batch) == 3 and isinstance(batch[0], float)):
            state["bad"].append("batch %d: not [ts, events, rank]" % seq)
            return
        for i, ev in enumerate(batch[1]):
            tag = ev[0]
            if seq == 0 and i == 0:
                state["first"] = tag
            if tag == "AllBlocksCleared":
                for s in held.values():
                    s.clear()
            elif tag == "BlockStored":
                hashes, parent, tokens, block_size, lora_id, medium = ev[1:7]
                if len(ev) not in (8, 9) or lora_id is not None or ev[7] is not None:
                    state["bad"].append("batch %d: BlockStored fields %r" % (seq, ev[4:]))
                if any(not isinstance(h, bytes) or len(h) != 32 for h in hashes):
                    state["bad"].append("batch %d: a hash is not 32 bytes" % seq)
                if parent is not None and (not isinstance(parent, bytes) or len(parent) != 32):
                    state["bad"].append("batch %d: bad parent" % seq)
                if tokens and len(tokens) != block_size * len(hashes):
                    state["bad"].append("batch %d: %d tokens for %d blocks of %d"
                                        % (seq, len(tokens), len(hashes), block_size))
                if tokens:
                    state["with_tokens"] += len(hashes)
                if len(ev) == 9 and len(ev[8]) != len(hashes):
                    state["bad"].append("batch %d: extra_keys not one a block" % seq)
                for h in hashes:
                    held[medium].add(h.hex())
            elif tag == "BlockRemoved":
                hashes, medium = ev[1], ev[2]
                for h in hashes:
                    if h.hex() not in held[medium]:
                        state["bad"].append("batch %d: removed %s from %s, not held"
                                            % (seq, h.hex()[:16], medium))
                    held[medium].discard(h.hex())
            else:
                state["bad"].append("batch %d: unknown tag %r" % (seq, tag))

    def replay_from(start):
        """Every kept batch from start on, until the end marker."""
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            if not dealer.poll(TIMEOUT_MS):
                raise SystemExit("replay: no answer")
            _, seq_b, payload = dealer.recv_multipart()
            seq = int.from_bytes(seq_b, "big", signed=True)
            if seq == -1:
                return out
            out.append((seq, payload))

    def receive_one():
        """Apply the next live batch, filling a gap from the replay socket;
        with no live batch for a while (those up to the one wanted may all
        have passed before this joined), ask the replay socket."""
        if not sub.poll(500):
            for s, p in replay_from(state["next"]):
                if s >= state["next"]:
                    apply(s, p)
            return
        topic, seq_b, payload = sub.recv_multipart()
        seq = int.from_bytes(seq_b, "big")
        if seq < state["next"]:
            return  # seen already through a replay
        if seq > state["next"]:
            for s, p in replay_from(state["next"]):
                if state["next"] <= s < seq:
                    apply(s, p)
        apply(seq, payload)

    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "sync":
            want = int(cmd[1])
            deadline = time.monotonic() + TIMEOUT_MS / 1000
            while state["next"] < want:
                if time.monotonic() > deadline:
                    raise SystemExit("batch %d not seen within %d ms" % (state["next"], TIMEOUT_MS))
                receive_one()
            ans = {m: sorted(s) for m, s in held.items()}
            ans.update(first=state["first"], batches=state["next"],
                       stores_with_tokens=state["with_tokens"], bad=state["bad"][:20])
        elif cmd[0] == "replay":
            got = replay_from(0)
            same = all(state["payloads"].get(s) == p for s, p in got)
            ans = {"replayed": len(got), "same": same,
                   "seqs": [got[0][0], got[-1][0]] if got else []}
        else:
            ans = {"error": "unknown command %r" % cmd[0]}
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
