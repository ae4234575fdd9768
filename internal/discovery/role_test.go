package discovery

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvrouter/internal/config"
)

// TestRoles: a Pod's role label (llm-d's values) gives its engine's pool;
// an unknown value is reported and taken as decode; roles off give none;
// the label name is configurable and checked.
func TestRoles(t *testing.T) {
	pod := func(name, ip string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: labels},
			Status: corev1.PodStatus{PodIP: ip, Phase: corev1.PodRunning,
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	}
	pods := []*corev1.Pod{
		pod("p", "192.0.2.1", map[string]string{config.DefaultRoleLabel: "prefill"}),
		pod("d", "192.0.2.2", map[string]string{config.DefaultRoleLabel: "decode"}),
		pod("pd", "192.0.2.3", map[string]string{config.DefaultRoleLabel: "prefill-decode"}),
		pod("both", "192.0.2.4", map[string]string{config.DefaultRoleLabel: "both"}),
		pod("none", "192.0.2.5", nil),
		pod("odd", "192.0.2.6", map[string]string{config.DefaultRoleLabel: "encode"}),
		pod("other", "192.0.2.7", map[string]string{"example.com/role": "prefill"}),
	}
	want := map[string]string{"p": config.RolePrefill, "d": config.RoleDecode, "pd": config.RoleDecode, "both": config.RoleDecode, "none": config.RoleDecode, "odd": config.RoleDecode, "other": config.RoleDecode}
	cfg, err := config.Discovery{Namespace: "ns", Selector: "app=vllm"}.WithDefaults()
	if err != nil || cfg.RoleLabel != config.DefaultRoleLabel {
		t.Fatalf("default role label %q, %v", cfg.RoleLabel, err)
	}
	var bad []string
	bld := &builder{cfg: cfg, skip: func(string, string) {}, pending: func(string, string) {},
		bad: func(pod, key, value string, _ error) { bad = append(bad, pod+" "+key+"="+value) }}
	for _, e := range bld.fromPods(pods) {
		if e.Role != want[e.Name] {
			t.Errorf("%s: role %q, want %q", e.Name, e.Role, want[e.Name])
		}
	}
	if strings.Join(bad, ",") != "ns/odd llm-d.ai/role=encode" {
		t.Errorf("reported %v, want only odd's value", bad)
	}
	bld.cfg.RoleLabel = "example.com/role"
	if es := bld.fromPods(pods); es[0].Role != config.RoleDecode || es[6].Role != config.RolePrefill {
		t.Errorf("with label example.com/role: p %q, other %q", es[0].Role, es[6].Role)
	}
	bld.cfg.RoleLabel = config.RoleLabelOff
	for _, e := range bld.fromPods(pods) {
		if e.Role != "" {
			t.Errorf("roles off: %s has role %q", e.Name, e.Role)
		}
	}
	if _, err := (config.Discovery{Namespace: "ns", Selector: "a=b", RoleLabel: "not a label!"}).WithDefaults(); err == nil || !strings.Contains(err.Error(), "role_label") {
		t.Errorf("bad role_label accepted: %v", err)
	}
}
