package sim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/pd"
	"kvrouter/internal/routing"
)

// Arrangements of a P/D comparison (Config.PD): the same GPUs serving the
// same arrivals three ways, all routed by the kv policy.
const (
	// ArrAggregated: every replica prefills and decodes its requests.
	ArrAggregated = "aggregated"
	// ArrDisaggregated: PD.PrefillReplicas replicas only prefill (max_tokens
	// 1), the others only decode, pulling the KV over PD.Rule's link
	// (pd.ModeAlways).
	ArrDisaggregated = "disaggregated"
	// ArrConditional: the same pools; per request, pd.Rule decides whether
	// the decode replica prefills itself (pd.ModeConditional).
	ArrConditional = "conditional"
)

// Arrangements lists the P/D arrangements, in report order.
func Arrangements() []string { return []string{ArrAggregated, ArrDisaggregated, ArrConditional} }

// PDConfig turns a run into a comparison of P/D arrangements.
type PDConfig struct {
	// PrefillReplicas is how many of Config.Replicas are prefill engines in
	// the disaggregated and conditional arrangements (0: no P/D run); at
	// least one replica is left to decode.
	PrefillReplicas int
	// Rule is the disaggregation rule: link, thresholds and the model's KV
	// shape (its Mode is set by the arrangement).
	Rule pd.Rule
}

// pdState is one fleet's P/D set-up: replicas 0..prefill-1 prefill, the
// rest decode.
type pdState struct {
	rule          pd.Rule
	prefill       int
	prefillNames  []string
	decodeNames   []string
	remote, local int // requests by path, for the run's note
	whole         int // requests served whole on a prefill replica
	// remoteAt marks the requests (by workload index) that took the remote
	// path, for attribution by path.
	remoteAt        []bool
	bytesPerToken   float64
	bandwidth       float64
	pendingTransfer []xfer
	// decide is the conditional rule (rule.Decide; tests replace it to
	// measure another rule on the same arrivals).
	decide func(pd.Inputs) pd.Verdict
}

// xfer is a KV pull under way: its request and replica.
type xfer struct {
	id  string
	rep int
}

// prefillLeg marks an in-flight prefill leg; its decode leg has the
// request's own ID.
const prefillPrefix = "prefill/"

// validatePD checks cfg.PD (after the other defaults).
func (cfg *Config) validatePD() []error {
	if cfg.PD.PrefillReplicas == 0 {
		return nil
	}
	var errs []error
	if cfg.PD.PrefillReplicas < 0 || cfg.PD.PrefillReplicas >= cfg.Replicas {
		errs = append(errs, fmt.Errorf("pd prefill replicas %d: want 1..%d (at least one decode replica)", cfg.PD.PrefillReplicas, cfg.Replicas-1))
	}
	if len(cfg.Scale) > 0 {
		// A scale event names no pool, and the split is what a P/D run
		// compares: compare --pd-prefill values instead.
		errs = append(errs, errors.New("pd: scaling is not simulated with prefill and decode pools (a scale event names no pool, and the split is what the run compares: run each --pd-prefill value instead)"))
	}
	for _, p := range cfg.Policies {
		if !slices.Contains(Arrangements(), p) {
			errs = append(errs, fmt.Errorf("pd: %q is no arrangement (known: %v)", p, Arrangements()))
		}
	}
	rule, err := cfg.PD.Rule.WithDefaults()
	if err != nil {
		errs = append(errs, fmt.Errorf("pd: %w", err))
	}
	cfg.PD.Rule = rule
	return errs
}

