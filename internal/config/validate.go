package config

import (
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"kvrouter/internal/routing"
)

// validateNumbers checks the sign and range of every number of the
// top-level, health and per-model settings that the packages below would
// otherwise clamp or misuse silently (a negative weight taken as 0, an
// absurd index size failing late). Zero always means the default. Negative
// durations are accepted only where a field documents them (probe and
// scrape intervals, credit_decay, predict_ttl: off).
func (c *Config) validateNumbers() []error {
	var errs []error
	add := func(msg string, path ...any) { errs = append(errs, ferr(msg, path...)) }
	if c.DrainTimeout < 0 {
		add("must not be negative", "drain_timeout")
	}
	h := c.Health
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"probe_timeout", h.ProbeTimeout}, {"backoff_base", h.BackoffBase}, {"backoff_max", h.BackoffMax}} {
		if d.v < 0 {
			add("must not be negative", "health", d.name)
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"eject_after_server_errors", h.EjectAfterServerErrors}, {"eject_after_backpressure", h.EjectAfterBackpressure}, {"eject_after_probe_timeouts", h.EjectAfterProbeTimeouts}} {
		if n.v < 0 {
			add("must not be negative", "health", n.name)
		}
	}
	if h.PanicThreshold > 1 || math.IsNaN(h.PanicThreshold) {
		add(fmt.Sprintf("%v: want a share in [0, 1] (negative: off)", h.PanicThreshold), "health", "panic_threshold")
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		add("cert_file and key_file go together", "tls")
	}
	if h.BackoffBase > 0 && h.BackoffMax > 0 && h.BackoffMax < h.BackoffBase {
		add(fmt.Sprintf("%v is less than backoff_base %v", h.BackoffMax, h.BackoffBase), "health", "backoff_max")
	}
	for i := range c.Models {
		errs = append(errs, validateModelNumbers(&c.Models[i], i)...)
	}
	return errs
}

