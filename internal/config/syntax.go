package config

import (
	"bytes"
	"fmt"
	"regexp"
	"sort"

	"go.yaml.in/yaml/v3"
)

// reSyntax matches a yaml.v3 syntax error, "yaml: line N: problem" or
// "yaml: problem" (yaml.v3 omits its line when it counts 0).
var reSyntax = regexp.MustCompile(`^yaml: (?:line \d+: )?(.*)$`)

// syntaxError rewrites yaml.v3's syntax error err for data with the line
// where the parser met the problem. yaml.v3 (decode.go, parser.fail) names
// the line where the enclosing block or flow collection starts, counted from
// 0 for parser errors, not the line of the problem: a mis-indented list item
// on line 5 of a model's engines is reported as "line 1".
//
// The line given instead is N such that the first N lines of data fail to
// parse with err's message (the same problem, met in the same block) and the
// first N-1 lines do not, found by a binary search over whole-line prefixes
// (about log2(lines) parses). A prefix that fails only because it ends early
// (inside a bracket the file closes later) does not count: a line "@", which
// cannot start any token, put after it changes the error. Errors of another
// kind are returned unchanged.
func syntaxError(data []byte, err error) error {
	m := reSyntax.FindStringSubmatch(err.Error())
	if m == nil || len(data) == 0 {
		return err
	}
	// ends[i]: the end of line i+1, its newline included.
	var ends []int
	for off := 0; off < len(data); {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			off = len(data)
		} else {
			off += i + 1
		}
		ends = append(ends, off)
	}
	fails := func(i int) bool {
		end := ends[i]
		if end == len(data) {
			return true // the whole file: err itself
		}
		return sameError(data[:end], err) && sameError(append(data[:end:end], "\n@\n"...), err)
	}
	n := sort.Search(len(ends), fails)
	return fmt.Errorf("line %d: %s", n+1, m[1])
}

// sameError reports whether parsing data fails with err's message.
func sameError(data []byte, err error) bool {
	var n yaml.Node
	perr := yaml.Unmarshal(data, &n)
	return perr != nil && perr.Error() == err.Error()
}
