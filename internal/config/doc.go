// Package config is router.yaml's schema: the types a file decodes into,
// their defaults, strict parsing that names each problem's field and line,
// validation, and the comparison of a running configuration with a
// reloaded one (Compare).
//
// Parse is the entry point: it decodes with unknown fields refused, fills
// defaults (Default, Config.FillDefaults; a zero field means the default
// its comment gives) and environment overrides, and validates, returning
// every problem at once, each as "models[0].engines[1].url (line 9): ...".
// Units are those of each field's comment: bytes, tokens, time.Duration
// for durations (YAML "5s").
//
// The Kubernetes settings (Discovery, Peers) are plain data here; package
// discovery watches the API with them. Nothing here imports a Kubernetes
// client or ZeroMQ, so the HTTP front and the tools that read router.yaml
// do not pull them in. The package starts no goroutines and holds no
// state; a Config is a value, safe to read from many goroutines once
// nobody writes it.
package config
