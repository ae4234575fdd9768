package routing

import (
	"sync"

	"github.com/zeebo/xxh3"
)

// PrefixChars is vLLM production-stack's prefix-aware router, kept as a
// baseline (vllm-project/production-stack src/vllm_router/routers/
// routing_logic.py PrefixAwareRouter and prefix/hashtrie.py): the prompt text
// is cut into 128-character chunks, a trie of chunk hashes remembers which
// endpoints were sent each prefix, a request goes to a random endpoint among
// those recorded at its longest matching prefix (any available endpoint when
// nothing matches), and the prompt is then inserted for the chosen endpoint.
// It ignores load and the engines' real caches. The trie is emptied when it
// reaches PrefixCharsConfig.MaxNodes (production-stack's grows unbounded).
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
	for off := 0; off < len(req.Text); off += p.chunk {
		c := n.children[xxh3.HashString(req.Text[off:min(off+p.chunk, len(req.Text))])]
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
		for i := range cands {
			if _, ok := c.endpoints[cands[i].Name]; ok {
				matched[i] = depth
			}
		}
		n = c
	}
	// Uniformly among the candidates at the deepest match (all when none).
	chosen, k := -1, 0
	for i := range cands {
		d.Terms[i].Cost = -float64(min(matched[i]*p.chunk, len(req.Text)))
		if matched[i] == depth {
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
	for off := 0; off < len(text); off += p.chunk {
		h := xxh3.HashString(text[off:min(off+p.chunk, len(text))])
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
