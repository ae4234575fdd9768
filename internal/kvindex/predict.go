package kvindex

import (
	"sync"
	"time"
)

// predictor holds Exact's predicted blocks: (key, replica) pairs routed
// moments ago, each with its expiry in aux. One global LRU list, oldest at the
// tail; since every prediction lives for the same TTL, the tail also expires
// first.
type predictor struct {
	mu    sync.RWMutex
	st    store
	srcOf []uint32 // ReplicaID -> source id + 1
	ttl   time.Duration
	max   int
	c     *counters
}

func newPredictor(ttl time.Duration, max int, c *counters) *predictor {
	return &predictor{st: newStore(false, false, false), ttl: ttl, max: max, c: c}
}

// source returns r's source id, creating it when create is set; ok false
// when r has none.
func (p *predictor) source(r ReplicaID, create bool) (uint32, bool) {
	if int(r) < len(p.srcOf) && p.srcOf[r] != 0 {
		return p.srcOf[r] - 1, true
	}
	if !create {
		return 0, false
	}
	for int(r) >= len(p.srcOf) {
		p.srcOf = append(p.srcOf, 0)
	}
	s := p.st.addSource(r, 0, 0)
	p.srcOf[r] = s + 1
	return s, true
}

// add predicts keys for r until now+ttl. Caller holds p.mu.
func (p *predictor) add(r ReplicaID, keys []Key, now int64) {
	p.expire(now)
	src, _ := p.source(r, true)
	exp := uint64(now + int64(p.ttl))
	// Reverse order: block 0 ends most recent, so eviction takes deep
	// blocks first.
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		if idx := p.st.find(src, uint64(k)); idx != 0 {
			p.st.ent(idx).aux = exp
			p.st.touch(idx)
			continue
		}
		p.st.insert(src, k, exp, -1)
		p.c.predicted.Add(1)
		for p.st.n > p.max {
			p.st.remove(p.st.oldest(0))
			p.c.expired.Add(1)
		}
	}
	p.c.predictedLive.Store(int64(p.st.n))
}

// expire drops predictions whose time has passed. Caller holds p.mu.
func (p *predictor) expire(now int64) {
	for {
		idx := p.st.oldest(0)
		if idx == 0 || p.st.ent(idx).aux >= uint64(now) {
			break
		}
		p.st.remove(idx)
		p.c.expired.Add(1)
	}
	p.c.predictedLive.Store(int64(p.st.n))
}

// confirm settles the prediction of k for r, if any. Caller holds p.mu.
func (p *predictor) confirm(r ReplicaID, k Key) {
	src, ok := p.source(r, false)
	if !ok {
		return
	}
	if idx := p.st.find(src, uint64(k)); idx != 0 {
		p.st.remove(idx)
		p.c.confirmed.Add(1)
	}
}

// dropReplica forgets r's predictions without counting them as expired.
// Caller holds p.mu.
func (p *predictor) dropReplica(r ReplicaID) {
	src, ok := p.source(r, false)
	if !ok {
		return
	}
	p.st.clearSource(src)
	p.st.srcs[src].live = false
	p.srcOf[r] = 0
	p.c.predictedLive.Store(int64(p.st.n))
}
