package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// Report records the outcome of one forwarded request on ep (passive health
// checking): a connection error or timeout takes ep down at once, a run of
// server errors or backpressure answers takes it down at the configured
// count, and any OK answer resets the runs. On an endpoint already down
// (one routed in panic mode) a failure only records its class: a
// connection error makes it a definite failure, so panic mode stops
// routing it.
func (f *Fleet) Report(ep *Endpoint, o Outcome) {
	now := f.cfg.Now()
	ep.mu.Lock()
	ejected, wasSoft := false, ep.down && ep.soft
	switch o {
	case OutcomeOK:
		ep.serverErrs, ep.backpress = 0, 0
	case OutcomeConnError, OutcomeTimeout:
		ejected = ep.ejectLocked(now, f.cfg.BackoffMax, o == OutcomeTimeout)
	case OutcomeServerError:
		ep.serverErrs++
		if ep.serverErrs >= f.cfg.EjectAfterServerErrors {
			ejected = ep.ejectLocked(now, f.cfg.BackoffMax, false)
		}
	case OutcomeBackpressure:
		ep.backpress++
		if ep.backpress >= f.cfg.EjectAfterBackpressure {
			ejected = ep.ejectLocked(now, f.cfg.BackoffMax, false)
		}
	}
	until, isSoft := ep.downUntil, ep.down && ep.soft
	ep.mu.Unlock()
	if ejected {
		f.withMetrics(ep, func(m *metrics) {
			m.ejections.WithLabelValues(ep.name, o.String()).Inc()
			m.up.WithLabelValues(ep.name).Set(0)
		})
		f.log.Warn("endpoint ejected", "endpoint", ep.name, "reason", o.String(), "until", until)
	}
	if ejected || wasSoft != isSoft {
		f.refreshPanic(ep)
	}
}

// Run probes and scrapes every endpoint until ctx is done, then returns
// ctx's error after all its goroutines have returned. Endpoints added while
// it runs get their loops at once; a removed endpoint's loops are stopped.
// A panic in a probe or scrape stops every loop and is returned as an error
// instead.
func (f *Fleet) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		panics []error
	)
	guard := func(what string, ep *Endpoint, fn func()) func() {
		return func() {
			defer func() {
				if r := recover(); r != nil {
					mu.Lock()
					panics = append(panics, fmt.Errorf("fleet: %s of %s panicked: %v", what, ep.name, r))
					mu.Unlock()
					cancel()
				}
			}()
			fn()
		}
	}
	start := func(ep *Endpoint) context.CancelFunc {
		ectx, stop := context.WithCancel(ctx)
		rng := rand.New(rand.NewPCG(hashString(ep.base), 0x6b76726f75746572))
		if f.cfg.ProbeInterval > 0 {
			wg.Go(guard("probe", ep, func() { f.loop(ectx, ep, f.cfg.ProbeInterval, rng, f.probe) }))
		}
		if f.cfg.ScrapeInterval > 0 {
			srng := rand.New(rand.NewPCG(hashString(ep.base), 0x736372617065))
			wg.Go(guard("scrape", ep, func() { f.loop(ectx, ep, f.cfg.ScrapeInterval, srng, f.scrape) }))
		}
		if f.cfg.ModelsInterval > 0 {
			mrng := rand.New(rand.NewPCG(hashString(ep.base), 0x6d6f64656c73))
			wg.Go(guard("model check", ep, func() { f.loop(ectx, ep, f.cfg.ModelsInterval, mrng, f.checkModels) }))
		}
		return stop
	}
	if f.cfg.StallAfter > 0 {
		wg.Go(guard("stall watch", &Endpoint{name: "every endpoint"}, func() { f.watchStalls(ctx) }))
	}
	running := map[*Endpoint]context.CancelFunc{}
	for {
		now := map[*Endpoint]bool{}
		for _, ep := range f.All() {
			now[ep] = true
			if running[ep] == nil {
				running[ep] = start(ep)
			}
		}
		for ep, stop := range running {
			if !now[ep] {
				stop()
				delete(running, ep)
			}
		}
		select {
		case <-f.changed:
			continue
		case <-ctx.Done():
		}
		break
	}
	wg.Wait()
	if err := errors.Join(panics...); err != nil {
		return err
	}
	return ctx.Err()
}

// loop calls do at once, then every interval ±10% (jittered by rng, seeded
// per endpoint), until ctx is done.
func (f *Fleet) loop(ctx context.Context, ep *Endpoint, interval time.Duration, rng *rand.Rand, do func(context.Context, *Endpoint)) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		do(ctx, ep)
		t.Reset(time.Duration(float64(interval) * (0.9 + 0.2*rng.Float64())))
	}
}

