package report

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestPooledBound: fixedRuns cache 100*(0+...+9) = 4,500 (round_robin) and
// 900*9 = 8,100 tokens (kv, whose tenth request failed); against a bound
// caching 9,000 they are 0.50 and 0.90 of it.
func TestPooledBound(t *testing.T) {
	r := fixedReport()
	if r.Policies[0].CachedTokens != 4500 || r.Policies[1].CachedTokens != 8100 {
		t.Fatalf("cached tokens %d, %d; want 4500, 8100", r.Policies[0].CachedTokens, r.Policies[1].CachedTokens)
	}
	r.SetPooledBound(PooledBound{HitRate: 0.9, CachedTokens: 9000, GPUBlocks: 81000, CPUBlocks: 100})
	for i, want := range []float64{0.5, 0.9} {
		if s := r.Policies[i].ShareOfPooledBound; s == nil || *s != want {
			t.Errorf("%s share %v, want %v", r.Policies[i].Name, s, want)
		}
	}
	var md bytes.Buffer
	if err := r.Markdown(&md); err != nil {
		t.Fatal(err)
	}
	want := " Pooled-cache bound (the fleet's 81000 GPU + 100 CPU blocks as one LRU, requests in arrival order; a reference, not a ceiling): 90.0%; share of its cached tokens: round_robin 0.50, kv 0.90."
	if !strings.Contains(md.String(), want) {
		t.Errorf("markdown lacks %q:\n%s", want, md.String())
	}
	var js bytes.Buffer
	if err := r.JSON(&js); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		PooledBound struct {
			HitRate      float64 `json:"hit_rate"`
			CachedTokens int64   `json:"cached_tokens"`
		} `json:"pooled_bound"`
		Policies []struct {
			Share *float64 `json:"share_of_pooled_bound"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.PooledBound.HitRate != 0.9 || doc.PooledBound.CachedTokens != 9000 || doc.Policies[1].Share == nil || *doc.Policies[1].Share != 0.9 {
		t.Errorf("json %s", js.String())
	}
	r.SetPooledBound(PooledBound{})
	if r.Policies[0].ShareOfPooledBound != nil {
		t.Error("share of a bound caching nothing")
	}
}