func validateModelNumbers(m *Model, i int) []error {
	var errs []error
	add := func(msg string, path ...any) {
		errs = append(errs, ferr(msg, append([]any{"models", i}, path...)...))
	}
	if m.Retries < 0 {
		add(fmt.Sprintf("%d: must be >= -1 (-1: no retry)", m.Retries), "retries")
	}
	if m.TokenizerPrefixCacheBytes < -1 {
		add(fmt.Sprintf("%d: must be >= -1 (0: 64 MiB, -1: off)", m.TokenizerPrefixCacheBytes), "tokenizer_prefix_cache_bytes")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"connect", m.Timeouts.Connect}, {"first_byte", m.Timeouts.FirstByte}, {"idle", m.Timeouts.Idle}} {
		if d.v < 0 {
			add("must not be negative", "timeouts", d.name)
		}
	}

	r := m.Routing
	nonNeg := func(v float64, path ...any) {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			add(fmt.Sprintf("%v: must be a finite number >= 0 (0: default)", v), append([]any{"routing"}, path...)...)
		}
	}
	nonNeg(r.PrefillRate, "prefill_rate")
	nonNeg(r.DecodeRate, "decode_rate")
	nonNeg(r.KV.GPUWeight, "kv", "gpu_weight")
	nonNeg(r.KV.CPUWeight, "kv", "cpu_weight")
	nonNeg(r.KV.StorageWeight, "kv", "storage_weight")
	nonNeg(r.KV.PredictedWeight, "kv", "predicted_weight")
	nonNeg(r.KV.DecodeWeight, "kv", "decode_weight")
	nonNeg(r.Dynamo.OverlapWeight, "dynamo", "overlap_weight")
	nonNeg(r.LLMD.QueueWeight, "llmd", "queue_weight")
	nonNeg(r.LLMD.KVUsageWeight, "llmd", "kv_usage_weight")
	nonNeg(r.LLMD.PrefixWeight, "llmd", "prefix_weight")
	nonNeg(r.SGLang.CacheThreshold, "sglang", "cache_threshold")
	if r.SGLang.CacheThreshold > 1 {
		add(fmt.Sprintf("%v: must be in [0, 1] (a prefix match rate)", r.SGLang.CacheThreshold), "routing", "sglang", "cache_threshold")
	}
	nonNeg(r.SGLang.BalanceRelThreshold, "sglang", "balance_rel_threshold")
	if v := r.SGLang.BalanceRelThreshold; v > 0 && v < 1 {
		add(fmt.Sprintf("%v: must be >= 1 (max load > threshold x min load)", v), "routing", "sglang", "balance_rel_threshold")
	}
	for _, n := range []struct {
		path []any
		v    int
	}{
		{[]any{"default_max_tokens"}, r.DefaultMaxTokens},
		{[]any{"sglang", "balance_abs_threshold"}, r.SGLang.BalanceAbsThreshold},
		{[]any{"prefix_chars", "chunk_size"}, r.PrefixChars.ChunkSize},
		{[]any{"prefix_chars", "max_nodes"}, r.PrefixChars.MaxNodes},
	} {
		if n.v < 0 {
			add(fmt.Sprintf("%d: must be >= 0 (0: default)", n.v), append([]any{"routing"}, n.path...)...)
		}
	}
	for _, d := range []struct {
		path []any
		v    time.Duration
	}{{[]any{"gauge_max_age"}, r.GaugeMaxAge}, {[]any{"kv", "waiting_penalty"}, r.KV.WaitingPenalty}} {
		if d.v < 0 {
			add(fmt.Sprintf("%v: must not be negative", d.v), append([]any{"routing"}, d.path...)...)
		}
	}
	if fb := r.SessionFallback; fb != "" && (fb == "session" || !slices.Contains(routing.Policies(), fb)) {
		add(fmt.Sprintf("%q: want a policy other than session (%s)", fb, strings.Join(routing.Policies(), ", ")), "routing", "session_fallback")
	}

	ix := m.Index
	for _, n := range []struct {
		name string
		v    int
		max  int
	}{
		{"max_entries", ix.MaxEntries, 1 << 30},
		{"max_predicted", ix.MaxPredicted, 1 << 31},
		{"approx_capacity", ix.ApproxCapacity, 1 << 30},
	} {
		if n.v < 0 || n.v > n.max {
			add(fmt.Sprintf("%d: must be in 0..%d (0: default)", n.v, n.max), "index", n.name)
		}
	}
	if ix.ApproxTTL < 0 {
		add(fmt.Sprintf("%v: must not be negative", ix.ApproxTTL), "index", "approx_ttl")
	}
	return errs
}

// checkZMQEndpoint checks a ZeroMQ endpoint kvrouter connects to (bind
// false) or binds (bind true): tcp://host:port (port 1..65535, leaving room
// for dpSize-1 more ranks on the following ports; host "*" only to bind) or
// ipc://path.
func checkZMQEndpoint(v string, dpSize int, bind bool) string {
	scheme, rest, ok := strings.Cut(v, "://")
	if !ok {
		return fmt.Sprintf("%q: want a ZeroMQ address such as tcp://host:port or ipc:///path", v)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		switch {
		case bind && (err != nil || host == ""):
			return fmt.Sprintf("%q: want tcp://host:port to bind (e.g. tcp://127.0.0.1:5557 or tcp://*:5557)", v)
		case !bind && (err != nil || host == "" || host == "*"):
			return fmt.Sprintf("%q: want tcp://host:port (the engine's address, not a bind wildcard; events_bind: true binds it)", v)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return fmt.Sprintf("%q: port must be a number in 1..65535", v)
		}
		if dpSize > 1 && p+dpSize-1 > 65535 {
			return fmt.Sprintf("%q: dp_size %d needs ports up to %d", v, dpSize, p+dpSize-1)
		}
	case "ipc":
		if rest == "" {
			return fmt.Sprintf("%q: want ipc:///path", v)
		}
		if dpSize > 1 {
			return fmt.Sprintf("%q: dp_size > 1 needs tcp:// (rank r publishes on port+r)", v)
		}
	default:
		return fmt.Sprintf("%q: unsupported transport %q: want tcp://host:port or ipc:///path", v, scheme)
	}
	return ""
}

