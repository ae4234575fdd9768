package kvindex

// Holder records: a key held by recMin or more entries gets a record with
// two bits per replica (its best tier over all its entries of the key), so
// that Lookup reads one record per block instead of one entry per (block,
// holder) pair. Keys with fewer holders keep only their entry chain: one or
// two entries cost a lookup no more than a record, and need no record memory.
//
// A record is stride = 2 + 2*w words of holderSets.recs: the key, the chain
// head (low 32 bits) and entry count (high 32 bits), then per word j of 64
// replicas a pair (hi, lo) of bit sets. Replica r's tier code is
// hi<<1 | lo: 3 GPU, 2 CPU, 1 STORAGE, 0 none. The key table stores a
// record's index with recTag set; an untagged value is the first entry of the
// key's chain. Record 0 is a sentinel; free records are chained through their
// head word.

const (
	recTag = uint32(1) << 31
)

// Tier codes in records.
const (
	codeNone uint64 = iota
	codeStorage
	codeCPU
	codeGPU
)

// holderSets is the record storage of a store; recs is nil when the store
// uses none (expiring entries: Approx, predictions).
type holderSets struct {
	recs    []uint64
	stride  int    // words per record
	w       int    // replica words per record (64 replicas each)
	freeRec uint32 // first free record, 0 = none
	nrecs   int    // live records
}

// recMin is the chain length at which a key gets a record (a record is
// dropped again when one entry is left): 4 for up to 128 replicas, more for
// wider records, so that a record adds at most about 10 bytes per entry
// (16+16*w bytes shared by recMin or more entries). Keys below it are walked.
func (h *holderSets) recMin() uint32 { return max(4, uint32(16+16*h.w+9)/10) }

func (h *holderSets) initRecs() {
	h.w = 1
	h.stride = 4
	h.recs = make([]uint64, h.stride)
}

// entryCode returns the tier code of the best medium holding a copy.
func entryCode(r *[3]uint16) uint64 {
	switch {
	case r[0] > 0:
		return codeGPU
	case r[1] > 0:
		return codeCPU
	case r[2] > 0:
		return codeStorage
	}
	return codeNone
}

func (h *holderSets) rec(v uint32) []uint64 {
	i := int(v&^recTag) * h.stride
	return h.recs[i : i+h.stride : i+h.stride]
}

func (h *holderSets) recHead(v uint32) uint32 { return uint32(h.recs[int(v&^recTag)*h.stride+1]) }

func setHead(r []uint64, head, n uint32) { r[1] = uint64(head) | uint64(n)<<32 }

func getCode(r []uint64, rep ReplicaID) uint64 {
	j, b := 2+2*(int(rep)>>6), uint(rep)&63
	if j >= len(r) {
		return codeNone
	}
	return (r[j]>>b&1)<<1 | r[j+1]>>b&1
}

func setCode(r []uint64, rep ReplicaID, c uint64) {
	j, b := 2+2*(int(rep)>>6), uint(rep)&63
	r[j] = r[j]&^(1<<b) | (c>>1)<<b
	r[j+1] = r[j+1]&^(1<<b) | (c&1)<<b
}

// ensureWords widens every record so that replica rep has bits.
func (h *holderSets) ensureWords(rep ReplicaID) {
	need := int(rep)>>6 + 1
	if need <= h.w {
		return
	}
	stride := 2 + 2*need
	n := len(h.recs) / h.stride
	recs := make([]uint64, n*stride, n*stride+n*stride/4)
	for i := range n {
		copy(recs[i*stride:], h.recs[i*h.stride:(i+1)*h.stride])
	}
	h.recs, h.w, h.stride = recs, need, stride
}

// newRec returns a zeroed record's tagged index.
func (h *holderSets) newRec() uint32 {
	h.nrecs++
	if v := h.freeRec; v != 0 {
		r := h.rec(v)
		h.freeRec = uint32(r[1])
		clear(r)
		return v
	}
	i := len(h.recs) / h.stride
	for range h.stride {
		h.recs = append(h.recs, 0)
	}
	return uint32(i) | recTag
}

func (h *holderSets) freeRecord(v uint32) {
	r := h.rec(v)
	clear(r)
	r[1] = uint64(h.freeRec)
	h.freeRec = v
	h.nrecs--
}

// link prepends new entry idx to the holders of the key in key table slot
// i, creating the key's record when the chain reaches recMin.
func (s *store) link(i int, idx uint32) {
	v := s.keys.get(i)
	e := s.ent(idx)
	if v&recTag != 0 {
		r := s.rec(v)
		e.next = uint32(r[1])
		setHead(r, idx, uint32(r[1]>>32)+1)
		rep := s.srcs[e.src].replica
		if c := entryCode(&e.refs); c > getCode(r, rep) {
			setCode(r, rep, c)
		}
		return
	}
	e.next = v
	s.keys.put(i, idx)
	if s.recs == nil {
		return
	}
	n := uint32(0)
	for p := idx; p != 0; p = s.ent(p).next {
		n++
	}
	if n < s.recMin() {
		return
	}
	rv := s.newRec()
	r := s.rec(rv)
	r[0] = uint64(e.key)
	setHead(r, idx, n)
	for p := idx; p != 0; p = s.ent(p).next {
		q := s.ent(p)
		rep := s.srcs[q.src].replica
		if c := entryCode(&q.refs); c > getCode(r, rep) {
			setCode(r, rep, c)
		}
	}
	s.keys.put(i, rv)
}

// unlinkRec removes entry idx from the record in key table slot i, updating
// its replica's tier code, and drops the record when one entry is left.
func (s *store) unlinkRec(i int, idx uint32) {
	v := s.keys.get(i)
	r := s.rec(v)
	rep := s.srcs[s.ent(idx).src].replica
	code := codeNone
	var prev uint32
	for p := uint32(r[1]); p != 0; {
		q := s.ent(p)
		next := q.next
		switch {
		case p == idx:
			if prev == 0 {
				r[1] = r[1]&^0xffffffff | uint64(next)
			} else {
				s.ent(prev).next = next
			}
		default:
			if s.srcs[q.src].replica == rep {
				code = max(code, entryCode(&q.refs))
			}
			prev = p
		}
		p = next
	}
	setCode(r, rep, code)
	n := uint32(r[1]>>32) - 1
	if n <= 1 {
		s.keys.put(i, uint32(r[1]))
		s.freeRecord(v)
		return
	}
	r[1] = r[1]&0xffffffff | uint64(n)<<32
}

// setRef sets entry idx's copy count on medium m to n, keeping its key's
// record (if any) up to date.
func (s *store) setRef(idx uint32, m int, n uint16) {
	e := s.ent(idx)
	old := entryCode(&e.refs)
	e.refs[m] = n
	c := entryCode(&e.refs)
	if c == old || s.recs == nil {
		return
	}
	v := s.keys.find(s, uint64(e.key))
	if v&recTag == 0 {
		return
	}
	r := s.rec(v)
	rep := s.srcs[e.src].replica
	if c > old {
		if c > getCode(r, rep) {
			setCode(r, rep, c)
		}
		return
	}
	code := codeNone
	for p := uint32(r[1]); p != 0; p = s.ent(p).next {
		q := s.ent(p)
		if s.srcs[q.src].replica == rep {
			code = max(code, entryCode(&q.refs))
		}
	}
	setCode(r, rep, code)
}
