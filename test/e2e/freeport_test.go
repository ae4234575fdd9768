package e2e

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// pickPort returns a loopback TCP port that was free a moment ago, for a
// process the test starts to bind later. It is drawn at random from the
// 12,000 ports below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), which the kernel never hands
// out by itself: between this check and the bind, no connect() and no
// bind to port 0 (httptest servers, this package's own listeners, the
// other test binaries that `go test ./...` runs at the same time) can take
// it. A port 0 listener's port, closed and handed on, can be drawn by any
// such bind meanwhile. Falls back to a port 0 draw when the range leaves no
// room below it.
func pickPort(t *testing.T) int {
	t.Helper()
	lo := 32768 // Linux's default range starts here
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				lo = v
			}
		}
	}
	if base := lo - 12000; base >= 10000 {
		for range 200 {
			p := base + rand.IntN(12000)
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				continue
			}
			ln.Close()
			return p
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestPickPort: pickPort's ports are outside the ephemeral range and free.
func TestPickPort(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip("no /proc/sys/net/ipv4/ip_local_port_range")
	}
	f := strings.Fields(string(b))
	lo, _ := strconv.Atoi(f[0])
	if lo-12000 < 10000 {
		t.Skipf("ephemeral range from %d: no room below it", lo)
	}
	for range 20 {
		p := pickPort(t)
		if p < lo-12000 || p >= lo {
			t.Fatalf("port %d outside [%d, %d)", p, lo-12000, lo)
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d not free: %v", p, err)
		}
		ln.Close()
	}
}
