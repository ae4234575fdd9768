package k8stest

import (
	"context"

	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// NetNS is a network namespace joined to the root namespace by a veth
// pair: HostAddr (10.213.X.1/24) on the root side, Addr (10.213.X.2/24)
// inside. Only these two addresses are on its subnet; traffic to Addr
// stays on this machine.
type NetNS struct {
	// Name is the namespace's name (ip netns), "kvtX".
	Name string
	// Addr is the namespace side's address, 10.213.X.2.
	Addr netip.Addr
	// HostAddr is the root side's address, 10.213.X.1.
	HostAddr netip.Addr
	hostIf   string
}

// netnsSubnets is how many /24s of 10.213.0.0/16 NewNetNS may use.
const netnsSubnets = 250

// NewNetNS creates a network namespace with a subnet no other namespace or
// interface on this machine uses, and deletes it on t.Cleanup. The subnet
// is claimed by creating the namespace "kvtX" (which fails if it exists),
// so parallel tests and test binaries never share one. It skips (or fails,
// see RequiredEnv) when not root.
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	requireRoot(t)
	used := usedSubnets()
	start := os.Getpid() % netnsSubnets
	for i := range netnsSubnets {
		x := (start + i) % netnsSubnets
		if used[x] {
			continue
		}
		name := "kvt" + strconv.Itoa(x)
		if err := exec.Command("ip", "netns", "add", name).Run(); err != nil {
			continue // taken by another test, or left over
		}
		n := &NetNS{
			Name:     name,
			Addr:     netip.AddrFrom4([4]byte{10, 213, byte(x), 2}),
			HostAddr: netip.AddrFrom4([4]byte{10, 213, byte(x), 1}),
			hostIf:   name + "h",
		}
		t.Cleanup(n.delete)
		if err := n.setup(); err != nil {
			t.Fatalf("k8stest: network namespace %s: %v", name, err)
		}
		return n
	}
	t.Fatalf("k8stest: no free subnet in 10.213.0.0/16 (left over: ip netns list | grep kvt)")
	return nil
}

// usedSubnets marks the X of every 10.213.X.0/24 an interface here has.
func usedSubnets() map[int]bool {
	used := map[int]bool{}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip4 := ipn.IP.To4(); ip4 != nil && ip4[0] == 10 && ip4[1] == 213 {
				used[int(ip4[2])] = true
			}
		}
	}
	return used
}

// setup makes the veth pair, addresses and links.
func (n *NetNS) setup() error {
	nsIf := n.Name + "n"
	_ = exec.Command("ip", "link", "del", n.hostIf).Run() // a leftover of a killed run
	steps := [][]string{
		{"ip", "link", "add", n.hostIf, "type", "veth", "peer", "name", nsIf},
		{"ip", "link", "set", nsIf, "netns", n.Name},
		{"ip", "addr", "add", n.HostAddr.String() + "/24", "dev", n.hostIf},
		{"ip", "link", "set", n.hostIf, "up"},
		{"ip", "netns", "exec", n.Name, "ip", "addr", "add", n.Addr.String() + "/24", "dev", nsIf},
		{"ip", "netns", "exec", n.Name, "ip", "link", "set", nsIf, "up"},
		{"ip", "netns", "exec", n.Name, "ip", "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	return nil
}

// delete removes the namespace and the host side of the pair (which also
// removes the namespace side, should a socket still hold the namespace).
func (n *NetNS) delete() {
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
	_ = exec.Command("ip", "link", "del", n.hostIf).Run()
}

// Listen opens a TCP listener on Addr:port inside the namespace (port 0
// picks one). The socket stays in the namespace; this process keeps
// running in the root namespace.
func (n *NetNS) Listen(port int) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread enters the namespace and is never unlocked, so it
		// ends with this goroutine and no other goroutine runs in it.
		runtime.LockOSThread()
		ln, err := n.listenHere(port)
		ch <- result{ln, err}
	}()
	r := <-ch
	return r.ln, r.err
}

func (n *NetNS) listenHere(port int) (net.Listener, error) {
	f, err := os.Open("/run/netns/" + n.Name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("setns %s: %w", n.Name, err)
	}
	return net.Listen("tcp", net.JoinHostPort(n.Addr.String(), strconv.Itoa(port)))
}

// Command returns a command that runs name with args inside the namespace
// (ip netns exec), e.g. "kvrouter engine-sim --host" Addr. The caller
// starts and stops it; ctx kills it.
func (n *NetNS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}