// newPDState returns the fleet's P/D state for arrangement, nil for
// aggregated serving.
func newPDState(cfg *Config, arrangement string) *pdState {
	if cfg.PD.PrefillReplicas == 0 || arrangement == ArrAggregated {
		return nil
	}
	rule := cfg.PD.Rule
	rule.Mode = pd.ModeAlways
	if arrangement == ArrConditional {
		rule.Mode = pd.ModeConditional
	}
	s := &pdState{rule: rule, prefill: cfg.PD.PrefillReplicas, bytesPerToken: rule.Model.BytesPerToken(), bandwidth: rule.Bandwidth()}
	s.decide = s.rule.Decide
	for i := range cfg.Replicas {
		name := fmt.Sprintf("r%02d", i)
		if i < s.prefill {
			s.prefillNames = append(s.prefillNames, name)
		} else {
			s.decodeNames = append(s.decodeNames, name)
		}
	}
	return s
}

// routingPolicy is the routing policy of a run named policy.
func routingPolicy(policy string) string {
	if slices.Contains(Arrangements(), policy) {
		return "kv"
	}
	return policy
}

// arrivePD routes request i of a P/D fleet: the rule's path, then either a
// local request on a decode replica or a prefill leg on a prefill replica.
func (f *fleet) arrivePD(i int) error {
	r := &f.w.Requests[i]
	f.toks = r.AppendTokens(f.toks[:0])
	out := max(r.OutputTokens, 1)
	s := &f.run.Samples[i]
	*s = report.Sample{ID: r.ID, Arrival: f.now, End: f.now, PromptTokens: len(f.toks)}
	if err := f.syncIndex(); err != nil {
		return err
	}
	p := f.pd
	remote, whole := p.rule.Mode == pd.ModeAlways, false
	if !remote {
		dd, err := f.router.Evaluate(&routing.Request{ID: r.ID, Tokens: f.toks, MaxTokens: out, Exclude: p.prefillNames}, nil)
		pp, err2 := f.router.Evaluate(&routing.Request{ID: r.ID, Tokens: f.toks, MaxTokens: 1, Exclude: p.decodeNames}, nil)
		if err == nil && err2 == nil {
			bs := f.blockSize()
			cached := min(dd.Chosen().CachedBlocks*bs, (len(f.toks)-1)/bs*bs)
			in := pd.Inputs{UncachedTokens: max(len(f.toks)-cached, 0), DecodePrefillRate: f.cfg.prefillRate()}
			if l, ok := f.router.Load(pp.Name); ok && l.PrefillRate > 0 {
				in.PrefillQueueSeconds = float64(l.QueuedPrefill) / l.PrefillRate
				in.PrefillPrefillRate = l.PrefillRate
				in.PrefillInFlight = int(l.InFlight)
			}
			if l, ok := f.router.Load(dd.Name); ok && l.PrefillRate > 0 {
				in.DecodeQueueSeconds = float64(l.QueuedPrefill) / l.PrefillRate
				in.DecodeInFlight = int(l.InFlight)
			}
			v := p.decide(in)
			remote, whole = v.Remote, v.Whole
		}
	}
	id, exclude, maxTokens := r.ID, p.prefillNames, out
	switch {
	case remote:
		p.remote++
		p.remoteAt[i] = true
		id, exclude, maxTokens = prefillPrefix+r.ID, p.decodeNames, 1
	case whole:
		// the whole request on a prefill replica: its core prefills and
		// decodes it, no transfer
		p.whole++
		exclude = p.decodeNames
	default:
		p.local++
	}
	d, lease, err := f.router.Route(&routing.Request{ID: id, Tokens: f.toks, MaxTokens: maxTokens, Exclude: exclude})
	if err != nil {
		s.Err = "no_replica"
		return nil
	}
	rep := f.byName[d.Name]
	if !remote {
		s.Replica = d.Name
	}
	f.submit(i, rep, lease, &enginesim.Request{ID: id, Tokens: f.toks, MaxTokens: maxTokens, ReportHits: f.ix != nil}, remote)
	return nil
}

