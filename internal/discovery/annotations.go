package discovery

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"kvrouter/internal/config"
)

// Pod annotations that set one engine's config.EngineSettings; an absent annotation
// leaves config.Discovery.Defaults' value. A value that does not parse is reported
// (logged once, counted) and the default is used for that setting.
const (
	// AnnotationEventsPort is the KV event PUB port, "5557"; "0" means no
	// events (config.EngineSettings.EventsPort).
	AnnotationEventsPort = "kvrouter/events-port"
	// AnnotationReplayPort is the replay ROUTER port, "5558"; "0" means no
	// replay (config.EngineSettings.ReplayPort).
	AnnotationReplayPort = "kvrouter/replay-port"
	// AnnotationDPSize is the data-parallel size, "2" (config.EngineSettings.DPSize).
	AnnotationDPSize = "kvrouter/dp-size"
	// AnnotationTopic is the KV events topic, any string (config.EngineSettings.Topic).
	AnnotationTopic = "kvrouter/topic"
	// AnnotationAPIKeySecret is "SECRET/KEY", the Secret key holding the
	// engine's API key; "" means none (config.EngineSettings.APIKeySecret).
	AnnotationAPIKeySecret = "kvrouter/api-key-secret"
)

// settingsFrom overlays annotations on def. Each bad annotation is passed
// to bad and leaves def's value; a combination that does not fit (ports
// overlapping for this dp_size) falls back to def as a whole.
func settingsFrom(ann map[string]string, def config.EngineSettings, bad func(key, value string, err error)) config.EngineSettings {
	s := def
	port := func(key string, dst *int) {
		v, ok := ann[key]
		if !ok {
			return
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err == nil && (n < 0 || n > 65535) {
			err = fmt.Errorf("port %d out of range", n)
		}
		if err != nil {
			bad(key, v, err)
			return
		}
		*dst = n
	}
	port(AnnotationEventsPort, &s.EventsPort)
	port(AnnotationReplayPort, &s.ReplayPort)
	if v, ok := ann[AnnotationDPSize]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err == nil && (n < 1 || n > config.MaxDPSize) {
			err = fmt.Errorf("dp_size %d not in 1..%d", n, config.MaxDPSize)
		}
		if err != nil {
			bad(AnnotationDPSize, v, err)
		} else {
			s.DPSize = n
		}
	}
	if v, ok := ann[AnnotationTopic]; ok {
		s.Topic = v
	}
	if v, ok := ann[AnnotationAPIKeySecret]; ok {
		ref, err := parseSecretRef(v)
		if err != nil {
			bad(AnnotationAPIKeySecret, v, err)
		} else {
			s.APIKeySecret = ref
		}
	}
	if errs := s.Check(); len(errs) > 0 {
		joined := make([]error, len(errs))
		for i, e := range errs {
			joined[i] = e
		}
		bad("kvrouter/*", fmt.Sprintf("events %d, replay %d, dp_size %d", s.EventsPort, s.ReplayPort, s.DPSize), errors.Join(joined...))
		return def
	}
	return s
}

// parseSecretRef parses "SECRET/KEY" ("" is no reference).
func parseSecretRef(v string) (config.SecretRef, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return config.SecretRef{}, nil
	}
	name, key, ok := strings.Cut(v, "/")
	if !ok {
		return config.SecretRef{}, fmt.Errorf("want SECRET/KEY")
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return config.SecretRef{}, fmt.Errorf("secret name %q: %s", name, msgs[0])
	}
	if msgs := validation.IsConfigMapKey(key); len(msgs) > 0 {
		return config.SecretRef{}, fmt.Errorf("secret key %q: %s", key, msgs[0])
	}
	return config.SecretRef{Name: name, Key: key}, nil
}
