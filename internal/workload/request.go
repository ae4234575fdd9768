package workload

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// Request is one request of a workload.
type Request struct {
	// ID is unique within the workload, e.g. "mooncake-000042".
	ID string
	// At is the arrival time, an offset from the start of the run.
	At time.Duration
	// Prompt is the prompt as segments; Tokens expands it.
	Prompt []Segment
	// OutputTokens is the number of tokens to generate (max_tokens, with
	// ignore_eos on engines that support it).
	OutputTokens int
	// Session groups requests of one conversation or prefix group (sent as
	// the x-session-id header; the session policy routes on it). Empty when
	// the request belongs to no session.
	Session string
	// LoRA is the LoRA adapter the request names as its model ("" for the
	// base model): an extra key of every block, served only by replicas
	// with the adapter loaded.
	LoRA string
}

// InputTokens returns the prompt length in tokens.
func (r *Request) InputTokens() int {
	n := 0
	for _, s := range r.Prompt {
		n += s.Len
	}
	return n
}

// AppendTokens appends the prompt's token ids to dst and returns it.
func (r *Request) AppendTokens(dst []uint32) []uint32 {
	dst = slices.Grow(dst, r.InputTokens())
	for _, s := range r.Prompt {
		dst = s.AppendTokens(dst)
	}
	return dst
}

// Tokens returns the prompt's token ids in a new slice.
func (r *Request) Tokens() []uint32 {
	return r.AppendTokens(make([]uint32, 0, r.InputTokens()))
}

// Workload is a named, arrival-ordered list of requests.
type Workload struct {
	// Name says what produced it, e.g. "mooncake" or "shared_prefix".
	Name string
	// Params describes the generator's settings for reports (string values
	// so the JSON stays stable).
	Params map[string]string
	// Requests are sorted by At (ties keep generation order).
	Requests []Request
}

// Info summarises a workload for reports. JSON field names are part of
// the report schema.
type Info struct {
	Name         string            `json:"name"`
	Requests     int               `json:"requests"`
	InputTokens  int64             `json:"input_tokens"`
	OutputTokens int64             `json:"output_tokens"`
	DurationS    float64           `json:"duration_s"`
	Params       map[string]string `json:"params,omitempty"`
}

// Info returns the workload's summary: request count, token totals and the
// span of arrivals in seconds.
func (w *Workload) Info() Info {
	in := Info{Name: w.Name, Requests: len(w.Requests), Params: w.Params}
	for i := range w.Requests {
		in.InputTokens += int64(w.Requests[i].InputTokens())
		in.OutputTokens += int64(w.Requests[i].OutputTokens)
	}
	if n := len(w.Requests); n > 0 {
		in.DurationS = (w.Requests[n-1].At - w.Requests[0].At).Seconds()
	}
	return in
}

// sortByArrival orders requests by At, keeping generation order on ties.
func sortByArrival(rs []Request) {
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].At < rs[j].At })
}

// Repeat returns a workload of copies back to back: copy k (0-based) keeps
// the arrival pattern shifted by k times the original span plus one mean
// gap, and its segment keys are moved to their own key space, so copies
// share no tokens with each other (a second, independent stretch of the
// same kind of traffic). At most 8 copies.
func Repeat(w *Workload, copies int) (*Workload, error) {
	if copies < 1 || copies > maxCopies {
		return nil, fmt.Errorf("repeat: copies %d not in 1..%d", copies, maxCopies)
	}
	n := len(w.Requests)
	out := &Workload{Name: w.Name, Params: clone(w.Params), Requests: make([]Request, 0, n*copies)}
	out.Params["copies"] = fmt.Sprint(copies)
	var span time.Duration
	if n > 0 {
		span = w.Requests[n-1].At - w.Requests[0].At
		if n > 1 {
			span += span / time.Duration(n-1)
		}
	}
	for k := range copies {
		for _, r := range w.Requests {
			r.At += time.Duration(k) * span
			if k > 0 {
				r.ID = fmt.Sprintf("%s-c%d", r.ID, k)
				if r.Session != "" {
					r.Session = fmt.Sprintf("%s-c%d", r.Session, k)
				}
				p := make([]Segment, len(r.Prompt))
				for i, s := range r.Prompt {
					if s.Key>>copyShift != 0 {
						return nil, fmt.Errorf("repeat: request %s is already a copy", r.ID)
					}
					p[i] = Segment{Key: s.Key | uint64(k)<<copyShift, Len: s.Len}
				}
				r.Prompt = p
			}
			out.Requests = append(out.Requests, r)
		}
	}
	return out, nil
}

func clone(m map[string]string) map[string]string {
	c := make(map[string]string, len(m)+1)
	for k, v := range m {
		c[k] = v
	}
	return c
}
