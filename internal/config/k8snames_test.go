package config

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// nameSeeds are inputs for the name checks: valid and invalid at each
// rule's edges.
var nameSeeds = []string{
	"", "a", "A", "0", "-", "a-", "-a", "a-b", "a--b", "a.b", "a_b", "a.b.c", ".a", "a.", "a..b", "a/b", "/b", "a/", "a/b/c",
	"example.com/name", "Example.com/name", "llm-d.ai/role", "app.kubernetes.io/name", "a/B_c.D-1", "a/_b", "a/b_",
	"http", "h2c", "8080", "p-8080", "port-name-longer", "a-b-c-d-e-f-g-h", "ns", "kube-system", "vllm", "1abc", "abc1",
	strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 15), strings.Repeat("a", 16),
	strings.Repeat("a", 62) + "-", strings.Repeat("a.", 126) + "a", strings.Repeat("a.", 127) + "a",
	strings.Repeat("b", 100) + ".c", strings.Repeat("a", 253), strings.Repeat("a", 254),
	"x/" + strings.Repeat("n", 63), "x/" + strings.Repeat("n", 64), strings.Repeat("p", 253) + "/n", strings.Repeat("p", 254) + "/n",
	"a b", "a\tb", "é", "a\x00b", "UPPER", "mIxed",
}

// selectorSeeds are selectors, valid and not, covering each token and
// each place a token may or may not go.
var selectorSeeds = []string{
	"", " ", "a", "!a", "a,b", "a=b", "a==b", "a!=b", "a=", "a==", "a!=", "a=,b", "a in (b)", "a notin (b,c)", "a in ()",
	"a in (,)", "a in (,b)", "a in (b,)", "a in (b,,c)", "a in (b c)", "a in b", "a in (b", "a in (b))", "a in", "a notin",
	"in", "in in (in)", "notin=notin", "a=in", "!in", "a>1", "a<-1", "a>b", "a>", "a>1,b<2", "a>99999999999999999999",
	"a > 1", "a>=1", "a=>1", "a<>1", "a=!b", "a!b", "!a=b", "!a,b", "!!a", "!", ",", "a,", ",a", "a,,b", "a b", "a=b c",
	"a = b", " a = b , c ", "a\t=\tb", "a\n=b", "a=b\r", "a=(b)", "a in (b)c", "a in (b)(c)", "(a)", ")", "a)", "a(",
	"app=vllm,model=llama-8b", "app.kubernetes.io/name=kvrouter,app.kubernetes.io/instance=r", "environment in (production, qa)",
	"tier notin (frontend,backend)", "partition", "!partition", "a/b/c=d", "a=b/c", "a=" + strings.Repeat("v", 63),
	"a=" + strings.Repeat("v", 64), "a=-b", "a=b-", "a=_b", "a=b.c", "a in (" + strings.Repeat("v", 64) + ")",
	"a\x00", "\x00a", "a\x00=b", "a=\x00b", "a=b\x00,c", "a,\x00", "a in (b\x00)", "a=\x00", "a\x00\x00b", "a=b,\x00c",
	"a==b==c", "a===b", "a!==b", "a!=!b", "a in (b,c),d notin (e)", "a,b,c=d,!e", "é=a", "a=é",
}

// agree checks that each name check accepts exactly what Kubernetes'
// own accepts.
func agree(t *testing.T, s string) {
	t.Helper()
	for _, c := range []struct {
		name string
		ours string
		k8s  []string
	}{
		{"DNS-1123 label", checkDNS1123Label(s), validation.IsDNS1123Label(s)},
		{"DNS-1123 subdomain", checkDNS1123Subdomain(s), validation.IsDNS1123Subdomain(s)},
		{"DNS-1035 label", checkDNS1035Label(s), validation.IsDNS1035Label(s)},
		{"port name", checkPortName(s), validation.IsValidPortName(s)},
		{"qualified name", checkLabelKey(s), validation.IsQualifiedName(s)},
	} {
		if (c.ours == "") != (len(c.k8s) == 0) {
			t.Errorf("%s %q: ours %q, Kubernetes %q", c.name, s, c.ours, c.k8s)
		}
	}
	if ours, k8s := labelValue(s), len(validation.IsValidLabelValue(s)) == 0; ours != k8s {
		t.Errorf("label value %q: ours %v, Kubernetes %v", s, ours, k8s)
	}
}

func agreeSelector(t *testing.T, s string) {
	t.Helper()
	ours := checkSelector(s)
	_, k8s := labels.Parse(s)
	if (ours == nil) != (k8s == nil) {
		t.Errorf("selector %q: ours %v, Kubernetes %v", s, ours, k8s)
	}
}

// TestNameChecksAgreeWithKubernetes: the checks of the discovery and
// peers blocks accept what k8s.io/apimachinery accepts, no more, no less.
func TestNameChecksAgreeWithKubernetes(t *testing.T) {
	for _, s := range nameSeeds {
		agree(t, s)
	}
	for _, s := range selectorSeeds {
		agreeSelector(t, s)
	}
	// The table holds both outcomes, so a check that accepts (or refuses)
	// everything fails above.
	var ok, bad int
	for _, s := range selectorSeeds {
		if checkSelector(s) == nil {
			ok++
		} else {
			bad++
		}
	}
	if ok < 20 || bad < 20 {
		t.Errorf("selector seeds: %d valid, %d invalid; want both kinds", ok, bad)
	}
}

func FuzzSelectorAgreesWithKubernetes(f *testing.F) {
	for _, s := range selectorSeeds {
		f.Add(s)
	}
	f.Fuzz(agreeSelector)
}

func FuzzNamesAgreeWithKubernetes(f *testing.F) {
	for _, s := range nameSeeds {
		f.Add(s)
	}
	f.Fuzz(agree)
}
