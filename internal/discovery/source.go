package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"kvrouter/internal/config"
)

// Source watches one model group's engines and sends snapshots of them.
// New starts nothing; Run runs the informers. Safe for concurrent use;
// Run may be called once.
type Source struct {
	cfg     config.Discovery
	client  kubernetes.Interface
	dyn     dynamic.Interface // InferencePool reads (nil without config.Discovery.InferencePool)
	log     *slog.Logger
	m       *metrics
	out     chan Snapshot
	kick    chan struct{}
	started atomic.Bool

	// warned holds the skip and annotation messages logged already; only
	// the Run goroutine touches it.
	warned map[string]struct{}
}

// maxWarned bounds warned; past it the set starts again (a message may
// then be logged a second time).
const maxWarned = 4096

// New checks cfg (every problem at once) and builds a Source that talks
// to the API server with rc; a nil rc means RESTConfig(cfg.Kubeconfig).
// A nil log discards; metrics go to reg (nil: not registered).
func New(cfg config.Discovery, rc *rest.Config, log *slog.Logger, reg prometheus.Registerer) (*Source, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if rc == nil {
		if rc, err = RESTConfig(cfg.Kubeconfig); err != nil {
			return nil, err
		}
	}
	rc = rest.CopyConfig(rc)
	if rc.UserAgent == "" {
		rc.UserAgent = "kvrouter-discovery"
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("discovery: client: %w", err)
	}
	var dyn dynamic.Interface
	if cfg.InferencePool != "" {
		if dyn, err = dynamic.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("discovery: dynamic client: %w", err)
		}
	}
	m, err := newMetrics(reg, cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("discovery: metrics: %w", err)
	}
	return &Source{
		cfg:    cfg,
		client: cs,
		dyn:    dyn,
		log:    log.With("source", cfg.Name),
		m:      m,
		out:    make(chan Snapshot, 1),
		kick:   make(chan struct{}, 1),
		warned: map[string]struct{}{},
	}, nil
}

// Snapshots delivers every changed snapshot, the first once the informers
// have synced. An unreceived snapshot is replaced by a newer one. The
// channel is never closed.
func (s *Source) Snapshots() <-chan Snapshot { return s.out }

// Run lists and watches until ctx ends, then stops the informers and
// returns nil after they have stopped. Calls the API server's
// authorization says it will refuse (checkAccess) end Run at once with an
// error wrapping ErrForbidden that names them. Before the first sync a
// list or watch refused as forbidden or unauthorized (missing RBAC, bad
// token) ends Run with that error; other failures, and any later, are logged,
// counted, and retried within 0.3 s (watcher.go).
func (s *Source) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("discovery: Run called twice")
	}
	if s.cfg.InferencePool != "" {
		return s.runPool(ctx)
	}
	parent := ctx
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// client-go logs through klog's contextual logger: this source's.
	ictx := klog.NewContext(ctx, logr.FromSlogHandler(s.log.Handler()))

	if err := s.checkAccess(ctx); err != nil {
		return err
	}
	var synced atomic.Bool
	var sliceInf, podInf *watcher
	if s.cfg.Service != "" {
		sel := discoveryv1.LabelServiceName + "=" + s.cfg.Service
		api := s.client.DiscoveryV1().EndpointSlices(s.cfg.Namespace)
		sliceInf = s.informer(&discoveryv1.EndpointSlice{}, sel, nil,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return api.List(ctx, o) },
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return api.Watch(ctx, o) })
	}
	if s.cfg.PodAnnotations {
		podInf = s.podInformer()
	}
	stopped := func() error {
		if parent.Err() != nil {
			return nil
		}
		return context.Cause(ctx)
	}
	if err := s.startInformers(ictx, cancel, &wg, &synced, false, sliceInf, podInf); err != nil {
		return err
	}
	if !cache.WaitForCacheSync(ctx.Done(), hasSynced(sliceInf, podInf)...) {
		return stopped()
	}
	synced.Store(true)
	s.log.Info("discovery synced", "namespace", s.cfg.Namespace, "service", s.cfg.Service, "selector", s.cfg.Selector)

	b := &builder{cfg: s.cfg, skip: s.skipped, bad: s.badAnnotation, pending: func(addr, pod string) {
		s.log.Debug("endpoint waits for its pod", "addr", addr, "pod", pod)
	}}
	keys := &secrets{s: s, cache: map[config.SecretRef]*secretEntry{}, now: time.Now}
	refresh := time.NewTicker(s.cfg.SecretRefresh)
	defer refresh.Stop()
	var last []Engine
	for first := true; ; first = false {
		engines, err := keys.resolve(ctx, s.build(b, sliceInf, podInf), first)
		if err != nil {
			return err
		}
		if first || !slices.Equal(engines, last) {
			s.send(Snapshot{Engines: engines})
			s.logChange(last, engines)
			last = engines
		}
		for {
			select {
			case <-ctx.Done():
				return stopped()
			case <-s.kick:
			case <-refresh.C:
				if !keys.inUse() {
					continue
				}
			}
			break
		}
	}
}

