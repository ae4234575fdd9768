package enginesim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// choiceState is one choice (engine request) of an HTTP request.
type choiceState struct {
	st        *stream
	prompt    int // index of its prompt
	text      strings.Builder
	generated int
	cached    int
	blockIDs  []int32
	done      bool
	reason    string
}

// generate serves /v1/completions and /v1/chat/completions.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	req, err := decodeGenRequest(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	lora, ok := s.loraFor(req.Model)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	f := &s.cfg.Faults
	if s.dice.roll(f.ErrorRate) {
		s.m.faults.WithLabelValues("error").Inc()
		writeError(w, f.ErrorStatus, "injected fault")
		return
	}
	prompts, mm, ok := s.prompts(w, req, body, chat)
	if !ok {
		return
	}
	remoteDecode, remoteKV, err := s.legs(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	n := req.choices()
	if len(prompts)*n > maxChoices {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("at most %d prompts x n per request", maxChoices))
		return
	}
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	id := newID(prefix)
	notify := make(chan struct{}, 1)
	var subs []submission
	choices := make([]*choiceState, 0, len(prompts)*n)
	for pi, p := range prompts {
		mt, msg := s.maxTokens(req, chat, len(p))
		if msg != "" {
			writeError(w, http.StatusBadRequest, msg)
			return
		}
		for range n {
			rid := fmt.Sprintf("%s-%d", id, len(choices))
			st := newStream(rid, notify)
			salt := ""
			if req.CacheSalt != nil {
				salt = *req.CacheSalt
			}
			subs = append(subs, submission{st: st, req: Request{
				ID: rid, Tokens: p, MM: mm, MaxTokens: mt, LoRAName: lora, CacheSalt: salt, ReportHits: req.reportHits(),
				RemoteDecode: remoteDecode, RemoteKV: remoteKV,
			}})
			choices = append(choices, &choiceState{st: st, prompt: pi})
		}
	}
	if s.dice.roll(f.SpikeRate) {
		s.m.faults.WithLabelValues("spike").Inc()
		if !s.sleepCtx(r, f.SpikeDelay) {
			return
		}
	}
	if s.dice.roll(f.HangRate) {
		s.m.faults.WithLabelValues("hang").Inc()
		<-r.Context().Done()
		return
	}
	if err := s.eng.send(r.Context(), command{submit: subs, reply: make(chan error, 1)}); err != nil {
		ids := make([]string, len(subs)) // the submit may have landed before the client left
		for i, sub := range subs {
			ids[i] = sub.req.ID
		}
		s.eng.abort(ids)
		if r.Context().Err() == nil {
			writeError(w, http.StatusInternalServerError, err.Error())
		}
		return
	}
	// Every exit path aborts what is still running (client gone, fault).
	defer func() {
		var ids []string
		for _, c := range choices {
			if !c.done {
				ids = append(ids, c.st.id)
			}
		}
		s.eng.abort(ids)
	}()
	out := &responder{s: s, w: w, r: r, req: req, chat: chat, id: id, choices: choices, prompts: prompts, notify: notify}
	if req.Stream {
		dieAfter := -1
		if s.dice.roll(f.DieRate) {
			dieAfter = f.DieAfterTokens
		}
		out.stream(dieAfter)
		return
	}
	out.whole()
}

// responder writes one generation response.
type responder struct {
	s       *Server
	w       http.ResponseWriter
	r       *http.Request
	req     *genRequest
	chat    bool
	id      string
	choices []*choiceState
	prompts [][]uint32
	notify  chan struct{}
	buf     []uint32
}

// wait blocks until a stream changed; false when the client left.
func (o *responder) wait() bool {
	select {
	case <-o.notify:
		return true
	case <-o.r.Context().Done():
		return false
	}
}

// collect drains every choice's new tokens, calling each(choice, token,
// last) per token; it returns an engine error (restart, stop) if any.
func (o *responder) collect(each func(c *choiceState, i int, tok uint32, last bool)) error {
	for i, c := range o.choices {
		if c.done {
			continue
		}
		st := c.st.take(o.buf)
		o.buf = st.toks
		if st.err != nil {
			return st.err
		}
		c.cached = st.cached
		if st.blockIDs != nil {
			c.blockIDs = st.blockIDs
		}
		for k, tok := range st.toks {
			c.generated++
			last := st.finished && k == len(st.toks)-1
			if last {
				c.done, c.reason = true, st.reason
			}
			each(c, i, tok, last)
		}
	}
	return nil
}

func (o *responder) allDone() bool {
	for _, c := range o.choices {
		if !c.done {
			return false
		}
	}
	return true
}

