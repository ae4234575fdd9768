package group

// Index trust. The exact index believes what an engine's KV events say,
// and anyone who can publish on (or connect to) an event port can say
// anything: a forged BlockStored for a prompt the engine never saw makes it
// the cheapest replica for that prompt. Every answer that reports the
// engine's prefix-cache hit (usage.prompt_tokens_details.cached_tokens) is
// compared with what the index said the chosen engine holds
// (Decision.IndexCachedTokens, as the engine would count them). An answer
// is a miss when the engine reported less than half the predicted hit (and
// at least missSlack tokens less); trustMisses misses in a row, with no
// agreeing answer in between, make the router stop trusting that engine's
// index entries (IndexTruster: it competes by load alone) until
// trustAgrees answers in a row agree again. Answers for which the index
// predicted nothing say nothing either way. This also catches index drift
// of any other cause (lost events the sequence checks missed, a block hash
// mismatch).

// Streaks that change an engine's trust.
const (
	// trustMisses is the number of misses in a row that distrust an engine.
	trustMisses = 3
	// trustAgrees is the number of agreeing answers in a row that trust a
	// distrusted engine again.
	trustAgrees = 3
	// missSlack is the over-prediction, in tokens, below which an answer
	// is never a miss (a block of 16 tokens evicted between the lookup and
	// the engine's schedule).
	missSlack = 16
)

// IndexTruster is a Router whose index trust can be switched per engine
// (Backend).
type IndexTruster interface {
	SetIndexTrusted(replica string, ok bool)
}

// TrustChange is what one answer did to an engine's trust.
type TrustChange int

// The changes Trust.Observe reports.
const (
	// TrustKept: the engine's trust is unchanged.
	TrustKept TrustChange = iota
	// TrustLost: the engine's index entries are no longer trusted.
	TrustLost
	// TrustRegained: they are trusted again.
	TrustRegained
)

// Trust keeps each engine's streaks of answers that miss or agree with the
// index's prediction, and whether its index entries are trusted. The zero
// value is ready. It is not safe for concurrent use: its owner serializes
// calls (the HTTP front holds a mutex that also covers its metrics).
type Trust struct {
	reps map[string]*trustState
}

type trustState struct {
	misses, agrees int
	distrusted     bool
}

// Observe records one answer of replica whose index prediction was
// predicted tokens and whose engine reported reported tokens cached. When
// the streak changes the engine's trust it calls it.SetIndexTrusted and
// reports the change; with a nil it (a router without an index) the
// streaks are kept but the trust never changes. streak is the length of the
// current run of misses (TrustLost) or agreements (TrustRegained).
func (t *Trust) Observe(it IndexTruster, replica string, predicted, reported int) (change TrustChange, streak int) {
	if predicted == 0 {
		return TrustKept, 0
	}
	if t.reps == nil {
		t.reps = map[string]*trustState{}
	}
	st := t.reps[replica]
	if st == nil {
		st = &trustState{}
		t.reps[replica] = st
	}
	miss := predicted-reported >= missSlack && reported < predicted/2
	if miss {
		st.misses, st.agrees = st.misses+1, 0
	} else {
		st.misses, st.agrees = 0, st.agrees+1
	}
	switch {
	case it == nil:
	case !st.distrusted && st.misses >= trustMisses:
		st.distrusted = true
		it.SetIndexTrusted(replica, false)
		return TrustLost, st.misses
	case st.distrusted && st.agrees >= trustAgrees:
		st.distrusted = false
		it.SetIndexTrusted(replica, true)
		return TrustRegained, st.agrees
	}
	return TrustKept, 0
}

// Forget drops replica's streaks (the engine left the fleet).
func (t *Trust) Forget(replica string) { delete(t.reps, replica) }
