package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
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