// usage sums prompt tokens once per prompt and generated tokens per choice;
// cached tokens come from each prompt's first choice.
func (o *responder) usage() *usage {
	u := &usage{}
	cached := 0
	for _, p := range o.prompts {
		u.PromptTokens += len(p)
	}
	seen := make(map[int]bool)
	for _, c := range o.choices {
		u.CompletionTokens += c.generated
		if !seen[c.prompt] {
			seen[c.prompt] = true
			cached += max(c.cached, 0)
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if !o.s.cfg.NoPromptTokensDetails {
		u.PromptTokensDetails = &promptDetails{CachedTokens: cached}
	}
	return u
}

// whole waits for every choice and writes one JSON response.
func (o *responder) whole() {
	for {
		if err := o.collect(func(c *choiceState, _ int, tok uint32, _ bool) {
			c.text.WriteString(o.s.words.token(tok))
		}); err != nil {
			panic(http.ErrAbortHandler) // the engine died: the connection drops
		}
		if o.allDone() {
			break
		}
		if !o.wait() {
			return
		}
	}
	created := o.s.cfg.Clock.Now().Unix()
	var ktp map[string]any
	if c := o.choices[0]; c.blockIDs != nil {
		ktp = o.s.transferParams(c.st.id, c.blockIDs, len(o.prompts[c.prompt]))
	}
	if o.chat {
		resp := chatResponse{ID: o.id, Object: "chat.completion", Created: created, Model: o.model(), Usage: o.usage(), KVTransferParams: ktp}
		for i, c := range o.choices {
			reason := c.reason
			resp.Choices = append(resp.Choices, chatChoice{Index: i, Message: &chatMessage{Role: "assistant", Content: c.text.String()},
				FinishReason: &reason})
		}
		writeJSON(o.w, resp)
		return
	}
	resp := completionResponse{ID: o.id, Object: "text_completion", Created: created, Model: o.model(), Usage: o.usage(), KVTransferParams: ktp}
	for i, c := range o.choices {
		reason := c.reason
		resp.Choices = append(resp.Choices, completionChoice{Index: i, Text: c.text.String(), FinishReason: &reason})
	}
	writeJSON(o.w, resp)
}

func (o *responder) model() string {
	if o.req.Model != "" {
		return o.req.Model
	}
	return o.s.cfg.ServedModelName
}

// stream writes SSE chunks as tokens arrive: one chunk per token per
// choice, the finish reason on the last one, then the usage chunk when
// stream_options.include_usage, then "data: [DONE]". dieAfter >= 0 cuts the
// connection after exactly that many token chunks, counted over all
// choices and checked per token (fault).
func (o *responder) stream(dieAfter int) {
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	o.w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(o.w)
	// Headers go out at once, body bytes with the first output: vLLM's
	// StreamingResponse sends its headers before iterating the generator,
	// whose first chunk (the chat role) waits for the engine's first
	// output (serving_chat.py chat_completion_stream_generator).
	if rc.Flush() != nil {
		return
	}
	created := o.s.cfg.Clock.Now().Unix()
	opts := o.req.StreamOptions
	includeUsage := opts != nil && opts.IncludeUsage
	continuous := includeUsage && opts.ContinuousUsageStats
	object := "text_completion"
	if o.chat {
		object = "chat.completion.chunk"
	}
	var sb strings.Builder
	sent := 0
	write := func(v any) {
		b, _ := json.Marshal(v)
		sb.WriteString("data: ")
		sb.Write(b)
		sb.WriteString("\n\n")
	}
	rolesSent := !o.chat
	for {
		err := o.collect(func(c *choiceState, i int, tok uint32, last bool) {
			if dieAfter >= 0 && sent >= dieAfter {
				return // the engine dies at exactly dieAfter tokens, whatever the batch holds
			}
			if !rolesSent { // with the first output, the first chunk of each choice carries the role
				rolesSent = true
				for i := range o.choices {
					write(chatResponse{ID: o.id, Object: object, Created: created, Model: o.model(),
						Choices: []chatChoice{{Index: i, Delta: &chatMessage{Role: "assistant"}}}})
				}
			}
			var reason *string
			if last {
				r := c.reason
				reason = &r
			}
			text := o.s.words.token(tok)
			var u *usage
			if continuous {
				u = o.usage()
			}
			if o.chat {
				write(chatResponse{ID: o.id, Object: object, Created: created, Model: o.model(), Usage: u,
					Choices: []chatChoice{{Index: i, Delta: &chatMessage{Content: text}, FinishReason: reason}}})
			} else {
				write(completionResponse{ID: o.id, Object: object, Created: created, Model: o.model(), Usage: u,
					Choices: []completionChoice{{Index: i, Text: text, FinishReason: reason}}})
			}
			sent++
		})
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		if dieAfter >= 0 && sent >= dieAfter {
			o.flush(rc, &sb)
			o.s.m.faults.WithLabelValues("die").Inc()
			panic(http.ErrAbortHandler)
		}
		if o.allDone() {
			break
		}
		if !o.flush(rc, &sb) || !o.wait() {
			return
		}
	}
	if includeUsage {
		if o.chat {
			write(chatResponse{ID: o.id, Object: object, Created: created, Model: o.model(), Choices: []chatChoice{}, Usage: o.usage()})
		} else {
			write(completionResponse{ID: o.id, Object: object, Created: created, Model: o.model(), Choices: []completionChoice{}, Usage: o.usage()})
		}
	}
	sb.WriteString("data: [DONE]\n\n")
	o.flush(rc, &sb)
}

// flush writes and flushes what sb holds; false when the client is gone.
func (o *responder) flush(rc *http.ResponseController, sb *strings.Builder) bool {
	if sb.Len() == 0 {
		return true
	}
	_, err := io.WriteString(o.w, sb.String())
	sb.Reset()
	if err != nil {
		return false
	}
	return rc.Flush() == nil
}
