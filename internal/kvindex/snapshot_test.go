package kvindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/zeebo/xxh3"

	"kvrouter/internal/vllm"
)

// snapFeed generates a deterministic stream of KV event batches over five
// engines and two ranks sharing prompts (so keys get holder records):
// chained stores with and without parents, CPU copies, removals of held
// and unknown blocks, and now and then AllBlocksCleared.
type snapFeed struct {
	rng     *rand.Rand
	next    map[string]uint64   // per engine/rank: next hash
	held    map[string][]uint64 // per engine/rank: hashes stored
	seq     map[string]uint64
	prompts [][]uint32
}

func newSnapFeed(seed uint64) *snapFeed {
	f := &snapFeed{rng: rand.New(rand.NewPCG(seed, 1)), next: map[string]uint64{}, held: map[string][]uint64{}, seq: map[string]uint64{}}
	for p := range 12 {
		f.prompts = append(f.prompts, seq(1000*p%7000, 40))
	}
	return f
}

type fedBatch struct {
	engine string
	rank   int
	b      *vllm.Batch
	m      Mark
}

func (f *snapFeed) batch() fedBatch {
	eng := fmt.Sprint("e", f.rng.IntN(5))
	rank := f.rng.IntN(2)
	sk := fmt.Sprint(eng, "/", rank)
	var evs []vllm.Event
	for range 1 + f.rng.IntN(3) {
		switch op := f.rng.IntN(20); {
		case op < 11: // a prompt's first blocks, chained
			p := f.prompts[f.rng.IntN(len(f.prompts))]
			n := 1 + f.rng.IntN(len(p)/4)
			hs := make([]uint64, n)
			for i := range hs {
				f.next[sk]++
				hs[i] = f.next[sk]
			}
			evs = append(evs, storedEv(nil, hs, p[:4*n], ""))
			f.held[sk] = append(f.held[sk], hs...)
		case op < 14 && len(f.held[sk]) > 0: // a block after a held parent
			parent := f.held[sk][f.rng.IntN(len(f.held[sk]))]
			f.next[sk]++
			evs = append(evs, storedEv(hp(parent), []uint64{f.next[sk]}, seq(f.rng.IntN(50), 4), "GPU"))
			f.held[sk] = append(f.held[sk], f.next[sk])
		case op < 16 && len(f.held[sk]) > 0: // a CPU copy of a held block
			h := f.held[sk][f.rng.IntN(len(f.held[sk]))]
			ev := storedEv(nil, []uint64{h}, nil, "CPU")
			evs = append(evs, ev)
		case op < 19 && len(f.held[sk]) > 0:
			i := f.rng.IntN(len(f.held[sk]))
			evs = append(evs, removedEv([]string{"", "CPU"}[f.rng.IntN(2)], f.held[sk][i], 1<<40+uint64(i)))
		case op == 19 && f.rng.IntN(4) == 0:
			evs = append(evs, vllm.Event{Type: vllm.AllBlocksCleared})
			f.held[sk] = nil
		}
	}
	f.seq[sk]++
	return fedBatch{eng, rank, batch(rank, evs...), Mark{Seq: f.seq[sk], Sum: f.rng.Uint64()}}
}

func (fb fedBatch) apply(x *Exact) { x.ApplyMarked(fb.engine, fb.rank, false, fb.b, &fb.m) }

// sameIndex fails unless a and b hold the same snapshot and answer every
// feed prompt alike.
func sameIndex(t *testing.T, f *snapFeed, a, b *Exact) {
	t.Helper()
	sa, sb := a.Snapshot(), b.Snapshot()
	if !reflect.DeepEqual(sa, sb) {
		t.Fatalf("snapshots differ: %d vs %d entries", sa.Entries(), sb.Entries())
	}
	for _, p := range f.prompts {
		for e := range 5 {
			name := fmt.Sprint("e", e)
			if ma, mb := lookupOf(a, name, p, Extras{}), lookupOf(b, name, p, Extras{}); ma != mb {
				t.Fatalf("lookup on %s: %+v vs %+v", name, ma, mb)
			}
		}
	}
}

