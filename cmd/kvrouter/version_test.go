package main

import (
	"runtime"
	"strings"
	"testing"
)

// kvrouter version (and --version) prints one line naming the build.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errs := runCmd(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		line := strings.TrimSuffix(out, "\n")
		if strings.Contains(line, "\n") || !strings.HasPrefix(line, "kvrouter ") ||
			!strings.HasSuffix(line, " "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH) {
			t.Fatalf("%v: %q", args, out)
		}
	}
	if code, _, _ := runCmd(t, "version", "extra"); code != 2 {
		t.Fatalf("version with an argument: exit %d, want 2", code)
	}
}
