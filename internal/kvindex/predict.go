package kvindex

import (
	"cmp"
	"slices"
	"sync"
	"time"
	"unsafe"
)

// predictor holds Exact's predicted blocks as runs: one per routed request,
// the request's keys from just before the blocks its replica held, so a
// request costs one copy of its keys instead of a table entry per block.
//
// Keys chain (each hashes its parent), so two key sequences agree up to some
// length and differ everywhere after it: a run covers, for a prompt looked
// up, the prompt's leading blocks up to that length (binary search), and its
// replica's engine stores the run's blocks in order, so confirming them is a
// cursor compared with each stored event's keys.
//
// A run counts Predicted for its blocks after the held ones, [held, n); the
// cursor next confirms them in order ([held, next) confirmed). A block
// predicted twice for one replica (two requests sharing a prefix) is pending
// in one run only: a new run takes over the pending blocks an older run of
// the same replica shares with it, so Predicted, Confirmed and Expired count
// (block, replica) pairs, as the Stats doc says.
//
// Runs live in a slice, linked oldest to newest; since every run lives for
// the same TTL, the oldest also expires first.
type predictor struct {
	mu    sync.RWMutex
	runs  []predRun
	free  []int32       // indices of dead runs, for reuse
	byRep [][]int32     // ReplicaID -> its live runs
	head  int32         // oldest live run (-1: none)
	tail  int32         // newest live run (-1: none)
	keys  int           // keys held by live runs (bounded by max)
	spare int           // capacity of the key buffers dead runs keep (bounded by max)
	pos   map[Key]int32 // confirm's scratch: an event's keys by position
	live  int           // pending predicted blocks of live runs
	seq   uint32        // last run sequence number given (Prediction.seq)
	ttl   time.Duration
	max   int
	c     *counters
}

// predRun is the prediction of one routed request.
type predRun struct {
	keys []Key // the request's keys from position off on
	// k0 and k1 are keys[0] and keys[1] (0 when absent), kept inline so
	// that a lookup rejects a run unrelated to its prompt, or one its
	// prompt leaves right after the blocks the run's replica held, without
	// loading the run's keys.
	k0, k1 Key
	exp    int64 // expiry, Config.Now in Unix nanoseconds
	r      ReplicaID
	off    int32 // position of keys[0]: max(held-1, 0)
	held   int32 // first predicted position
	next   int32 // confirmation cursor: [held, next) confirmed or handed over
	n      int32 // positions [0, n) are the request's
	// inherited is the end of the pending blocks this run took over from
	// older runs of its replica ([held, inherited)): requests routed
	// before it predicted them too, so Cancel keeps them.
	inherited int32
	seq       uint32 // names this use of the slot for Prediction
	// older and newer link the live runs by age (-1: none).
	older, newer int32
	live         bool
}

// maxRuns caps the routed requests whose predictions are kept, oldest
// dropped first: a lookup checks every run (two inline keys each, a
// binary search for runs sharing the prompt's prefix), so this bounds its
// cost when events stop confirming predictions (about 80 µs at the cap
// with every run sharing the prompt's first blocks; BenchmarkLookupPredicted).
const maxRuns = 1 << 14

// Key buffers of dead runs are kept for reuse while they hold at most max
// keys in all (predictor.spare); a reused buffer more than slack times the
// keys it gets (and over minKeep) is dropped instead, so that a live run
// holds at most about slack times its keys. Steady traffic then allocates
// nothing, and no mix of prompt lengths makes the memory grow beyond about
// (1 + slack) x MaxPredicted keys.
const (
	slack   = 4
	minKeep = 64
)

// confirmScan is the most runs x keys compares confirm makes by scanning;
// beyond it, it looks keys up in a map.
const confirmScan = 4096

func newPredictor(ttl time.Duration, max int, c *counters) *predictor {
	return &predictor{head: -1, tail: -1, ttl: ttl, max: max, c: c}
}

// pending returns how many of run's blocks wait for confirmation.
func (p *predRun) pending() int { return int(p.n - p.next) }

// key returns the key at position i, which must be in [off, n).
func (p *predRun) key(i int32) Key { return p.keys[i-p.off] }

// lcp returns how many leading keys of a request with keys q the run shares:
// 0 when q differs from the run at or before position off (the run then
// says nothing about q), else at most n.
func (p *predRun) lcp(q []Key) int32 {
	if int(p.off) >= len(q) || q[p.off] != p.k0 {
		return 0
	}
	end := min(p.n, int32(len(q)))
	if p.off+1 == end || q[p.off+1] != p.k1 {
		return p.off + 1
	}
	return chainEnd(p.off+2, end, func(i int32) bool { return q[i] == p.key(i) })
}

