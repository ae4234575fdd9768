package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// rollRecord is one client request of the rolling replacement.
type rollRecord struct {
	start, end time.Time
	stream     bool
	replica    string
	err        string // "" when the request succeeded whole
}

// rollTraffic runs concurrent clients against a router until stopped.
type rollTraffic struct {
	url    string
	client *http.Client
	stop   chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex
	records []rollRecord
	open    map[string]int // requests whose answer named the replica and are not finished
}

func (tr *rollTraffic) start(streams, plain int) {
	// Each client holds conversations of its own, a new one every 10
	// requests, so that the fleet's cache is spread over the engines and
	// new conversations can land on new engines (one system prompt shared
	// by every client would, under kv's affinity, stay on its holder).
	for c := range streams + plain {
		stream := c < streams
		tr.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-tr.stop:
					return
				default:
				}
				system := fmt.Sprintf("Conversation %d of client %d. ", i/10, c) + strings.Repeat("You are a careful assistant for a fleet of vLLM replicas. ", 20)
				body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 8, "stream": stream,
					"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": fmt.Sprintf("client %d question %d", c, i%5)}}})
				tr.one(stream, body)
			}
		})
	}
}

func (tr *rollTraffic) one(stream bool, body []byte) {
	rec := rollRecord{start: time.Now(), stream: stream}
	defer func() {
		rec.end = time.Now()
		tr.mu.Lock()
		if rec.replica != "" {
			tr.open[rec.replica]--
		}
		tr.records = append(tr.records, rec)
		tr.mu.Unlock()
	}()
	resp, err := tr.client.Post(tr.url+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		rec.err = err.Error()
		return
	}
	defer resp.Body.Close()
	if r := resp.Header.Get("X-Kvrouter-Replica"); r != "" {
		rec.replica = r
		tr.mu.Lock()
		tr.open[r]++
		tr.mu.Unlock()
	}
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		rec.err = "reading: " + err.Error()
	case resp.StatusCode != 200:
		rec.err = fmt.Sprintf("status %d: %s", resp.StatusCode, b)
	case stream && (!strings.HasSuffix(string(b), "data: [DONE]\n\n") || strings.Contains(string(b), `"error"`)):
		rec.err = "stream not whole: " + string(b)
	case !stream && !strings.Contains(string(b), `"choices"`):
		rec.err = "no choices: " + string(b)
	}
}

// firstTo returns when the first request answered by replica started.
func (tr *rollTraffic) firstTo(replica string) (time.Time, bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var first time.Time
	for _, r := range tr.records {
		if r.replica == replica && (first.IsZero() || r.start.Before(first)) {
			first = r.start
		}
	}
	return first, !first.IsZero()
}

// served counts the requests replica answered.
func (tr *rollTraffic) served(replica string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, r := range tr.records {
		if r.replica == replica {
			n++
		}
	}
	return n
}

func (tr *rollTraffic) openOn(replica string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.open[replica]
}

