package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLoadPaths(t *testing.T) {
	small := variantJSON(t, "qwen")
	cfg := []byte(`{"bos_token": null, "eos_token": "<|im_end|>", "chat_template": "{{ x }}"}`)
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var gz strings.Builder
	zw := gzip.NewWriter(&gz)
	zw.Write(small)
	zw.Close()
	write("plain/tokenizer.json", small)
	write("plain/tokenizer_config.json", cfg)
	write("gz/tokenizer.json.gz", []byte(gz.String()))
	write("noconfig/tokenizer.json", small)
	write("empty/README", nil)
	for _, c := range []struct {
		name, path string
		wantEOS    string
		wantErr    string
	}{
		{"dir plain", filepath.Join(dir, "plain"), "<|im_end|>", ""},
		{"file plain", filepath.Join(dir, "plain/tokenizer.json"), "<|im_end|>", ""},
		{"dir gz", filepath.Join(dir, "gz"), "", ""},
		{"file gz", filepath.Join(dir, "gz/tokenizer.json.gz"), "", ""},
		{"no config", filepath.Join(dir, "noconfig"), "", ""},
		{"missing", filepath.Join(dir, "nope"), "", "no such file"},
		{"empty dir", filepath.Join(dir, "empty"), "", "no tokenizer.json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tok, err := Load(c.path)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := tok.Config().EOSToken; got != c.wantEOS {
				t.Errorf("EOSToken = %q, want %q", got, c.wantEOS)
			}
			if got := tok.Encode("Hello world", false); len(got) == 0 {
				t.Error("no ids")
			}
		})
	}
}

