package discovery

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"kvrouter/internal/config"
)

func bp(b bool) *bool { return &b }

func TestEndpointState(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		ready, serv, terminat *bool
		want                  State
	}{
		{"all nil: ready", nil, nil, nil, StateReady},
		{"ready", bp(true), bp(true), bp(false), StateReady},
		{"not ready", bp(false), bp(false), bp(false), StateNotReady},
		{"not ready, serving nil", bp(false), nil, nil, StateNotReady},
		{"terminating serving", bp(false), bp(true), bp(true), StateDraining},
		{"terminating serving nil", bp(false), nil, bp(true), StateDraining},
		{"terminating not serving", bp(false), bp(false), bp(true), StateNotReady},
		{"publishNotReadyAddresses: ready and terminating", bp(true), bp(true), bp(true), StateDraining},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := endpointState(discoveryv1.EndpointConditions{Ready: tc.ready, Serving: tc.serv, Terminating: tc.terminat})
			if got != tc.want {
				t.Fatalf("state = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSettingsFrom(t *testing.T) {
	def := config.EngineSettings{EventsPort: 5557, ReplayPort: 5600, DPSize: 1, Topic: "kv"}
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want config.EngineSettings
		bad  []string // annotation keys reported
	}{
		{"none", nil, def, nil},
		{"all", map[string]string{
			AnnotationEventsPort: "6000", AnnotationReplayPort: "6100", AnnotationDPSize: "4",
			AnnotationTopic: "", AnnotationAPIKeySecret: "vllm-keys/llama",
		}, config.EngineSettings{EventsPort: 6000, ReplayPort: 6100, DPSize: 4, APIKeySecret: config.SecretRef{Name: "vllm-keys", Key: "llama"}}, nil},
		{"events off", map[string]string{AnnotationEventsPort: "0"}, config.EngineSettings{ReplayPort: 5600, DPSize: 1, Topic: "kv"}, nil},
		{"spaces", map[string]string{AnnotationEventsPort: " 7000 "}, config.EngineSettings{EventsPort: 7000, ReplayPort: 5600, DPSize: 1, Topic: "kv"}, nil},
		{"bad port keeps default", map[string]string{AnnotationEventsPort: "x", AnnotationDPSize: "2"},
			config.EngineSettings{EventsPort: 5557, ReplayPort: 5600, DPSize: 2, Topic: "kv"}, []string{AnnotationEventsPort}},
		{"port out of range", map[string]string{AnnotationReplayPort: "70000"}, def, []string{AnnotationReplayPort}},
		{"dp_size 0", map[string]string{AnnotationDPSize: "0"}, def, []string{AnnotationDPSize}},
		{"secret without key", map[string]string{AnnotationAPIKeySecret: "keys"}, def, []string{AnnotationAPIKeySecret}},
		{"secret bad name", map[string]string{AnnotationAPIKeySecret: "Keys!/k"}, def, []string{AnnotationAPIKeySecret}},
		{"ports overlap for dp_size: all defaults", map[string]string{AnnotationDPSize: "50"}, def, []string{"kvrouter/*"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bad []string
			got := settingsFrom(tc.ann, def, func(key, _ string, err error) {
				if err == nil {
					t.Errorf("%s reported with a nil error", key)
				}
				bad = append(bad, key)
			})
			if got != tc.want {
				t.Errorf("settings = %+v, want %+v", got, tc.want)
			}
			if strings.Join(bad, ",") != strings.Join(tc.bad, ",") {
				t.Errorf("reported %v, want %v", bad, tc.bad)
			}
		})
	}
}

// FuzzSettingsFrom: whatever the annotations say, the settings are valid.
func FuzzSettingsFrom(f *testing.F) {
	f.Add("5557", "5558", "1", "t", "s/k")
	f.Add("-1", "99999", "0", "", "/")
	f.Add("5557", "5557", "2", "", "a/b/c")
	f.Fuzz(func(t *testing.T, ev, rp, dp, topic, secret string) {
		ann := map[string]string{AnnotationEventsPort: ev, AnnotationReplayPort: rp, AnnotationDPSize: dp,
			AnnotationTopic: topic, AnnotationAPIKeySecret: secret}
		s := settingsFrom(ann, config.EngineSettings{DPSize: 1}, func(string, string, error) {})
		if errs := s.Check(); len(errs) > 0 {
			err := errs[0]
			t.Fatalf("settingsFrom(%v) = %+v: %v", ann, s, err)
		}
	})
}

func TestConfigErrors(t *testing.T) {
	_, err := config.Discovery{Selector: "a in (", Port: "99999", Resync: -time.Second,
		Defaults: config.EngineSettings{EventsPort: 5557, ReplayPort: 5557}}.WithDefaults()
	for _, want := range []string{"namespace: required", "selector: ", "port: 99999 out of range", "resync: -1s is negative", "defaults.replay_port: events ports 5557+1 overlap"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if _, err := (config.Discovery{Namespace: "ns"}).WithDefaults(); err == nil {
		t.Error("no service and no selector accepted")
	}
	for _, tc := range []struct {
		d    config.EngineSettings
		want string
	}{
		{config.EngineSettings{EventsPort: 5557, DPSize: 5000}, "discovery: defaults.dp_size: 5000: want 1..1024"},
		{config.EngineSettings{ReplayPort: 5600}, "discovery: defaults.replay_port: 5600 needs events_port"},
	} {
		if _, err := (config.Discovery{Namespace: "ns", Service: "vllm", Defaults: tc.d}).WithDefaults(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("defaults %+v: error %v, want %q", tc.d, err, tc.want)
		}
	}
	c, err := config.Discovery{Namespace: "ns", Selector: "app=vllm"}.WithDefaults()
	if err != nil || !c.PodAnnotations || c.Defaults.DPSize != 1 || c.Resync != 5*time.Minute || c.Name != "ns/app=vllm" {
		t.Errorf("defaults = %+v, %v", c, err)
	}
}

func TestRESTConfigErrors(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := RESTConfig(""); err == nil || !strings.Contains(err.Error(), "in-cluster") {
		t.Errorf("outside a cluster: err = %v", err)
	}
	if _, err := RESTConfig(t.TempDir() + "/none"); err == nil {
		t.Error("missing kubeconfig accepted")
	}
}

// TestFromSlices: ports, duplicates across slices (best state wins), pods
// looked up for annotations, endpoints without a known pod left out.
func TestFromSlices(t *testing.T) {
	port := func(name string, p int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: &name, Port: &p}
	}
	ep := func(ip string, c discoveryv1.EndpointConditions, pod string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: c}
		if pod != "" {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: pod}
		}
		return e
	}
	ready := discoveryv1.EndpointConditions{Ready: bp(true)}
	notReady := discoveryv1.EndpointConditions{Ready: bp(false)}
	a := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Ports: []discoveryv1.EndpointPort{port("http", 8000)},
		Endpoints: []discoveryv1.Endpoint{ep("192.0.2.2", notReady, "p2"), ep("192.0.2.1", ready, "p1"), {Conditions: ready}}}
	b := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Ports: []discoveryv1.EndpointPort{port("http", 8000)},
		Endpoints: []discoveryv1.Endpoint{ep("192.0.2.2", ready, "p2"), ep("2001:db8::3", ready, "")}}
	two := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "two"},
		Ports: []discoveryv1.EndpointPort{port("http", 8000), port("metrics", 9000)}, Endpoints: []discoveryv1.Endpoint{ep("192.0.2.9", ready, "")}}

	var skipped []string
	bld := &builder{cfg: config.Discovery{Defaults: config.EngineSettings{DPSize: 1}},
		skip: func(o, r string) { skipped = append(skipped, o) }, bad: func(string, string, string, error) {},
		pending: func(string, string) {}}
	def := config.EngineSettings{DPSize: 1}
	got := bld.fromSlices([]*discoveryv1.EndpointSlice{a, b, two}, nil)
	want := []Engine{
		{Name: "p1", Addr: "192.0.2.1:8000", State: StateReady, Settings: def},
		{Name: "p2", Addr: "192.0.2.2:8000", State: StateReady, Settings: def},
		{Name: "[2001:db8::3]:8000", Addr: "[2001:db8::3]:8000", State: StateReady, Settings: def},
	}
	if !equal(got, want) {
		t.Errorf("engines\n got %+v\nwant %+v", got, want)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0], "two") {
		t.Errorf("skipped %v, want the two-port slice", skipped)
	}

	bld.cfg.Port = "metrics"
	if got := bld.fromSlices([]*discoveryv1.EndpointSlice{two}, nil); len(got) != 1 || got[0].Addr != "192.0.2.9:9000" {
		t.Errorf("port by name: %+v", got)
	}
	bld.cfg.Port = "9000"
	if got := bld.fromSlices([]*discoveryv1.EndpointSlice{two}, nil); len(got) != 1 || got[0].Addr != "192.0.2.9:9000" {
		t.Errorf("port by number: %+v", got)
	}

	bld.cfg.Port = ""
	pods := map[string]*corev1.Pod{"p1": {ObjectMeta: metav1.ObjectMeta{Name: "p1", Annotations: map[string]string{AnnotationEventsPort: "5557"}}}}
	got = bld.fromSlices([]*discoveryv1.EndpointSlice{a}, func(n string) (*corev1.Pod, bool) { p, ok := pods[n]; return p, ok })
	want = []Engine{{Name: "p1", Addr: "192.0.2.1:8000", State: StateReady, Settings: config.EngineSettings{EventsPort: 5557, DPSize: 1}}}
	if !equal(got, want) {
		t.Errorf("with pods\n got %+v\nwant %+v", got, want)
	}
}

