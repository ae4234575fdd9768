package main

import "context"

// runSim implements "kvrouter sim".
func runSim(ctx context.Context, args []string, sio stdio) error {
	return errNotBuilt
}