// bindSet records the events addresses kvrouter binds (events_bind), to
// reject two engines on one address: a tcp port (one per data-parallel
// rank) is taken per host, a wildcard host ("*", 0.0.0.0, ::) taking it on
// every host; an ipc path once.
type bindSet struct {
	tcp map[int][]bound // port -> binds on it
	ipc map[string]string
}

type bound struct{ host, field string }

func wildcardHost(h string) bool { return h == "*" || h == "0.0.0.0" || h == "::" }

// add records v (dpSize ranks) for field and returns the field that
// already holds one of its addresses, or "" (also for an address
// checkZMQEndpoint rejects).
func (b *bindSet) add(v string, dpSize int, field string) string {
	scheme, rest, _ := strings.Cut(v, "://")
	switch scheme {
	case "ipc":
		if prev, ok := b.ipc[rest]; ok {
			return prev
		}
		if b.ipc == nil {
			b.ipc = map[string]string{}
		}
		b.ipc[rest] = field
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		p, perr := strconv.Atoi(port)
		if err != nil || perr != nil {
			return ""
		}
		for r := range max(dpSize, 1) {
			for _, o := range b.tcp[p+r] {
				if o.host == host || wildcardHost(o.host) || wildcardHost(host) {
					return o.field
				}
			}
		}
		if b.tcp == nil {
			b.tcp = map[int][]bound{}
		}
		for r := range max(dpSize, 1) {
			b.tcp[p+r] = append(b.tcp[p+r], bound{host, field})
		}
	}
	return ""
}

// portsOverlap reports, as an error message, an engine whose events and
// replay endpoints would be bound on the same address: vLLM's data-parallel
// rank r binds both at port+r (with events_bind the router binds the events
// ones, on the same host when the engine is local), so e.g. events 5557 and
// replay 5558 with dp_size 2 put rank 1's events on rank 0's replay port.
// Hosts match when equal (case-insensitive, localhost as 127.0.0.1) or
// either is a wildcard; ipc paths when equal. "" when they do not overlap.
func portsOverlap(events, replay string, dpSize int) string {
	if p, ok := strings.CutPrefix(events, "ipc://"); ok && replay == "ipc://"+p {
		return fmt.Sprintf("%q: the same ipc path as events", replay)
	}
	ep, eh, ok1 := tcpPort(events)
	rp, rh, ok2 := tcpPort(replay)
	n := max(dpSize, 1)
	if !ok1 || !ok2 || !sameHost(eh, rh) || ep+n <= rp || rp+n <= ep {
		return ""
	}
	return fmt.Sprintf("%q: ports %d..%d overlap the events ports %d..%d (rank r binds both at port+r; keep the base ports at least dp_size apart)",
		replay, rp, rp+n-1, ep, ep+n-1)
}

// sameHost reports whether two endpoint hosts may name one machine's
// address: equal ignoring case, localhost taken as 127.0.0.1, or either a
// wildcard.
func sameHost(a, b string) bool {
	norm := func(h string) string {
		h = strings.ToLower(h)
		if h == "localhost" {
			return "127.0.0.1"
		}
		return h
	}
	return norm(a) == norm(b) || wildcardHost(a) || wildcardHost(b)
}

// tcpPort splits a tcp:// endpoint into port and host.
func tcpPort(v string) (port int, host string, ok bool) {
	rest, found := strings.CutPrefix(v, "tcp://")
	if !found {
		return 0, "", false
	}
	host, ps, err := net.SplitHostPort(rest)
	if err != nil {
		return 0, "", false
	}
	p, err := strconv.Atoi(ps)
	return p, host, err == nil
}
