package main

import (
	"strings"
	"testing"
)

func TestBenchHelpDocumentsEveryFlag(t *testing.T) {
	code, _, help := runCmd(t, "bench", "-h")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, f := range []string{"router", "name", "engines", "policies", "metrics", "reset", "model", "timeout", "max-inflight",
		"slo-ttft", "slo-itl", "json", "html", "no-progress", "workload", "trace", "requests", "skip", "speed", "rate",
		"max-input-tokens", "max-output-tokens", "prompt-tokens", "prefix-tokens", "suffix-tokens", "output-tokens",
		"groups", "hot-share", "seed", "bound-blocks", "bound-engines"} {
		if !strings.Contains(help, "  -"+f+" ") && !strings.Contains(help, "  -"+f+"\n") {
			t.Errorf("help does not document -%s", f)
		}
	}
}
