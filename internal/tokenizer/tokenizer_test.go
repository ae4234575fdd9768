package tokenizer

import (
	"bufio"
	"encoding/json"
	"os"
	"slices"
	"sync"
	"testing"
)

const qwenDir = "../../testdata/tokenizer/qwen3"

// qwen loads the vendored Qwen3 tokenizer once per test binary.
var qwen = sync.OnceValues(func() (*Tokenizer, error) { return Load(qwenDir) })

func loadQwen(tb testing.TB) *Tokenizer {
	tb.Helper()
	tok, err := qwen()
	if err != nil {
		tb.Fatalf("Load(%s): %v", qwenDir, err)
	}
	return tok
}

type goldenCase struct {
	Text              string   `json:"text"`
	IDs               []uint32 `json:"ids"`
	IDsCurrentUnicode []uint32 `json:"ids_current_unicode"`
	Note              string   `json:"note"`
}

func readJSONL(tb testing.TB, name string) []goldenCase {
	tb.Helper()
	f, err := os.Open(name)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []goldenCase
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var c goldenCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			tb.Fatalf("%s line %d: %v", name, len(out)+1, err)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// TestEncodeGolden checks every reference case from Hugging Face
// tokenizers 0.23.2 (add_special_tokens=false) id for id.
func TestEncodeGolden(t *testing.T) {
	tok := loadQwen(t)
	cases := readJSONL(t, qwenDir+"/encode.jsonl")
	if len(cases) != 464 {
		t.Fatalf("encode.jsonl has %d cases, want 464", len(cases))
	}
	failed := 0
	for i, c := range cases {
		got := tok.Encode(c.Text, false)
		if !slices.Equal(got, c.IDs) {
			failed++
			if failed <= 20 {
				t.Errorf("case %d %q:\n got %v\nwant %v", i, c.Text, got, c.IDs)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d cases differ", failed, len(cases))
	}
}

// TestUnicodeVersionQuirks: Hugging Face normalizes with Unicode 9.0
// tables; the tokenizer reproduces that (see unicodeNorm), so these texts
// get HF's ids, not the ids current-Unicode NFC would give.
func TestUnicodeVersionQuirks(t *testing.T) {
	tok := loadQwen(t)
	cases := readJSONL(t, qwenDir+"/unicode_version_quirks.jsonl")
	if len(cases) == 0 {
		t.Fatal("no quirk cases")
	}
	for i, c := range cases {
		got := tok.Encode(c.Text, false)
		if !slices.Equal(got, c.IDs) {
			t.Errorf("case %d %+q: got %v, want HF's %v (current-Unicode ids %v)", i, c.Text, got, c.IDs, c.IDsCurrentUnicode)
		}
	}
}
