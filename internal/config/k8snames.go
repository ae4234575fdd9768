package config

import (
	"fmt"
	"strconv"
	"strings"
)

// Kubernetes name syntax for the discovery and peers blocks, checked here
// without the Kubernetes libraries so that the schema needs none. Each
// check accepts exactly what k8s.io/apimachinery accepts (IsDNS1123Label,
// IsDNS1123Subdomain, IsDNS1035Label, IsValidPortName, IsQualifiedName,
// IsValidLabelValue and labels.Parse of v0.37): the package's tests run both
// on the same inputs, table and fuzzed. The messages are kvrouter's own.

// checkDNS1123Label: at most 63 of a-z, 0-9 and '-', starting and ending
// with a letter or digit (RFC 1123).
func checkDNS1123Label(s string) string {
	if !dnsLabel(s, false) {
		return "want a DNS-1123 label: at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit"
	}
	return ""
}

// checkDNS1123Subdomain: at most 253 characters of DNS-1123 labels joined
// by '.'.
func checkDNS1123Subdomain(s string) string {
	if !dnsSubdomain(s) {
		return "want a DNS-1123 subdomain: at most 253 characters of DNS-1123 labels joined by '.'"
	}
	return ""
}

// checkDNS1035Label: a DNS-1123 label that starts with a letter (RFC 1035).
func checkDNS1035Label(s string) string {
	if !dnsLabel(s, true) {
		return "want a DNS-1035 label: at most 63 lower-case letters, digits and '-', starting with a letter and ending with a letter or digit"
	}
	return ""
}

// checkPortName: an IANA service name as Kubernetes takes it: 1 to 15 of
// a-z, 0-9 and '-', at least one letter, no "--", no '-' at either end.
func checkPortName(s string) string {
	ok := len(s) >= 1 && len(s) <= 15 && s[0] != '-' && s[len(s)-1] != '-' && !strings.Contains(s, "--")
	letter := false
	for i := 0; i < len(s) && ok; i++ {
		c := s[i]
		letter = letter || 'a' <= c && c <= 'z'
		ok = lowerAlnum(c) || c == '-'
	}
	if !ok || !letter {
		return "want a port number or name: 1 to 15 lower-case letters, digits and single '-' inside, at least one letter"
	}
	return ""
}

// checkLabelKey: a Kubernetes qualified name (label key): an optional
// DNS-1123 subdomain and '/', then a name of 1 to 63 letters, digits, '-',
// '_' and '.', starting and ending with a letter or digit.
func checkLabelKey(s string) string {
	name := s
	if prefix, rest, ok := strings.Cut(s, "/"); ok {
		if strings.Contains(rest, "/") || !dnsSubdomain(prefix) {
			return "want a label key: [DNS-1123 subdomain/]name"
		}
		name = rest
	}
	if name == "" || !labelValue(name) {
		return "want a label key: [DNS-1123 subdomain/]name, the name 1 to 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
	}
	return ""
}

// labelValue: empty, or at most 63 letters, digits, '-', '_' and '.',
// starting and ending with a letter or digit.
func labelValue(s string) bool {
	if s == "" {
		return true
	}
	if len(s) > 63 || !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func lowerAlnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }
func alnum(c byte) bool      { return lowerAlnum(c) || 'A' <= c && c <= 'Z' }

// dnsLabel: 1 to 63 of a-z, 0-9 and '-', starting (with letterFirst: with
// a letter) and ending with a letter or digit.
func dnsLabel(s string, letterFirst bool) bool {
	return len(s) <= 63 && dnsWord(s, letterFirst)
}

// dnsWord is dnsLabel of any length.
func dnsWord(s string, letterFirst bool) bool {
	if len(s) < 1 || !lowerAlnum(s[0]) || !lowerAlnum(s[len(s)-1]) {
		return false
	}
	if letterFirst && !('a' <= s[0] && s[0] <= 'z') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !lowerAlnum(s[i]) && s[i] != '-' {
			return false
		}
	}
	return true
}

// dnsSubdomain: at most 253 characters of words as dnsLabel's joined by
// '.', each of any length (as IsDNS1123Subdomain takes them).
func dnsSubdomain(s string) bool {
	if len(s) > 253 {
		return false
	}
	for l := range strings.SplitSeq(s, ".") {
		if !dnsWord(l, false) {
			return false
		}
	}
	return true
}

