#!/usr/bin/python3
"""Scripted stand-in for vLLM's ZmqEventPublisher, for interop tests.

Publishes KV event batches on a libzmq PUB socket exactly as vLLM does
(multipart [topic, seq8, msgpack payload]; see ../vllm/frames.md) and answers
replay requests on a ROUTER socket, in the current 4-frame form
["", topic, seq8, payload] or, with --replay-form old, the 3-frame form
["", seq8, payload] of engines before 2026-07, each followed by the end
marker. Batches are msgpack [ts, events, data_parallel_rank] with map events
in vLLM >= 0.24 field order (None-default fields omitted).

The test drives it over stdin, one command per line; each command is answered
on stdout with one line "ok next=<seq>" (the next seq to be published):

  publish N    publish N batches
  drop N       make N batches and keep them for replay without sending them
               (what vLLM does when the PUB high-water mark drops a batch)
  heartbeat    publish one batch with no events
  seq24        publish one batch whose seq frame is 24 bytes (seq + 16-byte id)
  restart      start a new epoch: seq back to 0, replay buffer emptied,
               block hashes change (a restarted engine process)
  quit         exit

Batch content is a pure function of (epoch, seq) so the test can check it:
  seq % 4 == 0  BlockStored  hashes [h(0), h(1)], parent None, 8 tokens, block_size 4, GPU
  seq % 4 == 1  BlockRemoved hashes [h(0)], GPU
  seq % 4 == 2  BlockStored  hashes [h(0) | 1<<63], parent h(0) of seq-2, 4 tokens, CPU
  seq % 4 == 3  AllBlocksCleared
  h(i) = epoch << 48 | seq << 8 | i;  ts = 1754530955.0 + epoch*1000 + seq/2
  data_parallel_rank = --rank

With --history N the process starts as an engine that has already
published batches 0..N-1 while nobody was subscribed: they are in the replay
buffer only (made before the sockets are bound, so no subscriber can see them
live).

On start it prints "ready pub=<endpoint> replay=<endpoint>" with the bound
endpoints (ports chosen by the OS when the endpoint ends in :0 or :*).
Run it with Debian's /usr/bin/python3 (python3-zmq, python3-msgpack).
"""

import argparse
import os
import sys

import msgpack
import zmq

END_SEQ = b"\xff" * 8


def event_hash(epoch, seq, i):
    return (epoch << 48) | (seq << 8) | i


def make_events(epoch, seq):
    kind = seq % 4
    if kind == 0:
        return [{
            "type": "BlockStored",
            "block_hashes": [event_hash(epoch, seq, 0), event_hash(epoch, seq, 1)],
            "parent_block_hash": None,
            "token_ids": [seq % 1000 + t for t in range(8)],
            "block_size": 4,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "group_idx": 0,
        }]
    if kind == 1:
        return [{
            "type": "BlockRemoved",
            "block_hashes": [event_hash(epoch, seq, 0)],
            "medium": "GPU",
            "group_idx": 0,
        }]
    if kind == 2:
        return [{
            "type": "BlockStored",
            "block_hashes": [event_hash(epoch, seq, 0) | (1 << 63)],
            "parent_block_hash": event_hash(epoch, seq - 2, 0),
            "token_ids": [1, 2, 3, 4],
            "block_size": 4,
            "lora_id": None,
            "medium": "CPU",
            "lora_name": None,
        }]
    return [{"type": "AllBlocksCleared"}]


def make_payload(epoch, seq, rank, events=None):
    if events is None:
        events = make_events(epoch, seq)
    ts = 1754530955.0 + epoch * 1000 + seq / 2
    return msgpack.packb([ts, events, rank], use_bin_type=True)


