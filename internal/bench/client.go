package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/workload"
)

// ReplicaHeader is the response header in which kvrouter names the replica
// that served a request.
const ReplicaHeader = "x-kvrouter-replica"

// SessionHeader carries a request's session (workload.Request.Session) for
// the session policy.
const SessionHeader = "x-session-id"

// completionBody is the JSON body bench sends.
type completionBody struct {
	Model         string   `json:"model"`
	Prompt        []uint32 `json:"prompt"`
	MaxTokens     int      `json:"max_tokens"`
	Stream        bool     `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	IgnoreEOS   bool    `json:"ignore_eos"`
	Temperature float64 `json:"temperature"`
}

// result is one request's measurement plus its chunk gaps.
type result struct {
	s    report.Sample
	gaps []time.Duration
}

// send posts r to base (an engine or kvrouter URL without path) and reads
// the stream. start is the run's time origin; replica names the endpoint
// when the response does not (direct mode). Failures are reported in the
// sample's Err, never as an error: the run goes on; a panic (it runs on
// its own goroutine) becomes Err "panic".
func (c *runner) send(ctx context.Context, base, replica string, r *workload.Request, start time.Time) (res result) {
	defer func() {
		if v := recover(); v != nil {
			c.log.Error("request panicked", "request_id", r.ID, "panic", v)
			res.s.Err = "panic"
		}
	}()
	out := max(r.OutputTokens, 1)
	body := completionBody{Model: c.cfg.Model, Prompt: r.Tokens(), MaxTokens: out, Stream: true, IgnoreEOS: true}
	body.StreamOptions.IncludeUsage = true
	buf, err := json.Marshal(&body)
	res = result{s: report.Sample{ID: r.ID, Replica: replica, PromptTokens: len(body.Prompt)}}
	sent := time.Now()
	res.s.Arrival = sent.Sub(start)
	defer func() { res.s.End = time.Since(start) }()
	if err != nil {
		res.s.Err = "encode"
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(buf))
	if err != nil {
		res.s.Err = "request"
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-request-id", r.ID)
	if r.Session != "" {
		req.Header.Set(SessionHeader, r.Session)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		res.s.Err = errClass(ctx, err)
		return res
	}
	defer resp.Body.Close()
	if h := resp.Header.Get(ReplicaHeader); h != "" {
		res.s.Replica = h
	}
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		res.s.Err = "http_" + strconv.Itoa(resp.StatusCode)
		return res
	}
	c.readStream(ctx, resp.Body, start, &res)
	return res
}

// readStream consumes the SSE body into res.
func (c *runner) readStream(ctx context.Context, body io.Reader, start time.Time, res *result) {
	sr := newSSEReader(body)
	var last time.Time
	chunks := 0
	var u *usage
	done := false
	for !done {
		data, err := sr.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // no [DONE]
			}
			res.s.Err = errClass(ctx, err)
			break
		}
		ev, err := parseData(data)
		if err != nil {
			res.s.Err = "malformed"
			break
		}
		switch {
		case ev.done:
			done = true
		case ev.c.Error != nil:
			res.s.Err = "stream_error"
			done = true
		default:
			if ev.c.Usage != nil {
				u = ev.c.Usage
			}
			if !ev.c.hasToken() {
				continue
			}
			now := time.Now()
			if chunks == 0 {
				res.s.FirstToken = now.Sub(start)
			} else {
				res.gaps = append(res.gaps, now.Sub(last))
			}
			last = now
			chunks++
		}
	}
	res.s.OutputTokens = chunks
	if u != nil {
		res.s.OutputTokens = u.CompletionTokens
		if u.PromptTokens > 0 {
			res.s.PromptTokens = u.PromptTokens
		}
		if u.PromptTokensDetails != nil {
			res.s.CachedTokens = u.PromptTokensDetails.CachedTokens
		}
	}
	if res.s.Err == "" && chunks == 0 {
		res.s.Err = "no_tokens"
	}
}

// errClass names a transport failure for the report.
func errClass(ctx context.Context, err error) string {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "timeout"
	case errors.Is(ctx.Err(), context.Canceled):
		return "canceled"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "truncated"
	case errors.Is(err, ErrMalformed):
		return "malformed"
	}
	return "connect"
}

// scrape reads one engine's counters from base+"/metrics".
func (c *runner) scrape(ctx context.Context, base string) (counters, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return counters{}, fmt.Errorf("scrape %s: %w", base, err)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return counters{}, fmt.Errorf("scrape %s: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return counters{}, fmt.Errorf("scrape %s: status %d", base, resp.StatusCode)
	}
	cs, err := parseCounters(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return cs, fmt.Errorf("scrape %s: %w", base, err)
	}
	return cs, nil
}

// reset asks base to drop its prefix cache (POST /reset_prefix_cache).
func (c *runner) reset(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/reset_prefix_cache", nil)
	if err != nil {
		return fmt.Errorf("reset %s: %w", base, err)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("reset %s: %w", base, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("reset %s: status %d", base, resp.StatusCode)
	}
	return nil
}