func encodeSnap(t *testing.T, snaps ...*Snapshot) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := EncodeSnapshots(&buf, snaps); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestSnapshotRestoreEqualsRunning: an index restored from a snapshot file
// equals the one it was taken of, entry by entry and lookup by lookup, and
// stays equal while both apply the same later batches (parents resolve
// through restored entries, removals find them).
func TestSnapshotRestoreEqualsRunning(t *testing.T) {
	c := newClock()
	f := newSnapFeed(7)
	run := testExact(c, nil)
	for range 600 {
		f.batch().apply(run)
	}
	snap := run.Snapshot()
	if snap.Entries() < 200 || len(snap.Engines) != 5 {
		t.Fatalf("feed too small: %d entries, %d engines", snap.Entries(), len(snap.Engines))
	}
	snaps, err := DecodeSnapshots(encodeSnap(t, snap))
	if err != nil {
		t.Fatal(err)
	}
	restored := testExact(c, nil)
	if err := restored.Restore(snaps[0]); err != nil {
		t.Fatal(err)
	}
	sameIndex(t, f, run, restored)
	if got, want := restored.Stats().Entries, run.Stats().Entries; got != want {
		t.Fatalf("entries %d, want %d", got, want)
	}
	for range 600 {
		fb := f.batch()
		fb.apply(run)
		fb.apply(restored)
	}
	sameIndex(t, f, run, restored)
	if m := restored.Marks("e1"); len(m) == 0 || m[0] != run.Marks("e1")[0] {
		t.Fatalf("marks %v vs %v", m, run.Marks("e1"))
	}
}

// TestApplyMarkedReset: a reset drops the rank's entries and mark in the
// same step as the batch; an update without a batch leaves the rank
// unmarked, so a snapshot leaves it out.
func TestApplyMarkedReset(t *testing.T) {
	x := testExact(newClock(), nil)
	x.ApplyMarked("a", 0, false, batch(0, storedEv(nil, []uint64{1, 2}, seq(0, 8), "")), &Mark{Seq: 4, Sum: 9})
	x.ApplyMarked("a", 1, false, batch(1, storedEv(nil, []uint64{1}, seq(0, 4), "")), &Mark{Seq: 2, Sum: 3})
	x.ApplyMarked("a", 0, true, batch(0, storedEv(nil, []uint64{7}, seq(0, 4), "")), &Mark{Seq: 0, Sum: 5})
	if m := x.Marks("a"); m[0] != (Mark{0, 5}) || m[1] != (Mark{2, 3}) {
		t.Fatalf("marks %v", m)
	}
	if n := x.Snapshot().Entries(); n != 2 {
		t.Fatalf("%d entries after reset, want 2", n)
	}
	x.ApplyMarked("a", 1, true, batch(1), nil)
	s := x.Snapshot()
	if len(s.Engines) != 1 || len(s.Engines[0].Ranks) != 1 || s.Engines[0].Ranks[0].Rank != 0 {
		t.Fatalf("snapshot %+v", s)
	}
	x.Apply("b", batch(0, storedEv(nil, []uint64{1}, seq(0, 4), "")))
	if len(x.Snapshot().Engines) != 1 {
		t.Fatal("unmarked engine in snapshot")
	}
}

