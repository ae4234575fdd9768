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
	"k8s.io/apimachinery/pkg/watch"
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

// watchSpec is what a watcher watches and whom it tells.
type watchSpec struct {
	obj       runtime.Object // the kind, e.g. &corev1.Pod{}
	list      func(context.Context, metav1.ListOptions) (runtime.Object, error)
	watch     func(context.Context, metav1.ListOptions) (watch.Interface, error)
	resync    time.Duration       // 0: none
	transform cache.TransformFunc // trims each object before it is stored; nil: kept whole
	changed   func()              // after every change to the store
	listed    func()              // after every list answered; nil: none
	failed    func(err error)     // after every failure (counted once); nil: none
	log       *slog.Logger        // failures and recoveries (failed, answered)
}

// watcher lists and watches one kind of object into a store: client-go's
// Reflector (list, then watch from the list's resource version, watch
// again while it can resume), run in a loop of its own that re-lists after
// any failure within the bounded retry delay. It stands in for a
// SharedIndexInformer, whose reflector's backoff cannot be set, and calls
// changed after every change to the store (adds, updates, deletes, a
// re-list, a resync), from which the caller rebuilds its view. Every
// failure, of a list or watch call (the reflector retries a watch that
// cannot start by itself, within the same bounded delay) or one that ended
// a list-and-watch, is counted once (spec.failed) and logged (failed).
type watcher struct {
	spec  watchSpec
	r     *cache.Reflector
	store *notifyStore
	delay retryDelay
	// onError, when set, hears every failure that ended a list-and-watch,
	// before the retry (Source: refusals before the first sync are fatal).
	onError func(ctx context.Context, err error)

	mu        sync.Mutex
	lastCall  error // the last failed call's error, not to count it twice
	failures  int   // the current run of failures, for the log
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

// newWatcher makes a watcher as spec says. It lists with List calls
// (plainList).
func newWatcher(spec watchSpec) *watcher {
	if spec.log == nil {
		spec.log = slog.New(slog.DiscardHandler)
	}
	w := &watcher{spec: spec}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			obj, err := spec.list(ctx, o)
			if err != nil {
				w.callFailed(err)
				return obj, err
			}
			if spec.listed != nil {
				spec.listed()
			}
			w.answered()
			return obj, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			wi, err := spec.watch(ctx, o)
			if err != nil {
				w.callFailed(err)
				return wi, err
			}
			w.answered()
			return wi, nil
		},
	}
	w.store = &notifyStore{Store: cache.NewStore(cache.MetaNamespaceKeyFunc), transform: spec.transform, changed: spec.changed}
	w.r = cache.NewReflectorWithOptions(plainList{lw}, spec.obj, w.store, cache.ReflectorOptions{ResyncPeriod: spec.resync, Backoff: retryBackoff()})
	return w
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
		if err != nil {
			w.mu.Lock()
			seen := w.lastCall != nil && errors.Is(err, w.lastCall)
			w.lastCall = nil
			w.mu.Unlock()
			if !seen {
				w.noteFailure(err)
			}
			if w.onError != nil {
				w.onError(ctx, err)
			}
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

// callFailed notes a list or watch call that failed.
func (w *watcher) callFailed(err error) {
	w.mu.Lock()
	w.lastCall = err
	w.mu.Unlock()
	w.noteFailure(err)
}

// noteFailure counts err and logs it (failed).
func (w *watcher) noteFailure(err error) {
	if w.spec.failed != nil {
		w.spec.failed(err)
	}
	w.failed(err)
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

// Resync asks for a rebuild (config.Discovery.Resync).
func (n *notifyStore) Resync() error {
	n.changed()
	return nil
}

// quietRefusal is how long a list or watch refused as forbidden or
// unauthorized after the first sync is logged at Debug only: a kube-apiserver
// that has just started refuses until its authorization cache has loaded
// (once per restart). Refused for longer, it is a warning (RBAC changed).
const quietRefusal = 10 * time.Second

// failed logs a failure of a list or watch: the first of a run of
// failures at Warn (a refusal at Debug until it has
// lasted quietRefusal, then Warn once), the rest of the run at Debug (they
// are counted in kvrouter_discovery_watch_errors_total); a watch that could
// not resume is the normal way to a re-list and logged at Debug.
func (w *watcher) failed(err error) {
	log := w.spec.log
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
		log.Warn("discovery: list or watch failed; retrying every 0.3 s at most, keeping what was listed last meanwhile",
			"type", kind, "failures", n, "for", now.Sub(since).Round(time.Millisecond), "err", err)
		return
	}
	log.Debug("discovery: list or watch failed; retrying", "type", kind, "failures", n, "err", err)
}

// answered notes a list or watch the API server answered: after a run of
// failures it logs how long they lasted.
func (w *watcher) answered() {
	log := w.spec.log
	w.mu.Lock()
	n, since := w.failures, w.failSince
	w.failures, w.warned = 0, false
	w.mu.Unlock()
	if n > 0 {
		log.Info("discovery: API server answering again after failures", "type", w.TypeDescription(), "failures", n,
			"for", time.Since(since).Round(time.Millisecond))
	}
}
