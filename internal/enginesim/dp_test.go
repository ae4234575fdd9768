package enginesim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// postRank sends a completion with the data-parallel rank header h ("":
// none) and returns the status and the reported cached tokens.
func postRank(t *testing.T, url, h, prompt string) (int, int, string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 2})
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if h != "" {
		req.Header.Set("x-data-parallel-rank", h) // lower case: the header is case-insensitive
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out completionOut
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
		return 200, out.Usage.PromptTokensDetails.CachedTokens, string(body)
	}
	return resp.StatusCode, 0, string(body)
}

// TestDataParallelRanks: two ranks behind one endpoint, each its own cache;
// the rank header picks the rank, its absence the least loaded (rank 0 when
// idle, as vLLM's balancer starts from rank 0), a rank out of range is a 400.
func TestDataParallelRanks(t *testing.T) {
	s := startServer(t, Config{DataParallelSize: 2})
	prompt := strings.Repeat("hello world ", 10) // 120 tokens: 112 reusable
	steps := []struct {
		header     string
		status     int
		wantCached int
	}{
		{"1", 200, 0},   // rank 1 computes it
		{"1", 200, 112}, // and holds it
		{"0", 200, 0},   // rank 0 does not
		{"", 200, 112},  // idle: rank 0, which holds it now
		{"2", 400, 0},
		{"-1", 400, 0},
		{"x", 200, 112}, // not an integer: as absent
	}
	for i, st := range steps {
		status, cached, body := postRank(t, s.url, st.header, prompt)
		if status != st.status || cached != st.wantCached {
			t.Fatalf("step %d (header %q): status %d cached %d, want %d %d: %s", i, st.header, status, cached, st.status, st.wantCached, body)
		}
	}
	// Per-rank series: rank 1 served 2 prompts of 120 tokens, rank 0 three.
	for rank, want := range map[string]float64{"0": 3 * 120, "1": 2 * 120} {
		got := -1.0
		mfs, err := s.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "vllm:prompt_tokens_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "engine" && l.GetValue() == rank {
						got = m.GetCounter().GetValue()
					}
				}
			}
		}
		if got != want {
			t.Errorf("prompt tokens of engine %s = %v, want %v", rank, got, want)
		}
	}
	if n := testutil.CollectAndCount(s.reg, "vllm:cache_config_info"); n != 2 {
		t.Errorf("cache_config_info series = %d, want one per rank (2)", n)
	}
}

// TestDataParallelBalances: without the header a busy rank is passed over.
func TestDataParallelBalances(t *testing.T) {
	s := startServer(t, Config{DataParallelSize: 2})
	s.ranks[0].state.Store(&snapshot{waiting: 1})
	if rs, _ := s.rankFor(""); rs != s.ranks[1] {
		t.Fatal("rank 0 has a waiting request: want rank 1")
	}
	s.ranks[1].state.Store(&snapshot{running: 5})
	if rs, _ := s.rankFor(""); rs != s.ranks[0] {
		t.Fatal("score waiting*4+running: 4 < 5, want rank 0")
	}
}

func TestDataParallelConfig(t *testing.T) {
	for _, cfg := range []Config{{DataParallelSize: 2, DataParallelRank: 1}, {DataParallelSize: -1}, {DataParallelSize: 65}} {
		if _, err := New(cfg, nil, nil); err == nil || !strings.Contains(err.Error(), "data-parallel size") {
			t.Errorf("%+v: err %v, want the data-parallel size refused", cfg, err)
		}
	}
}
