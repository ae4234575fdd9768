package routing

import (
	"sync"
	"unicode/utf8"

	"github.com/zeebo/xxh3"
)

// PrefixChars is vLLM production-stack's prefix-aware router, kept as a
// baseline (vllm-project/production-stack src/vllm_router/routers/
// routing_logic.py PrefixAwareRouter and src/vllm_router/prefix/hashtrie.py,
// read at commit a6c01db05f65f556235413ba8dbcfb0c01132fff; the chat text
// dates from 32319c3272e1c545ff13cb396d8891c98af075ec): the prompt text is
// cut into 128-character chunks (characters are Unicode code points, as
// Python's str counts them; ASCII text is one byte per character), a trie
// of chunk hashes remembers which endpoints were sent each prefix, a
// request goes to a random endpoint among those recorded at its longest
// matching prefix (any available endpoint when nothing matches), and the
// prompt is then inserted for the chosen endpoint. It ignores load and the
// engines' real caches. The trie is emptied when it reaches
// PrefixCharsConfig.MaxNodes (production-stack's grows unbounded), and
// prefix_min_match_length (production-stack's QPS fallback below a match
// length, default 0: off) is not modelled.
//
// Request.Text is the routing text, built by the request layer as
// production-stack builds it: a completion's prompt string; for chat, each
// message's content (a string as is; a list of parts: the "text" of its
// parts of type "text" joined by " "; absent: ""; null: left out) joined
// by "\n". A token-id prompt, which production-stack cannot route (its
// HashTrie hashes the list and xxhash raises TypeError), is routed by
// TokenText.
type PrefixChars struct {
	chunk, maxNodes int
	rng             *lockedRand

	mu    sync.Mutex
	root  *charNode
	nodes int
}

type charNode struct {
	children  map[uint64]*charNode
	endpoints map[string]struct{}
}

var _ Policy = (*PrefixChars)(nil)

func newPrefixChars(cfg PrefixCharsConfig, rng *lockedRand) *PrefixChars {
	return &PrefixChars{chunk: cfg.ChunkSize, maxNodes: cfg.MaxNodes, rng: rng, root: &charNode{}}
}

// Pick implements Policy. Cost is minus the matched length in characters.
func (p *PrefixChars) Pick(req *Request, cands []Candidate) Decision {
	return p.decide(req, cands, p.rng)
}

// Evaluate implements Evaluator: Pick without inserting the prompt into the
// trie, choosing the first candidate at the deepest match instead of a
// random one.
func (p *PrefixChars) Evaluate(req *Request, cands []Candidate) Decision {
	return p.decide(req, cands, nil)
}

// decide is Pick; rng nil means Evaluate.
func (p *PrefixChars) decide(req *Request, cands []Candidate, rng *lockedRand) Decision {
	d := newDecision("prefix_chars", cands)
	p.mu.Lock()
	defer p.mu.Unlock()
	// Walk the longest prefix whose node still names an available endpoint.
	matched := make([]int, len(cands))
	depth := 0
	n := p.root
	chars := 0 // characters in the matched chunks
	for off := 0; off < len(req.Text); {
		end, k := chunkEnd(req.Text, off, p.chunk)
		c := n.children[xxh3.HashString(req.Text[off:end])]
		if c == nil {
			break
		}
		any := false
		for i := range cands {
			if _, ok := c.endpoints[cands[i].Name]; ok {
				any = true
				break
			}
		}
		if !any {
			break
		}
		depth++
		chars += k
		for i := range cands {
			if _, ok := c.endpoints[cands[i].Name]; ok {
				matched[i] = depth
			}
		}
		n, off = c, end
	}
	// Uniformly among the candidates at the deepest match (all when none).
	chosen, k := -1, 0
	for i := range cands {
		// A shallower match is whole chunks; the deepest may end in a
		// shorter last chunk.
		d.Terms[i].Cost = -float64(matched[i] * p.chunk)
		if matched[i] == depth {
			d.Terms[i].Cost = -float64(chars)
			k++
			switch {
			case rng == nil:
				if chosen < 0 {
					chosen = i
				}
			case rng.IntN(k) == 0:
				chosen = i
			}
		}
	}
	reason := "prefix"
	if depth == 0 {
		reason = "no_match"
	}
	if rng != nil {
		p.insert(req.Text, cands[chosen].Name)
	}
	return d.choose(chosen, cands, reason)
}

func (p *PrefixChars) insert(text, endpoint string) {
	if p.nodes >= p.maxNodes {
		p.root, p.nodes = &charNode{}, 0
	}
	n := p.root
	for off := 0; off < len(text); {
		end, _ := chunkEnd(text, off, p.chunk)
		h := xxh3.HashString(text[off:end])
		off = end
		c := n.children[h]
		if c == nil {
			if n.children == nil {
				n.children = make(map[uint64]*charNode)
			}
			c = &charNode{endpoints: make(map[string]struct{}, 1)}
			n.children[h] = c
			p.nodes++
		}
		c.endpoints[endpoint] = struct{}{}
		n = c
	}
}

// chunkEnd returns the byte offset n characters after off in s, or len(s),
// and how many characters that is. A character is a byte and the
// continuation bytes (10xxxxxx) after it, so on valid UTF-8 (all the proxy
// sees) characters are code points, as Python counts them. A run of ASCII
// is checked 8 bytes at a time.
func chunkEnd(s string, off, n int) (end, chars int) {
	end = min(off+n, len(s))
	i := off
	for ; i+8 <= end; i += 8 {
		if s[i]|s[i+1]|s[i+2]|s[i+3]|s[i+4]|s[i+5]|s[i+6]|s[i+7] >= utf8.RuneSelf {
			break
		}
	}
	for ; i < end && s[i] < utf8.RuneSelf; i++ {
	}
	if i == end {
		return end, end - off
	}
	for chars = i - off; i < len(s) && chars < n; chars++ {
		for i++; i < len(s) && s[i]&0xc0 == 0x80; i++ {
		}
	}
	return i, chars
}

// TokenText is the routing text of a prompt known only by its token ids (a
// completion's token-id prompt, the simulator's workloads) for
// PrefixChars: each id as 4 ASCII characters of 7 bits each, low bits
// first, so a 128-character chunk spans 32 tokens (about what 128
// characters of English are) and the ASCII fast path applies. Ids below
// 2^28 (every vocabulary; vLLM rejects ids outside its own) render
// distinctly; higher bits are dropped. This is our extension:
// production-stack cannot route token-id prompts.
func TokenText(tokens []uint32) string {
	return string(AppendTokenText(make([]byte, 0, 4*len(tokens)), tokens))
}

// AppendTokenText appends TokenText(tokens) to dst.
func AppendTokenText(dst []byte, tokens []uint32) []byte {
	for _, t := range tokens {
		dst = append(dst, byte(t&0x7f), byte(t>>7&0x7f), byte(t>>14&0x7f), byte(t>>21&0x7f))
	}
	return dst
}
