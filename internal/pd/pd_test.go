package pd

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestBytesPerToken(t *testing.T) {
	// Llama-3.1-8B bf16: 2 x 32 x 8 x 128 x 2 = 131072 bytes (128 KiB).
	if got := Llama31_8B.BytesPerToken(); got != 131072 {
		t.Fatalf("Llama-3.1-8B bytes/token = %v, want 131072", got)
	}
	fp8 := Llama31_8B
	fp8.DTypeBytes = 1
	if got := fp8.BytesPerToken(); got != 65536 {
		t.Fatalf("fp8 bytes/token = %v, want 65536", got)
	}
}

func TestTransferSeconds(t *testing.T) {
	for _, tc := range []struct {
		link   string
		tokens int
		want   float64
	}{
		{"nvlink", 10000, 10000 * 131072 / 450e9},
		{"infiniband", 10000, 10000 * 131072 / 50e9}, // 26.2 ms
		{"roce", 10000, 10000 * 131072 / 25e9},
		{"tcp", 10000, 10000 * 131072 / 1e9}, // 1.31 s
		{"tcp", 0, 0},
	} {
		bw, err := LinkBandwidth(tc.link)
		if err != nil {
			t.Fatal(err)
		}
		if got := TransferSeconds(tc.tokens, Llama31_8B.BytesPerToken(), bw); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s %d tokens: %v s, want %v", tc.link, tc.tokens, got, tc.want)
		}
	}
	if !math.IsInf(TransferSeconds(1, 1, 0), 1) {
		t.Error("zero bandwidth must be an infinite transfer")
	}
	if _, err := LinkBandwidth("carrier-pigeon"); err == nil || !strings.Contains(err.Error(), "infiniband") {
		t.Errorf("unknown link: %v, want an error listing the known ones", err)
	}
}

