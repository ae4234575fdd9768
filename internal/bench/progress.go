package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// IsTerminal reports whether w is a character device (a terminal), where a
// progress bar redrawn with carriage returns makes sense.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progress starts redrawing the bar on cfg.Progress (if set) and returns
// the function that draws it one last time and stops the goroutine.
func (c *runner) progress(total int, start time.Time) (stop func()) {
	if c.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				c.drawProgress(total, start)
				fmt.Fprintln(c.cfg.Progress)
				return
			case <-t.C:
				c.drawProgress(total, start)
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// barWidth is the bar's length in characters.
const barWidth = 30

func (c *runner) drawProgress(total int, start time.Time) {
	c.mu.Lock()
	sent, finished, errs := c.sent, len(c.samples), c.errs
	c.mu.Unlock()
	fmt.Fprint(c.cfg.Progress, progressLine(c.cfg.Name, total, sent, finished, errs, time.Since(start)))
}

// progressLine renders "\r<name> [####----] done/total, in flight, errors, elapsed".
func progressLine(name string, total, sent, finished, errs int, elapsed time.Duration) string {
	fill := 0
	if total > 0 {
		fill = barWidth * finished / total
	}
	return fmt.Sprintf("\r%s [%s%s] %d/%d done, %d in flight, %d errors, %s ",
		name, strings.Repeat("#", fill), strings.Repeat("-", barWidth-fill),
		finished, total, sent-finished, errs, elapsed.Truncate(100*time.Millisecond))
}
