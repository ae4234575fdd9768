package enginesim

import (
	"fmt"
	"reflect"
	"testing"
)

// TestDecodeAloneAsStep: 40 requests (4 groups sharing a 500-token prefix,
// 200 own tokens, 37-76 output tokens) served one at a time by two Cores of
// 300 blocks (evicting), one stepping every decode token, one calling
// DecodeAlone after each Step: the same Stats, busy time, KV events in
// order, final tokens, and block pool (every block's hash, references and
// free-queue position). With two sequences running it does nothing.
func TestDecodeAloneAsStep(t *testing.T) {
	cfg := CoreConfig{NumGPUBlocks: 300, MaxModelLen: 4000, MaxNumSeqs: 1}
	a, err := NewCore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewCore(cfg)
	type trace struct {
		last []Output
	}
	var ta, tb trace
	var evA, evB []any
	alone := 0
	for i := range 40 {
		toks := make([]uint32, 700)
		for j := range toks {
			toks[j] = uint32(j + 1000*(i%4))
			if j >= 500 {
				toks[j] = uint32(j + 7919*i)
			}
		}
		for _, c := range []*Core{a, b} {
			if err := c.Submit(&Request{ID: fmt.Sprint(i), Tokens: toks, MaxTokens: 37 + i}); err != nil {
				t.Fatal(err)
			}
			for !c.Idle() {
				res := c.Step()
				for _, e := range res.Events {
					if c == a {
						evA = append(evA, e)
					} else {
						evB = append(evB, e)
					}
				}
				for _, o := range res.Outputs {
					if o.Finished {
						if c == a {
							ta.last = append(ta.last, o)
						} else {
							tb.last = append(tb.last, o)
						}
					}
				}
				if c == b {
					alone += c.DecodeAlone()
				}
			}
		}
	}
	if alone < 40*30 {
		t.Fatalf("DecodeAlone ran %d tokens", alone)
	}
	if a.Stats() != b.Stats() || a.busy != b.busy {
		t.Errorf("stats %+v busy %v, DecodeAlone %+v busy %v", a.Stats(), a.busy, b.Stats(), b.busy)
	}
	if !reflect.DeepEqual(evA, evB) || len(evA) == 0 {
		t.Errorf("%d KV events stepped, %d with DecodeAlone, or they differ", len(evA), len(evB))
	}
	if !reflect.DeepEqual(ta.last, tb.last) {
		t.Errorf("last outputs differ")
	}
	if !reflect.DeepEqual(a.pool.blocks, b.pool.blocks) || a.pool.fqHead != b.pool.fqHead || a.pool.fqLen != b.pool.fqLen || !reflect.DeepEqual(a.pool.fq, b.pool.fq) {
		t.Errorf("block pools differ")
	}

	c, _ := NewCore(CoreConfig{NumGPUBlocks: 300, MaxModelLen: 4000, MaxNumSeqs: 4})
	for i := range 2 {
		c.Submit(&Request{ID: fmt.Sprint(i), Tokens: make([]uint32, 40), MaxTokens: 20})
	}
	c.Step()
	if n := c.DecodeAlone(); n != 0 {
		t.Errorf("two running: DecodeAlone ran %d tokens", n)
	}
}