class Publisher:
    def __init__(self, args):
        self.args = args
        self.topic = args.topic.encode()
        self.epoch = args.epoch
        self.seq = 0
        self.buffer = []  # (seq, payload), oldest first, at most --buffer
        for _ in range(args.history):
            self.keep(*self.next_batch())
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 100000)
        self.pub.setsockopt(zmq.LINGER, 0)
        if args.pub_connect:
            self.pub.connect(args.pub_connect)
            self.pub_ep = args.pub_connect
        else:
            self.pub.bind(args.pub)
            self.pub_ep = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = None
        self.replay_ep = "none"
        if args.replay != "none":
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind(args.replay)
            self.replay_ep = self.router.getsockopt_string(zmq.LAST_ENDPOINT)

    def keep(self, seq, payload):
        self.buffer.append((seq, payload))
        if len(self.buffer) > self.args.buffer:
            del self.buffer[0]

    def next_batch(self, events=None):
        seq = self.seq
        self.seq += 1
        return seq, make_payload(self.epoch, seq, self.args.rank, events)

    def publish(self, seq, payload, seq_frame=None):
        if seq_frame is None:
            seq_frame = seq.to_bytes(8, "big")
        # Like vLLM: send, then append to the replay buffer.
        self.pub.send_multipart([self.topic, seq_frame, payload])
        self.keep(seq, payload)

    def serve_replay(self):
        frames = self.router.recv_multipart()
        if len(frames) != 3:
            print("invalid replay request of %d frames" % len(frames), file=sys.stderr, flush=True)
            return
        ident, start = frames[0], int.from_bytes(frames[2], "big")
        sent = 0
        for seq, payload in self.buffer:
            if seq < start:
                continue
            if self.args.replay_form == "old":
                self.router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
            else:
                self.router.send_multipart([ident, b"", self.topic, seq.to_bytes(8, "big"), payload])
            sent += 1
        if self.args.replay_form == "old":
            self.router.send_multipart([ident, b"", END_SEQ, b""])
        else:
            self.router.send_multipart([ident, b"", b"", END_SEQ, b""])
        print("replayed from=%d sent=%d" % (start, sent), file=sys.stderr, flush=True)

    def command(self, line):
        words = line.split()
        if not words:
            return True
        cmd, n = words[0], int(words[1]) if len(words) > 1 else 1
        if cmd == "publish":
            for _ in range(n):
                self.publish(*self.next_batch())
        elif cmd == "drop":
            for _ in range(n):
                self.keep(*self.next_batch())
        elif cmd == "heartbeat":
            self.publish(*self.next_batch(events=[]))
        elif cmd == "seq24":
            seq, payload = self.next_batch()
            self.publish(seq, payload, seq.to_bytes(8, "big") + bytes(range(16)))
        elif cmd == "restart":
            self.epoch += 1
            self.seq = 0
            self.buffer = []
        elif cmd == "quit":
            return False
        else:
            print("unknown command %r" % line, file=sys.stderr, flush=True)
            sys.exit(2)
        print("ok next=%d" % self.seq, flush=True)
        return True

    def run(self):
        print("ready pub=%s replay=%s" % (self.pub_ep, self.replay_ep), flush=True)
        poller = zmq.Poller()
        stdin = sys.stdin.fileno()
        poller.register(stdin, zmq.POLLIN)
        if self.router is not None:
            poller.register(self.router, zmq.POLLIN)
        pending = b""
        while True:
            for sock, _ in poller.poll():
                if sock is self.router:
                    self.serve_replay()
                    continue
                data = os.read(stdin, 65536)
                if not data:
                    return  # stdin closed: the test is gone
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if not self.command(line.decode()):
                        return

    def close(self):
        self.pub.close(0)
        if self.router is not None:
            self.router.close(0)
        self.ctx.term()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pub", default="tcp://127.0.0.1:*", help="PUB endpoint to bind")
    p.add_argument("--pub-connect", default="", help="PUB endpoint to connect to instead (router binds)")
    p.add_argument("--replay", default="tcp://127.0.0.1:*", help='ROUTER endpoint to bind, or "none"')
    p.add_argument("--replay-form", choices=["new", "old"], default="new")
    p.add_argument("--topic", default="kv-events")
    p.add_argument("--buffer", type=int, default=10000, help="batches kept for replay (vLLM buffer_steps)")
    p.add_argument("--rank", type=int, default=0, help="data_parallel_rank written in payloads")
    p.add_argument("--epoch", type=int, default=0, help="first epoch (changes block hashes)")
    p.add_argument("--history", type=int, default=0,
                   help="batches 0..N-1 published before anyone subscribed (replay buffer only)")
    pub = Publisher(p.parse_args())
    try:
        pub.run()
    finally:
        pub.close()


if __name__ == "__main__":
    main()
