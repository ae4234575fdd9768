package sim

import (
	"compress/gzip"
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/pd"
	"kvrouter/internal/workload"
)

// pathMiss counts one path's requests of an arrangement and which SLO they
// miss: TTFT, TPOT (the mean inter-token gap), or both.
type pathMiss struct{ n, ttft, tpot, both int }

func (m pathMiss) String() string {
	return fmt.Sprintf("%d (miss TTFT %d, TPOT %d, both %d)", m.n, m.ttft, m.tpot, m.both)
}

// pdOne runs one arrangement (conditional with decide, when not nil) and
// returns its run, which requests took the remote path and how many were
// served whole on a prefill replica.
func pdOne(t *testing.T, cfg Config, w *workload.Workload, arrangement string, decide func(*pd.Rule, pd.Inputs) pd.Verdict) (*report.Run, []bool, int) {
	t.Helper()
	cfg.Policies = []string{arrangement}
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	f, err := newFleet(cfg, arrangement, w, policySeed(cfg.Seed, cfg.Draw, arrangement))
	if err != nil {
		t.Fatal(err)
	}
	if f.pd != nil && decide != nil {
		rule := f.pd.rule
		f.pd.decide = func(in pd.Inputs) pd.Verdict { return decide(&rule, in) }
	}
	run, err := f.simulate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var remote []bool
	whole := 0
	if f.pd != nil {
		remote, whole = f.pd.remoteAt, f.pd.whole
	}
	return run, remote, whole
}

// attribute splits a run's requests by path and by the SLO each misses.
func attribute(run *report.Run, remoteAt []bool, slo report.SLO) (remote, local pathMiss) {
	for i := range run.Samples {
		s := &run.Samples[i]
		m := &local
		if remoteAt != nil && remoteAt[i] {
			m = &remote
		}
		m.n++
		missT, missI := s.Err != "" || s.TTFT() > slo.TTFT, s.Err != "" || s.TPOT() > slo.ITL
		switch {
		case missT && missI:
			m.both++
		case missT:
			m.ttft++
		case missI:
			m.tpot++
		}
	}
	return remote, local
}

// ruleBefore is the conditional rule as it was before the stall and the
// decode queue were costed per path (39592b7):
// saving = decode_queue + stall_weight x prefill - transfer, remote iff
// the prefill queue does not exceed it.
func ruleBefore(r *pd.Rule, in pd.Inputs) pd.Verdict {
	v := pd.Verdict{QueueSeconds: in.PrefillQueueSeconds}
	v.TransferSeconds = pd.TransferSeconds(in.UncachedTokens, r.Model.BytesPerToken(), r.Bandwidth())
	v.SavingSeconds = in.DecodeQueueSeconds + r.StallWeight*float64(in.UncachedTokens)/in.DecodePrefillRate - v.TransferSeconds
	v.Remote = in.UncachedTokens >= r.MinRemoteTokens && in.UncachedTokens > 0 && in.PrefillQueueSeconds <= v.SavingSeconds
	return v
}

