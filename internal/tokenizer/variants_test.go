package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"sync"
	"testing"
)

// Variant tokenizers exercise components Qwen3 does not use (Llama-3's
// digit pattern, ignore_merges and BOS template, GPT-2's ByteLevel regex
// and prefix space, RobertaProcessing, Split behaviors, added-token
// flags). Each is built from the vendored Qwen3 tokenizer cut down to its
// first smallMerges merges (every merge's parts come from earlier merges,
// so the cut is a valid BPE), with components replaced. The expected ids
// in variantGolden come from Hugging Face tokenizers 0.23.2 (npm
// "tokenizers", its Rust core) run on the same JSON that variantJSON
// produces; docs/tokenizer.md says how to regenerate them.

const smallMerges = 3000

var qwenRaw = sync.OnceValues(func() (map[string]json.RawMessage, error) {
	data, err := readMaybeGzip(qwenDir + "/tokenizer.json.gz")
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	return m, json.Unmarshal(data, &m)
})

type qwenModel struct {
	Vocab  map[string]uint32 `json:"vocab"`
	Merges [][2]string       `json:"merges"`
}

var qwenModelJSON = sync.OnceValues(func() (*qwenModel, error) {
	raw, err := qwenRaw()
	if err != nil {
		return nil, err
	}
	var m qwenModel
	return &m, json.Unmarshal(raw["model"], &m)
})

// smallQwen returns the cut-down Qwen3 tokenizer.json as a generic map.
func smallQwen(tb testing.TB) map[string]any {
	tb.Helper()
	raw, err := qwenRaw()
	if err != nil {
		tb.Fatal(err)
	}
	model, err := qwenModelJSON()
	if err != nil {
		tb.Fatal(err)
	}
	vocab := map[string]uint32{}
	for tok, id := range model.Vocab {
		if len([]rune(tok)) == 1 && id < 256 {
			vocab[tok] = id
		}
	}
	merges := slices.Clone(model.Merges[:smallMerges])
	for _, m := range merges {
		vocab[m[0]+m[1]] = model.Vocab[m[0]+m[1]]
	}
	out := map[string]any{}
	for k, v := range raw {
		if k != "model" {
			out[k] = v
		}
	}
	out["model"] = map[string]any{
		"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "",
		"end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
		"vocab": vocab, "merges": merges,
	}
	return out
}

