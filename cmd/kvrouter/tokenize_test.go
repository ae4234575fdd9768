package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

const qwen3Testdata = "../../testdata/tokenizer/qwen3"

// goldenLine returns line n (0-based) of a testdata jsonl file, decoded.
func goldenLine[T any](t *testing.T, file string, n int) T {
	t.Helper()
	f, err := os.Open(qwen3Testdata + "/" + file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for i := 0; sc.Scan(); i++ {
		if i == n {
			var v T
			if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("%s has no line %d", file, n)
	panic("unreachable")
}

func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(t.Context(), append([]string{"tokenize"}, args...), stdio{strings.NewReader(stdin), &out, &errb})
	return code, out.String(), errb.String()
}

func TestTokenizeText(t *testing.T) {
	type encodeCase struct {
		Text string   `json:"text"`
		IDs  []uint32 `json:"ids"`
	}
	// Each run loads the tokenizer (seconds under -race), so two runs: a
	// directory with --no-special, and the .gz file with the default (Qwen3
	// adds no special tokens, so the ids are the same).
	for _, tc := range []struct {
		line int
		args []string
	}{
		{0, []string{"--tokenizer", qwen3Testdata, "--no-special"}},
		{200, []string{"--tokenizer", qwen3Testdata + "/tokenizer.json.gz"}},
	} {
		c := goldenLine[encodeCase](t, "encode.jsonl", tc.line)
		code, stdout, stderr := runCLI(t, c.Text, tc.args...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		var got struct {
			IDs  []uint32 `json:"ids"`
			Text *string  `json:"text"`
		}
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatalf("output %q: %v", stdout, err)
		}
		if !slices.Equal(got.IDs, c.IDs) || got.Text != nil {
			t.Errorf("encode.jsonl line %d %v: got %s, want ids %v and no text", tc.line, tc.args, stdout, c.IDs)
		}
	}
}

func TestTokenizeChat(t *testing.T) {
	type chatCase struct {
		Messages            json.RawMessage `json:"messages"`
		Tools               json.RawMessage `json:"tools"`
		AddGenerationPrompt bool            `json:"add_generation_prompt"`
		ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
		Text                string          `json:"text"`
		IDs                 []uint32        `json:"ids"`
	}
	// Line 32: tools, tool calls and enable_thinking=false.
	c := goldenLine[chatCase](t, "chat.jsonl", 32)
	body, err := json.Marshal(map[string]any{
		"messages": c.Messages, "tools": c.Tools,
		"add_generation_prompt": c.AddGenerationPrompt, "chat_template_kwargs": c.ChatTemplateKwargs,
	})
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, string(body), "--tokenizer", qwen3Testdata, "--chat")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var got struct {
		IDs  []uint32 `json:"ids"`
		Text string   `json:"text"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("output %q: %v", stdout, err)
	}
	if got.Text != c.Text || !slices.Equal(got.IDs, c.IDs) {
		t.Errorf("chat.jsonl line 32: got %s\nwant text %q ids %v", stdout, c.Text, c.IDs)
	}
	if !strings.HasPrefix(stdout, `{"ids":[`) || !strings.Contains(stdout, `"text":"<|im_start|>`) {
		t.Errorf("output %q: want ids first and unescaped special tokens", stdout)
	}
}

func TestTokenizeErrors(t *testing.T) {
	tests := []struct {
		name, stdin string
		args        []string
		code        int
		stderr      string
	}{
		{"no tokenizer flag", "x", nil, 2, "--tokenizer is required"},
		{"stray argument", "x", []string{"--tokenizer", qwen3Testdata, "extra"}, 2, "unexpected arguments"},
		{"missing path", "x", []string{"--tokenizer", qwen3Testdata + "/nope"}, 1, "load tokenizer"},
		{"bad chat json", `{"messages":`, []string{"--tokenizer", qwen3Testdata, "--chat"}, 1, "chat request on stdin"},
		{"bare list of messages", `[{"role":"user","content":"Hi"}]`, []string{"--tokenizer", qwen3Testdata, "--chat"}, 1,
			`kvrouter tokenize: chat request on stdin: malformed chat request: want a JSON object {"messages":[...], "tools":[...], "add_generation_prompt":true, "chat_template_kwargs":{...}}, got an array (a bare list of messages? wrap it as {"messages":[...]})` + "\n"},
		{"field of the wrong type", `{"messages":[],"add_generation_prompt":"yes"}`, []string{"--tokenizer", qwen3Testdata, "--chat"}, 1,
			"kvrouter tokenize: chat request on stdin: malformed chat request: add_generation_prompt: want true or false, got a string\n"},
		{"null", `null`, []string{"--tokenizer", qwen3Testdata, "--chat"}, 1, "got null\n"},
		{"empty chat", " \n", []string{"--tokenizer", qwen3Testdata, "--chat"}, 1,
			`kvrouter tokenize: chat request on stdin: empty; want a JSON object {"messages":[...], ...}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tt.stdin, tt.args...)
			if code != tt.code || !strings.Contains(stderr, tt.stderr) || stdout != "" {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, stdout, stderr, tt.code, tt.stderr)
			}
			if strings.Contains(stderr, "Go ") || strings.Contains(stderr, "tokenizer.") {
				t.Errorf("stderr %q names a Go type", stderr)
			}
		})
	}
}
