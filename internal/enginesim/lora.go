package enginesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LoRA adapters, as vLLM serves them (vllm/entrypoints/openai/models/
// serving.py OpenAIServingModels): adapters given at start (--lora-modules)
// and those loaded at run time with POST /v1/load_lora_adapter
// {"lora_name", "lora_path", "load_inplace"} (only when the server allows
// runtime updates, vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) are model
// ids; /v1/models lists each with "parent" = the base model. A request for
// an adapter carries its name as the LoRA name of every block's extra keys
// (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys), so its
// blocks never match the base model's. vllm:lora_requests_info (vllm/v1/
// metrics/loggers.py) has labels max_lora, running_lora_adapters and
// waiting_lora_adapters (names joined by ","), value the time of the
// scrape.

// loraSet is the adapters a server (all its data-parallel ranks) serves.
// Safe for concurrent use.
type loraSet struct {
	mu    sync.Mutex
	names []string
}

func (l *loraSet) has(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.names, name)
}

func (l *loraSet) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.names)
}

// add adds name; false when it was there.
func (l *loraSet) add(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if slices.Contains(l.names, name) {
		return false
	}
	l.names = append(l.names, name)
	return true
}

// loadLoRARequest is vLLM's LoadLoRAAdapterRequest
// (vllm/entrypoints/serve/lora/protocol.py).
type loadLoRARequest struct {
	LoRAName    string `json:"lora_name"`
	LoRAPath    string `json:"lora_path"`
	LoadInplace bool   `json:"load_inplace"`
}

// loadLoRA serves POST /v1/load_lora_adapter: after Config.LoRALoadDelay
// the adapter is a model id of every rank. Answers as vLLM's
// OpenAIServingModels.load_lora_adapter: 400 without both name and path,
// or for an adapter already loaded without load_inplace; 200 with a text
// body on success.
func (s *Server) loadLoRA(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req loadLoRARequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.LoRAName == "" || req.LoRAPath == "" {
		writeError(w, http.StatusBadRequest, "Both 'lora_name' and 'lora_path' must be provided.")
		return
	}
	if s.loras.has(req.LoRAName) && !req.LoadInplace {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", req.LoRAName))
		return
	}
	if d := s.cfg.LoRALoadDelay; d > 0 && !s.sleepCtx(r, d) {
		return
	}
	s.loras.add(req.LoRAName)
	s.m.loraLoads.Inc()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.LoRAName)
}

// ActiveLoRAs returns the adapter names of running and of waiting
// requests, each sorted and without repeats.
func (c *Core) ActiveLoRAs() (running, waiting []string) {
	for _, s := range c.running {
		if s.lora != nil {
			running = append(running, *s.lora)
		}
	}
	for i := range c.waiting.size {
		if s := c.waiting.buf[(c.waiting.head+i)%len(c.waiting.buf)]; s.lora != nil {
			waiting = append(waiting, *s.lora)
		}
	}
	slices.Sort(running)
	slices.Sort(waiting)
	return slices.Compact(running), slices.Compact(waiting)
}

// loraInfo is vllm:lora_requests_info, read from the snapshot at scrape
// time: one series, labelled with the current adapters, value now.
type loraInfo struct {
	desc    *prometheus.Desc
	maxLoRA string
	state   func() *snapshot
	now     func() time.Time
}

func newLoRAInfo(model string, rank, maxLoRA int, state func() *snapshot, now func() time.Time) *loraInfo {
	return &loraInfo{
		desc: prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.",
			[]string{"max_lora", "waiting_lora_adapters", "running_lora_adapters"},
			prometheus.Labels{"model_name": model, "engine": strconv.Itoa(rank)}),
		maxLoRA: strconv.Itoa(maxLoRA), state: state, now: now,
	}
}

func (l *loraInfo) Describe(ch chan<- *prometheus.Desc) { ch <- l.desc }

func (l *loraInfo) Collect(ch chan<- prometheus.Metric) {
	st := l.state()
	ch <- prometheus.MustNewConstMetric(l.desc, prometheus.GaugeValue, float64(l.now().UnixNano())/1e9,
		l.maxLoRA, strings.Join(st.waitingLoRAs, ","), strings.Join(st.runningLoRAs, ","))
}
