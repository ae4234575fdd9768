package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// maxFileBytes bounds what Load reads from one file (after gunzip), so a
// hostile path cannot exhaust memory. Real tokenizer.json files are < 20 MB.
const maxFileBytes = 256 << 20

// Load reads a tokenizer from path, which is either a directory holding
// tokenizer.json or tokenizer.json.gz (plus tokenizer_config.json when
// present), or the tokenizer.json[.gz] file itself, in which case a
// tokenizer_config.json beside it is read when present. Errors name the
// file and, for unsupported components, the component.
func Load(path string) (*Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	dir, file := path, ""
	if st.IsDir() {
		for _, name := range []string{"tokenizer.json", "tokenizer.json.gz"} {
			if _, err := os.Stat(filepath.Join(path, name)); err == nil {
				file = filepath.Join(path, name)
				break
			}
		}
		if file == "" {
			return nil, fmt.Errorf("load tokenizer: no tokenizer.json or tokenizer.json.gz in %s", path)
		}
	} else {
		dir, file = filepath.Dir(path), path
	}
	tj, err := readMaybeGzip(file)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	cj, err := readMaybeGzip(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	t, err := Parse(tj, cj)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", file, err)
	}
	return t, nil
}

// readMaybeGzip reads a file, gunzipping it when it starts with the gzip
// magic bytes.
func readMaybeGzip(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return maybeGunzip(name, data)
}

func maybeGunzip(name string, data []byte) ([]byte, error) {
	if len(data) < 2 || data[0] != 0x1f || data[1] != 0x8b {
		if len(data) > maxFileBytes {
			return nil, fmt.Errorf("read %s: larger than %d bytes", name, maxFileBytes)
		}
		return data, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("gunzip %s: %w", name, err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("gunzip %s: %w", name, err)
	}
	if len(out) > maxFileBytes {
		return nil, fmt.Errorf("gunzip %s: larger than %d bytes", name, maxFileBytes)
	}
	return out, nil
}

// fileJSON is the top level of tokenizer.json.
type fileJSON struct {
	Truncation    json.RawMessage  `json:"truncation"`
	Padding       json.RawMessage  `json:"padding"`
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         json.RawMessage  `json:"model"`
}

type addedTokenJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// typed is the "type" tag every component object carries.
type typed struct {
	Type string `json:"type"`
}

func isNull(v json.RawMessage) bool {
	s := strings.TrimSpace(string(v))
	return s == "" || s == "null"
}

// Parse builds a Tokenizer from the bytes of tokenizer.json (plain or
// gzip) and, optionally, tokenizer_config.json (nil when absent). It is
// the entry point for embedded data; Load wraps it for files.
func Parse(tokenizerJSON, configJSON []byte) (*Tokenizer, error) {
	tj, err := maybeGunzip("tokenizer.json", tokenizerJSON)
	if err != nil {
		return nil, err
	}
	var f fileJSON
	if err := json.Unmarshal(tj, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	cfg, err := parseConfig(configJSON)
	if err != nil {
		return nil, err
	}
	var errs []error
	if !isNull(f.Truncation) {
		errs = append(errs, errors.New("truncation: not supported (must be null)"))
	}
	if !isNull(f.Padding) {
		errs = append(errs, errors.New("padding: not supported (must be null)"))
	}
	t := &Tokenizer{cfg: cfg}
	if t.norm, err = parseNormalizer(f.Normalizer); err != nil {
		errs = append(errs, fmt.Errorf("normalizer: %w", err))
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		errs = append(errs, fmt.Errorf("pre_tokenizer: %w", err))
	}
	if t.model, err = parseModel(f.Model); err != nil {
		errs = append(errs, fmt.Errorf("model: %w", err))
	}
	if err := parseDecoder(f.Decoder); err != nil {
		errs = append(errs, fmt.Errorf("decoder: %w", err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if t.added, err = newAddedVocab(f.AddedTokens, t.norm, t.model); err != nil {
		return nil, fmt.Errorf("added_tokens: %w", err)
	}
	if t.post, err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	t.scanDigits = t.pre.cl100kDigits()
	t.buildDecodeTable()
	return t, nil
}
