package serve

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/pool"
	"kvrouter/internal/proxy"
)

// reloader re-reads router.yaml while serving, on SIGHUP and when the
// file's content changes (polled: a Kubernetes ConfigMap volume swaps a
// symlink, which reading the path through it sees). A reload parses and
// validates the whole file first: a bad file changes nothing. Of a good
// file it applies the engine lists of the static model groups (each to its
// group's pool); every other setting needs a restart, and a changed one is
// named in the log line and otherwise ignored. One goroutine (Run) owns it.
type reloader struct {
	path     string               // "" when serve was started without --config
	getenv   func(string) string  // environment for api_key_env and KVROUTER_API_KEY
	override func(*config.Config) // the command line's overrides (--listen, --tls-*)
	poll     time.Duration        // <= 0: no polling, SIGHUP only
	hup      <-chan os.Signal
	log      *slog.Logger
	m        *reloadMetrics
	now      func() time.Time

	// running is the configuration in effect: the start's, with the
	// engine lists last applied.
	running config.Config
	// exact: the group started with KV events (an exact index); a group
	// without cannot take events until a restart.
	exact map[string]bool
	pools map[string]*pool.Pool // static groups' pools by model
	last  [32]byte              // hash of the content last tried
}

// reloadMetrics are the reloader's collectors.
type reloadMetrics struct {
	reloads     *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	restart     prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer, now time.Time) (*reloadMetrics, error) {
	m := &reloadMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_config_reloads_total",
			Help: "router.yaml reloads by result: ok (applied), error (the file was refused, or some engines could not be added).",
		}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful load of router.yaml (the start, or the last reload with result ok).",
		}),
		restart: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_config_restart_needed",
			Help: "1 when the last good router.yaml changed settings that only a restart applies (named in the reload's log line), else 0.",
		}),
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	m.lastSuccess.Set(float64(now.UnixNano()) / 1e9)
	for _, c := range []prometheus.Collector{m.reloads, m.lastSuccess, m.restart} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Run reloads on every SIGHUP and every changed content until ctx ends.
func (r *reloader) Run(ctx context.Context) error {
	var tick <-chan time.Time
	if r.poll > 0 && r.path != "" {
		t := time.NewTicker(r.poll)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.hup:
			if r.path == "" {
				r.log.Warn("SIGHUP ignored: serve was started without --config, there is no file to reload")
				continue
			}
			r.check("sighup")
		case <-tick:
			r.check("poll")
		}
	}
}

// check reads the file and reloads it when asked by SIGHUP or when its
// content differs from the content last tried (a bad file is not retried
// until it changes again).
func (r *reloader) check(trigger string) {
	data, err := os.ReadFile(r.path)
	h := sha256.Sum256(data)
	if err != nil {
		h = sha256.Sum256([]byte("read error: " + err.Error()))
	}
	if trigger == "poll" && h == r.last {
		return
	}
	r.last = h
	if err != nil {
		r.refused(trigger, err)
		return
	}
	r.reload(trigger, data)
}

func (r *reloader) refused(trigger string, err error) {
	r.m.reloads.WithLabelValues("error").Inc()
	r.log.Error("config reload refused; the running config stays", "path", r.path, "trigger", trigger, "err", err)
}

// reload applies data (see the type doc).
func (r *reloader) reload(trigger string, data []byte) {
	cfg, pos, err := config.Parse(data, r.getenv)
	if err != nil {
		r.refused(trigger, err)
		return
	}
	if r.override != nil {
		r.override(&cfg)
	}
	diff := config.Compare(r.running, cfg, r.exact)
	restart := diff.Restart
	// The groups whose engines change: static both before and after.
	type group struct {
		i   int // index in cfg.Models
		old []pool.Engine
		new []pool.Engine
	}
	var groups []group
	for _, g := range diff.Groups {
		groups = append(groups, group{i: g.Next, old: staticEngines(r.running.Models[g.Running]), new: staticEngines(cfg.Models[g.Next])})
	}
	// Removals first, in every group, so that an engine moved from one
	// group to another is gone from the first before the second adds it
	// (engine names are unique in the fleet).
	for _, g := range groups {
		keep := slices.DeleteFunc(slices.Clone(g.new), func(e pool.Engine) bool {
			return !slices.ContainsFunc(g.old, func(o pool.Engine) bool { return o.Name == e.Name })
		})
		_ = r.pools[cfg.Models[g.i].Name].Set(keep) // the errors come again from the full Set below
	}
	var errs []error
	added, removed, changed := 0, 0, 0
	for _, g := range groups {
		m := cfg.Models[g.i]
		if err := r.pools[m.Name].Set(g.new); err != nil {
			errs = append(errs, engineErrors(err, m, g.i, pos))
		}
		a, d, c := engineChanges(g.old, g.new)
		added, removed, changed = added+a, removed+d, changed+c
		j := slices.IndexFunc(r.running.Models, func(o config.Model) bool { return o.Name == m.Name })
		r.running.Models[j].Engines = m.Engines
	}
	attrs := []any{"path", r.path, "trigger", trigger, "engines_added", added, "engines_removed", removed, "engines_changed", changed}
	if len(restart) > 0 {
		attrs = append(attrs, "needs_restart", strings.Join(restart, ", "))
		r.m.restart.Set(1)
	} else {
		r.m.restart.Set(0)
	}
	if err := errors.Join(errs...); err != nil {
		r.m.reloads.WithLabelValues("error").Inc()
		r.log.Error("config reload: some engines could not be added (the rest is applied; the next reload retries them)", append(attrs, "err", err)...)
		return
	}
	r.m.reloads.WithLabelValues("ok").Inc()
	r.m.lastSuccess.Set(float64(r.now().UnixNano()) / 1e9)
	lvl := slog.LevelInfo
	if len(restart) > 0 {
		lvl = slog.LevelWarn
	}
	r.log.Log(context.Background(), lvl, "config reloaded", attrs...)
}

// engineChanges counts the engines added, removed and changed (same name,
// other settings) from old to new.
func engineChanges(old, new []pool.Engine) (added, removed, changed int) {
	for _, n := range new {
		i := slices.IndexFunc(old, func(o pool.Engine) bool { return o.Name == n.Name })
		switch {
		case i < 0:
			added++
		case old[i] != n:
			changed++
		}
	}
	for _, o := range old {
		if !slices.ContainsFunc(new, func(n pool.Engine) bool { return n.Name == o.Name }) {
			removed++
		}
	}
	return added, removed, changed
}

// hookedFleet is the fleet as a group's pool sees it: adding and removing
// an endpoint also creates and deletes its proxy series (the server is set
// once built; engines added before that get theirs from proxy.New).
type hookedFleet struct {
	*fleet.Fleet
	model string
	srv   *atomic.Pointer[proxy.Server]
}

// Add implements pool.Endpoints.
func (h hookedFleet) Add(ec fleet.EndpointConfig) (*fleet.Endpoint, error) {
	ep, err := h.Fleet.Add(ec)
	if s := h.srv.Load(); err == nil && s != nil {
		s.ReplicaAdded(h.model, ec.Name)
	}
	return ep, err
}

// Remove implements pool.Endpoints.
func (h hookedFleet) Remove(name string) bool {
	ok := h.Fleet.Remove(name)
	if s := h.srv.Load(); ok && s != nil {
		s.ReplicaRemoved(name)
	}
	return ok
}
