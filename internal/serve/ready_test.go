package serve

import (
	"context"
	"fmt"
	"maps"
	"net"
	"testing"

	"kvrouter/internal/config"

	"github.com/go-zeromq/zmq4"

	"kvrouter/internal/testwait"
)

// TestReadinessAsksSubscribers: the event-stream state readiness reads
// (proxy.Deps.EventsConnected, and the EPP's) is each engine's KV event
// subscriber's own: false before Run, true once the subscriber's
// connection to the engine's PUB socket is up.
func TestReadinessAsksSubscribers(t *testing.T) {
	pub := zmq4.NewPub(context.Background())
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf("models:\n  - name: m\n    tokenizer: none\n    engines: [{name: a, url: 'http://127.0.0.1:1', events: 'tcp://%s'}]\n", pub.Addr())
	cfg, pos, err := config.Parse([]byte(yaml), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	app, err := New(t.Context(), Options{Config: cfg, Positions: pos})
	if err != nil {
		t.Fatal(err)
	}
	if got := app.eventsConnected(); !maps.Equal(got, map[string]bool{"a": false}) {
		t.Fatalf("before Run: %v, want a not connected", got)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, ln) }()
	defer func() {
		// The PUB closes while the subscriber is still connected: zmq4
		// v0.17.0's PUB races with itself on Close after a subscriber left.
		pub.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	testwait.Seen(t, testwait.Default, "the subscriber of engine a to connect", func() (bool, any) {
		last := app.eventsConnected()
		return last["a"], last
	})
}
