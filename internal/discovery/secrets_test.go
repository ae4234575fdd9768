package discovery

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvrouter/internal/config"
)

// secret creates or replaces Secret name with data.
func (e *env) secret(t testing.TB, name string, data map[string]string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, StringData: data}
	api := e.cs.CoreV1().Secrets(e.ns)
	if cur, err := api.Get(e.ctx, name, metav1.GetOptions{}); err == nil {
		cur.Data, cur.StringData = nil, data
		if _, err := api.Update(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return
	}
	if _, err := api.Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// keysOf renders a snapshot as "addr=key" words, sorted by addr.
func keysOf(s Snapshot) string {
	out := ""
	for _, e := range s.Engines {
		if out != "" {
			out += " "
		}
		out += e.Addr + "=" + e.APIKey
	}
	return out
}

// testAPIKeySecret: an engine's API key comes from the Secret its
// annotation (or the defaults) names, trimmed; a rotated key is followed
// within secret_refresh; an engine whose key cannot be read is left out
// (counted) and comes back when the key appears; a key read before is
// kept when a later read fails.
func testAPIKeySecret(t *testing.T, e *env) {
	e.secret(t, "vllm-keys", map[string]string{"a": "key-a\n", "shared": "key-s"})
	r := start(t, e.c.Config(), config.Discovery{Namespace: e.ns, Selector: "app=vllm", SecretRefresh: 100 * time.Millisecond,
		Defaults: config.EngineSettings{APIKeySecret: config.SecretRef{Name: "vllm-keys", Key: "shared"}}})
	sel := map[string]string{"app": "vllm"}
	e.pod(t, "a", "192.0.2.1", sel, map[string]string{AnnotationAPIKeySecret: "vllm-keys/a"}, true)
	e.pod(t, "b", "192.0.2.2", sel, nil, true)
	wait := func(want string) time.Duration {
		t.Helper()
		t0 := time.Now()
		r.waitFor(t, want, func(s Snapshot) bool { return keysOf(s) == want })
		return time.Since(t0)
	}
	wait("192.0.2.1:8000=key-a 192.0.2.2:8000=key-s")

	e.secret(t, "vllm-keys", map[string]string{"a": "key-a2", "shared": "key-s"})
	d := wait("192.0.2.1:8000=key-a2 192.0.2.2:8000=key-s")
	t.Logf("rotated key reached the snapshot in %v (secret_refresh 100ms)", d.Round(time.Millisecond))

	// A Pod naming a key that does not exist is left out until it does.
	e.pod(t, "c", "192.0.2.3", sel, map[string]string{AnnotationAPIKeySecret: "vllm-keys/c"}, true)
	// Wait for the failed read (c's Pod seen), then several refreshes.
	for deadline := time.Now().Add(20 * time.Second); testutil.ToFloat64(r.src.m.secretErrors) < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("kvrouter_discovery_secret_errors_total = %v 20 s after a missing key", testutil.ToFloat64(r.src.m.secretErrors))
		}
	}
	time.Sleep(300 * time.Millisecond) // absence: no snapshot meanwhile may include c
	select {
	case s := <-r.src.Snapshots(): // any snapshot sent meanwhile must leave c out
		if got := keysOf(s); got != "192.0.2.1:8000=key-a2 192.0.2.2:8000=key-s" {
			t.Fatalf("with c's key missing: %s", got)
		}
	default: // nothing changed: c is not in the last snapshot
	}
	e.secret(t, "vllm-keys", map[string]string{"a": "key-a2", "shared": "key-s", "c": "key-c"})
	wait("192.0.2.1:8000=key-a2 192.0.2.2:8000=key-s 192.0.2.3:8000=key-c")

	// The Secret deleted: reads fail, the keys read before stay.
	if err := e.cs.CoreV1().Secrets(e.ns).Delete(e.ctx, "vllm-keys", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	before := testutil.ToFloat64(r.src.m.secretErrors)
	time.Sleep(300 * time.Millisecond) // past the refresh period: the next rebuild reads again
	e.pod(t, "d", "192.0.2.4", sel, nil, true)
	wait("192.0.2.1:8000=key-a2 192.0.2.2:8000=key-s 192.0.2.3:8000=key-c 192.0.2.4:8000=key-s")
	if n := testutil.ToFloat64(r.src.m.secretErrors); n <= before {
		t.Errorf("no failed read counted after the Secret was deleted (%v)", n)
	}
}