func TestFromPods(t *testing.T) {
	now := metav1.Now()
	pod := func(name, ip string, ready bool, deleting bool, phase corev1.PodPhase, ports ...corev1.ContainerPort) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: ports}}},
			Status: corev1.PodStatus{PodIP: ip, Phase: phase}}
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		if deleting {
			p.DeletionTimestamp = &now
		}
		return p
	}
	udp := corev1.ContainerPort{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}
	httpPort := corev1.ContainerPort{Name: "http", ContainerPort: 8080}
	pods := []*corev1.Pod{
		pod("ready", "192.0.2.1", true, false, corev1.PodRunning, udp, httpPort),
		pod("starting", "192.0.2.2", false, false, corev1.PodRunning),
		pod("draining", "192.0.2.3", true, true, corev1.PodRunning),
		pod("dying", "192.0.2.4", false, true, corev1.PodRunning),
		pod("pending", "", false, false, corev1.PodPending),
		pod("done", "192.0.2.6", false, false, corev1.PodSucceeded),
	}
	bld := &builder{cfg: config.Discovery{Defaults: config.EngineSettings{DPSize: 1}}, skip: func(string, string) {}, bad: func(string, string, string, error) {},
		pending: func(string, string) {}}
	def := config.EngineSettings{DPSize: 1}
	want := []Engine{
		{Name: "ready", Addr: "192.0.2.1:8080", State: StateReady, Settings: def},
		{Name: "starting", Addr: "192.0.2.2:8000", State: StateNotReady, Settings: def},
		{Name: "draining", Addr: "192.0.2.3:8000", State: StateDraining, Settings: def},
		{Name: "dying", Addr: "192.0.2.4:8000", State: StateNotReady, Settings: def},
	}
	if got := bld.fromPods(pods); !equal(got, want) {
		t.Errorf("engines\n got %+v\nwant %+v", got, want)
	}
	var skipped []string
	bld.skip = func(o, _ string) { skipped = append(skipped, o) }
	bld.cfg.Port = "http"
	if got := bld.fromPods(pods[:2]); len(got) != 1 || got[0].Addr != "192.0.2.1:8080" || len(skipped) != 1 {
		t.Errorf("named port: %+v, skipped %v", got, skipped)
	}
}

