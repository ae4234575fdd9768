package enginesim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"kvrouter/internal/pd"
)

// Engine roles of disaggregated serving (PDConfig.Role).
const (
	RolePrefill = "prefill" // vLLM kv_role kv_producer
	RoleDecode  = "decode"  // kv_role kv_consumer
	RoleBoth    = "both"    // kv_role kv_both
)

// PDConfig is the engine's KV connector, standing in for vLLM's
// NixlConnector (--kv-transfer-config
// '{"kv_connector":"NixlConnector","kv_role":...}',
// docs/features/nixl_connector_usage.md at vllm-project/vllm 026c83f). With
// a Role, requests' kv_transfer_params are honoured as the connector does:
//
//   - do_remote_decode: true (the prefill leg, sent with max_tokens 1):
//     the prompt is computed and the response carries kv_transfer_params
//     {do_remote_prefill: true, do_remote_decode: false, remote_block_ids
//     (one list per KV cache group: [[ids]]), remote_engine_id,
//     remote_request_id, remote_host, remote_port, tp_size,
//     remote_num_tokens}, the fields of NixlConnectorScheduler.
//     request_finished (nixl/scheduler.py at c8fac58);
//   - do_remote_prefill: true with remote_block_ids, remote_engine_id,
//     remote_request_id, remote_host and remote_port (the decode leg): the
//     prompt's KV not held locally is pulled, taking tokens x
//     Model.BytesPerToken() / link bandwidth of wall time during which the
//     request is in no batch; then the received blocks are published as
//     BlockStored and the request decodes. Without those fields vLLM logs
//     "Got invalid KVTransferParams" and computes the prompt itself; so
//     does the simulator.
//
// vLLM's NixlConnector does not enforce kv_role (its docs call it a
// placeholder); the simulator answers 400 to a decode leg on a prefill
// engine and to a prefill leg on a decode engine, so that a misrouted leg
// shows. Without a Role, kv_transfer_params are ignored (no connector).
type PDConfig struct {
	// Role is prefill, decode or both; "" means no KV connector.
	Role string
	// Link names the interconnect (pd.Links: nvlink, infiniband, roce,
	// tcp; default infiniband); LinkGBps overrides it in GB/s.
	Link     string
	LinkGBps float64
	// Model is the model's KV shape (default pd.Llama31_8B).
	Model pd.Shape
	// EngineID is remote_engine_id (default a random id, as vLLM's uuid).
	EngineID string
	// SideChannelHost and SideChannelPort are remote_host and remote_port
	// (vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST and _PORT: "localhost", 5600;
	// the port plus the data-parallel rank).
	SideChannelHost string
	SideChannelPort int
}

// pdState is a Server's resolved PDConfig.
type pdState struct {
	cfg           PDConfig
	bytesPerToken float64
	bandwidth     float64 // bytes/s
}

func (c PDConfig) resolve(rank int) (*pdState, error) {
	switch c.Role {
	case "":
		return nil, nil
	case RolePrefill, RoleDecode, RoleBoth:
	default:
		return nil, fmt.Errorf("pd role %q: want prefill, decode or both", c.Role)
	}
	rule, err := pd.Rule{Link: c.Link, LinkGBps: c.LinkGBps, Model: c.Model}.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("pd: %w", err)
	}
	if c.EngineID == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		c.EngineID = hex.EncodeToString(b[:])
	}
	if c.SideChannelHost == "" {
		c.SideChannelHost = "localhost"
	}
	if c.SideChannelPort == 0 {
		c.SideChannelPort = 5600
	}
	c.SideChannelPort += rank
	c.Link, c.Model = rule.Link, rule.Model
	return &pdState{cfg: c, bytesPerToken: rule.Model.BytesPerToken(), bandwidth: rule.Bandwidth()}, nil
}

// transferTime is the wall time of pulling tokens tokens' KV.
func (p *pdState) transferTime(tokens int) time.Duration {
	return time.Duration(pd.TransferSeconds(tokens, p.bytesPerToken, p.bandwidth) * float64(time.Second))
}

// errWrongRole marks a leg sent to an engine of the other role.
var errWrongRole = errors.New("kv_transfer_params do not fit this engine's role")

