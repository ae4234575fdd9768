package main

import "context"

// runTokenize implements "kvrouter tokenize".
func runTokenize(ctx context.Context, args []string, sio stdio) error {
	return errNotBuilt
}
