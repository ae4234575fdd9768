package proxy

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
)

// TestGracefulShutdown: when Run's ctx ends, the listener stops accepting,
// a stream in flight finishes within the drain deadline, and Run returns.
func TestGracefulShutdown(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.DrainTimeout = 5 * time.Second })
	step := make(chan struct{}, 4)
	rg.engines[0].set(func(e *engine) { e.step, e.chunks = step, 3 })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- rg.srv.Run(ctx, ln) }()
	url := "http://" + ln.Addr().String()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatStream))
	resp, err := rg.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	step <- struct{}{}
	buf := make([]byte, 4096)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	cancel() // shutdown starts with a stream in flight
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 100*time.Millisecond)
		if err != nil {
			break // no longer accepting
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("still accepting connections after shutdown began")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) before the stream finished", err)
	default:
	}
	step <- struct{}{}
	step <- struct{}{}
	rest := readAll(t, resp)
	if !strings.HasSuffix(rest, "data: [DONE]\n\n") {
		t.Errorf("drained stream ended with %q", rest)
	}
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestDrainDeadline: a stream still running at the drain deadline is cut
// and Run returns.
func TestDrainDeadline(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.DrainTimeout = 200 * time.Millisecond })
	rg.engines[0].set(func(e *engine) { e.block = true })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- rg.srv.Run(ctx, ln) }()
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/v1/chat/completions", strings.NewReader(chatBody))
		resp, err := rg.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-rg.engines[0].started
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the drain deadline")
	}
	<-rg.engines[0].canceled
	<-errc
}
