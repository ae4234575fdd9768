package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Positions maps configuration fields to their lines in the YAML source, for
// error messages. The zero value knows no lines.
type Positions struct {
	root *yaml.Node
}

// Field names a field by its path (names and indexes, e.g. "models", 0,
// "policy") and, when the source has it, its line: "models[0].policy (line
// 7)". A field absent from the file gets its parent's line.
func (p Positions) Field(path ...any) string {
	if line := p.line(path); line > 0 {
		return fmt.Sprintf("%s (line %d)", pathString(path), line)
	}
	return pathString(path)
}

func (p Positions) line(path []any) int {
	n := p.root
	if n == nil {
		return 0
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := n.Line
	for _, step := range path {
		var next *yaml.Node
		switch s := step.(type) {
		case string:
			if n.Kind == yaml.MappingNode {
				for i := 0; i+1 < len(n.Content); i += 2 {
					if n.Content[i].Value == s {
						next = n.Content[i+1]
						line = n.Content[i].Line
						break
					}
				}
			}
		case int:
			if n.Kind == yaml.SequenceNode && s >= 0 && s < len(n.Content) {
				next = n.Content[s]
				line = next.Line
			}
		}
		if next == nil {
			return line
		}
		n = next
	}
	return line
}

// pathAt returns the path of the mapping key on line, or "".
func (p Positions) pathAt(line int) string {
	if p.root == nil {
		return ""
	}
	var walk func(n *yaml.Node, path []any) string
	walk = func(n *yaml.Node, path []any) string {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				if r := walk(c, path); r != "" {
					return r
				}
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				sub := append(append([]any{}, path...), k.Value)
				if k.Line == line && v.Kind == yaml.ScalarNode {
					return pathString(sub)
				}
				if r := walk(v, sub); r != "" {
					return r
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				if r := walk(c, append(append([]any{}, path...), i)); r != "" {
					return r
				}
			}
		}
		return ""
	}
	return walk(p.root, nil)
}

// ParseConfig decodes router.yaml strictly (unknown fields are errors that
// name the field and line), fills in defaults and environment overrides
// (getenv: os.Getenv when nil), and validates; validation errors name the
// field and its line. The Positions serve later errors about the same file.
func ParseConfig(data []byte, getenv func(string) string) (Config, Positions, error) {
	var cfg Config
	var pos Positions
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return cfg, pos, fmt.Errorf("parse config: %w", err)
	}
	pos.root = &root
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		if errors.Is(err, io.EOF) {
			return cfg, pos, errors.New("parse config: empty file")
		}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			msgs := make([]string, len(te.Errors))
			for i, e := range te.Errors {
				msgs[i] = e
				var line int
				if _, serr := fmt.Sscanf(e, "line %d:", &line); serr == nil {
					if path := pos.pathAt(line); path != "" {
						msgs[i] = e + " (field " + path + ")"
					}
				}
			}
			return cfg, pos, fmt.Errorf("parse config: %s", strings.Join(msgs, "; "))
		}
		return cfg, pos, fmt.Errorf("parse config: %w", err)
	}
	cfg.FillDefaults(getenv)
	if err := cfg.Validate(); err != nil {
		return cfg, pos, pos.annotate(err)
	}
	return cfg, pos, nil
}

// annotate rewrites the fieldErrors joined in err with their lines.
func (p Positions) annotate(err error) error {
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		var fe *fieldError
		if errors.As(e, &fe) {
			out = append(out, fmt.Errorf("%s: %s", p.Field(fe.path...), fe.msg))
			continue
		}
		out = append(out, e)
	}
	return fmt.Errorf("invalid config: %w", errors.Join(out...))
}
