package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/admission"
	"kvrouter/internal/tokenizer"
)

// TestContinuationKeysFromPrefixCache routes a conversation turn by turn
// through a server whose tokenizer has a prefix cache and through one
// without: from the second turn on the block keys of the cached prefix
// come from the prefix cache (its hit_keys counter grows), and every
// decision's cached tokens, which come from the keys, are the same on
// both servers.
func TestContinuationKeysFromPrefixCache(t *testing.T) {
	tok, err := tokenizer.Load("../../testdata/tokenizer/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	local, err := tokenizer.NewLocal(tok, tokenizer.ContentAuto)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cache, err := tokenizer.NewPrefixCache(tokenizer.PrefixCacheConfig{Model: "m"}, reg)
	if err != nil {
		t.Fatal(err)
	}
	cachedSrc, err := tokenizer.NewSource(local.WithPrefixCache(cache), nil)
	if err != nil {
		t.Fatal(err)
	}
	plainSrc, err := tokenizer.NewSource(local, nil)
	if err != nil {
		t.Fatal(err)
	}
	cached := newBenchServer(t, "http://127.0.0.1:1", admission.TokenSource{Src: cachedSrc})
	plain := newBenchServer(t, "http://127.0.0.1:1", admission.TokenSource{Src: plainSrc})

	msgs := []string{`{"role":"system","content":"You answer questions about shipping, briefly and exactly."}`}
	for turn := range 6 {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"Question %d: %s"}`, turn, strings.Repeat("where is the parcel now, and when does it arrive? ", 5+turn)))
		body := []byte(`{"model":"m","messages":[` + strings.Join(msgs, ",") + `],"max_tokens":16}`)
		k0 := counterValue(t, reg, "kvrouter_tokenizer_prefix_cache_hit_keys_total")
		n, d := routeDecision(t, cached, body)
		hitKeys := counterValue(t, reg, "kvrouter_tokenizer_prefix_cache_hit_keys_total") - k0
		pn, pd := routeDecision(t, plain, body)
		if n != pn || d.CachedTokens != pd.CachedTokens || d.IndexCachedTokens != pd.IndexCachedTokens {
			t.Fatalf("turn %d: %d tokens, %d/%d cached with the prefix cache; %d tokens, %d/%d without", turn, n, d.CachedTokens, d.IndexCachedTokens, pn, pd.CachedTokens, pd.IndexCachedTokens)
		}
		if turn > 0 && (hitKeys == 0 || d.CachedTokens == 0) {
			t.Fatalf("turn %d: %v keys from the prefix cache, %d tokens cached, want both > 0", turn, hitKeys, d.CachedTokens)
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":"Answer %d: it is in the depot and arrives on Thursday."}`, turn))
	}
}
