package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
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
		return fmt.Sprintf("%s (line %d)", FieldPath(path...), line)
	}
	return FieldPath(path...)
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

// walk calls visit for every mapping entry (key and value) and sequence
// element (key nil) under n, depth first, parents before children, until
// visit returns true.
func walk(n *yaml.Node, path []any, visit func(path []any, key, val *yaml.Node) bool) bool {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if walk(c, path, visit) {
				return true
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			sub := append(slices.Clip(path), k.Value)
			if visit(sub, k, v) || walk(v, sub, visit) {
				return true
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			sub := append(slices.Clip(path), i)
			if visit(sub, nil, c) || walk(c, sub, visit) {
				return true
			}
		}
	}
	return false
}

// yaml.v3's per-field decoding errors (go.yaml.in/yaml/v3 decode.go).
var (
	reCannot  = regexp.MustCompile("^line (\\d+): cannot unmarshal (!!\\w+)(?: `([^`]*)`)? into (.+)$")
	reUnknown = regexp.MustCompile(`^line (\d+): field (.+) not found in type .+$`)
	reSet     = regexp.MustCompile(`^line (\d+): field (.+) already set in type .+$`)
	reDupKey  = regexp.MustCompile(`^line (\d+): mapping key "(.*)" already defined at line (\d+)$`)
)

// describe rewrites one of yaml.v3's decoding errors ("line 4: cannot
// unmarshal !!seq into string") to name the field first, as validation
// errors do: "listen (line 4): cannot unmarshal !!seq into string". An
// error it cannot place is returned unchanged.
func (p Positions) describe(e string) string {
	if p.root == nil {
		return e
	}
	find := func(match func(path []any, key, val *yaml.Node) bool) string {
		var out string
		walk(p.root, nil, func(path []any, k, v *yaml.Node) bool {
			if match(path, k, v) {
				out = FieldPath(path...)
				return true
			}
			return false
		})
		return out
	}
	if m := reCannot.FindStringSubmatch(e); m != nil {
		line, _ := strconv.Atoi(m[1])
		tag, value, into := m[2], m[3], m[4]
		path := find(func(path []any, _, v *yaml.Node) bool {
			if v.Line != line || v.ShortTag() != tag {
				return false
			}
			if t := configTypeAt(path); t == nil || t.String() != into {
				return false
			}
			if v.Kind != yaml.ScalarNode {
				return true
			}
			return v.Value == value || strings.HasSuffix(value, "...") && strings.HasPrefix(v.Value, strings.TrimSuffix(value, "..."))
		})
		if path != "" {
			got := tag
			if strings.Contains(e, " `") {
				got += " `" + value + "`"
			}
			return fmt.Sprintf("%s (line %d): cannot unmarshal %s into %s", path, line, got, into)
		}
		return e
	}
	for _, re := range []*regexp.Regexp{reUnknown, reSet, reDupKey} {
		m := re.FindStringSubmatch(e)
		if m == nil {
			continue
		}
		line, _ := strconv.Atoi(m[1])
		name := m[2]
		path := find(func(_ []any, k, _ *yaml.Node) bool { return k != nil && k.Line == line && k.Value == name })
		if path == "" {
			return e
		}
		switch re {
		case reUnknown:
			return fmt.Sprintf("%s (line %d): unknown field %q", path, line, name)
		case reSet:
			return fmt.Sprintf("%s (line %d): field %q given twice", path, line, name)
		default:
			return fmt.Sprintf("%s (line %d): key %q already given at line %s", path, line, name, m[3])
		}
	}
	return e
}

// ParseConfig decodes router.yaml strictly (unknown fields are errors that
// name the field and line), fills in defaults and environment overrides
// (getenv: os.Getenv when nil), and validates; validation errors name the
// field and its line. The Positions serve later errors about the same file.
func Parse(data []byte, getenv func(string) string) (Config, Positions, error) {
	var cfg Config
	var pos Positions
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return cfg, pos, fmt.Errorf("parse config: %w", syntaxError(data, err))
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
				msgs[i] = pos.describe(e)
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

// configTypeAt returns the Go type that decodes the YAML at path in a
// Config, or nil when path names no field.
func configTypeAt(path []any) reflect.Type {
	t := reflect.TypeFor[Config]()
	for _, step := range path {
		// Optional blocks (models[i].discovery) are pointers: yaml.v3
		// names the pointed-to type.
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch s := step.(type) {
		case int:
			if t.Kind() != reflect.Slice {
				return nil
			}
			t = t.Elem()
		case string:
			if t.Kind() != reflect.Struct {
				return nil
			}
			var next reflect.Type
			for i := range t.NumField() {
				f := t.Field(i)
				if name, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); name == s {
					next = f.Type
					break
				}
			}
			if next == nil {
				return nil
			}
			t = next
		}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}