// chainEnd returns the first position in [lo, hi) where same is false, or
// hi, for a same that holds up to some position and fails from there on (as
// chained keys compare): it gallops from lo, then bisects, so a mismatch
// near lo costs a few compares.
func chainEnd(lo, hi int32, same func(int32) bool) int32 {
	for step := int32(1); lo < hi; step *= 2 {
		probe := min(lo+step-1, hi-1)
		if !same(probe) {
			hi = probe
			break
		}
		lo = probe + 1
	}
	for lo < hi {
		mid := int32(uint32(lo+hi) >> 1)
		if same(mid) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Prediction names the blocks predicted for one routed request, for
// Exact.Cancel; the zero Prediction names none. It stays valid (and
// harmless) after its blocks are confirmed, expired or handed over.
type Prediction struct {
	run int32
	seq uint32 // 0: none
}

// add predicts keys[held:] for r until now+ttl and names the prediction.
// Caller holds p.mu.
func (p *predictor) add(r ReplicaID, keys []Key, held int, now int64) Prediction {
	p.expire(now)
	n := len(keys)
	if held >= n {
		return Prediction{}
	}
	off := max(held-1, 0)
	if n-off > p.max {
		n = off + p.max // a prompt longer than the whole budget
	}
	if held >= n {
		return Prediction{}
	}
	for (p.keys+n-off > p.max || len(p.runs)-len(p.free) >= maxRuns) && p.head >= 0 {
		p.drop(p.head, true)
	}
	i := p.alloc()
	run := &p.runs[i]
	p.spare -= cap(run.keys)
	if c := cap(run.keys); c > slack*(n-off) && c > minKeep {
		run.keys = nil
	}
	run.keys = append(run.keys[:0], keys[off:n]...)
	run.k0, run.k1, run.exp, run.r = run.keys[0], 0, now+int64(p.ttl), r
	if len(run.keys) > 1 {
		run.k1 = run.keys[1]
	}
	run.off, run.held, run.next, run.n = int32(off), int32(held), int32(held), int32(n)
	run.inherited = run.held
	p.seq++
	if p.seq == 0 {
		p.seq = 1
	}
	run.seq = p.seq
	fresh := n - held
	// Take over the pending blocks older runs of r share with this one.
	for int(r) >= len(p.byRep) {
		p.byRep = append(p.byRep, nil)
	}
	for j := 0; j < len(p.byRep[r]); j++ {
		o := &p.runs[p.byRep[r][j]]
		l := min(o.lcpRun(run), o.n)
		if l <= o.next {
			continue
		}
		// o's blocks [o.next, l) are run's too: those run predicts are
		// handed over, those below held are held already (confirmed).
		taken := int(l - max(o.next, run.held))
		if taken > 0 {
			fresh -= taken
			run.inherited = max(run.inherited, l)
		}
		if below := int(min(l, run.held) - o.next); below > 0 {
			p.c.confirmed.Add(int64(below))
		}
		p.live -= int(l - o.next)
		o.next = l
		if o.pending() == 0 {
			p.drop(p.byRep[r][j], false)
			j--
		}
	}
	p.link(i)
	p.c.predicted.Add(int64(fresh))
	p.live += run.pending()
	p.keys += len(run.keys)
	p.byRep[r] = append(p.byRep[r], i)
	p.c.predictedLive.Store(int64(p.live))
	return Prediction{run: i, seq: run.seq}
}

// cancel drops the pending blocks of prediction q that no older request
// predicted too (those it inherited stay, with its expiry), counting them
// as cancelled, and returns how many it dropped: 0 when q names no live
// run (none, or its blocks were confirmed, expired or handed over since).
// Caller holds p.mu.
func (p *predictor) cancel(q Prediction) int {
	if q.seq == 0 || int(q.run) >= len(p.runs) {
		return 0
	}
	run := &p.runs[q.run]
	if !run.live || run.seq != q.seq {
		return 0
	}
	keep := max(run.inherited, run.next)
	if keep >= run.n {
		return 0
	}
	dropped := int(run.n - keep)
	p.c.cancelled.Add(int64(dropped))
	if keep == run.next { // nothing of it pending any more
		p.drop(q.run, false)
	} else {
		p.live -= dropped
		p.keys -= dropped
		run.n = keep
		run.keys = run.keys[:keep-run.off]
		if len(run.keys) < 2 {
			run.k1 = 0
		}
	}
	p.c.predictedLive.Store(int64(p.live))
	return dropped
}

// lcpRun returns how many leading positions runs p and q share, as far as
// both hold keys there (0 when they differ at the first position both hold).
func (p *predRun) lcpRun(q *predRun) int32 {
	a := max(p.off, q.off)
	if a >= p.n || a >= q.n || p.key(a) != q.key(a) {
		return 0
	}
	return chainEnd(a+1, min(p.n, q.n), func(i int32) bool { return p.key(i) == q.key(i) })
}

// alloc returns the index of an unused run, keeping its key buffer.
func (p *predictor) alloc() int32 {
	if n := len(p.free); n > 0 {
		i := p.free[n-1]
		p.free = p.free[:n-1]
		return i
	}
	p.runs = append(p.runs, predRun{})
	return int32(len(p.runs) - 1)
}

// link makes run i the newest live run.
func (p *predictor) link(i int32) {
	run := &p.runs[i]
	run.live, run.older, run.newer = true, p.tail, -1
	if p.tail >= 0 {
		p.runs[p.tail].newer = i
	} else {
		p.head = i
	}
	p.tail = i
}

// drop removes live run i, counting its pending blocks as expired when
// expired is set.
func (p *predictor) drop(i int32, expired bool) {
	run := &p.runs[i]
	if expired {
		p.c.expired.Add(int64(run.pending()))
	}
	p.live -= run.pending()
	p.keys -= len(run.keys)
	if run.older >= 0 {
		p.runs[run.older].newer = run.newer
	} else {
		p.head = run.newer
	}
	if run.newer >= 0 {
		p.runs[run.newer].older = run.older
	} else {
		p.tail = run.older
	}
	list := p.byRep[run.r]
	for j, v := range list {
		if v == i {
			list[j] = list[len(list)-1]
			p.byRep[run.r] = list[:len(list)-1]
			break
		}
	}
	run.live = false
	run.keys = run.keys[:0]
	if p.spare+cap(run.keys) > p.max {
		run.keys = nil
	}
	p.spare += cap(run.keys)
	p.free = append(p.free, i)
}

// expire drops the runs whose time has passed. Caller holds p.mu.
func (p *predictor) expire(now int64) {
	for p.head >= 0 && p.runs[p.head].exp < now {
		p.drop(p.head, true)
	}
	p.c.predictedLive.Store(int64(p.live))
}

// confirm advances the runs of r over keys, the keys of blocks r just
// stored, in order, after expiring the runs past their time at now. Caller
// holds p.mu.
func (p *predictor) confirm(r ReplicaID, keys []Key, now int64) {
	p.expire(now)
	if int(r) >= len(p.byRep) || len(keys) == 0 {
		return
	}
	list := p.byRep[r]
	// Each run looks for its next key in keys: a scan, or with many runs
	// and keys a map of keys' positions built once (a stalled replica's
	// runs pile up to maxRuns under the write lock).
	pos := p.pos
	if len(list)*len(keys) > confirmScan {
		if pos == nil {
			pos = make(map[Key]int32, len(keys))
			p.pos = pos
		}
		clear(pos)
		for k := len(keys) - 1; k >= 0; k-- {
			pos[keys[k]] = int32(k) // the first occurrence wins
		}
	} else {
		pos = nil
	}
	for j := 0; j < len(list); j++ {
		run := &p.runs[list[j]]
		want := run.key(run.next)
		at := -1
		switch {
		case keys[0] == want:
			at = 0
		case pos != nil:
			if k, ok := pos[want]; ok {
				at = int(k)
			}
		default:
			for k := 1; k < len(keys); k++ {
				if keys[k] == want {
					at = k
					break
				}
			}
		}
		if at < 0 {
			continue
		}
		from := run.next
		for at < len(keys) && run.next < run.n && keys[at] == run.key(run.next) {
			at++
			run.next++
		}
		d := int(run.next - from)
		p.c.confirmed.Add(int64(d))
		p.live -= d
		if run.pending() == 0 {
			p.drop(list[j], false) // swaps the last run into j
			list = p.byRep[r]
			j--
		}
	}
	p.c.predictedLive.Store(int64(p.live))
}

// bytes estimates the memory the predictions hold.
func (p *predictor) bytes() int64 {
	b := int64(cap(p.runs))*int64(unsafe.Sizeof(predRun{})) + int64(cap(p.free))*4 + int64(cap(p.byRep))*24
	for i := range p.runs {
		b += int64(cap(p.runs[i].keys)) * 8
	}
	for _, l := range p.byRep {
		b += int64(cap(l)) * 4
	}
	return b
}

// dropReplica forgets r's predictions without counting them as expired.
// Caller holds p.mu.
func (p *predictor) dropReplica(r ReplicaID) {
	if int(r) >= len(p.byRep) {
		return
	}
	for len(p.byRep[r]) > 0 {
		p.drop(p.byRep[r][0], false)
	}
	p.c.predictedLive.Store(int64(p.live))
}

// covered returns how many leading blocks of keys the live runs of r
// predict at now (Unix nanoseconds): the longest prefix keys shares with
// one of them. Caller holds p.mu (read).
func (p *predictor) covered(r ReplicaID, keys []Key, now int64) int32 {
	if int(r) >= len(p.byRep) {
		return 0
	}
	best := int32(0)
	for _, i := range p.byRep[r] {
		run := &p.runs[i]
		if run.exp < now || run.n <= best {
			continue
		}
		best = max(best, run.lcp(keys))
	}
	return best
}

// predCover is how far one replica's predictions cover a looked-up prompt:
// its first l blocks.
type predCover struct{ l, r int32 }

// covers appends to dst the covers of keys at now (Unix nanoseconds) of the
// replicas below n that have some, sorted by l. Caller holds p.mu (read).
func (p *predictor) covers(dst []predCover, keys []Key, n int, now int64) []predCover {
	for r := range min(n, len(p.byRep)) {
		if len(p.byRep[r]) == 0 {
			continue
		}
		if l := p.covered(ReplicaID(r), keys, now); l > 0 {
			dst = append(dst, predCover{l, int32(r)})
		}
	}
	slices.SortFunc(dst, func(a, b predCover) int { return cmp.Compare(a.l, b.l) })
	return dst
}