// TestPDMatrix is the measurement of docs/results/2026-12-01-measurements.md (P/D, every
// link): aggregated, disaggregated, conditional before (two paths: the
// whole path off, whole_max_queue -1) and after (three paths), on
// identical arrivals, each summarized under the default and the tight SLO,
// with the requests of each conditional run split by path and SLO missed.
// KVROUTER_PD_MATRIX=long_prompt,mooncake selects the workloads;
// KVROUTER_PD_BEFORE=39592b7 measures the rule of 39592b7 (ruleBefore) as
// "before" instead.
func TestPDMatrix(t *testing.T) {
	sel := os.Getenv("KVROUTER_PD_MATRIX")
	if sel == "" {
		t.Skip("KVROUTER_PD_MATRIX not set (a measurement, minutes long)")
	}
	type wl struct {
		name     string
		w        *workload.Workload
		prefill  int
		scenario string
	}
	var wls []wl
	for _, name := range strings.Split(sel, ",") {
		o := ScenarioOptions{Replicas: 8, Seed: 1}
		prefill := 4
		switch name {
		case "long_prompt":
			o.Load, o.Requests, prefill = 0.5, 800, 6
		case "long_prompt_07":
			o.Load, o.Requests = 0.7, 800
		case "multi_turn":
			o.Requests = 1200
		case "mooncake":
			o.Requests, _ = strconv.Atoi(os.Getenv("KVROUTER_PD_REQUESTS"))
			fh, err := os.Open("../../testdata/mooncake/conversation_trace.jsonl.gz")
			if err != nil {
				t.Fatal(err)
			}
			gz, err := gzip.NewReader(fh)
			if err != nil {
				t.Fatal(err)
			}
			if o.Trace, err = workload.ReadTrace(gz); err != nil {
				t.Fatal(err)
			}
			fh.Close()
		default:
			t.Fatalf("unknown workload %q", name)
		}
		scn := strings.TrimSuffix(name, "_07")
		sc, err := BuildScenario(scn, o)
		if err != nil {
			t.Fatal(err)
		}
		wls = append(wls, wl{name: name, w: sc.Workload, prefill: prefill, scenario: scn})
	}
	slos := []report.SLO{{TTFT: DefaultSLOTTFT, ITL: DefaultSLOITL}, tightSLO}
	for _, x := range wls {
		type job struct {
			arr, link string
			decide    func(*pd.Rule, pd.Inputs) pd.Verdict
			label     string
		}
		jobs := []job{{ArrAggregated, "infiniband", nil, "aggregated"}}
		links := []string{"nvlink", "infiniband", "roce", "tcp"}
		if l := os.Getenv("KVROUTER_PD_LINKS"); l != "" {
			links = strings.Split(l, ",")
		}
		for _, link := range links {
			before := job{ArrConditional, link, nil, "cond-before"}
			if os.Getenv("KVROUTER_PD_BEFORE") == "39592b7" {
				before.decide = ruleBefore
			}
			jobs = append(jobs, job{ArrDisaggregated, link, nil, "disaggregated"}, before, job{ArrConditional, link, nil, "cond-after"})
		}
		type out struct {
			run    *report.Run
			remote []bool
			whole  int
		}
		res := make([]out, len(jobs))
		var wg sync.WaitGroup
		sem := make(chan struct{}, 2)
		for i, j := range jobs {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				cfg := Config{Replicas: 8, Seed: 1, PD: PDConfig{PrefillReplicas: x.prefill}}
				cfg.PD.Rule.Link = j.link
				if w, err := strconv.ParseFloat(os.Getenv("KVROUTER_PD_STALL"), 64); err == nil && j.decide == nil {
					cfg.PD.Rule.StallWeight = w
				}
				if n, err := strconv.Atoi(os.Getenv("KVROUTER_PD_MIN")); err == nil && j.decide == nil {
					cfg.PD.Rule.MinRemoteTokens = n
				}
				if j.label == "cond-before" {
					cfg.PD.Rule.WholeMaxQueue = -1
				} else if d, err := time.ParseDuration(os.Getenv("KVROUTER_PD_WHOLE")); err == nil {
					cfg.PD.Rule.WholeMaxQueue = d
				}
				res[i].run, res[i].remote, res[i].whole = pdOne(t, cfg, x.w, j.arr, j.decide)
			})
		}
		wg.Wait()
		for si, slo := range slos {
			agg := report.Summarize(res[0].run, slo)
			for li := range links {
				d := report.Summarize(res[1+3*li].run, slo)
				best := math.Max(agg.GoodputRPS, d.GoodputRPS)
				line := fmt.Sprintf("%s %d P slo#%d %s:", x.name, x.prefill, si, jobs[1+3*li].link)
				for k, r := range []report.PolicyResult{agg, d, report.Summarize(res[2+3*li].run, slo), report.Summarize(res[3+3*li].run, slo)} {
					line += fmt.Sprintf(" | %s %.0f/%.0f ms, %.2f ms, %.2f", []string{"agg", "dis", "before", "after"}[k], r.TTFT.P50, r.TTFT.P99, r.ITL.P99, r.GoodputRPS)
					if k >= 2 {
						line += fmt.Sprintf(" (%.1f%%)", 100*r.GoodputRPS/best)
					}
				}
				t.Log(line)
				for k := 2; k <= 3; k++ {
					rm, lc := attribute(res[k+3*li].run, res[k+3*li].remote, slo)
					t.Logf("    %s: remote %v; local or whole %v; whole %d", jobs[k+3*li].label, rm, lc, res[k+3*li].whole)
				}
			}
		}
	}
}