// checkSelector checks a label selector's syntax, as kubectl's -l takes
// it: requirements joined by ',', each "key", "!key", "key=value",
// "key==value", "key!=value", "key in (v1,v2)", "key notin (v1,v2)",
// "key>n" or "key<n" (n an integer), keys and values as checkLabelKey
// and labelValue say; blanks between tokens; "" selects everything.
func checkSelector(s string) error {
	p := selParser{toks: selectorTokens(s)}
	if p.peek() == "" {
		return nil
	}
	for {
		if t := p.peek(); t != "!" && !isIdent(t) {
			return fmt.Errorf("found %s, want '!', a key or the end", quoteTok(t))
		}
		if err := p.requirement(); err != nil {
			return err
		}
		switch t := p.next(); {
		case t == "":
			return nil
		case t == ",":
			if n := p.peek(); n != "!" && !isIdent(n) {
				return fmt.Errorf("found %s after ',', want '!' or a key", quoteTok(n))
			}
		default:
			return fmt.Errorf("found %s, want ',' or the end", quoteTok(t))
		}
	}
}

// selectorTokens splits a selector into its tokens: the operators "!=",
// "==", "=", "!", "(", ")", ",", ">", "<", and words (runs of other
// bytes, blanks ' ', '\t', '\r' and '\n' between them). A NUL byte ends the
// selector where a token would start and is skipped right after one, as
// labels.Parse's lexer reads it.
func selectorTokens(s string) []string {
	var toks []string
	i := 0
	for {
		for i < len(s) && strings.IndexByte(" \t\r\n", s[i]) >= 0 {
			i++
		}
		if i == len(s) || s[i] == 0 {
			return toks
		}
		j := i + 1
		if selSymbol(s[i]) {
			if (s[i] == '!' || s[i] == '=') && j < len(s) && s[j] == '=' {
				j++
			}
		} else {
			for j < len(s) && s[j] != 0 && !selSymbol(s[j]) && strings.IndexByte(" \t\r\n", s[j]) < 0 {
				j++
			}
		}
		toks = append(toks, s[i:j])
		i = j
		if i < len(s) && s[i] == 0 {
			i++
		}
	}
}

func selSymbol(c byte) bool { return strings.IndexByte("=!(),><", c) >= 0 }

// isIdent reports whether a token is a word (a key or value; "in" and
// "notin" too, except where an operator is expected).
func isIdent(t string) bool { return t != "" && !selSymbol(t[0]) }

func quoteTok(t string) string {
	if t == "" {
		return "the end"
	}
	return strconv.Quote(t)
}

// selParser walks a selector's tokens; "" is the end.
type selParser struct {
	toks []string
	i    int
}

func (p *selParser) peek() string {
	if p.i < len(p.toks) {
		return p.toks[p.i]
	}
	return ""
}

func (p *selParser) next() string {
	t := p.peek()
	p.i++
	return t
}

// requirement reads one requirement.
func (p *selParser) requirement() error {
	neg := p.peek() == "!"
	if neg {
		p.next()
	}
	key := p.next()
	if !isIdent(key) {
		return fmt.Errorf("found %s, want a key", quoteTok(key))
	}
	if msg := checkLabelKey(key); msg != "" {
		return fmt.Errorf("key %q: %s", key, msg)
	}
	if neg || p.peek() == "" || p.peek() == "," {
		return nil // !key, key
	}
	op := p.next()
	var values []string
	switch op {
	case "in", "notin":
		if t := p.next(); t != "(" {
			return fmt.Errorf("found %s after %s, want '('", quoteTok(t), op)
		}
		var err error
		if values, err = p.valueList(); err != nil {
			return err
		}
	case "=", "==", "!=", ">", "<":
		switch t := p.peek(); {
		case t == "" || t == ",":
			values = []string{""}
		case isIdent(t):
			values = []string{p.next()}
		default:
			return fmt.Errorf("found %s after %s, want a value", quoteTok(t), op)
		}
	default:
		return fmt.Errorf("found %s after key %q, want in, notin, =, ==, !=, > or <", quoteTok(op), key)
	}
	for _, v := range values {
		if op == ">" || op == "<" {
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				return fmt.Errorf("key %q: %q: %s needs an integer", key, v, op)
			}
		}
		if !labelValue(v) {
			return fmt.Errorf("key %q: value %q: want at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit", key, v)
		}
	}
	return nil
}

// valueList reads the values of "in (" or "notin (" up to and with ")":
// words and commas, no two words in a row; an empty place (as in "(a,,b)",
// "(,a)" or "()") is the empty value, which is valid.
func (p *selParser) valueList() ([]string, error) {
	var values []string
	word := false // the previous token was a value
	for {
		switch t := p.next(); {
		case t == ")":
			return values, nil
		case t == ",":
			word = false
		case isIdent(t) && !word:
			values, word = append(values, t), true
		default:
			return nil, fmt.Errorf("found %s in a value list, want a value, ',' or ')'", quoteTok(t))
		}
	}
}
