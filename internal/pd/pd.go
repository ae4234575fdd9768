package pd

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Shape is the part of a model's architecture that sets its KV cache size:
// each token keeps one key and one value vector per layer and KV head.
type Shape struct {
	// Layers is num_hidden_layers.
	Layers int `yaml:"layers"`
	// KVHeads is num_key_value_heads (grouped-query attention: fewer than
	// the attention heads).
	KVHeads int `yaml:"kv_heads"`
	// HeadDim is the head dimension (hidden_size / num_attention_heads
	// unless the config names head_dim).
	HeadDim int `yaml:"head_dim"`
	// DTypeBytes is the KV cache element size in bytes: 2 for bf16/fp16
	// (vLLM's --kv-cache-dtype auto on a bf16 model), 1 for fp8.
	DTypeBytes int `yaml:"dtype_bytes"`
}

// Llama31_8B is meta-llama/Llama-3.1-8B(-Instruct) in bf16: its
// config.json has num_hidden_layers 32, num_key_value_heads 8,
// hidden_size 4096 over 32 attention heads (head dim 128); 128 KiB per
// token.
var Llama31_8B = Shape{Layers: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 2}

// BytesPerToken is the KV cache one token takes: 2 (key and value) x
// layers x KV heads x head dim x element size, in bytes.
func (s Shape) BytesPerToken() float64 {
	return 2 * float64(s.Layers) * float64(s.KVHeads) * float64(s.HeadDim) * float64(s.DTypeBytes)
}

// Validate reports a shape with a non-positive field.
func (s Shape) Validate() error {
	if s.Layers <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.DTypeBytes <= 0 {
		return fmt.Errorf("model shape %+v: every field must be positive", s)
	}
	return nil
}

// Links are the named interconnects and their usable bandwidth in bytes per
// second (GB = 1e9 bytes): NVLink 4 within a node (~450 GB/s one way on
// H100), InfiniBand NDR 400 Gb/s (~50 GB/s), RoCE 200 Gb/s (~25 GB/s) and
// plain TCP over a 10 GbE-class path (~1 GB/s). These are the seed figures
// the P/D issue gives; a measured figure goes in link_gbps instead.
func Links() map[string]float64 {
	return map[string]float64{
		"nvlink":     450e9,
		"infiniband": 50e9,
		"roce":       25e9,
		"tcp":        1e9,
	}
}

