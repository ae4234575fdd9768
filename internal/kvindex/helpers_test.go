package kvindex

import (
	"sync"
	"time"

	"kvrouter/internal/vllm"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Unix(1000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// seq returns n tokens starting at from.
func seq(from, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(from + i)
	}
	return t
}

func hp(h uint64) *vllm.BlockHash { b := vllm.BlockHash(h); return &b }

// storedEv is a BlockStored of len(hashes) blocks of tokens after parent.
func storedEv(parent *vllm.BlockHash, hashes []uint64, tokens []uint32, medium string) vllm.Event {
	hs := make([]vllm.BlockHash, len(hashes))
	for i, h := range hashes {
		hs[i] = vllm.BlockHash(h)
	}
	return vllm.Event{Type: vllm.BlockStored, BlockHashes: hs, ParentBlockHash: parent, TokenIDs: tokens, BlockSize: 4, Medium: medium}
}

func removedEv(medium string, hashes ...uint64) vllm.Event {
	hs := make([]vllm.BlockHash, len(hashes))
	for i, h := range hashes {
		hs[i] = vllm.BlockHash(h)
	}
	return vllm.Event{Type: vllm.BlockRemoved, BlockHashes: hs, Medium: medium}
}

func batch(rank int, evs ...vllm.Event) *vllm.Batch {
	return &vllm.Batch{Events: evs, DataParallelRank: rank}
}

// testExact is an Exact with block size 4 on a test clock.
func testExact(c *clock, mod func(*Config)) *Exact {
	cfg := Config{Model: "m", BlockSize: 4, Now: c.Now}
	if mod != nil {
		mod(&cfg)
	}
	x, err := NewExact(cfg, nil, nil)
	if err != nil {
		panic(err)
	}
	return x
}

// lookupOf returns name's Match for tokens.
func lookupOf(x interface {
	Lookup([]Key, []Match) []Match
	ReplicaID(string) (ReplicaID, bool)
	Root() Key
	BlockSize() int
}, name string, tokens []uint32, ex Extras) Match {
	ex.Root = x.Root()
	keys := Keys(nil, tokens, x.BlockSize(), ex)
	out := x.Lookup(keys, nil)
	id, ok := x.ReplicaID(name)
	if !ok || int(id) >= len(out) {
		return Match{}
	}
	return out[id]
}

// cat concatenates token slices.
func cat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
