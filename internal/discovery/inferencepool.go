package discovery

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// InferencePoolResource is the InferencePool API: group
// inference.networking.k8s.io, version v1, resource inferencepools (the
// Gateway API Inference Extension, module
// sigs.k8s.io/gateway-api-inference-extension api/v1, whose types are
// decoded here; they are read with client-go's dynamic client because the
// module's generated clientset would pull in its controller-runtime tree).
var InferencePoolResource = schema.GroupVersionResource{Group: infv1.GroupName, Version: "v1", Resource: "inferencepools"}

// runPool is Run for config.Discovery.InferencePool: an informer on the one
// InferencePool (by name) and one on the namespace's Pods (narrowed by
// config.Discovery.Selector); each snapshot is the Pods the pool's selector matches,
// on each of the pool's target ports (portEngine: several ports are one
// engine each per Pod), with the same states and annotations as the
// selector source. A pool that does not exist (yet), or that has no
// selector or target port, yields an empty snapshot and a warning.
func (s *Source) runPool(ctx context.Context) error {
	parent := ctx
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ictx := klog.NewContext(ctx, logr.FromSlogHandler(s.log.Handler()))

	pools := s.dyn.Resource(InferencePoolResource).Namespace(s.cfg.Namespace)
	byName := fields.OneTermEqualSelector("metadata.name", s.cfg.InferencePool).String()
	poolInf := s.informer(&unstructured.Unstructured{}, "", nil,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return pools.List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return pools.Watch(ctx, o)
		})
	podInf := s.podInformer()
	var synced atomic.Bool
	// NotFound before the first sync: the CRD is not installed.
	if err := s.startInformers(ictx, cancel, &wg, &synced, true, poolInf, podInf); err != nil {
		return err
	}
	stopped := func() error {
		if parent.Err() != nil {
			return nil
		}
		return context.Cause(ctx)
	}
	if !cache.WaitForCacheSync(ctx.Done(), poolInf.HasSynced, podInf.HasSynced) {
		return stopped()
	}
	synced.Store(true)
	s.log.Info("discovery synced", "namespace", s.cfg.Namespace, "inference_pool", s.cfg.InferencePool, "selector", s.cfg.Selector)
	var last []Engine
	for first := true; ; first = false {
		engines := s.poolEngines(poolInf, podInf)
		if first || !slices.Equal(engines, last) {
			s.send(Snapshot{Engines: engines})
			s.logChange(last, engines)
			last = engines
		}
		select {
		case <-ctx.Done():
			return stopped()
		case <-s.kick:
		}
	}
}

// poolEngines builds the engines from the cached pool and Pods.
func (s *Source) poolEngines(poolInf, podInf *watcher) []Engine {
	pool, err := s.cachedPool(poolInf)
	if err != nil {
		s.skipped("inferencepool "+s.cfg.Namespace+"/"+s.cfg.InferencePool, err.Error())
		return nil
	}
	set := labels.Set{}
	for k, v := range pool.Spec.Selector.MatchLabels {
		set[string(k)] = string(v)
	}
	if len(set) == 0 {
		s.skipped("inferencepool "+s.cfg.Namespace+"/"+s.cfg.InferencePool, "its selector has no matchLabels")
		return nil
	}
	if len(pool.Spec.TargetPorts) == 0 {
		s.skipped("inferencepool "+s.cfg.Namespace+"/"+s.cfg.InferencePool, "it has no targetPorts")
		return nil
	}
	sel := labels.SelectorFromSet(set)
	var pods []*corev1.Pod
	for _, o := range podInf.GetStore().List() {
		if p, ok := o.(*corev1.Pod); ok && sel.Matches(labels.Set(p.Labels)) {
			pods = append(pods, p)
		}
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	ports := pool.Spec.TargetPorts
	var out []Engine
	for i, port := range ports {
		cfg := s.cfg
		cfg.Port = strconv.Itoa(int(port.Number))
		b := &builder{cfg: cfg, skip: s.skipped, bad: s.badAnnotation, pending: func(string, string) {}}
		for _, e := range b.fromPods(pods) {
			if len(ports) > 1 {
				e = portEngine(e, i)
				if e.Settings.EventsPort > 65535 || e.Settings.ReplayPort > 65535 {
					s.skipped("engine "+e.Name, fmt.Sprintf("its KV event or replay port, offset for target port %d, passes 65535", port.Number))
					continue
				}
			}
			out = append(out, e)
		}
	}
	return dedup(out)
}

// portEngine is engine e of a pool with several target ports as the
// one on its i-th target port: each Pod and target port is an endpoint,
// as the upstream API defines targetPorts ("every port will be treated as
// a distinctive endpoint by EPP, addressable as a 'podIP:portNumber'
// combination": api/v1/inferencepool_types.go at v1.6.0), named
// POD-rank-I as the upstream picker names them
// (pkg/lwepp/datastore/datastore.go, createEndpointNamespacedName). Each
// port is one vLLM API server of a data-parallel deployment (external or
// hybrid load balancing), the target ports in rank order: server i holds
// the ranks i*dp_size .. i*dp_size+dp_size-1, and vLLM offsets a rank's
// KV event and replay endpoints by its rank (vllm/distributed/kv_events.py,
// ZmqEventPublisher), so its events and replay ports are the Pod's plus
// i*dp_size (unset ports stay unset).
func portEngine(e Engine, i int) Engine {
	e.Name += "-rank-" + strconv.Itoa(i)
	off := i * max(e.Settings.DPSize, 1)
	if e.Settings.EventsPort > 0 {
		e.Settings.EventsPort += off
	}
	if e.Settings.ReplayPort > 0 {
		e.Settings.ReplayPort += off
	}
	return e
}

// cachedPool decodes the informer's pool into the upstream API type.
func (s *Source) cachedPool(inf *watcher) (*infv1.InferencePool, error) {
	obj, ok, err := inf.GetStore().GetByKey(s.cfg.Namespace + "/" + s.cfg.InferencePool)
	if err != nil || !ok {
		return nil, fmt.Errorf("it does not exist (yet)")
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("cached object is a %T", obj)
	}
	var pool infv1.InferencePool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pool); err != nil {
		return nil, fmt.Errorf("decoding it: %w", err)
	}
	return &pool, nil
}