// legs reads kv_transfer_params: remoteDecode for a prefill leg,
// remoteKV for a decode leg with complete remote fields.
func (s *Server) legs(r *genRequest) (remoteDecode, remoteKV bool, err error) {
	if s.pd == nil || r.KVTransferParams == nil {
		return false, false, nil
	}
	p := r.KVTransferParams
	remoteDecode, _ = p["do_remote_decode"].(bool)
	remotePrefill, _ := p["do_remote_prefill"].(bool)
	role := s.pd.cfg.Role
	switch {
	case remoteDecode && role == RoleDecode:
		return false, false, fmt.Errorf("%w: do_remote_decode sent to a decode engine", errWrongRole)
	case remotePrefill && role == RolePrefill:
		return false, false, fmt.Errorf("%w: do_remote_prefill sent to a prefill engine", errWrongRole)
	}
	if remotePrefill {
		ids, _ := p["remote_block_ids"].([]any)
		remoteKV = len(ids) > 0
		for _, k := range []string{"remote_engine_id", "remote_request_id", "remote_host", "remote_port"} {
			if p[k] == nil {
				remoteKV = false
			}
		}
	}
	return remoteDecode, remoteKV, nil
}

// transferParams is a prefill leg's answer (NixlConnectorScheduler.
// request_finished): the decode engine's instructions for the pull.
func (s *Server) transferParams(requestID string, blocks []int32, promptTokens int) map[string]any {
	ids := make([]int, len(blocks))
	for i, b := range blocks {
		ids[i] = int(b)
	}
	c := &s.pd.cfg
	return map[string]any{
		"do_remote_prefill": true,
		"do_remote_decode":  false,
		"remote_block_ids":  [][]int{ids},
		"remote_engine_id":  c.EngineID,
		"remote_request_id": requestID,
		"remote_host":       c.SideChannelHost,
		"remote_port":       c.SideChannelPort,
		"tp_size":           1,
		"remote_num_tokens": promptTokens,
	}
}

// startTransfers charges each new transfer's time on the engine's clock
// and then tells the loop the KV arrived; a transfer of nothing completes
// at once. Called by the loop only.
func (e *engine) startTransfers(ctx context.Context, ts []Transfer) {
	for _, t := range ts {
		var d time.Duration
		if e.pd != nil {
			d = e.pd.transferTime(t.Tokens)
		}
		if d <= 0 {
			e.core.Received(t.ID)
			continue
		}
		e.m.kvTransfer.Observe(d.Seconds())
		id, epoch := t.ID, e.epoch
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			select {
			case <-e.clock.After(d):
			case <-ctx.Done():
				return
			}
			_ = e.send(ctx, command{received: id, epoch: epoch})
		}()
	}
}

// ParseKVTransferConfig reads vLLM's --kv-transfer-config JSON (its
// KVTransferConfig fields kv_connector, kv_role, engine_id; others are
// accepted and ignored) into a PDConfig's Role and EngineID: kv_producer
// is prefill, kv_consumer decode, kv_both both. "" is no connector. Only
// NixlConnector is simulated.
func ParseKVTransferConfig(s string) (PDConfig, error) {
	if s == "" {
		return PDConfig{}, nil
	}
	var c struct {
		Connector string `json:"kv_connector"`
		Role      string `json:"kv_role"`
		EngineID  string `json:"engine_id"`
	}
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return PDConfig{}, fmt.Errorf("--kv-transfer-config: %w", err)
	}
	if c.Connector != "NixlConnector" {
		return PDConfig{}, fmt.Errorf("--kv-transfer-config: kv_connector %q: only NixlConnector is simulated", c.Connector)
	}
	role, ok := map[string]string{"kv_producer": RolePrefill, "kv_consumer": RoleDecode, "kv_both": RoleBoth}[c.Role]
	if !ok {
		return PDConfig{}, fmt.Errorf("--kv-transfer-config: kv_role %q: want kv_producer, kv_consumer or kv_both", c.Role)
	}
	return PDConfig{Role: role, EngineID: c.EngineID}, nil
}

// ParseShape reads a model KV shape "layers,kv_heads,head_dim,dtype_bytes",
// e.g. "32,8,128,2" (Llama-3.1-8B in bf16).
func ParseShape(s string) (pd.Shape, error) {
	var sh pd.Shape
	parts := strings.Split(s, ",")
	if len(parts) != 4 {
		return sh, fmt.Errorf("model shape %q: want layers,kv_heads,head_dim,dtype_bytes", s)
	}
	vals := []*int{&sh.Layers, &sh.KVHeads, &sh.HeadDim, &sh.DTypeBytes}
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil {
			return sh, fmt.Errorf("model shape %q: %w", s, err)
		}
		*vals[i] = n
	}
	return sh, sh.Validate()
}
