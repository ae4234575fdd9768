package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// buildVersionOverride, set by the linker (-ldflags "-X
// main.buildVersionOverride=v1.2.3", as the Dockerfile does from its VERSION
// build argument), replaces the module version for builds without VCS
// information. It is never written at run time.
var buildVersionOverride string

// buildVersion describes the running binary from the build information the
// Go toolchain embeds: module version, VCS revision and time (present when
// built inside a git checkout; "+dirty" when it had uncommitted changes),
// Go version and platform, e.g.
// "kvrouter (devel) 86d416c3a1b2+dirty 2026-12-01T10:00:00Z go1.27.3 linux/amd64".
func buildVersion() string {
	version, rev, when, dirty := "(unknown)", "", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if buildVersionOverride != "" {
		version = buildVersionOverride
	}
	out := "kvrouter " + version
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "+dirty"
		}
		out += " " + rev
	}
	if when != "" {
		out += " " + when
	}
	return out + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
}

// runVersion implements "kvrouter version".
func runVersion(_ context.Context, args []string, sio stdio) error {
	fs := newFlagSet("version", "\n\nPrints the build: module version, VCS revision and time, Go version, platform.", sio.err)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	_, err := fmt.Fprintln(sio.out, buildVersion())
	return err
}
