package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// endSeq is the seq of the replay end marker: ff ff ff ff ff ff ff ff.
const endSeq = ^uint64(0)

// errReplayProtocol marks a replay reply that fits neither of vLLM's shapes.
var errReplayProtocol = errors.New("unexpected replay reply")

// replayer asks one engine rank's ROUTER (vLLM's replay_endpoint) for the
// batches it still buffers. Each request uses a fresh DEALER connection, so
// a late reply to a request that timed out can never be read as the answer
// to the next one. Replays are rare (gaps and start-up); a connection per
// request costs one TCP handshake.
type replayer struct {
	ep      zmtpEndpoint
	timeout time.Duration
	// topic is the SUB prefix of the live stream (SubscriberConfig.Topic):
	// replies in the 4-frame form whose topic does not start with it are
	// skipped, as the SUB socket skips such live messages. The 3-frame form
	// carries no topic and is never filtered.
	topic string
	// limit bounds the replies (set by the rank before its first request).
	limit frameLimit
}

// replayResult summarises one replay request.
type replayResult struct {
	// batches is the number of data replies received (end marker excluded).
	batches int
	// first is the seq of the first data reply; valid when batches > 0.
	first uint64
	// last is the seq of the last data reply; valid when batches > 0.
	last uint64
	// filtered is the number of data replies skipped for their topic (not
	// in batches, first or last).
	filtered int
}

// replay sends ["", seq8(from)] and calls fn for every data reply, oldest
// first, until the end marker. It accepts both reply shapes of
// frames.md §3: ["", topic, seq8, payload] (vLLM main since 2026-07-07) and
// ["", seq8, payload] (older engines), with end markers
// ["", "", ffx8, ""] and ["", ffx8, ""]. A data reply whose seq is
// ff..ff but whose payload is not empty is data, not the end. A data reply
// whose topic does not start with r.topic is skipped (SUB filtering is a
// prefix match, and the live stream never delivers such batches).
//
// The whole request, connection included, is bounded by r.timeout and ctx;
// a failing dial is retried for up to dialRetryFor.
// When the engine buffers nothing from `from` on (all older), it starts at
// its oldest batch: callers compare result.first with from. An error from fn
// stops the replay and is returned. The result covers the replies handled
// before any error.
func (r *replayer) replay(ctx context.Context, from uint64, fn func(seq uint64, payload []byte) error) (replayResult, error) {
	var res replayResult
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	c, err := r.dial(ctx)
	if err != nil {
		return res, fmt.Errorf("replay: dial %s: %w", r.ep.addr, err)
	}
	defer c.close()
	// Close the connection when ctx ends so a blocked read returns.
	stop := context.AfterFunc(ctx, func() { c.close() })
	defer stop()

	var seq8 [8]byte
	binary.BigEndian.PutUint64(seq8[:], from)
	if err := c.send(nil, seq8[:]); err != nil {
		return res, r.wrap(ctx, "send request", err)
	}
	for {
		frames, err := c.recv()
		if err != nil {
			return res, r.wrap(ctx, "receive", err)
		}
		topic, seq, payload, end, err := parseReplay(frames)
		if err != nil {
			return res, fmt.Errorf("replay: reply %d: %w", res.batches+res.filtered, err)
		}
		if end {
			return res, nil
		}
		if topic != nil && !bytes.HasPrefix(topic, []byte(r.topic)) {
			res.filtered++
			continue
		}
		if res.batches == 0 {
			res.first = seq
		}
		res.batches++
		res.last = seq
		if err := fn(seq, payload); err != nil {
			return res, err
		}
	}
}

// dialRetryFor is how long a failing replay dial is retried: vLLM binds its
// ROUTER just after its PUB, so a subscriber reconnecting to a starting
// engine can find the PUB up and the ROUTER not yet.
const dialRetryFor = 500 * time.Millisecond

// dial connects a DEALER to the ROUTER, retrying every 20ms for up to
// dialRetryFor (and within ctx) while the dial fails.
func (r *replayer) dial(ctx context.Context) (*zmtpConn, error) {
	give := time.Now().Add(dialRetryFor)
	for {
		c, err := dialZMTP(ctx, r.ep, zmq4.Dealer, r.limit)
		if err == nil || ctx.Err() != nil || time.Now().After(give) {
			return c, err
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

// wrap turns a read/write error into a timeout or cancellation error when
// ctx is what ended the request.
func (r *replayer) wrap(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return fmt.Errorf("replay: %s: timed out after %v: %w", what, r.timeout, cerr)
		}
		return fmt.Errorf("replay: %s: %w", what, cerr)
	}
	return fmt.Errorf("replay: %s: %w", what, err)
}

// parseReplay reads one DEALER-side replay reply. The first frame must be
// the empty delimiter; then 3 frames are topic, seq, payload and 2 frames
// are seq, payload (topic is then nil; in the 4-frame form it is non-nil,
// possibly empty). end reports the end marker (seq ff..ff, empty payload).
// The seq frame must be at least 8 bytes; its first 8 are the seq (a
// tolerant reading of the 24-byte seq frame of vLLM PR #57789).
func parseReplay(frames [][]byte) (topic []byte, seq uint64, payload []byte, end bool, err error) {
	if len(frames) == 0 || len(frames[0]) != 0 {
		return nil, 0, nil, false, fmt.Errorf("%w: %d frames, first not the empty delimiter", errReplayProtocol, len(frames))
	}
	var seqFrame []byte
	switch len(frames) {
	case 4:
		topic, seqFrame, payload = frames[1], frames[2], frames[3]
		if topic == nil {
			topic = []byte{}
		}
	case 3:
		seqFrame, payload = frames[1], frames[2]
	default:
		return nil, 0, nil, false, fmt.Errorf("%w: %d frames, want 3 or 4", errReplayProtocol, len(frames))
	}
	if len(seqFrame) < 8 {
		return nil, 0, nil, false, fmt.Errorf("%w: seq frame of %d bytes", errReplayProtocol, len(seqFrame))
	}
	seq = binary.BigEndian.Uint64(seqFrame)
	if seq == endSeq && len(payload) == 0 {
		return topic, seq, nil, true, nil
	}
	return topic, seq, payload, false, nil
}

// parseLive reads one live PUB message [topic, seq, payload]. The topic must
// start with prefix (SUB filtering is a prefix match; a libzmq PUB filters
// already, this is a second check). The seq frame must be at least 8 bytes
// and its first 8 are the seq.
func parseLive(frames [][]byte, prefix string) (seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return 0, nil, fmt.Errorf("live message of %d frames, want 3 [topic, seq, payload]", len(frames))
	}
	if !bytes.HasPrefix(frames[0], []byte(prefix)) {
		return 0, nil, fmt.Errorf("live message topic %q does not match %q", frames[0], prefix)
	}
	if len(frames[1]) < 8 {
		return 0, nil, fmt.Errorf("live message seq frame of %d bytes, want 8 (or 24)", len(frames[1]))
	}
	return binary.BigEndian.Uint64(frames[1]), frames[2], nil
}