func obj(kv ...any) map[string]any {
	m := map[string]any{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func byteLevel(prefix, regex bool) map[string]any {
	return obj("type", "ByteLevel", "add_prefix_space", prefix, "trim_offsets", false, "use_regex", regex)
}

func split(pattern map[string]any, behavior string, invert bool) map[string]any {
	return obj("type", "Split", "pattern", pattern, "behavior", behavior, "invert", invert)
}

// stringMerges rewrites the merges in the "a b" form.
func stringMerges(m map[string]any) {
	model := m["model"].(map[string]any)
	var s []string
	for _, p := range model["merges"].([][2]string) {
		s = append(s, p[0]+" "+p[1])
	}
	model["merges"] = s
}

// setAddedFlags changes the flags of the added token with content c.
func setAddedFlags(tb testing.TB, m map[string]any, content string, f func(t map[string]any)) {
	var list []map[string]any
	if err := json.Unmarshal(m["added_tokens"].(json.RawMessage), &list); err != nil {
		tb.Fatal(err)
	}
	for _, t := range list {
		if t["content"] == content {
			f(t)
		}
	}
	b, _ := json.Marshal(list)
	m["added_tokens"] = json.RawMessage(b)
}

// variantJSON builds the tokenizer.json of a named variant.
func variantJSON(tb testing.TB, name string) []byte {
	tb.Helper()
	m := smallQwen(tb)
	bos := obj("SpecialToken", obj("id", "<|endoftext|>", "type_id", 0))
	seqA := obj("Sequence", obj("id", "A", "type_id", 0))
	switch name {
	case "qwen":
	case "llama3":
		m["normalizer"] = nil
		m["pre_tokenizer"] = obj("type", "Sequence", "pretokenizers", []any{
			split(obj("Regex", llama3Pattern), "Isolated", false), byteLevel(false, false)})
		m["post_processor"] = obj("type", "Sequence", "processors", []any{
			byteLevel(true, false),
			obj("type", "TemplateProcessing", "single", []any{bos, seqA},
				"pair", []any{bos, seqA, bos, obj("Sequence", obj("id", "B", "type_id", 1))},
				"special_tokens", obj("<|endoftext|>", obj("id", "<|endoftext|>", "ids", []int{151643}, "tokens", []string{"<|endoftext|>"}))),
		})
		m["model"].(map[string]any)["ignore_merges"] = true
		stringMerges(m)
	case "gpt2":
		m["normalizer"] = nil
		m["pre_tokenizer"] = byteLevel(true, true)
		m["post_processor"] = obj("type", "RobertaProcessing", "sep", []any{"<|im_end|>", 151645},
			"cls", []any{"<|im_start|>", 151644}, "trim_offsets", true, "add_prefix_space", true)
		stringMerges(m)
		setAddedFlags(tb, m, "<think>", func(t map[string]any) { t["lstrip"] = true })
		setAddedFlags(tb, m, "</think>", func(t map[string]any) { t["rstrip"] = true })
		setAddedFlags(tb, m, "<tool_call>", func(t map[string]any) { t["single_word"] = true })
		setAddedFlags(tb, m, "</tool_call>", func(t map[string]any) { t["lstrip"], t["rstrip"] = true, true })
	case "normalized":
		// NFC normalizer; normalized added tokens are matched after
		// normalization (the "<tool_résponse>" content is decomposed).
		m["normalizer"] = obj("type", "Sequence", "normalizers", []any{obj("type", "NFC"),
			obj("type", "Replace", "pattern", obj("String", "``"), "content", "\""),
			obj("type", "Strip", "strip_left", true, "strip_right", false)})
		setAddedFlags(tb, m, "<think>", func(t map[string]any) { t["normalized"] = true; t["single_word"] = true })
		setAddedFlags(tb, m, "<tool_response>", func(t map[string]any) {
			t["normalized"] = true
			t["content"] = "<tool_re\u0301sponse>"
		})
		setAddedFlags(tb, m, "</tool_response>", func(t map[string]any) { t["normalized"] = true; t["lstrip"] = true })
	default:
		// Split behaviors: "<behavior>" or "<behavior>-invert".
		behavior, invert := name, false
		if n := len(name) - len("-invert"); n > 0 && name[n:] == "-invert" {
			behavior, invert = name[:n], true
		}
		m["pre_tokenizer"] = obj("type", "Sequence", "pretokenizers", []any{
			split(obj("Regex", `\s+|[,.]`), behavior, invert),
			split(obj("String", "ab"), "Isolated", false),
			byteLevel(false, true)})
	}
	b, err := json.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

var variantNames = []string{"qwen", "llama3", "gpt2", "normalized",
	"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous",
	"Isolated-invert", "Removed-invert", "MergedWithPrevious-invert", "MergedWithNext-invert", "Contiguous-invert"}

// variantTexts exercise the variants' features.
var variantTexts = []string{
	"",
	"Hello world",
	" Hello, world! It's 2024; I'd've said 12345678 things.",
	"it'S THEY'RE we'Ll I'M",
	"  leading and trailing  ",
	"tabs\tand\nnewlines\r\n\n  end",
	"12345 67 8901234",
	"café naïve e\u0301 ``quoted``",
	"中文字符和日本語のテキスト",
	"<think>reasoning</think>answer",
	"a <think> b </think> c",
	"x<tool_call>y <tool_call> z</tool_call> w",
	"  <think>  \n </think>  ",
	"<tool_résponse>ok</tool_response>",
	"<tool_re\u0301sponse> and <tool_response> and  </tool_response>",
	"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
	"ab,cd. ef  gh,ab.ab",
	"a,b,,c..d  e",
	",,,   ...",
	"<think>",
	"   <think>",
	"_<think>_ x<think>1",
	"\u00a0nbsp\u3000ideographic\u2028sep",
	"emoji 😀👍🏽 and ſ'ſ it'ſ",
}

type variantCase struct {
	text    int // index into variantTexts
	special bool
	ids     []uint32
	decoded string
}

// TestVariantsDump writes each variant's tokenizer.json and texts for the
// Hugging Face oracle (see docs/tokenizer.md); it runs only with
// KVROUTER_TOKENIZER_DUMP set to an output directory.
func TestVariantsDump(t *testing.T) {
	dir := os.Getenv("KVROUTER_TOKENIZER_DUMP")
	if dir == "" {
		t.Skip("KVROUTER_TOKENIZER_DUMP not set")
	}
	for _, name := range variantNames {
		if err := os.WriteFile(dir+"/"+name+".json", variantJSON(t, name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	texts, _ := json.Marshal(variantTexts)
	if err := os.WriteFile(dir+"/texts.json", texts, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestVariants compares every variant with Hugging Face, with and without
// special tokens, for Encode and Decode.
func TestVariants(t *testing.T) {
	for _, name := range variantNames {
		t.Run(name, func(t *testing.T) {
			cases, ok := variantGolden[name]
			if !ok || len(cases) != 2*len(variantTexts) {
				t.Fatalf("variantGolden[%q] has %d cases, want %d", name, len(cases), 2*len(variantTexts))
			}
			tok, err := Parse(variantJSON(t, name), nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cases {
				text := variantTexts[c.text]
				got := tok.Encode(text, c.special)
				if !slices.Equal(got, c.ids) {
					t.Errorf("Encode(%q, %v)\n got %v\nwant %v", text, c.special, got, c.ids)
				}
				if dec := tok.Decode(c.ids); dec != c.decoded {
					t.Errorf("Decode(%v) = %q, want %q", c.ids, dec, c.decoded)
				}
			}
		})
	}
}