// TestE2ERollingReplacement replaces every engine of a group, one at a
// time, through router.yaml reloads (real SIGHUP to a kvrouter serve
// process) under continuous streaming and non-streaming traffic: each
// step adds a new engine-sim process, then removes an old one and stops
// it once its requests have finished. No client request may fail; the
// new engines get traffic; a removed engine leaves no series (index,
// proxy, fleet, events) and the index forgets its entries; in-flight
// counters end at zero.
func TestE2ERollingReplacement(t *testing.T) {
	bin := e2eBuild(t)
	const n = 3
	old := make([]*e2eSim, n)
	for i := range old {
		old[i] = startE2ESimProcess(t, bin)
	}
	tokDir, err := filepath.Abs(e2eQwen3Dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "router.yaml")
	type member struct {
		name string
		sim  *e2eSim
	}
	write := func(ms []member) {
		t.Helper()
		var b strings.Builder
		fmt.Fprintf(&b, "health: {probe_interval: 100ms, scrape_interval: 200ms}\nmodels:\n  - name: m\n    tokenizer: %q\n    engines:\n", tokDir)
		for _, m := range ms {
			fmt.Fprintf(&b, "      - {name: %s, url: %q, events: %q, replay: %q}\n", m.name, m.sim.url, m.sim.events, m.sim.replay)
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	var fleet []member
	for i, s := range old {
		fleet = append(fleet, member{fmt.Sprintf("old%d", i), s})
	}
	write(fleet)

	port := e2eFreePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	logs := &syncLog{}
	cmd := exec.Command(bin, "serve", "--config", path, "--config-poll", "0", "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("router log:\n%s", logs)
		}
	})
	r := &e2eRouter{t: t, url: url, client: &http.Client{Timeout: 10 * time.Second}}
	defer r.client.CloseIdleConnections()
	e2eEventually(t, 60*time.Second, "router ready with every event stream", func() bool {
		resp, err := r.client.Get(url + "/ready?full=1")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	tr := &rollTraffic{url: url, client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}},
		stop: make(chan struct{}), open: map[string]int{}}
	defer tr.client.CloseIdleConnections()
	began := time.Now()
	tr.start(4, 4)
	stopTraffic := sync.OnceFunc(func() { close(tr.stop); tr.wg.Wait() })
	t.Cleanup(stopTraffic) // a failed check must not leave the clients running
	// Every old engine holds some cache before the replacement starts.
	waitServed := func(what string, ms []member) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			per, all := map[string]int{}, true
			for _, m := range ms {
				per[m.name] = tr.served(m.name)
				all = all && per[m.name] > 0
			}
			if all {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30 s; requests answered per engine: %v", what, per)
			}
		}
	}
	waitServed("every old engine answered a request", fleet)
	hup := func() time.Time {
		t.Helper()
		at := time.Now()
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		return at
	}
	var addAdmit, addFirst, removeGone []time.Duration
	hupAt := map[string]time.Time{}
	for i := range n {
		nw := member{fmt.Sprintf("new%d", i), startE2ESimProcess(t, bin)}
		fleet = append(fleet, nw)
		write(fleet)
		at := hup()
		e2eEventually(t, 10*time.Second, nw.name+" admitted and up", func() bool {
			return e2eMetric(t, url, "kvrouter_fleet_endpoint_up", `endpoint="`+nw.name+`"`) == 1 &&
				e2eMetric(t, url, "kvrouter_fleet_endpoint_admitted", `endpoint="`+nw.name+`"`) == 1
		})
		addAdmit = append(addAdmit, time.Since(at))
		hupAt[nw.name] = at
		// A cold engine gets requests once the warm ones' queues cost more
		// than its prefill (kv's affinity slack keeps conversations on their
		// holders up to 2 s of queueing): give it a moment, but do not wait
		// for it; every new engine must have served by the end.
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, ok := tr.firstTo(nw.name); ok {
				break
			}
		}

		gone := fleet[0]
		fleet = fleet[1:]
		cleared := e2eMetric(t, url, "kvrouter_kvindex_blocks_cleared_total")
		write(fleet)
		at = hup()
		e2eEventually(t, 10*time.Second, gone.name+" out of the pool", func() bool {
			return e2eMetric(t, url, "kvrouter_pool_engines", `model="m"`) == n
		})
		removeGone = append(removeGone, time.Since(at))
		e2eEventually(t, 30*time.Second, gone.name+"'s requests finished", func() bool { return tr.openOn(gone.name) == 0 })
		e2eEventually(t, 10*time.Second, "no series of "+gone.name, func() bool {
			return !strings.Contains(e2eMetricsText(t, url), `"`+gone.name+`"`)
		})
		if got := e2eMetric(t, url, "kvrouter_kvindex_replicas"); got != n {
			t.Errorf("after removing %s: %v replicas in the index, want %d", gone.name, got, n)
		}
		if got := e2eMetric(t, url, "kvrouter_kvindex_blocks_cleared_total"); got <= cleared && tr.served(gone.name) > 0 {
			t.Errorf("removing %s cleared no index entries (%v -> %v): it served requests and held blocks", gone.name, cleared, got)
		}
		gone.sim.stop()
	}
	// Traffic on the new fleet alone, until every new engine has answered
	// (the check below).
	waitServed("every new engine answered a request", fleet)
	stopTraffic()
	for name, at := range hupAt {
		if first, ok := tr.firstTo(name); ok {
			addFirst = append(addFirst, first.Sub(at))
		}
	}
	elapsed := time.Since(began)

	var failed []string
	per := map[string]int{}
	streams := 0
	for _, rec := range tr.records {
		per[rec.replica]++
		if rec.stream {
			streams++
		}
		if rec.err != "" {
			failed = append(failed, fmt.Sprintf("%s (replica %q): %s", rec.start.Format("15:04:05.000"), rec.replica, rec.err))
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d requests failed:\n%s", len(failed), len(tr.records), strings.Join(failed[:min(len(failed), 20)], "\n"))
	}
	for _, m := range fleet {
		if per[m.name] == 0 {
			t.Errorf("new engine %s got no requests: %v", m.name, per)
		}
	}
	for _, name := range []string{"kvrouter_proxy_in_flight_requests", "kvrouter_routing_in_flight_requests", "kvrouter_routing_queued_prefill_tokens", "kvrouter_routing_running_decode_tokens"} {
		e2eEventually(t, 10*time.Second, name+" back to 0", func() bool { return e2eMetric(t, url, name) == 0 })
	}
	if v := e2eMetric(t, url, "kvrouter_routing_lease_underflow_total"); v != 0 {
		t.Errorf("lease underflow %v", v)
	}
	if v := e2eMetric(t, url, "kvrouter_config_reloads_total", `result="ok"`); v != 2*n {
		t.Errorf("reloads ok = %v, want %d", v, 2*n)
	}
	metrics := e2eMetricsText(t, url)
	for i := range n {
		if l := grepLines(metrics, fmt.Sprintf(`"old%d"`, i)); l != "" {
			t.Errorf("series of old%d remain:\n%s", i, l)
		}
	}
	if v := e2eMetric(t, url, "kvrouter_kvindex_entries"); v == 0 {
		t.Errorf("the new engines hold no index entries after serving traffic")
	}
	_ = cmd.Process.Signal(os.Interrupt)
	if err := <-exited; err != nil {
		t.Errorf("kvrouter serve: %v", err)
	}
	stopped = true
	ms := func(ds []time.Duration) string {
		out := make([]string, len(ds))
		for i, d := range ds {
			out[i] = fmt.Sprintf("%.0f", float64(d.Microseconds())/1000)
		}
		return strings.Join(out, ", ")
	}
	slices.Sort(addFirst) // for the log only
	t.Logf("rolling replacement of %d engines: %d requests (%d streaming) in %v, %d failed; per replica %v", n, len(tr.records), streams, elapsed.Round(time.Millisecond), len(failed), per)
	t.Logf("SIGHUP -> new engine admitted and up: %s ms; -> first request routed to it: %s ms; SIGHUP -> old engine out of the pool: %s ms", ms(addAdmit), ms(addFirst), ms(removeGone))
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), "config reload") && !strings.Contains(sc.Text(), "config reloaded") {
			t.Errorf("reload problem: %s", sc.Text())
		}
	}
}