// LinkNames lists Links' names, sorted.
func LinkNames() []string {
	var out []string
	for n := range Links() {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// LinkBandwidth returns the named link's bandwidth in bytes per second; an
// unknown name is an error listing the known ones.
func LinkBandwidth(name string) (float64, error) {
	bw, ok := Links()[strings.ToLower(name)]
	if !ok {
		return 0, fmt.Errorf("unknown link %q (known: %s)", name, strings.Join(LinkNames(), ", "))
	}
	return bw, nil
}

// TransferSeconds is how long moving tokens tokens of KV cache takes at
// bytesPerSec: tokens x bytesPerToken / bytesPerSec seconds (the
// connector's handshake, paid once per engine pair, is left out). A
// non-positive bandwidth means an infinitely slow link (+Inf).
func TransferSeconds(tokens int, bytesPerToken, bytesPerSec float64) float64 {
	if tokens <= 0 {
		return 0
	}
	if bytesPerSec <= 0 {
		return math.Inf(1)
	}
	return float64(tokens) * bytesPerToken / bytesPerSec
}

// Modes of the disaggregation decision.
const (
	// ModeConditional decides per request (Rule.Decide): the default.
	ModeConditional = "conditional"
	// ModeAlways sends every request through a prefill engine.
	ModeAlways = "always"
	// ModeNever prefills every request on its decode engine (the prefill
	// pool idles): aggregated serving on the decode pool.
	ModeNever = "never"
)

// Default thresholds of Rule.
const (
	// DefaultMinRemoteTokens: a request whose uncached prompt part on the
	// decode engine is shorter is prefilled there. Dynamo's disaggregated
	// router prefills locally up to max_local_prefill_length = 1000 tokens
	// (ai-dynamo/dynamo examples/python_rs/llm/vllm_nixl/router/
	// disagg_router.py); below that the two-leg round trip and the
	// transfer outweigh the interference a short prefill causes.
	DefaultMinRemoteTokens = 1000
	// DefaultLink is the link assumed when none is configured.
	DefaultLink = "infiniband"
	// DefaultTTFTTarget is Rule.TTFTTarget's default: 2 s, the TTFT SLO
	// of kvrouter's goodput measurements (and of the DistServe/Mooncake
	// evaluations' chat workloads).
	DefaultTTFTTarget = 2 * time.Second
	// DefaultWholeMaxQueue is Rule.WholeMaxQueue's default: a prefill
	// engine with at most 1 s of prefill queued (half the default TTFT
	// target; 2.5 prefills of 8,192 tokens at 20,000 tokens per second)
	// may serve a request whole. Measured in docs/results/2026-12-01-measurements.md (P/D):
	// 250 ms left the TCP 4 + 4 split at 94.4% of aggregated, 1 s 95.6%.
	DefaultWholeMaxQueue = time.Second
)

// Rule is the conditional-disaggregation rule. A zero field means the
// default in its comment (WithDefaults).
type Rule struct {
	// Mode is conditional (default), always or never.
	Mode string `yaml:"mode"`
	// MinRemoteTokens is the uncached prompt length, in tokens, from which
	// a request may be prefilled remotely (default 1000); shorter ones are
	// prefilled on the decode engine. Negative: 0 (no length threshold).
	MinRemoteTokens int `yaml:"min_remote_tokens"`
	// Link names the interconnect between prefill and decode engines:
	// nvlink, infiniband (default), roce or tcp (Links).
	Link string `yaml:"link"`
	// LinkGBps overrides Link's bandwidth with a measured one, in GB/s
	// (1e9 bytes per second).
	LinkGBps float64 `yaml:"link_gbps"`
	// Model is the model's KV shape (default Llama31_8B, 128 KiB/token).
	Model Shape `yaml:"model"`
	// StallWeight weighs the stall a local prefill imposes on each request
	// in flight on the decode engine against the request's own time to
	// first token (default 1: a second of one sequence's stall counts as
	// much as a second of this request's wait; raise it where inter-token
	// latency is the binding SLO, lower it toward 0 to favour local
	// prefill).
	StallWeight float64 `yaml:"stall_weight"`
	// TTFTTarget is the time to first token a request should meet (the
	// TTFT SLO; default 2 s, negative: none). When only one path's
	// predicted time to first token meets it, that path is taken whatever
	// the stall: a remote prefill that misses the target while a local one
	// would meet it loses the request to spare the decodes a stall that
	// rarely breaks their inter-token SLO, and the reverse.
	TTFTTarget time.Duration `yaml:"ttft_target"`
	// WholeMaxQueue enables the third path, a whole request (prefill and
	// decode, no transfer) on a prefill engine, while that engine's queued
	// prefill is at most it (default 1 s; negative: the path is off).
	// The prefill engines must then serve plain requests, which vLLM's
	// NixlConnector does in any kv_role: a request without
	// kv_transfer_params is neither saved nor pulled (see Decide).
	WholeMaxQueue time.Duration `yaml:"whole_max_queue"`
}

// WithDefaults returns r with zero fields filled in and checks it,
// returning every problem at once.
func (r Rule) WithDefaults() (Rule, error) {
	if r.Mode == "" {
		r.Mode = ModeConditional
	}
	if r.MinRemoteTokens == 0 {
		r.MinRemoteTokens = DefaultMinRemoteTokens
	} else if r.MinRemoteTokens < 0 {
		r.MinRemoteTokens = 0
	}
	if r.Link == "" {
		r.Link = DefaultLink
	}
	if r.Model == (Shape{}) {
		r.Model = Llama31_8B
	}
	if r.StallWeight == 0 {
		r.StallWeight = 1
	}
	if r.TTFTTarget == 0 {
		r.TTFTTarget = DefaultTTFTTarget
	}
	if r.WholeMaxQueue == 0 {
		r.WholeMaxQueue = DefaultWholeMaxQueue
	}
	var errs []error
	switch r.Mode {
	case ModeConditional, ModeAlways, ModeNever:
	default:
		errs = append(errs, fmt.Errorf("mode %q: want conditional, always or never", r.Mode))
	}
	if _, err := LinkBandwidth(r.Link); err != nil && r.LinkGBps == 0 {
		errs = append(errs, fmt.Errorf("link: %w", err))
	}
	if r.StallWeight < 0 {
		errs = append(errs, errors.New("stall_weight must not be negative"))
	}
	if r.LinkGBps < 0 {
		errs = append(errs, errors.New("link_gbps must not be negative"))
	}
	if err := r.Model.Validate(); err != nil {
		errs = append(errs, err)
	}
	return r, errors.Join(errs...)
}

// Bandwidth is the rule's link bandwidth in bytes per second (LinkGBps
// when set, else Link's; 0 for an unknown link).
func (r *Rule) Bandwidth() float64 {
	if r.LinkGBps > 0 {
		return r.LinkGBps * 1e9
	}
	bw, _ := LinkBandwidth(r.Link)
	return bw
}

// Inputs are what the rule weighs for one request, from the routing state
// of both pools.
type Inputs struct {
	// UncachedTokens are the prompt tokens the chosen decode engine does
	// not hold: what it would prefill locally, and what a remote prefill
	// transfers to it.
	UncachedTokens int
	// DecodePrefillRate is the decode engine's prefill throughput, in
	// tokens per second (the router's rate for it).
	DecodePrefillRate float64
	// PrefillQueueSeconds is the chosen prefill engine's queued prefill
	// time: its queued uncached prompt tokens over its prefill rate, in
	// seconds.
	PrefillQueueSeconds float64
	// DecodeQueueSeconds is the same for the decode engine: prefill work
	// already queued there (local prefills), in seconds.
	DecodeQueueSeconds float64
	// DecodeInFlight is the number of requests in flight on the decode
	// engine (routing.Load.InFlight): the sequences a local prefill there
	// stalls or delays.
	DecodeInFlight int
	// PrefillPrefillRate is the prefill engine's prefill throughput, in
	// tokens per second (0: DecodePrefillRate).
	PrefillPrefillRate float64
	// PrefillInFlight is the number of requests in flight on the prefill
	// engine: its prefill legs and the whole requests it decodes, which a
	// whole request's prefill there stalls or delays.
	PrefillInFlight int
}

// Decision reasons.
const (
	ReasonAlways      = "always"       // Mode always
	ReasonNever       = "never"        // Mode never
	ReasonShort       = "short_prompt" // uncached part below MinRemoteTokens
	ReasonPrefillBusy = "prefill_busy" // prefill queue longer than the saving
	ReasonRemote      = "remote"       // disaggregated: the remote path saves time
	// ReasonWhole: the whole request on the prefill engine predicts the
	// best time to first token (its queue below WholeMaxQueue).
	ReasonWhole = "whole"
)

// Verdict is the rule's answer and the record of why.
type Verdict struct {
	// Remote: prefill on a prefill engine and transfer; false: prefill on
	// the decode engine.
	Remote bool `json:"remote"`
	// Whole: serve the request whole (prefill and decode, no transfer) on
	// the prefill engine; Remote is then false.
	Whole bool `json:"whole"`
	// Reason is one of the Reason constants.
	Reason string `json:"reason"`
	// TransferSeconds is the KV transfer time of the uncached part.
	TransferSeconds float64 `json:"transfer_seconds"`
	// SavingSeconds is what the remote path saves: the local path's time
	// to first token plus StallSeconds, minus the remote path's time to
	// first token (Decide); negative when local prefill is cheaper.
	SavingSeconds float64 `json:"saving_seconds"`
	// StallSeconds is the weighted stall a local prefill would impose on
	// the decode engine's requests in flight.
	StallSeconds float64 `json:"stall_seconds"`
	// QueueSeconds is the prefill engine's queued prefill time.
	QueueSeconds float64 `json:"prefill_queue_seconds"`
	// LocalSeconds, RemoteSeconds and WholeSeconds are the predicted times
	// to first token of the three paths (WholeSeconds 0 when the whole
	// path was not weighed).
	LocalSeconds  float64 `json:"local_seconds"`
	RemoteSeconds float64 `json:"remote_seconds"`
	WholeSeconds  float64 `json:"whole_seconds,omitempty"`
}

// Decide applies the rule (after WithDefaults) to one request. It compares
// the request's time to first token on both paths, and charges the local
// path the stall it imposes on the decode engine's running sequences:
//
//	prefill  = uncached / decode_prefill_rate
//	transfer = uncached x bytes_per_token / link_bandwidth
//	local    = decode_queue + prefill
//	remote   = max(prefill_queue + prefill, decode_queue) + transfer
//	stall    = stall_weight x prefill x max(1, decode_in_flight)
//	saving   = local + stall - remote
//	remote path  iff  uncached >= min_remote_tokens  and
//	                  (remote <= ttft_target < local  or
//	                   saving >= 0 unless local <= ttft_target < remote)
//
// In mode conditional, for a prompt not short, a third path is then
// weighed (weighWhole): the whole request on the prefill engine.
//
// Both paths wait for the prefills already queued on the decode engine:
// the decode leg joins the decode engine's FCFS waiting queue when the
// prefill leg ends (vLLM's scheduler reaches a do_remote_prefill request
// in order, then parks it in WAITING_FOR_REMOTE_KVS while it pulls), so a
// backlog there is no saving of the remote path, only the part of it that
// drains during the prefill leg is. A local prefill stalls every sequence
// the decode engine is serving for its whole length (chunked prefill
// shares each step with the decodes), and delays every request queued
// behind it; the remote path does neither. Counting that stall once per
// sequence in flight is what keeps a slow link or a small decode pool from
// drawing every prefill onto the decode engines: the greedy comparison of
// this request's own time to first token alone prefers the local path as
// long as the pull is slower than the prefill, whatever the decode engines'
// load. The TTFT target bounds that: the stall is worth a wait, not a
// missed first-token SLO. Modes always and never skip the test.
func (r *Rule) Decide(in Inputs) Verdict {
	v := Verdict{QueueSeconds: in.PrefillQueueSeconds}
	v.TransferSeconds = TransferSeconds(in.UncachedTokens, r.Model.BytesPerToken(), r.Bandwidth())
	rate := in.DecodePrefillRate
	if rate <= 0 {
		rate = 1
	}
	prefill := float64(in.UncachedTokens) / rate
	local := in.DecodeQueueSeconds + prefill
	remote := math.Max(in.PrefillQueueSeconds+prefill, in.DecodeQueueSeconds) + v.TransferSeconds
	v.StallSeconds = r.StallWeight * prefill * float64(max(1, in.DecodeInFlight))
	v.SavingSeconds = local + v.StallSeconds - remote
	switch {
	case r.Mode == ModeAlways:
		v.Remote, v.Reason = true, ReasonAlways
	case r.Mode == ModeNever:
		v.Reason = ReasonNever
	case in.UncachedTokens < r.MinRemoteTokens || in.UncachedTokens <= 0:
		v.Reason = ReasonShort
	case r.TTFTTarget > 0 && (remote <= r.TTFTTarget.Seconds()) != (local <= r.TTFTTarget.Seconds()):
		if remote <= r.TTFTTarget.Seconds() {
			v.Remote, v.Reason = true, ReasonRemote
		} else {
			v.Reason = ReasonPrefillBusy
		}
	case v.SavingSeconds < 0:
		v.Reason = ReasonPrefillBusy
	default:
		v.Remote, v.Reason = true, ReasonRemote
	}
	v.LocalSeconds, v.RemoteSeconds = local, remote
	if r.Mode == ModeConditional && v.Reason != ReasonShort {
		r.weighWhole(in, &v)
	}
	return v
}

// weighWhole replaces v's path by the whole path when that is enabled, the
// prefill engine's queue is below WholeMaxQueue, and the whole request's
// time to first token meets the target where v's path misses it, or its
// cost (time to first token plus the stall it imposes on the prefill
// engine and the one it suffers there) is below v's path's (local: with
// its stall; remote: without):
//
//	whole_prefill = uncached / prefill_rate
//	whole         = prefill_queue + whole_prefill
//	whole_stall   = stall_weight x whole_prefill x max(1, prefill_in_flight)
//
// The prefill is sized, as the remote path's prefill leg is, by the
// decode engine's uncached part (what the prefill engine holds is not
// weighed on either path: weighing it on this one alone would draw every
// repeated prompt onto the prefill engine that computed it, whose cached
// prefix the remote path's leg reuses as well).
//
// The stall counts the requests in flight on the prefill engine (its
// prefill legs and the whole requests it already decodes), and at least
// one for the decode the request then carries: on an idle prefill engine
// the next prefill leg, of about the same length, stalls it as long. With
// an idle decode pool, the whole path beats the remote one only while
// stall_weight x max(1, prefill_in_flight) is below 1 + transfer /
// prefill: 131072 bytes per token over 1 GB/s against 20,000 tokens per
// second makes transfer / prefill 2.6 on TCP, 0.05 on InfiniBand. On a
// fast link it wins only against a decode-pool backlog the remote path
// waits behind, or a target the others miss; WholeMaxQueue keeps it off a
// prefill pool that is already busy.
//
// The engine contract: an engine with vLLM's NixlConnector serves a
// request without kv_transfer_params as a plain one, whatever its kv_role
// (kv_producer, kv_consumer, kv_both: the connector's scheduler never reads
// it): NixlConnectorScheduler.get_num_new_matched_tokens loads nothing
// unless do_remote_prefill is set, update_state_after_alloc returns at once
// without params, and request_finished frees the blocks at once and returns
// no kv_transfer_params (vllm/distributed/kv_transfer/kv_connector/v1/
// nixl_connector.py at vllm-project/vllm 002a105).
func (r *Rule) weighWhole(in Inputs, v *Verdict) {
	if r.WholeMaxQueue < 0 || in.PrefillQueueSeconds > r.WholeMaxQueue.Seconds() {
		return
	}
	rate := in.PrefillPrefillRate
	if rate <= 0 {
		rate = in.DecodePrefillRate
	}
	if rate <= 0 {
		rate = 1
	}
	prefill := float64(in.UncachedTokens) / rate
	whole := in.PrefillQueueSeconds + prefill
	wholeCost := whole + r.StallWeight*prefill*float64(max(1, in.PrefillInFlight))
	v.WholeSeconds = whole
	chosen, chosenCost := v.LocalSeconds, v.LocalSeconds+v.StallSeconds
	if v.Remote {
		chosen, chosenCost = v.RemoteSeconds, v.RemoteSeconds
	}
	target := r.TTFTTarget.Seconds()
	switch {
	case r.TTFTTarget > 0 && chosen > target && whole <= target:
		// only the whole path meets the target: take it
	case r.TTFTTarget > 0 && chosen <= target && whole > target:
		return
	case wholeCost >= chosenCost:
		return
	}
	v.Remote, v.Whole, v.Reason = false, true, ReasonWhole
}
