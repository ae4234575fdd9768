package main

import "context"

// runEvents implements "kvrouter events".
func runEvents(ctx context.Context, args []string, sio stdio) error {
	return errNotBuilt
}
