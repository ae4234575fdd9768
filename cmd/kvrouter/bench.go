package main

import "context"

// runBench implements "kvrouter bench".
func runBench(ctx context.Context, args []string, sio stdio) error {
	return errNotBuilt
}
