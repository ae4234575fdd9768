package request

import (
	"bufio"
	"encoding/json"
	"math/big"
	"os"
	"strconv"
	"testing"
)

// pydanticCase is one line of testdata/pydantic_int.jsonl: a JSON value
// and what pydantic's lax int made of it (an integer in decimal, null, or
// the error type when it refused it).
type pydanticCase struct {
	JSON  string `json:"json"`
	Int   string `json:"int"`
	Null  bool   `json:"null"`
	Error string `json:"error"`
}

func pydanticCases(tb testing.TB) []pydanticCase {
	tb.Helper()
	fh, err := os.Open("testdata/pydantic_int.jsonl")
	if err != nil {
		tb.Fatal(err)
	}
	defer fh.Close()
	var cs []pydanticCase
	sc := bufio.NewScanner(fh)
	for line := 1; sc.Scan(); line++ {
		if line == 1 {
			continue // the pydantic version
		}
		var c pydanticCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil || c.JSON == "" {
			tb.Fatalf("pydantic_int.jsonl:%d: %v", line, err)
		}
		cs = append(cs, c)
	}
	if err := sc.Err(); err != nil || len(cs) < 100 {
		tb.Fatalf("pydantic_int.jsonl: %d cases, %v", len(cs), err)
	}
	return cs
}

// want is the router's answer for c: whether it accepts the value and
// the token count it reads (pydantic's integer, clamped to tokenCeiling;
// a negative one is refused, as vLLM refuses it).
func (c pydanticCase) want(tb testing.TB) (n int, ok bool) {
	tb.Helper()
	if c.Null {
		return 0, true
	}
	if c.Error != "" {
		return 0, false
	}
	v, good := new(big.Int).SetString(c.Int, 10)
	if !good {
		tb.Fatalf("%s: int %q", c.JSON, c.Int)
	}
	if v.Sign() < 0 {
		return 0, false
	}
	if v.Cmp(big.NewInt(tokenCeiling)) > 0 {
		return tokenCeiling, true
	}
	return int(v.Int64()), true
}

// TestMaxTokensAsPydantic: max_tokens and max_completion_tokens are
// accepted exactly when vLLM's pydantic model accepts them (non-negative),
// read as the same integer, by the encoding/json parse and the one-pass
// chat parse alike, for chats and completions.
func TestMaxTokensAsPydantic(t *testing.T) {
	for _, c := range pydanticCases(t) {
		wantN, wantOK := c.want(t)
		for _, field := range []string{"max_tokens", "max_completion_tokens"} {
			for _, k := range []Kind{Chat, Completion} {
				if k == Completion && field == "max_completion_tokens" {
					continue // no completions field; MaxTokens still counts it (below)
				}
				body := `{"model":"m","messages":[{"role":"user","content":"x"}],"` + field + `":` + c.JSON + `}`
				if k == Completion {
					body = `{"model":"m","prompt":"x","` + field + `":` + c.JSON + `}`
				}
				parses := map[string]func() (*Parsed, *Error){
					"Parse": func() (*Parsed, *Error) { return Parse(k, []byte(body)) },
					"encoding/json": func() (*Parsed, *Error) {
						return parseRequestJSON(k, []byte(body), []byte(body))
					},
				}
				for name, parse := range parses {
					r, e := parse()
					switch {
					case wantOK && e != nil:
						t.Errorf("%s %s: refused (%s); pydantic: %s", name, body, e.Message, c.Int)
					case !wantOK && e == nil:
						t.Errorf("%s %s: accepted as %d; pydantic: %s%s", name, body, r.MaxTokens, c.Error, c.Int)
					case !wantOK && (e.Param != field || e.Message != field+" must be a non-negative integer"):
						t.Errorf("%s %s: error %q on %q", name, body, e.Message, e.Param)
					case wantOK && (r.MaxTokens != wantN || r.OutputTokens != wantN):
						t.Errorf("%s %s: MaxTokens %d, OutputTokens %d; want %d", name, body, r.MaxTokens, r.OutputTokens, wantN)
					}
				}
				if k == Chat {
					if d := sameParse([]byte(body)); d != "" {
						t.Errorf("%s: %s", body, d)
					}
				}
			}
		}
	}
}

// TestLaxIntCeiling: counts past tokenCeiling read as it, so a prompt
// length plus the output budget cannot overflow.
func TestLaxIntCeiling(t *testing.T) {
	for _, raw := range []string{"9007199254740993", "9223372036854775807", "123456789012345678901234567890", `"1_000_000_000_000_000_000_000"`, "9.2233720368547748e18"} {
		if n, ok := LaxInt([]byte(raw)); !ok || n != tokenCeiling {
			t.Errorf("%s: %d, %v; want %d", raw, n, ok, tokenCeiling)
		}
	}
	if n, ok := LaxInt([]byte("9007199254740992")); !ok || n != 1<<53 {
		t.Errorf("2^53: %d, %v", n, ok)
	}
}

// FuzzLaxInt: laxInt never panics, reads every JSON integer that
// encoding/json reads as an int64 as the same number (clamped), and reads
// a number's decimal digits in a string as the number.
func FuzzLaxInt(f *testing.F) {
	for _, c := range pydanticCases(f) {
		f.Add([]byte(c.JSON))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		n, ok := LaxInt(raw)
		if !json.Valid(raw) || isNull(raw) {
			return // callers check null first
		}
		var v int64
		if json.Unmarshal(raw, &v) == nil && raw[0] != '"' {
			want := int(max(-tokenCeiling, min(tokenCeiling, v)))
			if !ok || n != want {
				t.Fatalf("%s: %d, %v; encoding/json: %d", raw, n, ok, v)
			}
			if sn, sok := LaxInt([]byte(strconv.Quote(strconv.FormatInt(v, 10)))); !sok || sn != want {
				t.Fatalf("%q: %d, %v; want %d", strconv.FormatInt(v, 10), sn, sok, want)
			}
		}
	})
}
