package sim

import "time"

// evKind orders simultaneous events: arrivals and scale changes first, then
// step ends and event deliveries, then gauge scrapes, and replica kicks last,
// so that a step starting at t sees every request that arrived at t.
type evKind uint8

const (
	evScale evKind = iota
	evArrival
	evStepEnd
	evDeliver
	evGauges
	evKick
	evTransfer // a KV pull ends (pdsim.go); after the kicks of its instant
)

// event is one scheduled happening.
type event struct {
	at   time.Duration
	kind evKind
	seq  uint64 // insertion order, set by push: ties stay deterministic
	rep  int    // replica index (step end, delivery, kick)
	i    int    // request index (arrival), scale index, delivery slot
}

// qent is a queued event packed into 24 bytes: ord is kind<<56 | seq, so
// that (at, ord) orders as (at, kind, seq) while seq < 2^56.
type qent struct {
	at     time.Duration
	ord    uint64
	rep, i int32
}

// queue is a binary min-heap of events by (at, kind, seq), without
// interface boxing (millions of events per run).
type queue struct {
	evs []qent
	seq uint64
}

func (q *queue) len() int { return len(q.evs) }

func less(x, y *qent) bool {
	if x.at != y.at {
		return x.at < y.at
	}
	return x.ord < y.ord
}

func (q *queue) push(e event) {
	q.seq++
	q.evs = append(q.evs, qent{at: e.at, ord: uint64(e.kind)<<56 | q.seq, rep: int32(e.rep), i: int32(e.i)})
	i := len(q.evs) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !less(&q.evs[i], &q.evs[p]) {
			break
		}
		q.evs[i], q.evs[p] = q.evs[p], q.evs[i]
		i = p
	}
}

func (q *queue) pop() event {
	top := q.evs[0]
	n := len(q.evs) - 1
	q.evs[0] = q.evs[n]
	q.evs = q.evs[:n]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && less(&q.evs[l], &q.evs[m]) {
			m = l
		}
		if r < n && less(&q.evs[r], &q.evs[m]) {
			m = r
		}
		if m == i {
			break
		}
		q.evs[i], q.evs[m] = q.evs[m], q.evs[i]
		i = m
	}
	return event{at: top.at, kind: evKind(top.ord >> 56), seq: top.ord &^ (0xff << 56), rep: int(top.rep), i: int(top.i)}
}
