package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"kvrouter/internal/vllm"
)

// TestBlockhashGolden runs "kvrouter blockhash" in-process on every golden
// case of testdata/vllm/blockhash.json that the command can express (no
// multimodal items) and compares its JSON with the golden digests and event
// values.
func TestBlockhashGolden(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/vllm/blockhash.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Name      string          `json:"name"`
		Algo      string          `json:"algo"`
		Seed      string          `json:"pythonhashseed"`
		BlockSize int             `json:"block_size"`
		Tokens    json.RawMessage `json:"tokens"`
		Request   struct {
			LoRAName  *string `json:"lora_name"`
			CacheSalt *string `json:"cache_salt"`
			MM        []struct {
				ID     string `json:"identifier"`
				Offset int    `json:"offset"`
				Length int    `json:"length"`
			} `json:"mm_features"`
		} `json:"request"`
		NoneHash    string   `json:"none_hash_hex"`
		Digests     []string `json:"block_digests_hex"`
		EventValues []string `json:"event_values"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, c := range cases {
		ran++
		t.Run(c.Name, func(t *testing.T) {
			args := []string{"blockhash", "--algo", c.Algo, "--seed", c.Seed, "--block-size", itoa(c.BlockSize)}
			if c.Request.LoRAName != nil {
				args = append(args, "--lora", *c.Request.LoRAName)
			}
			if c.Request.CacheSalt != nil {
				args = append(args, "--cache-salt", *c.Request.CacheSalt)
			}
			for _, f := range c.Request.MM {
				args = append(args, "--mm", fmt.Sprintf("%s:%d:%d", f.ID, f.Offset, f.Length))
			}
			var out, errb bytes.Buffer
			if code := run(context.Background(), args, stdio{bytes.NewReader(c.Tokens), &out, &errb}); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			var got vllm.PromptHashes
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatalf("output %q: %v", out.String(), err)
			}
			want := vllm.PromptHashes{NoneHash: c.NoneHash, Digests: c.Digests, EventValues: c.EventValues}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("\n got %+v\nwant %+v", got, want)
			}
			if !strings.HasPrefix(out.String(), `{"none_hash":"`) || strings.Count(out.String(), "\n") != 1 {
				t.Errorf("output is not one JSON line in the documented key order: %q", out.String())
			}
		})
	}
	if ran < 25 {
		t.Errorf("only %d golden cases ran", ran)
	}
}

func TestBlockhashErrors(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		stdin string
		code  int
		msg   string
	}{
		{"bad algo", []string{"--algo", "builtin"}, "[1]", 2, "unknown hash algorithm"},
		{"bad block size", []string{"--block-size", "0"}, "[1]", 2, "--block-size"},
		{"extra arg", []string{"x"}, "[1]", 2, "unexpected arguments"},
		{"not an array", []string{"--seed", "0"}, `{"a":1}`, 1, "read token ids"},
		{"negative token", []string{"--seed", "0"}, `[1,-2]`, 1, "read token ids"},
		{"trailing data", []string{"--seed", "0"}, `[1] [2]`, 1, "after the array"},
		{"bad mm", []string{"--mm", "abc:1"}, "[1]", 2, "IDENTIFIER:OFFSET:LENGTH"},
		{"mm zero length", []string{"--mm", "abc:0:0"}, "[1]", 2, "LENGTH >= 1"},
		{"mm past the prompt", []string{"--mm", "abc:0:5"}, "[1,2]", 2, "inside the 2 tokens"},
		{"mm overlapping", []string{"--mm", "a:0:2", "--mm", "b:1:1"}, "[1,2,3]", 2, "disjoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), append([]string{"blockhash"}, tt.args...), stdio{strings.NewReader(tt.stdin), &out, &errb})
			if code != tt.code || !strings.Contains(errb.String(), tt.msg) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errb.String(), tt.code, tt.msg)
			}
		})
	}
	// Unset seed: random NONE_HASH of 32 bytes, partial block gives nothing.
	var out bytes.Buffer
	if code := run(context.Background(), []string{"blockhash", "--algo", "xxhash"}, stdio{strings.NewReader("[1,2,3]"), &out, &out}); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	var got vllm.PromptHashes
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || len(got.NoneHash) != 64 || got.Digests == nil || len(got.Digests) != 0 {
		t.Errorf("unset seed output %q (%v)", out.String(), err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
