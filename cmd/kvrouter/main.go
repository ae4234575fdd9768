// Command kvrouter is a KV-cache-aware request router for fleets of vLLM
// replicas. Run "kvrouter help" for its subcommands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"kvrouter/internal/demo"
	"kvrouter/internal/sim"
)

// command is one subcommand. run parses its own flags from args and returns
// errUsage (wrapped or not) when they are wrong.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, io stdio) error
}

// stdio is what a subcommand reads and writes, injected so tests can run
// subcommands in-process.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

func commands() []command {
	return []command{
		{"serve", "run the OpenAI-compatible router", runServe},
		{"epp", "run as a Gateway API Inference Extension endpoint picker (ext_proc)", runEPP},
		{"engine-sim", "run a simulated vLLM engine", runEngineSim},
		{"events", "tail an engine's KV events over ZeroMQ", runEvents},
		{"blockhash", "compute vLLM block hashes for token ids on stdin", runBlockhash},
		{"tokenize", "tokenize text or a chat with a tokenizer.json", runTokenize},
		{"sim", "simulate a fleet on a virtual clock and compare policies", runSim},
		{"bench", "replay a workload against live servers", runBench},
		{"audit", "does this fleet's traffic deserve a KV-aware router? (Prometheus or the engines' /metrics)", runAudit},
		{"plan", "size the KV cache: bytes per token, tokens per GPU, requests that fit, transfer time", runPlan},
		{"demo", "start engine-sims and kvrouter and compare policies on the Mooncake trace", runDemo},
		{"version", "print the build: version, VCS revision, Go version", runVersion},
	}
}

func main() {
	// Nothing in kvrouter reads heap profiles (no pprof endpoint, no
	// profile files), so the runtime's default sampling, which records
	// the stack of one allocation per 512 KiB (deep in the chat template
	// engine: about 8 % of the instructions of a continued 100K-token
	// chat request), is turned off, at the start of main as the runtime
	// asks.
	runtime.MemProfileRate = 0
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], stdio{os.Stdin, os.Stdout, os.Stderr})
	stop()
	os.Exit(code)
}

// run dispatches to a subcommand and returns the process exit code: 0 on
// success, 2 on a usage error, 1 on any other error.
func run(ctx context.Context, args []string, sio stdio) int {
	if len(args) == 0 {
		usage(sio.err)
		return 2
	}
	if args[0] == "--version" {
		args = []string{"version"}
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(sio.out)
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], sio)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage), errors.Is(err, demo.ErrConfig), errors.Is(err, sim.ErrConfig):
			fmt.Fprintf(sio.err, "kvrouter %s: %v\n", c.name, err)
			return 2
		default:
			fmt.Fprintf(sio.err, "kvrouter %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(sio.err, "kvrouter: unknown command %q\n", args[0])
	usage(sio.err)
	return 2
}

// errUsage marks bad command-line arguments (exit code 2), as do the
// packages' errors for configurations the flags filled badly.
var errUsage = errors.New("usage")

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kvrouter <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun \"kvrouter <command> -h\" for a command's flags.")
}

// newFlagSet returns a FlagSet that reports errors instead of exiting and
// prints its usage to w.
func newFlagSet(name, synopsis string, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvrouter "+name, flag.ContinueOnError)
	fs.SetOutput(w)
	fs.Usage = func() {
		fmt.Fprintf(w, "usage: kvrouter %s %s\n\nflags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args and wraps a parse failure in errUsage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	return nil
}
