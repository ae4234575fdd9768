package main

import "context"

// runDemo implements "kvrouter demo".
func runDemo(ctx context.Context, args []string, sio stdio) error {
	return errNotBuilt
}