// TestParseGzip: Parse takes tokenizer.json gzipped (as embedded in the
// binary) or plain, with or without tokenizer_config.json.
func TestParseGzip(t *testing.T) {
	small := variantJSON(t, "qwen")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(small)
	zw.Close()
	cfg := []byte(`{"eos_token": "<|im_end|>"}`)
	a, err := Parse(gz.Bytes(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse(small, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := a.Encode("Hello world", false), b.Encode("Hello world", false); !slices.Equal(got, want) || len(got) == 0 {
		t.Errorf("gzip %v, plain %v", got, want)
	}
	if a.Config().EOSToken != "<|im_end|>" || b.Config().Raw != nil {
		t.Errorf("configs %+v %+v", a.Config(), b.Config())
	}
}

// TestUnsupportedComponents: anything not implemented is a load error
// naming the component; several are reported together.
func TestUnsupportedComponents(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(m map[string]any)
		want   []string
	}{
		{"model WordPiece", func(m map[string]any) { m["model"].(map[string]any)["type"] = "WordPiece" }, []string{`model: type "WordPiece" not supported`}},
		{"dropout", func(m map[string]any) { m["model"].(map[string]any)["dropout"] = 0.1 }, []string{"model: BPE dropout"}},
		{"byte_fallback", func(m map[string]any) { m["model"].(map[string]any)["byte_fallback"] = true }, []string{"model: BPE byte_fallback"}},
		{"subword prefix", func(m map[string]any) { m["model"].(map[string]any)["continuing_subword_prefix"] = "##" }, []string{"continuing_subword_prefix"}},
		{"merge not in vocab", func(m map[string]any) {
			model := m["model"].(map[string]any)
			model["merges"] = append(model["merges"].([][2]string), [2]string{"Ġ", "qqqq"})
		}, []string{"model: merges[3000]", "not in vocab"}},
		{"missing byte", func(m map[string]any) { delete(m["model"].(map[string]any)["vocab"].(map[string]uint32), "Ġ") }, []string{"not a byte-level BPE"}},
		{"normalizer Lowercase", func(m map[string]any) { m["normalizer"] = obj("type", "Lowercase") }, []string{`normalizer: type "Lowercase" not supported`}},
		{"normalizer Replace regex", func(m map[string]any) {
			m["normalizer"] = obj("type", "Replace", "pattern", obj("Regex", "a+"), "content", "b")
		}, []string{"normalizer: Replace: only a String pattern"}},
		{"pre_tokenizer Whitespace", func(m map[string]any) { m["pre_tokenizer"] = obj("type", "Whitespace") }, []string{`pre_tokenizer: type "Whitespace" not supported`}},
		{"pre_tokenizer Metaspace in Sequence", func(m map[string]any) {
			m["pre_tokenizer"] = obj("type", "Sequence", "pretokenizers", []any{obj("type", "Metaspace"), byteLevel(false, true)})
		}, []string{`pre_tokenizer: Sequence[0]: type "Metaspace" not supported`}},
		{"no ByteLevel", func(m map[string]any) {
			m["pre_tokenizer"] = split(obj("Regex", `\s+`), "Isolated", false)
		}, []string{"pre_tokenizer: no ByteLevel step"}},
		{"step after ByteLevel", func(m map[string]any) {
			m["pre_tokenizer"] = obj("type", "Sequence", "pretokenizers", []any{byteLevel(false, false), split(obj("String", " "), "Isolated", false)})
		}, []string{"after ByteLevel"}},
		{"bad behavior", func(m map[string]any) {
			m["pre_tokenizer"] = obj("type", "Sequence", "pretokenizers", []any{split(obj("String", " "), "Sideways", false), byteLevel(false, false)})
		}, []string{`behavior "Sideways"`}},
		{"bad regex", func(m map[string]any) {
			m["pre_tokenizer"] = obj("type", "Sequence", "pretokenizers", []any{split(obj("Regex", "(a"), "Isolated", false), byteLevel(false, false)})
		}, []string{"pre_tokenizer: Sequence[0]: Split: regex"}},
		{"decoder WordPiece", func(m map[string]any) { m["decoder"] = obj("type", "WordPiece") }, []string{`decoder: type "WordPiece" not supported`}},
		{"decoder missing", func(m map[string]any) { m["decoder"] = nil }, []string{"decoder: missing"}},
		{"post BertProcessing bad", func(m map[string]any) { m["post_processor"] = obj("type", "BertProcessing", "sep", []any{"x"}) }, []string{"post_processor: BertProcessing"}},
		{"post unknown", func(m map[string]any) { m["post_processor"] = obj("type", "Fancy") }, []string{`post_processor: type "Fancy" not supported`}},
		{"truncation", func(m map[string]any) { m["truncation"] = obj("max_length", 512) }, []string{"truncation: not supported"}},
		{"padding", func(m map[string]any) { m["padding"] = obj("strategy", "BatchLongest") }, []string{"padding: not supported"}},
		{"several at once", func(m map[string]any) {
			m["normalizer"] = obj("type", "BertNormalizer")
			m["decoder"] = obj("type", "Metaspace")
		}, []string{`normalizer: type "BertNormalizer"`, `decoder: type "Metaspace"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := smallQwen(t)
			c.mutate(m)
			data, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Parse(data, nil)
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParseMalformed(t *testing.T) {
	for _, in := range []string{"", "{", "[]", `{"model": 3}`, "\x1f\x8b\x08garbage"} {
		if _, err := Parse([]byte(in), nil); err == nil {
			t.Errorf("Parse(%q) succeeded", in)
		}
	}
}

// tinyJSON is a minimal byte-level BPE tokenizer.json (256 byte symbols,
// a few merges, one added token) with the given pre_tokenizer and
// post_processor, used to seed FuzzParse.
func tinyJSON(tb testing.TB, pre, post any) []byte {
	tb.Helper()
	vocab := map[string]int{}
	for b := range 256 {
		vocab[string(byteToChar[b])] = b
	}
	merges := [][2]string{{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}}
	for i, m := range merges {
		vocab[m[0]+m[1]] = 256 + i
	}
	m := obj("version", "1.0", "truncation", nil, "padding", nil,
		"added_tokens", []any{obj("id", 260, "content", "<|x|>", "single_word", false, "lstrip", false, "rstrip", false, "normalized", false, "special", true)},
		"normalizer", obj("type", "NFC"), "pre_tokenizer", pre, "post_processor", post,
		"decoder", byteLevel(false, true),
		"model", obj("type", "BPE", "vocab", vocab, "merges", merges, "ignore_merges", false))
	b, err := json.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestTinyTokenizer(t *testing.T) {
	tok, err := Parse(tinyJSON(t, byteLevel(false, true), nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	// " the" -> Ġthe (259); "in" -> 259+... ; "<|x|>" is the added token.
	if got, want := tok.Encode(" the<|x|>in", true), []uint32{258, 260, 259}; !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	if got := tok.Decode([]uint32{258, 260, 259}); got != " the<|x|>in" {
		t.Errorf("Decode = %q", got)
	}
}

// FuzzParse: Parse never panics on malformed tokenizer.json or
// tokenizer_config.json, and whatever it accepts encodes and decodes
// without panicking. The fuzzed tokenizer.json bytes are a JSON object
// whose keys replace those of a tiny byte-level BPE (so inputs stay small
// and reach the component decoders); bytes that are not a JSON object are
// parsed as the whole file.
func FuzzParse(f *testing.F) {
	seed := func(kv ...any) []byte {
		b, _ := json.Marshal(obj(kv...))
		return b
	}
	bos := obj("SpecialToken", obj("id", "<|x|>", "type_id", 0))
	seqA := obj("Sequence", obj("id", "A", "type_id", 0))
	f.Add(seed("pre_tokenizer", byteLevel(false, true)), []byte(`{"bos_token": "<|x|>"}`))
	f.Add(seed("pre_tokenizer", obj("type", "Sequence", "pretokenizers", []any{split(obj("Regex", llama3Pattern), "Isolated", false), byteLevel(false, false)}),
		"post_processor", obj("type", "TemplateProcessing", "single", []any{bos, seqA}, "special_tokens", obj("<|x|>", obj("id", "<|x|>", "ids", []int{260})))), []byte(`{}`))
	f.Add(seed("pre_tokenizer", obj("type", "Sequence", "pretokenizers", []any{split(obj("String", " "), "MergedWithNext", true), byteLevel(true, true)}),
		"post_processor", obj("type", "RobertaProcessing", "sep", []any{"<|x|>", 260}, "cls", []any{"<|x|>", 260}),
		"normalizer", obj("type", "Sequence", "normalizers", []any{obj("type", "NFKC"), obj("type", "Strip", "strip_left", true)})), []byte(nil))
	f.Add(seed("added_tokens", []any{obj("id", 1, "content", "ab", "single_word", true, "lstrip", true, "rstrip", true, "normalized", true)}), []byte(`{"chat_template": [{"name": "a", "template": "b"}]}`))
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a a"]}}`), []byte(`{"eos_token": {"content": "x"}}`))
	var base map[string]any
	if err := json.Unmarshal(tinyJSON(f, byteLevel(false, true), nil), &base); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, tj, cj []byte) {
		var over map[string]json.RawMessage
		if json.Unmarshal(tj, &over) == nil {
			m := maps.Clone(base)
			for k, v := range over {
				m[k] = v
			}
			tj, _ = json.Marshal(m)
		}
		tok, err := Parse(tj, cj)
		if err != nil {
			return
		}
		for _, s := range []string{"", " the in<|x|>ab", "中文 1234 \n\n it's"} {
			tok.Decode(tok.Encode(s, true))
		}
		_ = tok.Config()
	})
}
