package main

import "context"

// runBlockhash implements "kvrouter blockhash".
func runBlockhash(ctx context.Context, args []string, sio stdio) error {
	return errNotBuilt
}
