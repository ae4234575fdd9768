package config

import (
	"encoding/json"
	"fmt"
	"time"
)

// AdapterConfig is one LoRA adapter served by a model group's engines.
type Adapter struct {
	// Name is the adapter's model id, as clients send it (vLLM's
	// lora_name).
	Name string `yaml:"name"`
	// Path is the adapter's lora_path on the engines, for loading it at
	// run time ("": never loaded by kvrouter).
	Path string `yaml:"path"`
}

// Adapter loading modes of Model.AdapterLoading.
const (
	AdapterLoadingOff  = "off"
	AdapterLoadingLoad = "load"
)

// validateAdapters checks models[i]'s adapters.
func validateAdapters(m *Model, i int, seen map[string]bool) []error {
	var errs []error
	if m.AdapterLoading != AdapterLoadingOff && m.AdapterLoading != AdapterLoadingLoad {
		errs = append(errs, ferr(fmt.Sprintf("%q: want off or load", m.AdapterLoading), "models", i, "adapter_loading"))
	}
	for j, a := range m.Adapters {
		switch {
		case a.Name == "":
			errs = append(errs, ferr("required", "models", i, "adapters", j, "name"))
		case seen[a.Name]:
			errs = append(errs, ferr(fmt.Sprintf("%q: already a model or adapter name", a.Name), "models", i, "adapters", j, "name"))
		}
		seen[a.Name] = true
	}
	return errs
}

// AliasConfig is one route alias of a model group.
type Alias struct {
	// Name is the model name clients send.
	Name string `yaml:"name"`
	// ChatTemplateKwargs are set in a chat request's chat_template_kwargs,
	// over the client's (e.g. {enable_thinking: false}).
	ChatTemplateKwargs map[string]any `yaml:"chat_template_kwargs"`
	// ThinkingTokenBudget, when set, caps the request's
	// thinking_token_budget (set when absent).
	ThinkingTokenBudget *int `yaml:"thinking_token_budget"`
	// MaxTokens is max_tokens for a request that sets neither max_tokens
	// nor max_completion_tokens (0: none).
	MaxTokens int `yaml:"max_tokens"`
	// MaxTokensCap caps max_tokens and max_completion_tokens (set to it
	// when absent and MaxTokens is 0; 0: no cap).
	MaxTokensCap int `yaml:"max_tokens_cap"`
	// StripReasoning removes reasoning_content and reasoning from the
	// engine's answers.
	StripReasoning bool `yaml:"strip_reasoning"`
	// Media replaces the group's media limits for this route.
	Media *MediaLimits `yaml:"media"`
}

// validateAliases checks models[i]'s aliases; seen holds the names taken.
func validateAliases(m *Model, i int, seen map[string]bool) []error {
	var errs []error
	for j, a := range m.Aliases {
		switch {
		case a.Name == "":
			errs = append(errs, ferr("required", "models", i, "aliases", j, "name"))
		case seen[a.Name]:
			errs = append(errs, ferr(fmt.Sprintf("%q: already a model, adapter or alias name", a.Name), "models", i, "aliases", j, "name"))
		}
		seen[a.Name] = true
		if a.MaxTokens < 0 || a.MaxTokensCap < 0 || a.MaxTokensCap > 0 && a.MaxTokens > a.MaxTokensCap {
			errs = append(errs, ferr(fmt.Sprintf("max_tokens %d, max_tokens_cap %d: want 0 <= max_tokens <= max_tokens_cap (0: none)", a.MaxTokens, a.MaxTokensCap), "models", i, "aliases", j))
		}
		if a.ThinkingTokenBudget != nil && *a.ThinkingTokenBudget < 0 {
			errs = append(errs, ferr("must be >= 0", "models", i, "aliases", j, "thinking_token_budget"))
		}
		if _, err := json.Marshal(a.ChatTemplateKwargs); err != nil {
			errs = append(errs, ferr(err.Error(), "models", i, "aliases", j, "chat_template_kwargs"))
		}
	}
	return errs
}

// MediaLimits bound the media items of one prompt. Zero fields: no limit.
type MediaLimits struct {
	// MaxItems maps a modality (image, audio, video) to the most items one
	// prompt may carry (0: none allowed); a modality not listed is not
	// limited.
	MaxItems map[string]int `yaml:"max_items"`
	// MaxPixels bounds the sum of width*height over the prompt's inlined
	// images.
	MaxPixels int64 `yaml:"max_pixels"`
	// MaxVisualTokens bounds the prompt's estimated visual tokens
	// (Qwen2VLImageTokens of each inlined image).
	MaxVisualTokens int `yaml:"max_visual_tokens"`
}

// validateMedia checks limits at path.
func validateMedia(lim *MediaLimits, path ...any) []error {
	if lim == nil {
		return nil
	}
	var errs []error
	for mod, n := range lim.MaxItems {
		if mod != "image" && mod != "audio" && mod != "video" {
			errs = append(errs, ferr(fmt.Sprintf("unknown modality %q (image, audio, video)", mod), append(path, "max_items")...))
		}
		if n < 0 {
			errs = append(errs, ferr(fmt.Sprintf("%s: %d: must be >= 0", mod, n), append(path, "max_items")...))
		}
	}
	if lim.MaxPixels < 0 || lim.MaxVisualTokens < 0 {
		errs = append(errs, ferr("max_pixels and max_visual_tokens must be >= 0", path...))
	}
	return errs
}

// ClientsConfig lists the engine controls clients may set themselves.
type Clients struct {
	// AllowDPRank forwards a client's X-Data-Parallel-Rank header when the
	// router does not choose a rank itself (default false: dropped).
	AllowDPRank bool `yaml:"allow_dp_rank"`
	// AllowKVTransferParams forwards a body's kv_transfer_params (default
	// false: the request is answered 400).
	AllowKVTransferParams bool `yaml:"allow_kv_transfer_params"`
}

// SnapshotConfig configures snapshots of the exact index (router.yaml
// "snapshot"): written on shutdown and every Interval, read on start.
type Snapshot struct {
	// Path is the snapshot file ("" : no snapshots). It is written by a
	// temporary file in the same directory renamed over it, so a reader
	// finds the old file or the new one, never a part.
	Path string `yaml:"path"`
	// Interval between periodic snapshots while serving (default 5m;
	// negative: only on shutdown).
	Interval time.Duration `yaml:"interval"`
}

// DefaultSnapshotInterval is Snapshot.Interval's default.
const DefaultSnapshotInterval = 5 * time.Minute

func (c *Snapshot) fillDefaults() {
	if c.Interval == 0 {
		c.Interval = DefaultSnapshotInterval
	}
}

// DefaultBodyLimit is the default Config.BodyLimit, in bytes: 16 MiB, twice
// what the largest context vLLM serves today needs as a request body. A
// prompt of 1,048,576 tokens (max_model_len of the longest-context models,
// e.g. Qwen2.5-*-Instruct-1M) sent as token ids takes at most 8 bytes per
// token with Python's json.dumps separators (ids of 6 digits for a
// vocabulary under 1M, then ", "): 8 MiB. As text it is about 4 bytes per
// token in English; CJK text escaped as \uXXXX takes about 6 bytes per
// character at about 1.5 characters per token: 9 MiB. The other half leaves
// room for images as data URLs (media limits apply to those separately).
const DefaultBodyLimit = 16 << 20