// submit gives a request (or leg) to replica rep's core; a rejection is
// the sample's error.
func (f *fleet) submit(i, rep int, lease *routing.Lease, req *enginesim.Request, prefillLeg bool) {
	s := &f.run.Samples[i]
	if err := f.reps[rep].core.Submit(req); err != nil {
		s.Err = "rejected"
		if !errors.Is(err, enginesim.ErrInvalidRequest) {
			s.Err = "duplicate"
		}
		if lease != nil {
			lease.Release()
		}
		return
	}
	f.live[req.ID] = &inflight{sample: i, rep: rep, lease: lease, prefillLeg: prefillLeg, remote: req.RemoteKV}
	f.reps[rep].load++
	f.kick(rep)
}

// prefillOutput takes a prefill leg's output: when it is the last, the leg
// ends and its decode leg goes to the decode replica with the least decode
// load (routed without tokens, as the proxy does); the decode leg's first
// token is the request's.
func (f *fleet) prefillOutput(fl *inflight, o *enginesim.Output, rep int) {
	if !o.Finished {
		return
	}
	if fl.lease != nil {
		fl.lease.Release()
	}
	f.reps[rep].load--
	delete(f.live, o.ID)
	i := fl.sample
	r := &f.w.Requests[i]
	s := &f.run.Samples[i]
	s.CachedTokens = o.CachedTokens // the prefill engine's hit is the request's
	f.toks = r.AppendTokens(f.toks[:0])
	out := max(r.OutputTokens, 1)
	d, lease, err := f.router.Route(&routing.Request{ID: r.ID, MaxTokens: out, Exclude: f.pd.prefillNames})
	if err != nil {
		s.Err = "no_replica"
		return
	}
	s.Replica = d.Name
	f.submit(i, f.byName[d.Name], lease, &enginesim.Request{ID: r.ID, Tokens: f.toks, MaxTokens: out, ReportHits: f.ix != nil, RemoteKV: true}, false)
}

// startTransfers schedules the end of each KV pull a step started: the
// uncached tokens over the link, from the step's start.
func (f *fleet) startTransfers(rep int, ts []enginesim.Transfer) {
	for _, t := range ts {
		var secs float64
		if f.pd != nil {
			secs = pd.TransferSeconds(t.Tokens, f.pd.bytesPerToken, f.pd.bandwidth)
		}
		slot := len(f.pd.pendingTransfer)
		f.pd.pendingTransfer = append(f.pd.pendingTransfer, xfer{id: t.ID, rep: rep})
		f.q.push(event{at: f.now + time.Duration(secs*float64(time.Second)), kind: evTransfer, rep: rep, i: slot})
	}
}

// transferDone ends a KV pull: the request runs on its decode replica.
func (f *fleet) transferDone(slot int) {
	x := f.pd.pendingTransfer[slot]
	f.pd.pendingTransfer[slot] = xfer{}
	f.reps[x.rep].core.Received(x.id)
	f.kick(x.rep)
}

// PDVerdict states, for the rows of a P/D comparison, which arrangement
// has the most goodput and whether conditional disaggregation is within 5%
// of the better of aggregated and disaggregated (its design goal); "" when
// the rows are not the three arrangements.
func PDVerdict(rows []report.PolicyResult) string {
	by := map[string]report.PolicyResult{}
	for _, r := range rows {
		by[r.Name] = r
	}
	a, okA := by[ArrAggregated]
	d, okD := by[ArrDisaggregated]
	c, okC := by[ArrConditional]
	if !okA || !okD || !okC {
		return ""
	}
	best, name := a.GoodputRPS, ArrAggregated
	if d.GoodputRPS > best {
		best, name = d.GoodputRPS, ArrDisaggregated
	}
	ratio := 1.0
	if best > 0 {
		ratio = c.GoodputRPS / best
	}
	ok := "within"
	if ratio < 0.95 {
		ok = "NOT within"
	}
	return fmt.Sprintf("P/D verdict: %s leads aggregated/disaggregated on goodput (%.2f req/s); conditional %.2f req/s = %.1f%% of it, %s 5%%.",
		name, best, c.GoodputRPS, 100*ratio, ok)
}
