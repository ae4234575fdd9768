package frontmetrics

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Both fronts' views write one family per metric, told apart by the front
// label; deleting a replica's series through one view leaves the other's.
func TestFrontsShareFamilies(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	h, e := s.Front(HTTP), s.Front(EPP)
	h.Requests.WithLabelValues("m", "r1", OutcomeOK).Inc()
	e.Requests.WithLabelValues("m", "r1", OutcomeOK).Add(2)
	e.Requests.WithLabelValues("m", "", OutcomeShed).Inc()
	h.InFlight.WithLabelValues("r1").Inc()
	e.InFlight.WithLabelValues("r1").Set(3)
	for _, f := range []*Front{h, e} {
		for _, o := range []prometheus.ObserverVec{f.Decision, f.PromptTokens, f.CachedTokens, f.TTFT, f.ITL, f.Tokenize} {
			o.WithLabelValues("m").Observe(1)
		}
		f.TokenizeErrors.WithLabelValues("m").Inc()
		f.TokenizerUnavailable.WithLabelValues("m").Inc()
	}
	want := `
# HELP kvrouter_proxy_in_flight_requests Requests open on each replica, by front.
# TYPE kvrouter_proxy_in_flight_requests gauge
kvrouter_proxy_in_flight_requests{front="epp",replica="r1"} 3
kvrouter_proxy_in_flight_requests{front="http",replica="r1"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouter_proxy_in_flight_requests"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(s.requests); n != 3 {
		t.Errorf("%d request series, want 3", n)
	}
	if v := testutil.ToFloat64(s.requests.WithLabelValues(EPP, "m", "r1", OutcomeOK)); v != 2 {
		t.Errorf("epp ok %v, want 2", v)
	}
	for _, name := range []string{"kvrouter_proxy_decision_duration_seconds", "kvrouter_proxy_prompt_tokens",
		"kvrouter_proxy_predicted_cached_tokens", "kvrouter_proxy_time_to_first_token_seconds", "kvrouter_proxy_inter_token_latency_seconds",
		"kvrouter_proxy_tokenize_duration_seconds", "kvrouter_proxy_tokenize_errors_total", "kvrouter_proxy_tokenizer_unavailable_total"} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 2 {
			t.Errorf("%s: %d series (%v), want one per front", name, n, err)
		}
	}

	h.DeleteReplica("r1")
	if v := testutil.ToFloat64(s.requests.WithLabelValues(HTTP, "m", "r1", OutcomeOK)); v != 0 {
		t.Errorf("http ok %v after deleting http's r1: the series is still there", v)
	}
	if v := testutil.ToFloat64(s.requests.WithLabelValues(EPP, "m", "r1", OutcomeOK)); v != 2 {
		t.Errorf("epp ok %v after deleting http's r1, want 2", v)
	}
	if n := testutil.CollectAndCount(s.inFlight); n != 1 {
		t.Errorf("%d in-flight series after deleting http's r1, want epp's only", n)
	}
}

// One Set per registry: a second fails with every name, so a process
// running both fronts must hand one Set to both.
func TestSecondSetOnOneRegistryFails(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(reg); err != nil {
		t.Fatal(err)
	}
	_, err := New(reg)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Fatalf("second Set: %v, want AlreadyRegisteredError", err)
	}
	if _, err := New(nil); err != nil {
		t.Errorf("unregistered Set: %v", err)
	}
}

// Every outcome constant is listed once.
func TestOutcomes(t *testing.T) {
	seen := map[string]bool{}
	for _, o := range Outcomes() {
		if seen[o] || o == "" {
			t.Errorf("outcome %q listed twice or empty", o)
		}
		seen[o] = true
	}
	if len(seen) != 11 {
		t.Errorf("%d outcomes, want 11", len(seen))
	}
}
