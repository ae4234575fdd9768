package enginesim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestPDTwoLegs runs vLLM's two-leg exchange by hand against a prefill
// engine and a decode engine: the prefill leg answers kv_transfer_params
// shaped as NixlConnector's; the decode leg with them waits the transfer
// time of the part it does not hold (over a 1 GB/s link, 992 tokens x 128
// KiB = 130 ms, against 0.5 ms of prefill on the fast profile), and not
// again once it holds the prompt.
func TestPDTwoLegs(t *testing.T) {
	p := startServer(t, Config{PD: PDConfig{Role: RolePrefill, EngineID: "p0", SideChannelHost: "10.0.0.1"}})
	d := startServer(t, Config{PD: PDConfig{Role: RoleDecode, Link: "tcp"}})
	prompt := seqTokens(1, 1000)

	resp, body := post(t, p.url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("prefill leg: %d %s", resp.StatusCode, body)
	}
	var out struct {
		KVTransferParams map[string]any `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatal(err)
	}
	ktp := out.KVTransferParams
	ids, _ := ktp["remote_block_ids"].([]any)
	if ktp["do_remote_prefill"] != true || ktp["do_remote_decode"] != false || ktp["remote_engine_id"] != "p0" ||
		ktp["remote_host"] != "10.0.0.1" || ktp["remote_port"] != float64(5600) || ktp["tp_size"] != float64(1) ||
		ktp["remote_num_tokens"] != float64(1000) || ktp["remote_request_id"] == nil || len(ids) != 1 {
		t.Fatalf("kv_transfer_params %v", ktp)
	}
	if group, _ := ids[0].([]any); len(group) != 63 { // 1001 tokens in blocks of 16
		t.Fatalf("remote_block_ids %v, want one group of 63 blocks", ids)
	}

	decode := func() time.Duration {
		t0 := time.Now()
		resp, body := post(t, d.url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4, "kv_transfer_params": ktp})
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"completion_tokens":4`) {
			t.Fatalf("decode leg: %d %s", resp.StatusCode, body)
		}
		return time.Since(t0)
	}
	// transfers counts the timed KV pulls (each observes the histogram
	// once): the checks below read it, not the wall clock, which a loaded
	// machine stretches.
	transfers := func() uint64 {
		var m dto.Metric
		if err := d.m.kvTransfer.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}
	if took := decode(); took < 130*time.Millisecond {
		t.Fatalf("decode leg took %v, want at least the 130 ms transfer", took)
	}
	if took := decode(); transfers() != 1 {
		t.Fatalf("second decode leg took %v and pulled again (%d transfers): the engine holds the prompt, nothing to pull", took, transfers())
	}
	if got := d.state.Load().stats.RemoteTokens; got != 992 {
		t.Fatalf("remote tokens %d, want 992 (62 full blocks, the last token computed locally)", got)
	}
	if n := testutil.CollectAndCount(d.m.kvTransfer); n != 1 {
		t.Fatalf("vllm:nixl_xfer_time_seconds series %d", n)
	}

	// Misrouted legs are refused; incomplete decode params compute locally.
	if resp, _ := post(t, p.url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "kv_transfer_params": ktp}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("decode leg on a prefill engine: %d, want 400", resp.StatusCode)
	}
	if resp, _ := post(t, d.url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"do_remote_decode": true}}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("prefill leg on a decode engine: %d, want 400", resp.StatusCode)
	}
	t0 := time.Now()
	resp, body = post(t, d.url+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": strings.Repeat("long ", 400)}},
		"max_tokens": 2, "kv_transfer_params": map[string]any{"do_remote_prefill": true}})
	if resp.StatusCode != http.StatusOK || transfers() != 1 || d.state.Load().stats.RemoteTokens != 992 {
		t.Fatalf("incomplete params: %d after %v, %d transfers, %d remote tokens (%s), want a local prefill", resp.StatusCode, time.Since(t0), transfers(), d.state.Load().stats.RemoteTokens, body)
	}
}

func TestPDConfigErrors(t *testing.T) {
	for _, pc := range []PDConfig{{Role: "producer"}, {Role: RoleDecode, Link: "smoke-signals"}} {
		if _, err := New(Config{PD: pc}, nil, nil); err == nil {
			t.Errorf("%+v: no error", pc)
		}
	}
}

func TestParseKVTransferConfig(t *testing.T) {
	for in, want := range map[string]string{
		`{"kv_connector":"NixlConnector","kv_role":"kv_producer"}`:                             RolePrefill,
		`{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}`:                             RoleDecode,
		`{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"fail"}`: RoleBoth,
		``: "",
	} {
		c, err := ParseKVTransferConfig(in)
		if err != nil || c.Role != want {
			t.Errorf("%s: %+v %v, want role %q", in, c, err, want)
		}
	}
	for _, in := range []string{`{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`, `{"kv_connector":"NixlConnector","kv_role":"boss"}`, `{`} {
		if _, err := ParseKVTransferConfig(in); err == nil {
			t.Errorf("%s: no error", in)
		}
	}
	if sh, err := ParseShape("32,8,128,2"); err != nil || sh.BytesPerToken() != 131072 {
		t.Errorf("shape %+v %v", sh, err)
	}
	for _, in := range []string{"32,8,128", "32,8,x,2", "0,8,128,2"} {
		if _, err := ParseShape(in); err == nil {
			t.Errorf("shape %q: no error", in)
		}
	}
}
