package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/enginesim"
)

// TestEngineSimHelp: --help documents every flag, and each has usage text.
func TestEngineSimHelp(t *testing.T) {
	var out bytes.Buffer
	_, err := parseEngineSimFlags([]string{"--help"}, func(string) string { return "" }, stdio{err: &out})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, name := range []string{
		"host", "port", "served-model-name", "block-size", "num-gpu-blocks-override", "num-cpu-blocks",
		"max-num-seqs", "max-num-batched-tokens", "max-model-len", "kv-events-config", "prefix-caching-hash-algo",
		"tokenizer", "lora-modules", "legacy-events", "profile", "fault-error-rate", "fault-drop-every-k-batches",
		"fault-slow-start", "fault-hang-rate", "fault-die-rate", "fault-spike-rate", "data-parallel-rank",
		"kv-events-bind", "kv-events-buffer-bytes", "kv-events-queue-bytes",
	} {
		if !strings.Contains(out.String(), "  -"+name+" ") && !strings.Contains(out.String(), "  -"+name+"\n") {
			t.Errorf("--help lacks -%s", name)
		}
	}
	if !strings.Contains(out.String(), "PYTHONHASHSEED") {
		t.Error("--help does not mention PYTHONHASHSEED")
	}
}

func TestEngineSimFlags(t *testing.T) {
	env := map[string]string{"PYTHONHASHSEED": "0"}
	fl, err := parseEngineSimFlags([]string{
		"--host", "127.0.0.1", "--port", "0", "--served-model-name", "m", "--block-size", "32",
		"--num-gpu-blocks-override", "5000", "--max-model-len", "8192", "--max-num-seqs", "64",
		"--kv-events-config", `{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","topic":"t"}`,
		"--prefix-caching-hash-algo", "sha256_cbor", "--lora-modules", "ad=/path", "--enable-prompt-tokens-details=false",
		"--kv-events-buffer-bytes", "1048576", "--shutdown-timeout", "30",
	}, func(k string) string { return env[k] }, stdio{err: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	c := fl.cfg
	if c.Addr != "127.0.0.1:0" || c.ServedModelName != "m" || c.Core.BlockSize != 32 || c.Core.NumGPUBlocks != 5000 ||
		c.Core.MaxModelLen != 8192 || c.Core.MaxNumSeqs != 64 || !c.KVEvents.EnableKVCacheEvents || c.KVEvents.Topic != "t" ||
		c.HashAlgo != "sha256_cbor" || len(c.LoRAModules) != 1 || c.LoRAModules[0] != "ad" || !c.NoPromptTokensDetails ||
		c.KVEvents.BufferBytes != 1<<20 || c.KVEvents.QueueBytes != enginesim.DefaultQueueBytes || c.ShutdownTimeout != 30*time.Second {
		t.Fatalf("config %+v", c)
	}
	// PYTHONHASHSEED=0 makes the hasher vLLM's seeded one: NONE_HASH of "0".
	h, err := c.NewHasher()
	if err != nil {
		t.Fatal(err)
	}
	a, b := h.HashBlock(nil, []uint32{1, 2}, nil), h.HashBlock(nil, []uint32{1, 2}, nil)
	if !bytes.Equal(a, b) || len(a) != 32 {
		t.Fatalf("seeded sha256_cbor hasher: %x %x", a, b)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--prefix-caching-hash-algo", "md5"}, `"md5": want sha256, sha256_cbor, xxhash, xxhash_cbor or fast`},
		{[]string{"--kv-events-config", `{"nope":1}`}, ""},
		{[]string{"--port", "x"}, ""},
		{[]string{"--port", "-5"}, "--port -5: want 0..65535"},
		{[]string{"--port", "65536"}, "--port 65536"},
		{[]string{"--shutdown-timeout", "-1"}, "--shutdown-timeout -1: want seconds >= 0"},
		{[]string{"--kv-events-buffer-bytes", "0"}, "--kv-events-buffer-bytes 0"},
		{[]string{"--kv-events-queue-bytes", "-1"}, "--kv-events-queue-bytes -1"},
		{[]string{"extra"}, ""},
	} {
		_, err := parseEngineSimFlags(bad.args, func(string) string { return "" }, stdio{err: io.Discard})
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want a usage error with %q", bad.args, err, bad.want)
		}
	}
	// Through run(), as main: usage errors exit 2.
	var errb bytes.Buffer
	if code := run(context.Background(), []string{"engine-sim", "--port", "-5"}, stdio{out: io.Discard, err: &errb}); code != 2 {
		t.Errorf("--port -5: exit %d, want 2 (%s)", code, errb.String())
	}
}

// TestEngineSimKVEventsBindFlag: --kv-events-bind sets the KV events
// config's bind (the PUB's part is test/e2e's TestEngineSimKVEventsBind).
func TestEngineSimKVEventsBindFlag(t *testing.T) {
	kv := `{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:0","replay_endpoint":"tcp://127.0.0.1:0"}`
	for _, bind := range []bool{false, true} {
		args := []string{"--kv-events-config", kv}
		if bind {
			args = append(args, "--kv-events-bind")
		}
		fl, err := parseEngineSimFlags(args, func(string) string { return "" }, stdio{err: io.Discard})
		if err != nil || fl.cfg.KVEvents.Bind != bind {
			t.Fatalf("%q: bind %v, %v", args, fl.cfg.KVEvents.Bind, err)
		}
	}
}

// TestEngineSimTokenizer: --tokenizer plugs the real tokenizer and chat
// template in; a golden chat gives the golden ids.
func TestEngineSimTokenizer(t *testing.T) {
	fl, err := parseEngineSimFlags([]string{"--tokenizer", "../../testdata/tokenizer/qwen3"}, func(string) string { return "" }, stdio{err: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := fl.cfg.Tokenizer.EncodeChat([]byte(`{"messages":[{"role":"user","content":"Hello!"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []uint32{151644, 872, 198, 9707, 0, 151645, 198, 151644, 77091, 198} // testdata/tokenizer/qwen3/chat.jsonl
	if !slices.Equal(ids, want) || fl.cfg.Core.VocabSize != 262144 {
		t.Fatalf("ids %v, want %v (vocab %d)", ids, want, fl.cfg.Core.VocabSize)
	}
}