// probe sends GET /health and updates ep: a 200 re-admits a down endpoint
// whose backoff has passed (and resets the backoff of an up one); a
// definite failure (connection refused, TLS verification, a status other
// than 200) takes it down at once, and EjectAfterProbeTimeouts timeouts in
// a row take it down for timeouts (routed in panic mode). A probe cut
// short because ctx ended says nothing about the engine.
func (f *Fleet) probe(ctx context.Context, ep *Endpoint) {
	err := f.get(ctx, ep, "/health", nil)
	if ctx.Err() != nil {
		return
	}
	timeout := err != nil && isTimeout(err)
	now := f.cfg.Now()
	ep.mu.Lock()
	wasSoft := ep.down && ep.soft
	var changed, reason string
	switch {
	case err == nil:
		ep.probeAnswered(now) // a sign of life only while nothing waits (stall.go)
		ep.probeTimeouts = 0
		if ep.down && !now.Before(ep.downUntil) {
			ep.down, ep.soft, ep.probed = false, false, true
			changed = "endpoint re-admitted"
		} else if !ep.down {
			ep.probed = true
			ep.backoff = f.cfg.BackoffBase
		}
	case timeout:
		ep.probeTimeouts++
		if ep.down || ep.probeTimeouts >= f.cfg.EjectAfterProbeTimeouts {
			if ep.ejectLocked(now, f.cfg.BackoffMax, true) {
				changed, reason = "endpoint failed probe", "probe_timeout"
			}
		}
	default:
		ep.probeTimeouts = 0
		if ep.ejectLocked(now, f.cfg.BackoffMax, false) {
			changed, reason = "endpoint failed probe", "probe"
		}
	}
	up, isSoft, timeouts := !ep.down, ep.down && ep.soft, ep.probeTimeouts
	ep.mu.Unlock()
	result := "ok"
	switch {
	case timeout:
		result = "timeout"
	case err != nil:
		result = "error"
	}
	f.withMetrics(ep, func(m *metrics) {
		m.probes.WithLabelValues(ep.name, result).Inc()
		switch {
		case changed != "" && up:
			m.up.WithLabelValues(ep.name).Set(1)
		case changed != "":
			m.up.WithLabelValues(ep.name).Set(0)
			m.ejections.WithLabelValues(ep.name, reason).Inc()
		}
	})
	if changed != "" {
		if up {
			f.log.Info(changed, "endpoint", ep.name)
		} else {
			args := []any{"endpoint", ep.name, "reason", reason, "err", err}
			if h := failureHint(err); h != "" {
				args = append(args, "hint", h)
			}
			f.log.Warn(changed, args...)
		}
	} else if timeout && up {
		f.log.Debug("probe timed out; endpoint kept", "endpoint", ep.name, "timeouts_in_a_row", timeouts, "eject_after", f.cfg.EjectAfterProbeTimeouts)
	}
	if changed != "" || wasSoft != isSoft {
		f.refreshPanic(ep)
	}
}

// isTimeout reports whether err is a timeout: no answer in time, as
// opposed to a definite failure.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// failureHint says in words what a probe failure means, for the log line.
func failureHint(err error) string {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		recHdr  tls.RecordHeaderError
	)
	switch {
	case err == nil:
		return ""
	case errors.As(err, &unknown):
		return "the engine's TLS certificate is not signed by a trusted CA: check the engine CA file"
	case errors.As(err, &host):
		return "the engine's TLS certificate does not name the host of its URL"
	case errors.As(err, &verify):
		return "the engine's TLS certificate did not verify"
	case errors.As(err, &recHdr):
		return "the engine did not answer TLS: is its URL http:// rather than https://?"
	case isTimeout(err):
		return "no answer within the probe timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: nothing listens at the engine's address"
	}
	return ""
}

// get sends GET base+path with the endpoint's API key, bounded by
// ProbeTimeout, and hands a 200 body to read (which may be nil).
func (f *Fleet) get(ctx context.Context, ep *Endpoint, path string, read func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.ProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.base+path, nil)
	if err != nil {
		return fmt.Errorf("%s %s: %w", ep.name, path, err)
	}
	if k := ep.APIKey(); k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	}
	resp, err := f.cfg.Client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", ep.name, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return fmt.Errorf("%s %s: status %d", ep.name, path, resp.StatusCode)
	}
	if read == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	if err := read(io.LimitReader(resp.Body, 16<<20)); err != nil {
		return fmt.Errorf("%s %s: %w", ep.name, path, err)
	}
	return nil
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}
