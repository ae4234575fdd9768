package enginesim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
)

// RunRestarting is Run, restarting the simulated engine (Restart) each
// time restart receives (SIGHUP for "kvrouter engine-sim"), until ctx
// ends. A panic while restarting stops the engine and is returned.
func (s *Server) RunRestarting(ctx context.Context, restart <-chan os.Signal) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	var hupErr error // a panic of the restart goroutine, read after done
	go func() {
		defer close(done)
		defer cancel() // a panic stops the engine too
		defer func() {
			if r := recover(); r != nil {
				hupErr = fmt.Errorf("SIGHUP handler panicked: %v\n%s", r, debug.Stack())
			}
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-restart:
				s.log.Info("SIGHUP: restarting the simulated engine")
				if err := s.Restart(ctx); err != nil && ctx.Err() == nil {
					s.log.Warn("restart failed", "err", err)
				}
			}
		}
	}()
	err := s.Run(ctx)
	cancel()
	<-done
	return errors.Join(err, hupErr)
}