func TestRuleDefaultsAndValidate(t *testing.T) {
	r, err := Rule{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if r.Mode != ModeConditional || r.MinRemoteTokens != 1000 || r.Link != "infiniband" || r.Model != Llama31_8B || r.Bandwidth() != 50e9 || r.TTFTTarget != 2*time.Second || r.StallWeight != 1 || r.WholeMaxQueue != time.Second {
		t.Fatalf("defaults: %+v", r)
	}
	r, err = Rule{LinkGBps: 12.5, Link: "nonsense"}.WithDefaults()
	if err != nil || r.Bandwidth() != 12.5e9 {
		t.Fatalf("link_gbps overrides the link: %+v %v", r, err)
	}
	_, err = Rule{Mode: "sometimes", Link: "x", LinkGBps: -1, Model: Shape{Layers: 1}, StallWeight: -1}.WithDefaults()
	for _, want := range []string{"mode", "link", "link_gbps", "shape", "stall_weight"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}

func TestDecide(t *testing.T) {
	rule, _ := Rule{}.WithDefaults()
	tcp, _ := Rule{Link: "tcp"}.WithDefaults()
	always, _ := Rule{Mode: ModeAlways}.WithDefaults()
	tcpStall, _ := Rule{Link: "tcp", StallWeight: 3}.WithDefaults()
	never, _ := Rule{Mode: ModeNever}.WithDefaults()
	noTarget, _ := Rule{TTFTTarget: -1}.WithDefaults()
	tcpNoWhole, _ := Rule{Link: "tcp", WholeMaxQueue: -1}.WithDefaults()
	// a decode pool backlogged 1 s and serving 8, an 8,000-token prompt
	busyDecode := Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, DecodeQueueSeconds: 1, DecodeInFlight: 8}
	busyDecodeBusyPrefill := busyDecode
	busyDecodeBusyPrefill.PrefillQueueSeconds = 1.1
	busyDecodeCrowdedPrefill := busyDecode
	busyDecodeCrowdedPrefill.PrefillInFlight = 3
	for _, tc := range []struct {
		name   string
		r      Rule
		in     Inputs
		remote bool
		reason string
	}{
		// local 1.4 s + stall 3.2 s, remote max(0.4, 1) + 1.05 = 2.05 s
		// misses the target; whole on the idle prefill engine: 0.4 s, its
		// cost 0.4 + 0.4 = 0.8 s
		{"slow link, busy decode pool: whole on the prefill engine", tcp, busyDecode, false, ReasonWhole},
		{"same, whole path off", tcpNoWhole, busyDecode, false, ReasonPrefillBusy},
		{"same, prefill queue above whole_max_queue", tcp, busyDecodeBusyPrefill, false, ReasonPrefillBusy},
		// whole cost 0.4 + 0.4 x 3 = 1.6 s against local 4.6 s: whole
		{"same, prefill engine serving 3", tcp, busyDecodeCrowdedPrefill, false, ReasonWhole},
		// over InfiniBand the remote path waits 1 s behind the decode
		// backlog (1.02 s): the whole path's cost (0.4 + 0.4 = 0.8 s) is
		// below it; with the prefill engine serving 3 (1.6 s) it is not
		{"fast link, backlogged decode pool: whole", rule, busyDecode, false, ReasonWhole},
		{"fast link, backlogged decode pool, prefill engine serving 3", rule, busyDecodeCrowdedPrefill, true, ReasonRemote},
		{"long prompt idle prefill pool", rule, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000}, true, ReasonRemote},
		{"short uncached part", rule, Inputs{UncachedTokens: 999, DecodePrefillRate: 20000}, false, ReasonShort},
		{"fully cached on decode", rule, Inputs{UncachedTokens: 0, DecodePrefillRate: 20000}, false, ReasonShort},
		// saving = 8000/20000 - 8000*131072/50e9 = 0.4 - 0.021 = 0.379 s
		{"prefill queue below saving", rule, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, PrefillQueueSeconds: 0.37}, true, ReasonRemote},
		{"prefill queue above saving", rule, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, PrefillQueueSeconds: 0.38}, false, ReasonPrefillBusy},
		// over TCP the transfer (1.05 s) exceeds the prefill it spares (0.4 s)
		// and the idle decode engine has nothing to stall
		{"slow link, idle decode engine", tcp, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000}, false, ReasonPrefillBusy},
		// local 0.4 s, remote 1.45 s, but the local prefill stalls the 4
		// requests in flight 0.4 s each: saving = 0.4 + 1.6 - 1.45 = 0.55 s
		{"slow link, decode engine serving 4", tcpNoWhole, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, DecodeInFlight: 4}, true, ReasonRemote},
		// the same with the whole path: 0.4 + 0.4 = 0.8 s beats 1.45 s
		{"slow link, decode engine serving 4, idle prefill engine", tcp, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, DecodeInFlight: 4}, false, ReasonWhole},
		// ... but not once the prefill engine serves 3: 0.4 + 1.2 = 1.6 s
		{"slow link, decode engine serving 4, prefill engine serving 3", tcp, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, DecodeInFlight: 4, PrefillInFlight: 3}, true, ReasonRemote},
		// 1 s of local prefills queued on the decode engine: the decode leg
		// waits for them too (remote = max(0.4, 1) + 1.05 = 2.05 s, local
		// 1.4 s), so the backlog is no saving of the remote path
		{"slow link, decode engine backlogged", tcpNoWhole, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, DecodeQueueSeconds: 1}, false, ReasonPrefillBusy},
		// remote = 1.65 + 0.4 + 0.021 = 2.07 s misses the 2 s target, local
		// (0.4 s) meets it: local, though the stall of 8 (3.2 s) outweighs
		{"remote misses the TTFT target", rule, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, PrefillQueueSeconds: 1.65, DecodeInFlight: 8}, false, ReasonPrefillBusy},
		{"remote misses the TTFT target, no target", noTarget, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, PrefillQueueSeconds: 1.65, DecodeInFlight: 8}, true, ReasonRemote},
		// local = 2.5 + 0.4 s misses, remote = max(1.5, 2.5) + 0.021 s too:
		// the saving decides (2.9 + 0.4 - 2.52 = 0.78 s); the prefill
		// engine's 1.1 s queue is above whole_max_queue (1 s)
		{"both miss the target", rule, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, DecodeQueueSeconds: 2.5, PrefillQueueSeconds: 1.1}, true, ReasonRemote},
		// with the prefill engine's queue below whole_max_queue, the whole
		// path (0.4 s) is the one meeting the target
		{"both miss the target, whole meets it", rule, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, DecodeQueueSeconds: 2.5}, false, ReasonWhole},
		{"busy prefill pool, busier decode engine", rule, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000, PrefillQueueSeconds: 0.5, DecodeQueueSeconds: 0.2}, true, ReasonRemote},
		// saving = 3 x 0.4 - 1.05 = 0.15 s: the stall of the running decodes outweighs the pull
		{"slow link, stall weighed 3x", tcpStall, Inputs{UncachedTokens: 8000, DecodePrefillRate: 20000}, true, ReasonRemote},
		{"always", always, Inputs{UncachedTokens: 1, PrefillQueueSeconds: 100}, true, ReasonAlways},
		{"never", never, Inputs{UncachedTokens: 100000}, false, ReasonNever},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.r.Decide(tc.in)
			if v.Remote != tc.remote || v.Reason != tc.reason {
				t.Fatalf("verdict %+v, want remote=%v reason=%s", v, tc.remote, tc.reason)
			}
		})
	}
}
