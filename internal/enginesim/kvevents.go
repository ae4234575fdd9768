package enginesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Defaults of KVEventsConfig's byte bounds, engine-sim's own (vLLM bounds
// its replay buffer and queue by counts only).
const (
	DefaultBufferBytes = 64 << 20 // replay buffer, 64 MiB
	DefaultQueueBytes  = 64 << 20 // batches waiting for the publisher, 64 MiB
)

// KVEventsConfig is vLLM's --kv-events-config, the same JSON
// (vllm/config/kv_events.py). A zero field means the default in its
// comment, filled in by ParseKVEventsConfig and Server.
type KVEventsConfig struct {
	// EnableKVCacheEvents turns publishing on (false).
	EnableKVCacheEvents bool `json:"enable_kv_cache_events"`
	// Publisher is "zmq" or "null"; "zmq" when events are enabled and this
	// is empty or "null" (vLLM picks zmq the same way).
	Publisher string `json:"publisher"`
	// Endpoint is the PUB socket ("tcp://*:5557"). Bound when it contains
	// "*" or "::" or is ipc:// or inproc://, otherwise connected (vLLM's
	// rule), so a subscriber may bind and let engines dial in.
	Endpoint string `json:"endpoint"`
	// ReplayEndpoint is the ROUTER socket for replay, always bound; empty
	// means no replay.
	ReplayEndpoint string `json:"replay_endpoint"`
	// BufferSteps is how many batches the replay buffer keeps (10000),
	// vLLM's only bound on it (a deque with maxlen=buffer_steps in
	// vllm/distributed/kv_events.py).
	BufferSteps int `json:"buffer_steps"`
	// HWM is the PUB send high-water mark in messages (100000); above it
	// batches are dropped silently.
	HWM int `json:"hwm"`
	// MaxQueueSize bounds batches waiting for the publisher (100000); when
	// full, new batches are dropped before they get a sequence number.
	MaxQueueSize int `json:"max_queue_size"`
	// BufferBytes bounds the replay buffer in bytes (DefaultBufferBytes):
	// encoded payloads plus a fixed 32 B per batch; the oldest batches are
	// dropped until both this bound and BufferSteps hold, but the newest
	// batch is always kept. Not a vLLM
	// setting (vLLM bounds its buffer by BufferSteps alone, so with long
	// prompts it holds buffer_steps batches of thousands of token ids
	// each), so it cannot be set from --kv-events-config JSON; the
	// command's --kv-events-buffer-bytes sets it.
	BufferBytes int64 `json:"-"`
	// QueueBytes bounds the batches waiting for the publisher in bytes
	// (DefaultQueueBytes), estimated from what they reference (4 B per
	// token id, 8 B per block hash, the event structs); a batch that does
	// not fit is dropped before it gets a sequence number, as when
	// MaxQueueSize is reached. Not a vLLM setting; the command's
	// --kv-events-queue-bytes sets it.
	QueueBytes int64 `json:"-"`
	// Topic is the first frame of every PUB message ("").
	Topic string `json:"topic"`
	// Bind makes the PUB socket bind even when Endpoint names a host, e.g.
	// "tcp://127.0.0.1:0" to listen on loopback only. Not a vLLM setting
	// (vLLM binds only for "*", "::", ipc:// and inproc://), so it cannot
	// be set from --kv-events-config JSON; the command's --kv-events-bind
	// sets it.
	Bind bool `json:"-"`
}

// bindPub reports whether the PUB socket binds: vLLM's rule, or Bind.
func (c KVEventsConfig) bindPub() bool {
	return c.Bind || shouldBind(c.Endpoint)
}

// ParseKVEventsConfig decodes --kv-events-config JSON strictly (unknown keys
// are errors, as vLLM's config validation) and fills in defaults.
func ParseKVEventsConfig(s string) (KVEventsConfig, error) {
	var c KVEventsConfig
	if strings.TrimSpace(s) != "" {
		dec := json.NewDecoder(bytes.NewReader([]byte(s)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return c, fmt.Errorf("kv-events-config: %w", err)
		}
	}
	return c.withDefaults()
}

func (c KVEventsConfig) withDefaults() (KVEventsConfig, error) {
	if c.Endpoint == "" {
		c.Endpoint = "tcp://*:5557"
	}
	if c.BufferSteps == 0 {
		c.BufferSteps = 10000
	}
	if c.HWM == 0 {
		c.HWM = 100000
	}
	if c.MaxQueueSize == 0 {
		c.MaxQueueSize = 100000
	}
	if c.BufferBytes == 0 {
		c.BufferBytes = DefaultBufferBytes
	}
	if c.QueueBytes == 0 {
		c.QueueBytes = DefaultQueueBytes
	}
	if c.EnableKVCacheEvents && (c.Publisher == "" || c.Publisher == "null") {
		c.Publisher = "zmq"
	}
	switch {
	case c.Publisher != "" && c.Publisher != "zmq" && c.Publisher != "null":
		return c, fmt.Errorf("kv-events-config: unknown publisher %q (zmq or null)", c.Publisher)
	case c.BufferSteps < 0 || c.HWM < 0 || c.MaxQueueSize < 0:
		return c, fmt.Errorf("kv-events-config: buffer_steps, hwm and max_queue_size must be positive")
	case c.BufferBytes < 0 || c.QueueBytes < 0:
		return c, fmt.Errorf("kv events: the replay buffer and queue byte bounds must not be negative, got %d and %d", c.BufferBytes, c.QueueBytes)
	}
	return c, nil
}

// enabled reports whether a ZeroMQ publisher runs.
func (c KVEventsConfig) enabled() bool { return c.EnableKVCacheEvents && c.Publisher == "zmq" }

// shouldBind is vLLM's rule for the PUB socket.
func shouldBind(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// offsetEndpoint is vLLM's offset_endpoint_port for data-parallel rank r:
// the port of a tcp endpoint plus r; inproc gets a "_dp<r>" suffix; ipc
// cannot be offset.
func offsetEndpoint(endpoint string, r int) (string, error) {
	if r == 0 || endpoint == "" {
		return endpoint, nil
	}
	switch {
	case strings.HasPrefix(endpoint, "inproc://"):
		return fmt.Sprintf("%s_dp%d", endpoint, r), nil
	case strings.HasPrefix(endpoint, "tcp://"):
		host, port, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
		if err != nil {
			return "", fmt.Errorf("endpoint %q: %w", endpoint, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return "", fmt.Errorf("endpoint %q: bad port", endpoint)
		}
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+r)), nil
	}
	return "", fmt.Errorf("endpoint %q cannot be offset for data-parallel rank %d", endpoint, r)
}

// goEndpoint rewrites a ZeroMQ wildcard address for Go's listener:
// tcp://*:p becomes tcp://0.0.0.0:p and tcp://[::]:p stays.
func goEndpoint(endpoint string) string {
	return strings.Replace(endpoint, "tcp://*:", "tcp://0.0.0.0:", 1)
}

// removeStaleIPC removes the socket file of an ipc:// endpoint that nobody
// listens on (left by a killed process), as libzmq does before binding
// ipc. A file that is not a socket, or a socket that accepts a connection
// (another live engine), is left alone: the bind then fails with
// "address already in use". Other endpoints are not touched.
func removeStaleIPC(endpoint string) error {
	path, ok := strings.CutPrefix(endpoint, "ipc://")
	if !ok {
		return nil
	}
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != fs.ModeSocket {
		return nil
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return nil
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale ipc socket %s: %w", path, err)
	}
	return nil
}
