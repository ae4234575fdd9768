package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"kvrouter/internal/vllm"
)

const blockhashSynopsis = "--algo ALGO --seed SEED --block-size N [--lora NAME] [--cache-salt S] [--mm ID:OFFSET:LENGTH ...] < tokens.json"

// runBlockhash implements "kvrouter blockhash": it reads a JSON array of
// token ids on stdin and prints vLLM's prefix-cache block hashes for them,
//
//	{"none_hash":"hex","digests":["hex",...],"event_values":["decimal",...]}
//
// one digest per full block (a trailing partial block has none), event
// values as the decimal uint64 a KV event carries. With the engine's
// --prefix-caching-hash-algo and PYTHONHASHSEED it reproduces the engine's
// hashes; without --seed NONE_HASH is random, like an engine with
// PYTHONHASHSEED unset.
func runBlockhash(ctx context.Context, args []string, sio stdio) error {
	fs := newFlagSet("blockhash", blockhashSynopsis, sio.err)
	algoFlag := fs.String("algo", string(vllm.HashSHA256), "hash algorithm, as vLLM's --prefix-caching-hash-algo: sha256, sha256_cbor, xxhash or xxhash_cbor")
	seed := fs.String("seed", "", "the engine's PYTHONHASHSEED string; empty means unset (random NONE_HASH)")
	blockSize := fs.Int("block-size", 16, "block size in tokens (the engine's, see vllm:cache_config_info)")
	lora := fs.String("lora", "", "LoRA adapter name, if the request used one")
	salt := fs.String("cache-salt", "", "the request's cache_salt")
	var mm []vllm.MMFeature
	fs.Func("mm", "a multimodal item as IDENTIFIER:OFFSET:LENGTH (its mm hash and placeholder range, as the render endpoint's features give them); repeat in prompt order", func(v string) error {
		f, err := parseMMFlag(v)
		if err == nil {
			mm = append(mm, f)
		}
		return err
	})
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	algo, err := vllm.ParseHashAlgo(*algoFlag)
	if err != nil {
		return fmt.Errorf("%w: --algo: %v", errUsage, err)
	}
	if *blockSize <= 0 {
		return fmt.Errorf("%w: --block-size must be positive, got %d", errUsage, *blockSize)
	}
	var tokens []uint32
	dec := json.NewDecoder(sio.in)
	if err := dec.Decode(&tokens); err != nil {
		return fmt.Errorf("read token ids (a JSON array of non-negative ints) from stdin: %w", err)
	}
	if dec.More() {
		return fmt.Errorf("read token ids from stdin: unexpected data after the array")
	}
	h, err := vllm.NewBlockHasher(algo, *seed, nil)
	if err != nil {
		return err
	}
	for i, f := range mm {
		if f.Offset+f.Length > len(tokens) || i > 0 && f.Offset < mm[i-1].Offset+mm[i-1].Length {
			return fmt.Errorf("%w: --mm %s:%d:%d: want ranges in prompt order, disjoint, inside the %d tokens", errUsage, f.Identifier, f.Offset, f.Length, len(tokens))
		}
	}
	out := vllm.HashPromptText(h, tokens, *blockSize, vllm.RequestKeys{LoRAName: *lora, CacheSalt: *salt, MM: mm})
	return json.NewEncoder(sio.out).Encode(out)
}

// parseMMFlag reads IDENTIFIER:OFFSET:LENGTH; the identifier may hold
// colons ("<lora>:<hash>"), so the numbers are taken from the right.
func parseMMFlag(v string) (vllm.MMFeature, error) {
	rest, ln, ok1 := cutLast(v)
	id, off, ok2 := cutLast(rest)
	o, err1 := strconv.Atoi(off)
	n, err2 := strconv.Atoi(ln)
	if !ok1 || !ok2 || id == "" || err1 != nil || err2 != nil || o < 0 || n < 1 {
		return vllm.MMFeature{}, fmt.Errorf("want IDENTIFIER:OFFSET:LENGTH with OFFSET >= 0 and LENGTH >= 1, got %q", v)
	}
	return vllm.MMFeature{Identifier: id, Offset: o, Length: n}, nil
}

func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}
