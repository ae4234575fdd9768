package main

import "context"

// runEngineSim implements "kvrouter engine-sim".
func runEngineSim(ctx context.Context, args []string, sio stdio) error {
	return errNotBuilt
}
