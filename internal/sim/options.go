package sim

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"kvrouter/internal/routing"
)

// The "kvrouter sim" flags' values, parsed and checked.

// ParseLoads reads --load: one value (0: the scenario's default) or a
// comma-separated list of positive loads to sweep.
func ParseLoads(s string) ([]float64, error) {
	var out []float64
	for _, part := range splitList(s) {
		v, err := strconv.ParseFloat(part, 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("%q: want a non-negative number", part)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return []float64{0}, nil
	}
	if len(out) > 1 {
		for _, v := range out {
			if v == 0 {
				return nil, fmt.Errorf("a sweep needs positive loads, got %s", s)
			}
		}
	}
	return out, nil
}

// LoadRoutingConfig reads routing weights from a YAML file, rejecting
// unknown fields.
func LoadRoutingConfig(path string) (routing.Config, error) {
	var cfg routing.Config
	f, err := os.Open(path)
	if err != nil {
		return cfg, fmt.Errorf("routing config: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return cfg, fmt.Errorf("routing config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseScale parses "TIME:DELTA,..." (e.g. "120s:+4,300s:-2").
func ParseScale(s string) ([]Scale, error) {
	var out []Scale
	for _, part := range splitList(s) {
		at, delta, ok := strings.Cut(part, ":")
		if !ok {
			return nil, fmt.Errorf("%q: want TIME:DELTA", part)
		}
		d, err := time.ParseDuration(at)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", part, err)
		}
		n, err := strconv.Atoi(strings.TrimPrefix(delta, "+"))
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q: delta must be a non-zero integer", part)
		}
		out = append(out, Scale{At: d, Delta: n})
	}
	return out, nil
}

// MaxReplicas bounds the simulated fleet at any moment: each replica is a
// whole engine core with its own prefix cache (about 1 MB of index tables
// and its block pool), so an unbounded --scale could exhaust memory.
const MaxReplicas = 1024

// CheckSize rejects fleet sizes and request counts the simulator cannot
// run: --replicas outside 1..MaxReplicas, a negative --requests, or
// --scale steps that take the fleet above MaxReplicas or below 1 at any
// time.
func CheckSize(replicas, requests int, scale []Scale) error {
	if replicas < 1 || replicas > MaxReplicas {
		return fmt.Errorf("--replicas %d: want 1..%d", replicas, MaxReplicas)
	}
	if requests < 0 {
		return fmt.Errorf("--requests %d: must not be negative", requests)
	}
	steps := slices.Clone(scale)
	slices.SortStableFunc(steps, func(a, b Scale) int { return cmp.Compare(a.At, b.At) })
	n := replicas
	for _, st := range steps {
		if n += st.Delta; n > MaxReplicas {
			return fmt.Errorf("--scale: %v:%+d makes %d replicas, more than %d", st.At, st.Delta, n, MaxReplicas)
		}
		if n < 1 {
			return fmt.Errorf("--scale: %v:%+d leaves %d replicas, need at least 1", st.At, st.Delta, n)
		}
	}
	return nil
}

// splitList splits a comma-separated value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