// TestSnapshotRejected: every prefix of a file, every flipped byte, another
// version or magic, a payload that breaks the structural rules, and a
// snapshot of another key space are rejected with ErrSnapshot, and the
// index restored into keeps what it had.
func TestSnapshotRejected(t *testing.T) {
	c := newClock()
	f := newSnapFeed(3)
	run := testExact(c, nil)
	for range 100 {
		f.batch().apply(run)
	}
	good := encodeSnap(t, run.Snapshot())
	check := func(name string, data []byte) {
		t.Helper()
		if _, err := DecodeSnapshots(data); !errors.Is(err, ErrSnapshot) {
			t.Fatalf("%s: err %v, want ErrSnapshot", name, err)
		}
	}
	for n := range len(good) {
		check(fmt.Sprint("truncated to ", n), good[:n])
	}
	for i := range len(good) {
		bad := bytes.Clone(good)
		bad[i] ^= 0x20
		check(fmt.Sprint("byte ", i, " flipped"), bad)
	}
	ver := bytes.Clone(good)
	binary.BigEndian.PutUint32(ver[8:], SnapshotVersion+1)
	check("version", ver)

	// Structurally bad but well checksummed.
	s := run.Snapshot()
	s.Engines[0].Ranks[0].Groups[0].Keys = s.Engines[0].Ranks[0].Groups[0].Keys[1:]
	check("keys short", encodeSnap(t, s))
	s = run.Snapshot()
	g := &s.Engines[1].Ranks[0].Groups[0]
	g.Refs[0], g.Refs[1], g.Refs[2] = 0, 0, 0
	check("no copies", encodeSnap(t, s))
	s = run.Snapshot()
	s.Engines[2].Name = s.Engines[1].Name
	check("engine twice", encodeSnap(t, s))
	check("model twice", encodeSnap(t, run.Snapshot(), run.Snapshot()))

	// Another key space, and a bad snapshot given to Restore directly:
	// refused, the index untouched.
	other := testExact(c, nil)
	for range 50 {
		f.batch().apply(other)
	}
	before := other.Snapshot()
	for name, mod := range map[string]func(*Snapshot){
		"model":      func(s *Snapshot) { s.Model = "other" },
		"block size": func(s *Snapshot) { s.BlockSize = 16 },
		"root":       func(s *Snapshot) { s.Root++ },
		"late bad": func(s *Snapshot) {
			g := &s.Engines[len(s.Engines)-1].Ranks[0].Groups[0]
			clear(g.Refs[len(g.Refs)-3:])
		},
	} {
		s := run.Snapshot()
		mod(s)
		if err := other.Restore(s); !errors.Is(err, ErrSnapshot) {
			t.Fatalf("%s: err %v", name, err)
		}
		if !reflect.DeepEqual(other.Snapshot(), before) {
			t.Fatalf("%s: rejected snapshot half applied", name)
		}
	}
}

// FuzzDecodeSnapshots: any bytes either fail with ErrSnapshot or decode to
// snapshots that encode and decode again to the same value.
func FuzzDecodeSnapshots(f *testing.F) {
	x := testExact(newClock(), nil)
	feed := newSnapFeed(11)
	for range 20 {
		feed.batch().apply(x)
	}
	var buf bytes.Buffer
	if err := EncodeSnapshots(&buf, []*Snapshot{x.Snapshot()}); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	buf.Reset()
	_ = EncodeSnapshots(&buf, nil)
	f.Add(buf.Bytes())
	f.Add([]byte("KVRSNAP\x00\x00\x00\x00\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		// The checksum hides payload defects from a byte-level fuzzer:
		// also try data as a payload under a valid header and checksum.
		for _, in := range [][]byte{data, wrapPayload(data)} {
			snaps, err := DecodeSnapshots(in)
			if err != nil {
				if !errors.Is(err, ErrSnapshot) {
					t.Fatalf("err %v not ErrSnapshot", err)
				}
				continue
			}
			var out bytes.Buffer
			if err := EncodeSnapshots(&out, snaps); err != nil {
				t.Fatal(err)
			}
			again, err := DecodeSnapshots(out.Bytes())
			if err != nil || !reflect.DeepEqual(again, snaps) {
				t.Fatalf("round trip: %v", err)
			}
			for _, s := range snaps {
				y, err := NewExact(Config{Model: s.Model, Pool: s.Pool, BlockSize: s.BlockSize, MaxEntries: 64}, nil, nil)
				if err != nil || y.BlockSize() != s.BlockSize {
					continue
				}
				s.Root = uint64(y.Root())
				if err := y.Restore(s); err != nil {
					t.Fatalf("restore of a decoded snapshot: %v", err)
				}
			}
		}
	})
}

// wrapPayload frames payload as a version-1 snapshot file.
func wrapPayload(payload []byte) []byte {
	var buf bytes.Buffer
	buf.WriteString(snapMagic)
	_ = binary.Write(&buf, binary.BigEndian, [2]uint32{SnapshotVersion, 0})
	_ = binary.Write(&buf, binary.BigEndian, uint64(len(payload)))
	buf.Write(payload)
	return binary.BigEndian.AppendUint64(buf.Bytes(), xxh3.Hash(buf.Bytes()))
}
