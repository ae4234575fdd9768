package config

import (
	"time"
)

// ListenerConfig bounds the connections of the HTTP listeners (the main
// and the admin one, each on its own count). A zero field means the
// default in its comment.
type Listener struct {
	// HeaderTimeout bounds the wait for a request's headers, from the
	// connection's accept or the previous answer (default 10s).
	HeaderTimeout time.Duration `yaml:"header_timeout"`
	// BodyIdleTimeout bounds the wait for each next part of a request
	// body (default 30s): a client that stops sending mid-body is answered
	// 408 and its connection closed. A body of any length may take any
	// time while it keeps coming.
	BodyIdleTimeout time.Duration `yaml:"body_idle_timeout"`
	// BodyTimeout bounds the wait for a whole request body, from its
	// request's headers (default 2m): a body still unfinished then is
	// answered 408 and its connection closed. With body buffers taken
	// from the body budget as bytes arrive, it bounds how long bytes
	// sent once can hold that budget.
	BodyTimeout time.Duration `yaml:"body_timeout"`
	// IdleTimeout closes a keep-alive connection after this long without
	// a request (default 60s).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConnections caps the open client connections (default 8192);
	// keep it well below the process's file descriptor limit (each
	// request also holds a connection to an engine).
	MaxConnections int `yaml:"max_connections"`
	// ReservedConnections are accepted past MaxConnections for GET /health
	// and GET /ready only (default 32; negative: none).
	ReservedConnections int `yaml:"reserved_connections"`
	// MaxHeaderBytes bounds a request's line and headers, in bytes
	// (default 64 KiB); larger ones are answered 431 by net/http.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
}

// defaultListener returns the listener defaults.
func defaultListener() Listener {
	return Listener{
		HeaderTimeout:       10 * time.Second,
		BodyIdleTimeout:     30 * time.Second,
		BodyTimeout:         2 * time.Minute,
		IdleTimeout:         60 * time.Second,
		MaxConnections:      8192,
		ReservedConnections: 32,
		MaxHeaderBytes:      64 << 10,
	}
}

func (l *Listener) fillDefaults(d Listener) {
	if l.HeaderTimeout == 0 {
		l.HeaderTimeout = d.HeaderTimeout
	}
	if l.BodyIdleTimeout == 0 {
		l.BodyIdleTimeout = d.BodyIdleTimeout
	}
	if l.BodyTimeout == 0 {
		l.BodyTimeout = d.BodyTimeout
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	if l.MaxConnections == 0 {
		l.MaxConnections = d.MaxConnections
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	switch {
	case l.ReservedConnections == 0:
		l.ReservedConnections = d.ReservedConnections
	case l.ReservedConnections < 0:
		l.ReservedConnections = -1 // none; kept non-zero so a refill keeps it
	}
}

func (l *Listener) validate() []error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"header_timeout", l.HeaderTimeout}, {"body_idle_timeout", l.BodyIdleTimeout}, {"body_timeout", l.BodyTimeout}, {"idle_timeout", l.IdleTimeout}} {
		if d.v < 0 {
			errs = append(errs, ferr("must be positive", "http", d.name))
		}
	}
	if l.MaxConnections < 0 {
		errs = append(errs, ferr("must be positive", "http", "max_connections"))
	}
	if l.MaxHeaderBytes < 0 {
		errs = append(errs, ferr("must be positive", "http", "max_header_bytes"))
	}
	return errs
}
