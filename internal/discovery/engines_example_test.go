package discovery

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"kvrouter/internal/config"
	"kvrouter/internal/enginesim"
)

// TestEnginesExample: the engine Deployment in deploy/kubernetes drains as
// docs/kubernetes.md says: a --shutdown-timeout above 0 (vLLM's drain
// mode), a preStop sleep, and a grace period longer than both together;
// its Pods' annotations give discovery the events and replay ports the
// engine's --kv-events-config binds. (TestHelmChart applies the file to a
// real kube-apiserver.)
func TestEnginesExample(t *testing.T) {
	b, err := os.ReadFile("../../deploy/kubernetes/vllm-engines.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var dep *appsv1.Deployment
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.Contains(doc, "\nkind: Deployment\n") {
			dep = &appsv1.Deployment{}
			if err := yaml.UnmarshalStrict([]byte(doc), dep); err != nil {
				t.Fatal(err)
			}
		}
	}
	if dep == nil || len(dep.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("no Deployment with one container in the file")
	}
	pod := dep.Spec.Template
	c := pod.Spec.Containers[0]
	var shutdown time.Duration
	var kv enginesim.KVEventsConfig
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--shutdown-timeout="); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s: %v", a, err)
			}
			shutdown = time.Duration(n) * time.Second
		}
		if v, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
			if kv, err = enginesim.ParseKVEventsConfig(v); err != nil {
				t.Fatalf("%s: %v", a, err)
			}
		}
	}
	if shutdown <= 0 {
		t.Fatalf("no --shutdown-timeout above 0 in %q: vLLM would abort the requests in flight", c.Args)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds <= 0 {
		t.Fatalf("no preStop sleep: %+v", c.Lifecycle)
	}
	sleep := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	grace := time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	if grace <= sleep+shutdown {
		t.Errorf("terminationGracePeriodSeconds %v <= preStop %v + --shutdown-timeout %v: SIGKILL would cut the drain", grace, sleep, shutdown)
	}
	s := settingsFrom(pod.Annotations, config.EngineSettings{DPSize: 1}, func(key, value string, err error) { t.Errorf("annotation %s=%q: %v", key, value, err) })
	if want := "tcp://*:" + strconv.Itoa(s.EventsPort); kv.Endpoint != want || !kv.EnableKVCacheEvents {
		t.Errorf("--kv-events-config endpoint %q (enabled %v), the events-port annotation says %s", kv.Endpoint, kv.EnableKVCacheEvents, want)
	}
	if want := "tcp://*:" + strconv.Itoa(s.ReplayPort); kv.ReplayEndpoint != want {
		t.Errorf("--kv-events-config replay_endpoint %q, the replay-port annotation says %s", kv.ReplayEndpoint, want)
	}
}
