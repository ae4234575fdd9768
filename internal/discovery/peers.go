package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"kvrouter/internal/config"
)

// Peers watches the router Pods (config.Peers) and tells set this
// replica's place among them: set(n, i) with n the Ready, not terminating
// Pods matching the selector and i the own Pod's index among them in name
// order, each time that changes. While the own Pod is not among them (not
// yet Ready, terminating, not listed) or before the first list, the place
// is (1, 0): one router, no stripes. A watch that fails later keeps the
// last place (the Pods are most likely unchanged) while it retries (at
// most 0.3 s apart, then a re-list). Nothing here blocks routing or makes it fail. Safe for
// concurrent use; Run may be called once.
type Peers struct {
	cfg     config.Peers
	client  kubernetes.Interface
	set     func(routers, index int)
	log     *slog.Logger
	started atomic.Bool

	mu    sync.Mutex // serializes recomputations and set
	place [2]int
}

// NewPeers checks cfg and builds a Peers talking to the API server with
// rc (nil: RESTConfig(cfg.Kubeconfig)); set receives each new place (it
// must not block: routing.Router.SetStripes). A nil log discards.
func NewPeers(cfg config.Peers, rc *rest.Config, set func(routers, index int), log *slog.Logger) (*Peers, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Resync == 0 {
		cfg.Resync = 5 * time.Minute
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var err error
	if rc == nil {
		if rc, err = RESTConfig(cfg.Kubeconfig); err != nil {
			return nil, err
		}
	}
	rc = rest.CopyConfig(rc)
	if rc.UserAgent == "" {
		rc.UserAgent = "kvrouter-peers"
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("discovery: peers: client: %w", err)
	}
	log = log.With("peers", cfg.Namespace+"/"+cfg.Selector, "pod", cfg.PodName)
	return &Peers{cfg: cfg, client: cs, set: set, log: log, place: [2]int{1, 0}}, nil
}

// Place returns the last place given to set: routers and index.
func (p *Peers) Place() (routers, index int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.place[0], p.place[1]
}

// Run watches the router Pods until ctx ends and returns nil once its
// watch has stopped. Errors (forbidden, API server down) are logged and
// retried within 0.3 s (watcher.go); they never end Run. On return the place goes back to
// (1, 0).
func (p *Peers) Run(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("discovery: peers: Run called twice")
	}
	api := p.client.CoreV1().Pods(p.cfg.Namespace)
	sel := p.cfg.Selector
	var w *watcher
	w = newWatcher(watchSpec{
		obj: &corev1.Pod{},
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return api.List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return api.Watch(ctx, o)
		},
		resync: p.cfg.Resync, transform: trimPod, changed: func() { p.update(w.GetStore()) }, log: p.log,
	})
	defer p.setPlace(1, 0)
	ictx := klog.NewContext(ctx, logr.FromSlogHandler(p.log.Handler()))
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				p.log.Error("peers watch panic; routing as one router", "panic", r)
			}
		}()
		w.Run(ictx)
	}()
	// Once the first list has reached the store, say whether the own Pod
	// is among the matches: a selector, namespace or pod_name that misses it
	// otherwise only shows as a router that never stripes.
	sctx, stopCheck := context.WithCancel(ctx)
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		defer func() {
			if r := recover(); r != nil {
				p.log.Error("peers own-Pod check panic", "panic", r)
			}
		}()
		if cache.WaitForCacheSync(sctx.Done(), w.HasSynced) {
			p.checkOwn(w.GetStore())
		}
	}()
	<-done
	stopCheck()
	<-checked
	return nil
}

// checkOwn logs, once after the first list, the Pods the selector matched
// and, as a warning, when the own Pod (PodName) is not among them, Ready or
// not: this replica then routes as one router (1, 0) for as long as that
// lasts.
func (p *Peers) checkOwn(store cache.Store) {
	var names []string
	own := false
	for _, obj := range store.List() {
		if pod, ok := obj.(*corev1.Pod); ok {
			names = append(names, pod.Name)
			own = own || pod.Name == p.cfg.PodName
		}
	}
	slices.Sort(names)
	n := len(names)
	names = names[:min(len(names), 10)] // for the log line
	if own {
		p.log.Info("router Pods listed", "matched", n)
		return
	}
	p.log.Warn("own Pod not among the router Pods the peers selector matches; routing as one router (no stripes) until it is: check peers.selector against the Pod's labels, peers.namespace and pod_name (POD_NAME)",
		"matched", n, "matched_pods", names)
}

// update recomputes the place from the informer's Pods.
func (p *Peers) update(store cache.Store) {
	var ready []string
	for _, obj := range store.List() {
		if pod, ok := obj.(*corev1.Pod); ok && peerReady(pod) {
			ready = append(ready, pod.Name)
		}
	}
	slices.Sort(ready)
	n, i := 1, 0
	if k := slices.Index(ready, p.cfg.PodName); k >= 0 {
		n, i = len(ready), k
	}
	p.setPlace(n, i)
}

func (p *Peers) setPlace(n, i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.place == [2]int{n, i} {
		return
	}
	p.log.Info("router replicas", "routers", n, "router_index", i, "was_routers", p.place[0], "was_router_index", p.place[1])
	p.place = [2]int{n, i}
	p.set(n, i)
}

// peerReady: a router Pod that gets traffic: Ready, not terminating, not
// finished.
func peerReady(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