func equal(a, b []Engine) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSnapshotsCoalesce: a snapshot not yet received is replaced by the
// newer one, and the sender never blocks.
func TestSnapshotsCoalesce(t *testing.T) {
	src, err := New(config.Discovery{Namespace: "ns", Service: "vllm"}, &rest.Config{Host: "https://127.0.0.1:1"}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	one := Snapshot{Engines: []Engine{{Name: "a", Addr: "192.0.2.1:8000", State: StateReady}}}
	two := Snapshot{Engines: []Engine{{Name: "a", Addr: "192.0.2.1:8000", State: StateDraining}}}
	src.send(one)
	src.send(two) // would block on a full channel without the replace
	if got := <-src.Snapshots(); !equal(got.Engines, two.Engines) {
		t.Fatalf("received %+v, want the newer %+v", got, two)
	}
	select {
	case s := <-src.Snapshots():
		t.Fatalf("a second snapshot %+v was queued", s)
	default:
	}
	if got := testutil.ToFloat64(src.m.engines.WithLabelValues("draining")); got != 1 {
		t.Errorf("engines{state=draining} = %v, want 1", got)
	}
}

// TestRunTwice: a second Run is refused.
func TestRunTwice(t *testing.T) {
	src, err := New(config.Discovery{Namespace: "ns", Service: "vllm"}, &rest.Config{Host: "https://127.0.0.1:1"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	for !src.started.Load() {
		runtime.Gosched()
	}
	if err := src.Run(ctx); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("second Run = %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel = %v, want nil", err)
	}
}

// TestTrimPod: a trimmed Pod gives the same engine as the full one, and
// drops what discovery does not read.
func TestTrimPod(t *testing.T) {
	now := metav1.Now()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", Labels: map[string]string{"app": "vllm"},
			Annotations: map[string]string{AnnotationEventsPort: "5557"}, DeletionTimestamp: &now,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "sidecar", Image: "x", Env: []corev1.EnvVar{{Name: "A", Value: "b"}}},
			{Name: "vllm", Image: "vllm", Args: []string{"--port", "8080"}, Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}},
		}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "192.0.2.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	tp, err := trimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := tp.(*corev1.Pod)
	for _, port := range []string{"", "http"} {
		bld := &builder{cfg: config.Discovery{Port: port, Defaults: config.EngineSettings{DPSize: 1}}, skip: func(string, string) {},
			bad: func(string, string, string, error) {}, pending: func(string, string) {}}
		if a, b := bld.fromPods([]*corev1.Pod{p}), bld.fromPods([]*corev1.Pod{trimmed}); !equal(a, b) || len(a) != 1 {
			t.Errorf("port %q: full %+v, trimmed %+v", port, a, b)
		}
	}
	if len(trimmed.ManagedFields) != 0 || len(trimmed.Spec.Containers) != 1 || trimmed.Spec.Containers[0].Args != nil {
		t.Errorf("trimmed pod keeps %+v", trimmed)
	}
	if o, _ := trimPod("tombstone"); o != "tombstone" {
		t.Errorf("non-pod changed: %v", o)
	}
}
