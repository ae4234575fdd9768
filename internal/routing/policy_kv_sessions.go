package routing

import "sync"

// sessionMemory remembers, per conversation (Request.SessionKey), the name
// of the replica kv last sent it to: the replica holding the conversation's
// own history. It holds at most max conversations and forgets the oldest
// remembered first. Safe for concurrent use.
type sessionMemory struct {
	mu    sync.Mutex
	max   int
	last  map[string]string // session key -> replica name
	count map[string]int    // replica name -> sessions remembered there
	ring  []string          // keys in the order first remembered
	next  int               // ring slot to overwrite once full
}

func newSessionMemory(n int) *sessionMemory {
	if n <= 0 {
		return nil
	}
	return &sessionMemory{max: n, last: make(map[string]string, min(n, 1024)), count: map[string]int{}}
}

// replica returns the replica session was last sent to, "" when unknown.
func (s *sessionMemory) replica(session string) string {
	if s == nil || session == "" {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[session]
}

// remember records that session was sent to replica.
func (s *sessionMemory) remember(session, replica string) {
	if s == nil || session == "" || replica == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.last[session]; ok {
		s.move(old, replica)
		s.last[session] = replica
		return
	}
	if len(s.ring) < s.max {
		s.ring = append(s.ring, session)
	} else {
		gone := s.ring[s.next]
		s.move(s.last[gone], "")
		delete(s.last, gone)
		s.ring[s.next] = session
		s.next = (s.next + 1) % s.max
	}
	s.move("", replica)
	s.last[session] = replica
}

// move moves one session's count from replica from to replica to ("":
// none). Called with mu held.
func (s *sessionMemory) move(from, to string) {
	if from != "" {
		if s.count[from]--; s.count[from] <= 0 {
			delete(s.count, from)
		}
	}
	if to != "" {
		s.count[to]++
	}
}

// sessions returns how many remembered sessions each candidate last went
// to, into dst (len(cands)).
func (s *sessionMemory) sessions(cands []Candidate, dst []int) []int {
	dst = dst[:0]
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range cands {
		dst = append(dst, s.count[cands[i].Name])
	}
	return dst
}
