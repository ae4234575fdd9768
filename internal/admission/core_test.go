package admission

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/group"
	"kvrouter/internal/request"
	"kvrouter/internal/tracing"
)

// stage is a feature that records its stages in log and may refuse.
type stage struct {
	name   string
	log    *[]string
	refuse bool
	route  func(in *group.RouteInput)
}

func (f stage) Admit(_ context.Context, x *Flow) *request.Error {
	*f.log = append(*f.log, f.name+".admit")
	if f.refuse {
		return request.Invalid("", f.name+" refused")
	}
	if f.route != nil {
		x.AddRoute(f.route)
	}
	return nil
}

// rewriter is a stage that renames the request's model to its group's.
type rewriter struct{ stage }

func (f rewriter) Rewrite(_ context.Context, _ *Flow, g *Group, req *request.Parsed, body []byte) (*request.Parsed, *request.Error) {
	*f.log = append(*f.log, f.name+".rewrite")
	if req.Model == g.Cfg.Name {
		return req, nil
	}
	return request.Parse(req.Kind, []byte(`{"model":"`+g.Cfg.Name+`","prompt":"hi"}`))
}

func newTestCore(t *testing.T, fs ...Feature) *Core {
	t.Helper()
	fl, err := fleet.New(fleet.Config{Models: []string{"m"}, ProbeInterval: -1, ScrapeInterval: -1, ModelsInterval: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	set, err := frontmetrics.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	mc := config.Model{Name: "m", Aliases: []config.Alias{{Name: "fast"}}}
	groups := map[string]*Group{"m": {Cfg: mc, Features: fs}}
	return New(config.Config{Models: []config.Model{mc}}, groups,
		Deps{Fleet: fl, Metrics: set, View: set.Front(frontmetrics.HTTP), Tracing: tracing.Disabled(), Now: time.Now}, nil)
}

// TestAdmitPlugsEachFeatureOnce: the front is called back once per
// feature, a Rewriter's right after its Rewrite (before the checks after
// it), the others' after their Admit, in the group's order; a feature that
// refuses ends admission before the features after it.
func TestAdmitPlugsEachFeatureOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refuse bool
		want   []string
	}{
		{"admitted", false, []string{"alias.rewrite", "plug alias", "alias.admit", "check.admit", "plug check", "last.admit", "plug last"}},
		{"refused", true, []string{"alias.rewrite", "plug alias", "alias.admit", "check.admit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log []string
			c := newTestCore(t,
				rewriter{stage{name: "alias", log: &log}},
				stage{name: "check", log: &log, refuse: tc.refuse},
				stage{name: "last", log: &log})
			x := &Flow{Ctx: context.Background(), ID: "r1", Header: noHeader,
				Plug: func(_ context.Context, f Feature, g *Group) {
					if g == nil || g.Cfg.Name != "m" {
						t.Errorf("plug of %v with group %v, want m", f, g)
					}
					switch f := f.(type) {
					case rewriter:
						log = append(log, "plug "+f.name)
					case stage:
						log = append(log, "plug "+f.name)
					}
				}}
			e := c.Admit(context.Background(), x, request.Completion, []byte(`{"model":"fast","prompt":"hi"}`))
			if (e != nil) != tc.refuse {
				t.Fatalf("Admit: %v, want refused %v", e, tc.refuse)
			}
			if !slices.Equal(log, tc.want) {
				t.Fatalf("stages %q, want %q", log, tc.want)
			}
			if x.Asked != "fast" || x.Req == nil || x.Req.Model != "m" || x.Group == nil {
				t.Fatalf("flow: asked %q, request %+v, group %v; want fast, m, m", x.Asked, x.Req, x.Group)
			}
			if !tc.refuse && x.Fwd == nil {
				t.Fatal("no body to forward")
			}
		})
	}
}

// TestAdmitUnknownModel: a model no group serves is refused as unknown,
// naming it, with no feature run and no group set.
func TestAdmitUnknownModel(t *testing.T) {
	var log []string
	c := newTestCore(t, stage{name: "check", log: &log})
	x := &Flow{Ctx: context.Background(), Header: noHeader}
	e := c.Admit(context.Background(), x, request.Completion, []byte(`{"model":"other","prompt":"hi"}`))
	if e == nil || e.Type != request.UnknownModel || e.Param != "model" {
		t.Fatalf("Admit: %+v, want an unknown model error on param model", e)
	}
	if len(log) != 0 || x.Group != nil || x.Asked != "other" {
		t.Fatalf("stages %q, group %v, asked %q; want none, nil, other", log, x.Group, x.Asked)
	}
}

// TestRouteInputEstimatesUnknownTokens: a prompt whose tokens are unknown
// counts as one token per body byte (an upper bound), so its prefill is
// load and its first token has a predicted time.
func TestRouteInputEstimatesUnknownTokens(t *testing.T) {
	c := newTestCore(t)
	x := &Flow{Ctx: context.Background(), ID: "r1", Header: noHeader}
	body := []byte(`{"model":"m","prompt":"` + strings.Repeat("word ", 8000) + `"}`)
	if e := c.Admit(context.Background(), x, request.Completion, body); e != nil {
		t.Fatal(e)
	}
	if x.Tokens != nil {
		t.Fatalf("tokens %d, want unknown (no tokenizer)", len(x.Tokens))
	}
	in := c.RouteInput(context.Background(), x, []string{"e0"}, false)
	if want := len(x.Fwd); in.Tokens != nil || in.PromptTokens != want || want < 10000 {
		t.Fatalf("route input: %d tokens, prompt tokens %d; want none and %d", len(in.Tokens), in.PromptTokens, want)
	}
}

// TestRouteStagesInOrder: route stages added by features run in the
// order added, and a new Admit starts with none.
func TestRouteStagesInOrder(t *testing.T) {
	var log []string
	c := newTestCore(t,
		stage{name: "a", log: &log, route: func(in *group.RouteInput) { in.LoRA += "a" }},
		stage{name: "b", log: &log, route: func(in *group.RouteInput) { in.LoRA += "b" }})
	x := &Flow{Ctx: context.Background(), ID: "r1", Header: noHeader}
	body := []byte(`{"model":"m","prompt":"hi"}`)
	if e := c.Admit(context.Background(), x, request.Completion, body); e != nil {
		t.Fatal(e)
	}
	x.AddRoute(func(in *group.RouteInput) { in.LoRA += "c" })
	if in := c.RouteInput(context.Background(), x, []string{"e0"}, false); in.LoRA != "abc" || in.RequestID != "r1" || !slices.Equal(in.Candidates, []string{"e0"}) {
		t.Fatalf("route input: LoRA %q, id %q, candidates %q; want abc, r1, [e0]", in.LoRA, in.RequestID, in.Candidates)
	}
	if e := c.Admit(context.Background(), x, request.Completion, body); e != nil {
		t.Fatal(e)
	}
	if in := c.RouteInput(context.Background(), x, nil, false); in.LoRA != "ab" {
		t.Fatalf("route input after a new Admit: LoRA %q, want ab", in.LoRA)
	}
}