// informer makes a watcher of one namespace's objects matching selector,
// trimmed by transform (nil: kept whole), counting the full lists
// answered and the failures; every change pokes the snapshot loop.
func (s *Source) informer(obj runtime.Object, selector string, transform cache.TransformFunc,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *watcher {
	return newWatcher(watchSpec{
		obj: obj,
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return list(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return watchFn(ctx, o)
		},
		resync: s.cfg.Resync, transform: transform, changed: s.poke,
		listed: s.m.lists.Inc, failed: func(error) { s.m.watchErrors.Inc() }, log: s.log,
	})
}

// plainList makes the reflector list with a List call, not with client-go's
// WatchList stream (a watch that sends the initial state). One Service's
// EndpointSlices or one selector's Pods are small; a List behaves the same
// on every API server (WatchList falls back to List over etcd 3.4) and
// makes every re-list visible to the lists counter.
type plainList struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported tells client-go's reflector to List.
func (plainList) IsWatchListSemanticsUnSupported() bool { return true }

// poke asks the Run loop for a rebuild; bursts merge into one.
func (s *Source) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// send replaces an unreceived snapshot with snap. Only Run sends, so the
// channel has room after the drain. The metrics describe snap before it
// is delivered, so a receiver never reads the previous snapshot's counts.
func (s *Source) send(snap Snapshot) {
	s.m.snapshots.Inc()
	counts := map[State]int{}
	for _, e := range snap.Engines {
		counts[e.State]++
	}
	for _, st := range []State{StateReady, StateDraining, StateNotReady} {
		s.m.engines.WithLabelValues(st.String()).Set(float64(counts[st]))
	}
	select {
	case <-s.out:
	default:
	}
	s.out <- snap
}

// build lists the engines from the informers' caches.
func (s *Source) build(b *builder, sliceInf, podInf *watcher) []Engine {
	var pods []*corev1.Pod
	var podByName map[string]*corev1.Pod
	if podInf != nil {
		for _, o := range podInf.GetStore().List() {
			if p, ok := o.(*corev1.Pod); ok {
				pods = append(pods, p)
			}
		}
	}
	if sliceInf == nil {
		return b.fromPods(pods)
	}
	var lookup func(string) (*corev1.Pod, bool)
	if podInf != nil {
		podByName = make(map[string]*corev1.Pod, len(pods))
		for _, p := range pods {
			podByName[p.Name] = p
		}
		lookup = func(name string) (*corev1.Pod, bool) { p, ok := podByName[name]; return p, ok }
	}
	var sl []*discoveryv1.EndpointSlice
	for _, o := range sliceInf.GetStore().List() {
		if es, ok := o.(*discoveryv1.EndpointSlice); ok {
			sl = append(sl, es)
		}
	}
	slices.SortFunc(sl, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return b.fromSlices(sl, lookup)
}

// once reports whether msg is new (and remembers it).
func (s *Source) once(msg string) bool {
	if _, ok := s.warned[msg]; ok {
		return false
	}
	if len(s.warned) >= maxWarned {
		clear(s.warned)
	}
	s.warned[msg] = struct{}{}
	return true
}

func (s *Source) skipped(object, reason string) {
	if s.once(object + ": " + reason) {
		s.log.Warn("discovery skips "+object, "reason", reason)
	}
}

func (s *Source) badAnnotation(pod, key, value string, err error) {
	if s.once(pod + " " + key + "=" + value) {
		s.m.badAnn.Inc()
		s.log.Warn("discovery: bad pod annotation, using the default", "pod", pod, "annotation", key, "value", value, "err", err)
	}
}

// logChange logs engines added, removed, replaced (another Pod at the
// same address) or changed: one line per changed field (state, settings,
// role, API key; never the key itself).
func (s *Source) logChange(old, cur []Engine) {
	prev := make(map[string]Engine, len(old))
	for _, e := range old {
		prev[e.Addr] = e
	}
	for _, e := range cur {
		p, ok := prev[e.Addr]
		delete(prev, e.Addr)
		if !ok {
			s.log.Info("engine discovered", "engine", e.Name, "addr", e.Addr, "state", e.State.String())
			continue
		}
		if p.Name != e.Name {
			s.log.Info("engine replaced: another pod at its address", "engine", e.Name, "addr", e.Addr, "state", e.State.String(), "was", p.Name)
			continue
		}
		if p.State != e.State {
			s.log.Info("engine state", "engine", e.Name, "addr", e.Addr, "state", e.State.String(), "was", p.State.String())
		}
		if p.Settings != e.Settings {
			s.log.Info("engine settings changed", "engine", e.Name, "addr", e.Addr)
		}
		if p.Role != e.Role {
			s.log.Info("engine role changed", "engine", e.Name, "addr", e.Addr, "role", e.Role, "was", p.Role)
		}
		if p.APIKey != e.APIKey {
			s.log.Info("engine API key changed", "engine", e.Name, "addr", e.Addr)
		}
	}
	for _, e := range prev {
		s.log.Info("engine gone", "engine", e.Name, "addr", e.Addr)
	}
}

// startInformers runs each watcher (nil ones skipped) on wg until ictx
// ends: before the first sync (synced false) a failure refused as
// forbidden or unauthorized (and not found, with notFoundFatal: a CRD that
// is not installed) cancels the run with an error naming the resource; any
// other failure, or any later, is counted, logged and retried within the
// bounded delay (watcher.go);
// a watcher's panic cancels the run instead of crossing the goroutine.
func (s *Source) startInformers(ictx context.Context, cancel context.CancelCauseFunc, wg *sync.WaitGroup, synced *atomic.Bool, notFoundFatal bool, infs ...*watcher) error {
	for _, inf := range infs {
		if inf == nil {
			continue
		}
		inf.onError = func(ctx context.Context, err error) {
			if !synced.Load() && (apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || (notFoundFatal && apierrors.IsNotFound(err))) {
				cancel(fmt.Errorf("discovery: %s in namespace %s: %w", inf.TypeDescription(), s.cfg.Namespace, err))
			}
		}
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					cancel(fmt.Errorf("discovery: informer panic: %v", p))
				}
			}()
			inf.Run(ictx)
		})
	}
	return nil
}

// hasSynced is the HasSynced of each non-nil watcher.
func hasSynced(infs ...*watcher) []cache.InformerSynced {
	var out []cache.InformerSynced
	for _, inf := range infs {
		if inf != nil {
			out = append(out, inf.HasSynced)
		}
	}
	return out
}

// podInformer is a watcher of the namespace's Pods matching
// config.Discovery.Selector, trimmed to what discovery reads (trimPod).
func (s *Source) podInformer() *watcher {
	api := s.client.CoreV1().Pods(s.cfg.Namespace)
	return s.informer(&corev1.Pod{}, s.cfg.Selector, trimPod,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return api.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return api.Watch(ctx, o) })
}
