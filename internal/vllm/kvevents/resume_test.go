package kvevents

import (
	"maps"
	"sync"
	"testing"
	"time"

	"kvrouter/internal/testwait"
)

// positionConsumer is a heldConsumer that also keeps the Position of the
// last batch applied, as a snapshot of the index does.
type positionConsumer struct {
	*heldConsumer
	mu  sync.Mutex
	pos Position
	n   int
}

func (c *positionConsumer) apply(u Update) {
	c.heldConsumer.apply(u)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !u.NoBatch {
		c.pos, c.n = Position{Seq: u.Seq, Sum: u.Sum}, c.n+1
	}
}

func (c *positionConsumer) position() Position {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pos
}

// resumeRun runs a subscriber on e until the consumer has applied 40
// batches, stops it, lets the engine publish 30 more, then starts a second
// subscriber that resumes from the first one's position (with at changing
// it) over a copy of its state, and returns the second consumer once it has
// applied the engine's last batch or a reset.
func resumeRun(t *testing.T, e *bufEngine, at func(*Position)) (*positionConsumer, *Subscriber) {
	t.Helper()
	cfg := SubscriberConfig{Engine: "e0", Endpoint: e.pubEP, ReplayEndpoint: e.replayEP, Topic: "kv@", IdleCheck: -1}
	first := &positionConsumer{heldConsumer: newHeldConsumer()}
	s1, err := NewSubscriber(cfg, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := runSubscriber(t, s1, first.apply)
	e.waitSubscribed()
	for range 40 {
		e.publish()
	}
	testwait.Within(t, time.Minute, "the first 40 batches", func() bool { return first.got(39) })
	stop()
	for range 30 {
		e.publish()
	}
	pos := first.position()
	at(&pos)
	second := &positionConsumer{heldConsumer: newHeldConsumer()}
	second.held = maps.Clone(first.held)
	cfg.Resume = map[int]Position{0: pos}
	s2, err := NewSubscriber(cfg, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	runSubscriber(t, s2, second.apply)
	testwait.Within(t, time.Minute, "the resumed stream", func() bool {
		second.heldConsumer.mu.Lock()
		defer second.heldConsumer.mu.Unlock()
		return second.last == 69 || len(second.resets) > 0
	})
	return second, s2
}

// TestResumeCoveredByReplay: a subscriber resumed from the position of the
// last batch its predecessor applied gets exactly the batches after it, by
// replay, with no reset, and its consumer ends with the engine's state.
func TestResumeCoveredByReplay(t *testing.T) {
	e := newBufEngine(t, "kv@e0@m", 1000)
	c, s := resumeRun(t, e, func(*Position) {})
	testwait.Within(t, time.Minute, "the last batch", func() bool { return c.got(69) })
	c.heldConsumer.mu.Lock()
	defer c.heldConsumer.mu.Unlock()
	if len(c.resets) != 0 || len(c.seqs) == 0 || c.seqs[0] != 40 {
		t.Fatalf("resets %+v, first seq %v: want none, from 40", c.resets, c.seqs[:min(len(c.seqs), 1)])
	}
	if !maps.Equal(c.held, e.held) {
		t.Fatalf("consumer holds %d blocks, engine %d", len(c.held), len(e.held))
	}
	if st := s.Stats(); st.UnrecoverableGaps != 0 || st.Restarts != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestResumeNotCovered: when the engine no longer buffers the resumed
// batch, the rank is reset (gap lost) and starts from what the engine still
// buffers; when the engine's batch under that seq is another one (a new
// process), it is reset as a restart.
func TestResumeNotCovered(t *testing.T) {
	for _, tc := range []struct {
		name   string
		buffer int
		at     func(*Position)
		want   ResetReason
	}{
		{"rolled out of the buffer", 20, func(*Position) {}, ResetGapLost},
		{"another engine process", 1000, func(p *Position) { p.Sum++ }, ResetRestart},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newBufEngine(t, "kv@e0@m", tc.buffer)
			c, _ := resumeRun(t, e, tc.at)
			c.heldConsumer.mu.Lock()
			defer c.heldConsumer.mu.Unlock()
			if len(c.resets) == 0 || c.resets[0].Reset != tc.want {
				t.Fatalf("resets %+v, want %v first", c.resets, tc.want)
			}
		})
	}
}
