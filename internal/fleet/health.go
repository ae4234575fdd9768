package fleet

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Report records the outcome of one forwarded request on ep (passive health
// checking): a connection error takes ep down at once, a run of server
// errors or backpressure answers takes it down at the configured count, and
// any OK answer resets the runs.
func (f *Fleet) Report(ep *Endpoint, o Outcome) {
	now := f.cfg.Now()
	ep.mu.Lock()
	ejected := false
	switch o {
	case OutcomeOK:
		ep.serverErrs, ep.backpress = 0, 0
	case OutcomeConnError:
		ejected = ep.ejectLocked(now, f.cfg.BackoffMax)
	case OutcomeServerError:
		ep.serverErrs++
		if ep.serverErrs >= f.cfg.EjectAfterServerErrors {
			ejected = ep.ejectLocked(now, f.cfg.BackoffMax)
		}
	case OutcomeBackpressure:
		ep.backpress++
		if ep.backpress >= f.cfg.EjectAfterBackpressure {
			ejected = ep.ejectLocked(now, f.cfg.BackoffMax)
		}
	}
	until := ep.downUntil
	ep.mu.Unlock()
	if ejected {
		f.m.ejections.WithLabelValues(ep.name, o.String()).Inc()
		f.m.up.WithLabelValues(ep.name).Set(0)
		f.log.Warn("endpoint ejected", "endpoint", ep.name, "reason", o.String(), "until", until)
	}
}

// Run probes and scrapes every endpoint until ctx is done, then returns
// ctx's error after all its goroutines have returned. A panic in a probe or
// scrape stops every loop and is returned as an error instead.
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
	for _, ep := range f.all {
		rng := rand.New(rand.NewPCG(hashString(ep.base), 0x6b76726f75746572))
		if f.cfg.ProbeInterval > 0 {
			wg.Go(guard("probe", ep, func() { f.loop(ctx, ep, f.cfg.ProbeInterval, rng, f.probe) }))
		}
		if f.cfg.ScrapeInterval > 0 {
			srng := rand.New(rand.NewPCG(hashString(ep.base), 0x736372617065))
			wg.Go(guard("scrape", ep, func() { f.loop(ctx, ep, f.cfg.ScrapeInterval, srng, f.scrape) }))
		}
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
// whose backoff has passed (and resets the backoff of an up one); anything
// else takes it down.
func (f *Fleet) probe(ctx context.Context, ep *Endpoint) {
	err := f.get(ctx, ep, "/health", nil)
	now := f.cfg.Now()
	ep.mu.Lock()
	var changed string
	switch {
	case err == nil && ep.down && !now.Before(ep.downUntil):
		ep.down, ep.probed = false, true
		changed = "endpoint re-admitted"
	case err == nil && !ep.down:
		ep.probed = true
		ep.backoff = f.cfg.BackoffBase
	case err != nil && !ep.down:
		ep.ejectLocked(now, f.cfg.BackoffMax)
		changed = "endpoint failed probe"
	}
	up := !ep.down
	ep.mu.Unlock()
	result := "ok"
	if err != nil {
		result = "error"
	}
	f.m.probes.WithLabelValues(ep.name, result).Inc()
	if changed == "" {
		return
	}
	if up {
		f.m.up.WithLabelValues(ep.name).Set(1)
		f.log.Info(changed, "endpoint", ep.name)
	} else {
		f.m.up.WithLabelValues(ep.name).Set(0)
		f.m.ejections.WithLabelValues(ep.name, "probe").Inc()
		f.log.Warn(changed, "endpoint", ep.name, "err", err)
	}
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
	if ep.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+ep.apiKey)
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
