package epp

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/bodybudget"
	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/pick"
)

// noPicker is a picker that is never asked: the test's client sends no
// request.
type noPicker struct{}

func (noPicker) Pick(context.Context, pick.Input) (*pick.Pick, *pick.Error) {
	return nil, &pick.Error{Status: 503}
}
func (noPicker) EndpointNamed(func(string) bool) (string, string, bool) { return "", "", false }
func (noPicker) TooLarge() *pick.Error                                  { return &pick.Error{Status: 413} }
func (noPicker) BodyLimit() int64                                       { return 1 << 20 }
func (noPicker) Bodies() *bodybudget.Budget                             { return bodybudget.New(1 << 20) }
func (noPicker) AllowDPRank() bool                                      { return false }
func (noPicker) CountClientControl(string)                              {}
func (noPicker) HasReplica(string) bool                                 { return false }

// A client that connects to the ext_proc port and sends nothing is closed
// after handshake_timeout (gRPC's default waits 120 s); real TCP on
// loopback.
func TestRunClosesSilentConnections(t *testing.T) {
	reg := prometheus.NewRegistry()
	fs, err := frontmetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{HandshakeTimeout: 300 * time.Millisecond}
	cfg.FillDefaults()
	s, err := newServer(cfg, noPicker{}, fs, Deps{}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 256)
	for {
		_, err := c.Read(buf) // the server's SETTINGS frame, then the close
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("a connection that sent nothing is still open after 10 s")
		}
		return
	}
}
