package discovery

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
)

// Retry delays after a failed list or watch: retryFirst doubling to
// retryCap, each stretched by up to retryJitter, so never more than
// retryCap × (1 + retryJitter) = 0.3 s. While the API server is down a
// watcher tries about four times a second; once it answers again, the next
// try comes within 0.3 s. client-go's informer default (0.8 s doubling to
// 30 s, stretched up to 2x) made changes made during a 12 s outage reach
// routing 9-24 s after the API server was back.
const (
	retryFirst  = 50 * time.Millisecond
	retryCap    = 250 * time.Millisecond
	retryJitter = 0.2
	// retryReset: after this long without a failure the delay starts
	// again from retryFirst.
	retryReset = time.Minute
)

// retryBackoff is the bounded backoff above, for a reflector's internal
// retries (a watch that cannot start) and the watcher's own.
func retryBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: retryFirst, Factor: 2, Jitter: retryJitter, Cap: retryCap, Steps: math.MaxInt32}
}

// watcher lists and watches one kind of object into a store: client-go's
// Reflector (list, then watch from the list's resource version, watch
// again while it can resume), run in a loop of its own that re-lists after
// any failure within the bounded retry delay. It stands in for a
// SharedIndexInformer, whose reflector's backoff cannot be set, and calls
// changed after every change to the store (adds, updates, deletes, a
// re-list, a resync), from which the caller rebuilds its view.
type watcher struct {
	r       *cache.Reflector
	store   *notifyStore
	delay   retryDelay
	onError func(ctx context.Context, err error)

	// A run of failures, for the log (Source.watchFailed, recovered).
	mu        sync.Mutex
	failures  int
	failSince time.Time
	warned    bool
}

// retryDelay steps retryBackoff, starting again after retryReset without
// a failure. Only the watcher's Run goroutine uses it.
type retryDelay struct {
	b    wait.Backoff
	last time.Time
}

func (d *retryDelay) next(now time.Time) time.Duration {
	if d.last.IsZero() || now.Sub(d.last) > retryReset {
		d.b = *retryBackoff()
	}
	d.last = now
	return d.b.Step()
}

// newWatcher makes a watcher of obj's kind through lw. transform (nil:
// none) trims each object before it is stored; onError (nil: ignored)
// hears every failure that ended a list-and-watch, before the retry.
func newWatcher(lw cache.ListerWatcher, obj runtime.Object, resync time.Duration, transform cache.TransformFunc, changed func()) *watcher {
	st := &notifyStore{Store: cache.NewStore(cache.MetaNamespaceKeyFunc), transform: transform, changed: changed}
	r := cache.NewReflectorWithOptions(lw, obj, st, cache.ReflectorOptions{ResyncPeriod: resync, Backoff: retryBackoff()})
	return &watcher{r: r, store: st}
}

// GetStore is the watched objects (after the first list: HasSynced).
func (w *watcher) GetStore() cache.Store { return w.store.Store }

// HasSynced reports whether the first list has reached the store.
func (w *watcher) HasSynced() bool { return w.store.synced.Load() }

// TypeDescription names the kind watched, e.g. "*v1.Pod".
func (w *watcher) TypeDescription() string { return w.r.TypeDescription() }

// Run lists and watches until ctx ends. A list-and-watch that ends with a
// failure goes to onError and is tried again after the retry delay; one
// whose watch could not resume (resource version too old, as after an API
// server restart) re-lists at once, that being the remedy rather than a
// retry (once: if that fails the same way, the delay applies).
func (w *watcher) Run(ctx context.Context) {
	quick := false
	for {
		err := w.r.ListAndWatchWithContext(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil && w.onError != nil {
			w.onError(ctx, err)
		}
		if quick = err != nil && resumeFailed(err) && !quick; quick {
			continue
		}
		t := time.NewTimer(w.delay.next(time.Now()))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// resumeFailed reports whether err says a watch cannot resume from its
// resource version (expired, or newer than the server knows): a re-list
// fixes it.
func resumeFailed(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) ||
		apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// notifyStore is a thread-safe store that trims what it stores, reports
// every change and remembers the first Replace (the first list).
type notifyStore struct {
	cache.Store
	transform cache.TransformFunc
	changed   func()
	synced    atomic.Bool
	mu        sync.Mutex // orders transform + write with Replace
}

func (n *notifyStore) trim(obj any) (any, error) {
	if n.transform == nil {
		return obj, nil
	}
	return n.transform(obj)
}

func (n *notifyStore) write(obj any, op func(any) error) error {
	obj, err := n.trim(obj)
	if err != nil {
		return err
	}
	n.mu.Lock()
	err = op(obj)
	n.mu.Unlock()
	n.changed()
	return err
}

func (n *notifyStore) Add(obj any) error    { return n.write(obj, n.Store.Add) }
func (n *notifyStore) Update(obj any) error { return n.write(obj, n.Store.Update) }
func (n *notifyStore) Delete(obj any) error { return n.write(obj, n.Store.Delete) }

// Replace stores a full list (the first, or a re-list).
func (n *notifyStore) Replace(list []any, rv string) error {
	for i, o := range list {
		t, err := n.trim(o)
		if err != nil {
			return err
		}
		list[i] = t
	}
	n.mu.Lock()
	err := n.Store.Replace(list, rv)
	n.mu.Unlock()
	if err == nil {
		n.synced.Store(true)
	}
	n.changed()
	return err
}

// Resync asks for a rebuild (Config.Resync).
func (n *notifyStore) Resync() error {
	n.changed()
	return nil
}

// quietRefusal is how long a list or watch refused as forbidden or
// unauthorized after the first sync is logged at Debug only: a kube-apiserver
// that has just started refuses until its authorization cache has loaded
// (once per restart). Refused for longer, it is a warning (RBAC changed).
const quietRefusal = 10 * time.Second

// failed logs a failure that ended a watcher's list and watch: the
// first of a run of failures at Warn (a refusal at Debug until it has
// lasted quietRefusal, then Warn once), the rest of the run at Debug (they
// are counted in kvrouter_discovery_watch_errors_total); a watch that could
// not resume is the normal way to a re-list and logged at Debug.
func (w *watcher) failed(log *slog.Logger, err error) {
	kind := w.TypeDescription()
	if resumeFailed(err) {
		log.Debug("discovery: watch cannot resume; re-listing", "type", kind, "err", err)
		return
	}
	now := time.Now()
	w.mu.Lock()
	if w.failures == 0 {
		w.failSince = now
	}
	w.failures++
	n, since, warned := w.failures, w.failSince, w.warned
	refused := apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)
	loud := !warned && (!refused || now.Sub(since) >= quietRefusal)
	w.warned = w.warned || loud
	w.mu.Unlock()
	if loud {
		log.Warn("discovery: list or watch failed; retrying every 0.3 s at most, serving the last engine set meanwhile",
			"type", kind, "failures", n, "for", now.Sub(since).Round(time.Millisecond), "err", err)
		return
	}
	log.Debug("discovery: list or watch failed; retrying", "type", kind, "failures", n, "err", err)
}

// listed notes a list answered: after a run of failures it logs how long
// they lasted. Nil w does nothing (a list before the watcher was made).
func (w *watcher) listed(log *slog.Logger) {
	if w == nil {
		return
	}
	w.mu.Lock()
	n, since := w.failures, w.failSince
	w.failures, w.warned = 0, false
	w.mu.Unlock()
	if n > 0 {
		log.Info("discovery: listed again after failures", "type", w.TypeDescription(), "failures", n,
			"for", time.Since(since).Round(time.Millisecond))
	}
}
