package main

import "context"

// runServe implements "kvrouter serve".
func runServe(ctx context.Context, args []string, sio stdio) error {
	return errNotBuilt
}
