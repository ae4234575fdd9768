package k8stest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The node's network: a Linux bridge on a private subnet that stays on this
// machine (no masquerade, no route out). kube-apiserver listens on the
// bridge's address, where the kubelet and the Pods reach it; one DNAT rule,
// scoped to the bridge, stands in for kube-proxy and sends the `kubernetes`
// Service address (the first of ServiceCIDR) to it.
const (
	// NodeBridge is the Pods' bridge.
	NodeBridge = "kvrnode0"
	// NodePodCIDR is the Pods' subnet; NodeAddr, its first address, is the
	// bridge's (the node's InternalIP and kube-apiserver's address).
	NodePodCIDR = "10.214.0.0/24"
	NodeAddr    = "10.214.0.1"
	// NodeServiceCIDR is kube-apiserver's --service-cluster-ip-range;
	// NodeAPIServiceIP the `kubernetes` Service's address in it.
	NodeServiceCIDR  = "10.214.1.0/24"
	NodeAPIServiceIP = "10.214.1.1"
	// NodeName is the node's name.
	NodeName = "kvrnode"
	// nodeLock serializes real nodes on this machine: they share the
	// bridge's name and subnet, and a kubelet owns the /kubepods cgroups.
	nodeLock     = "/run/kvrouter-k8stest-node.lock"
	nodeLockWait = 10 * time.Minute
	// pauseRef is the sandbox image containerd uses (imported, never pulled).
	pauseRef = "docker.io/library/kvrouter-test-pause:1"
)

// NodeOptions configures StartNode.
type NodeOptions struct {
	// Images are image archives (OCI layout or docker-save tarballs, as
	// internal/image writes) imported into the node's containerd before
	// the kubelet starts; Pods must use imagePullPolicy Never.
	Images []string
	// Pause is an image archive whose image is named
	// docker.io/library/kvrouter-test-pause:1 (PauseRef): the Pod sandbox.
	Pause string
}

// PauseRef is the name the pause image archive of NodeOptions must give
// its image.
const PauseRef = pauseRef

// nodeBinaries are the node's programs beside the control plane's.
type nodeBinaries struct {
	kubelet, scheduler, controllerManager string
	containerd, ctr, runc, iptables       string
	cniBridge                             string
}

// findNodeBinaries locates the node's programs; the error names what is
// missing.
func findNodeBinaries() (nodeBinaries, error) {
	var b nodeBinaries
	var errs []error
	d, err := cacheDir()
	if err != nil {
		return b, fmt.Errorf("no cache directory: %w", err)
	}
	for _, x := range []struct {
		dst  *string
		name string
	}{{&b.kubelet, "kubelet"}, {&b.scheduler, "kube-scheduler"}, {&b.controllerManager, "kube-controller-manager"}} {
		p := filepath.Join(d, KubeVersion, x.name)
		if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("no %s %s at %s", x.name, KubeVersion, p))
		}
		*x.dst = p
	}
	for _, x := range []struct {
		dst       *string
		name, pkg string
	}{{&b.containerd, "containerd", "containerd"}, {&b.ctr, "ctr", "containerd"}, {&b.runc, "runc", "runc"}, {&b.iptables, "iptables", "iptables"}} {
		p, err := exec.LookPath(x.name)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s not on PATH (Debian %s)", x.name, x.pkg))
		}
		*x.dst = p
	}
	b.cniBridge = "/usr/lib/cni/bridge"
	if _, err := os.Stat(b.cniBridge); err != nil {
		errs = append(errs, errors.New("no CNI bridge plugin at /usr/lib/cni/bridge (Debian containernetworking-plugins)"))
	}
	return b, errors.Join(errs...)
}

// Node is a single-node cluster that runs real Pods: etcd,
// kube-apiserver (RBAC), kube-controller-manager, kube-scheduler, and a
// kubelet with its own containerd (runc, the CNI bridge plugin). Safe for
// concurrent use.
type Node struct {
	*Cluster
	mu    sync.Mutex // guards procs
	dir   string
	bins  nodeBinaries
	sock  string // containerd's socket
	procs map[string]*proc
	// netnsBefore are the network namespaces that existed before the node
	// started; those made since (by the CNI for Pods) are removed at the end.
	netnsBefore map[string]bool
	// ipForward is net.ipv4.ip_forward before the node started: the CNI
	// bridge plugin switches it on, and the node's end restores it.
	ipForward []byte
}

// StartNode starts a node for the test and removes all of it on t.Cleanup:
// Pods and their containers, sandboxes, network namespaces and mounts,
// containerd's state, the processes (containerd's shims too), the bridge
// and the DNAT rule. It skips (or fails, see RequiredEnv) when a binary is
// missing, the process is not root, or the node does not come up (bridge,
// rule, containerd, components, Ready within 3 minutes); it fails when an
// image does not import. It waits (up to 10 minutes) while another test on
// this machine has a node. It returns once the node is Ready.
func StartNode(t testing.TB, opt NodeOptions) *Node {
	t.Helper()
	RequireNode(t)
	nb, _ := findNodeBinaries()
	unlock, err := lockNode(nodeLockWait)
	if err != nil {
		t.Fatalf("k8stest: %v", err)
	}
	t.Cleanup(unlock)
	n := &Node{dir: t.TempDir(), bins: nb, procs: map[string]*proc{}, netnsBefore: netnsNames()}
	n.ipForward, _ = os.ReadFile(ipForwardPath)
	// A crashed run may have left the bridge or the rule: both are ours.
	n.removeNetwork()
	t.Cleanup(n.removeNetwork)
	if err := n.addBridge(); err != nil {
		cannotStart(t, fmt.Errorf("node bridge: %w", err), "")
	}
	n.Cluster = Start(t, Options{RBAC: true, BindAddress: NodeAddr, ServiceCIDR: NodeServiceCIDR})
	if err := n.run(n.bins.iptables, n.dnatArgs("-A")...); err != nil {
		cannotStart(t, fmt.Errorf("DNAT rule for the kubernetes Service: %w", err), "")
	}
	t.Cleanup(n.stopRuntime)
	if err := n.startContainerd(); err != nil {
		cannotStart(t, err, "")
	}
	for _, img := range append([]string{opt.Pause}, opt.Images...) {
		if err := n.Import(img); err != nil {
			t.Fatalf("k8stest: %v", err) // the archive's fault, not the machine's
		}
	}
	if err := n.writeKubeconfig(); err != nil {
		t.Fatalf("k8stest: %v", err)
	}
	t.Cleanup(n.stopComponents)
	if err := n.startComponents(); err != nil {
		cannotStart(t, err, "")
	}
	t.Cleanup(n.deletePods)
	if err := n.waitReady(3 * time.Minute); err != nil {
		cannotStart(t, err, "kubelet log:\n"+n.procTail("kubelet", 3000))
	}
	return n
}

// RequireNode skips t with one line (or fails it, see RequiredEnv) unless
// StartNode can run: root, and every program it starts installed.
func RequireNode(t testing.TB) {
	t.Helper()
	requireRoot(t)
	if _, err := findBinaries(); err != nil {
		unavailable(t, err.Error(), fixBinaries)
	}
	if _, err := findNodeBinaries(); err != nil {
		unavailable(t, err.Error(), fixBinaries)
	}
}

// ContainerLog returns what a container of Pod ns/pod wrote (all its
// restarts), read from the kubelet's Pod log directory; "" when none.
func (n *Node) ContainerLog(ns, pod, container string) string {
	files, _ := filepath.Glob(filepath.Join(n.dir, "pod-logs", ns+"_"+pod+"_*", container, "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		b.Write(data)
	}
	return b.String()
}

// cannotStart ends t when the node's programs are there but the node does
// not come up (a kernel or cgroup setup the kubelet refuses, say): it
// fails with err and detail when RequiredEnv is 1, else skips with one
// line naming err's first line.
func cannotStart(t testing.TB, err error, detail string) {
	t.Helper()
	if os.Getenv(RequiredEnv) == "1" {
		t.Fatalf("k8stest: the node cannot start: %v\n%s", err, detail)
	}
	first, _, _ := strings.Cut(err.Error(), "\n")
	t.Skipf("k8stest: skipped: the node cannot start: %s (%s=1 makes this fail)", first, RequiredEnv)
}

// lockNode takes the machine-wide node lock, waiting up to wait.
func lockNode(wait time.Duration) (func(), error) {
	f, err := os.OpenFile(nodeLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("node lock %s: %w", nodeLock, err)
	}
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("another test on this machine has held the node lock %s for %s: %v", nodeLock, wait, err)
		}
		time.Sleep(time.Second)
	}
}

// run runs a command, returning its output in the error.
func (n *Node) run(path string, args ...string) error {
	out, err := exec.Command(path, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", filepath.Base(path), strings.Join(args, " "), err, out)
	}
	return nil
}

// dnatArgs is the DNAT rule with op (-A, -C, -D).
func (n *Node) dnatArgs(op string) []string {
	port := 0
	if n.Cluster != nil {
		port = n.port
	}
	return []string{"-w", "-t", "nat", op, "PREROUTING", "-i", NodeBridge, "-d", NodeAPIServiceIP + "/32",
		"-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", net.JoinHostPort(NodeAddr, strconv.Itoa(port)),
		"-m", "comment", "--comment", "kvrouter-k8stest-node"}
}

// addBridge creates the bridge with the node's address, before
// kube-apiserver listens on it; the CNI bridge plugin adopts it.
func (n *Node) addBridge() error {
	for _, args := range [][]string{
		{"link", "add", NodeBridge, "type", "bridge"},
		{"addr", "add", NodeAddr + "/24", "dev", NodeBridge},
		{"link", "set", NodeBridge, "up"},
	} {
		if err := n.run("ip", args...); err != nil {
			return err
		}
	}
	return nil
}

// removeNetwork deletes the DNAT rules this package made (any port), the
// bridge, and the network namespaces made since the node started.
func (n *Node) removeNetwork() {
	if n.bins.iptables != "" {
		out, _ := exec.Command(n.bins.iptables, "-w", "-t", "nat", "-S", "PREROUTING").Output()
		for _, line := range strings.Split(string(out), "\n") {
			if !strings.Contains(line, "kvrouter-k8stest-node") || !strings.HasPrefix(line, "-A ") {
				continue
			}
			args := append([]string{"-w", "-t", "nat", "-D"}, splitRule(strings.TrimPrefix(line, "-A "))...)
			_ = exec.Command(n.bins.iptables, args...).Run()
		}
	}
	_ = exec.Command("ip", "link", "del", NodeBridge).Run()
	if len(n.ipForward) > 0 {
		_ = os.WriteFile(ipForwardPath, n.ipForward, 0o644)
	}
	for name := range netnsNames() {
		if !n.netnsBefore[name] && strings.HasPrefix(name, "cni-") {
			p := filepath.Join("/var/run/netns", name)
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
			_ = os.Remove(p)
		}
	}
}

const ipForwardPath = "/proc/sys/net/ipv4/ip_forward"

// splitRule splits an iptables -S line into arguments (its comment is
// quoted only when it has spaces, which ours has not).
func splitRule(s string) []string {
	f := strings.Fields(s)
	for i := range f {
		f[i] = strings.Trim(f[i], `"`)
	}
	return f
}

// netnsNames lists /var/run/netns.
func netnsNames() map[string]bool {
	m := map[string]bool{}
	ents, _ := os.ReadDir("/var/run/netns")
	for _, e := range ents {
		m[e.Name()] = true
	}
	return m
}

// start starts a node process and records it.
func (n *Node) start(name, path string, args ...string) (*proc, error) {
	p, err := startProc(name, filepath.Join(n.dir, name+".log"), path, args...)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.procs[name] = p
	n.mu.Unlock()
	return p, nil
}

func (n *Node) procTail(name string, max int) string {
	n.mu.Lock()
	p := n.procs[name]
	n.mu.Unlock()
	if p == nil {
		return "(not started)"
	}
	return p.tail(max)
}

// ProcLog returns the end of a node process's log ("kubelet",
// "containerd", "kube-scheduler", "kube-controller-manager"), for failure
// messages.
func (n *Node) ProcLog(name string) string { return n.procTail(name, 4000) }

// containerdConfig is containerd 1.6's configuration: its own root, state
// and socket under the node's directory, the CRI plugin with the local
// pause image, Debian's CNI plugin path and the node's CNI network.
const containerdConfig = `version = 2
root = "%[1]s/containerd/root"
state = "%[1]s/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "%[2]s"
[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "%[3]s"
  disable_apparmor = true
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "%[1]s/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "%[1]s/cni"
`

// cniConfig is the node's network: the bridge, host-local addresses.
const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "kvrnode",
  "plugins": [{
    "type": "bridge",
    "bridge": %q,
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "ranges": [[{"subnet": %q, "gateway": %q}]],
      "routes": [{"dst": "0.0.0.0/0"}],
      "dataDir": %q
    }
  }]
}
`

func (n *Node) startContainerd() error {
	for _, d := range []string{"containerd", "cni", "cni-ipam", "kubelet", "pod-logs"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return err
		}
	}
	n.sock = filepath.Join(n.dir, "containerd", "containerd.sock")
	cfg := filepath.Join(n.dir, "containerd", "config.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(containerdConfig, n.dir, n.sock, pauseRef)), 0o644); err != nil {
		return err
	}
	cni := fmt.Sprintf(cniConfig, NodeBridge, NodePodCIDR, NodeAddr, filepath.Join(n.dir, "cni-ipam"))
	if err := os.WriteFile(filepath.Join(n.dir, "cni", "10-kvrnode.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	p, err := n.start("containerd", n.bins.containerd, "--config", cfg)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("containerd %w: %v\n%s", errExited, p.err, p.tail(3000))
		}
		if exec.Command(n.bins.ctr, "-a", n.sock, "version").Run() == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("containerd not answering on %s after 60s:\n%s", n.sock, p.tail(3000))
}

// Ctr runs ctr against the node's containerd in namespace k8s.io and
// returns its output.
func (n *Node) Ctr(args ...string) (string, error) {
	out, err := exec.Command(n.bins.ctr, append([]string{"-a", n.sock, "-n", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Import imports an image archive into the node's containerd (ctr images
// import), as `ctr -n k8s.io images import FILE` does for a user.
func (n *Node) Import(archive string) error {
	_, err := n.Ctr("images", "import", archive)
	return err
}

func (n *Node) writeKubeconfig() error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: node
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: node
  context: {cluster: node, user: admin}
current-context: node
`, n.URL(), filepath.Join(n.Cluster.dir, "certs", "apiserver.crt"), n.token)
	return os.WriteFile(n.Kubeconfig(), []byte(kc), 0o600)
}

// Kubeconfig is the path of a kubeconfig for the administrator (kubectl,
// helm).
func (n *Node) Kubeconfig() string { return filepath.Join(n.dir, "kubeconfig") }

// kubeletConfig is a KubeletConfiguration for this machine: cgroupfs and
// cgroup v1 allowed (v1.37 refuses v1 unless failCgroupV1 is false), swap
// allowed, no anonymous access, no read-only port, eviction and image GC
// thresholds out of the way (a shared machine's disk must not evict the
// test's Pods or remove its imported images).
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
address: %[1]s
port: %[2]d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://%[3]s
podLogsDir: %[4]s
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
syncFrequency: 10s
nodeStatusUpdateFrequency: 2s
`

func (n *Node) startComponents() error {
	root := filepath.Join(n.dir, "kubelet")
	// The kubelet's directory is a shared mount, so the volume mounts it
	// makes reach the containers' mount namespaces.
	if err := syscall.Mount(root, root, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s: %w", root, err)
	}
	if err := syscall.Mount("", root, "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s rshared: %w", root, err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	cfg := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(kubeletConfig, NodeAddr, ports[0], n.sock, filepath.Join(n.dir, "pod-logs"))), 0o644); err != nil {
		return err
	}
	if _, err := n.start("kubelet", n.bins.kubelet, "--config", cfg, "--kubeconfig", n.Kubeconfig(),
		"--root-dir", root, "--hostname-override", NodeName, "--node-ip", NodeAddr, "--v", "1"); err != nil {
		return err
	}
	if _, err := n.start("kube-controller-manager", n.bins.controllerManager, "--kubeconfig", n.Kubeconfig(),
		"--authentication-kubeconfig", n.Kubeconfig(), "--authorization-kubeconfig", n.Kubeconfig(),
		"--root-ca-file", filepath.Join(n.Cluster.dir, "certs", "apiserver.crt"),
		"--service-account-private-key-file", filepath.Join(n.Cluster.dir, "sa.key"),
		"--controllers", "*,-nodeipam", "--leader-elect=false", "--use-service-account-credentials=false",
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(ports[1]),
		"--node-monitor-grace-period", "40s"); err != nil {
		return err
	}
	if _, err := n.start("kube-scheduler", n.bins.scheduler, "--kubeconfig", n.Kubeconfig(),
		"--authentication-kubeconfig", n.Kubeconfig(), "--authorization-kubeconfig", n.Kubeconfig(),
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(ports[2])); err != nil {
		return err
	}
	return nil
}

// waitReady waits for the node to be Ready and the default namespace's
// ServiceAccount (the controller manager's) to exist.
func (n *Node) waitReady(within time.Duration) error {
	cs, err := kubernetes.NewForConfig(n.Config())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	last := "no node object yet"
	for ctx.Err() == nil {
		for _, name := range []string{"kubelet", "kube-controller-manager", "kube-scheduler", "containerd"} {
			n.mu.Lock()
			p := n.procs[name]
			n.mu.Unlock()
			if p != nil && p.exited() {
				return fmt.Errorf("%s %w: %v\n%s", name, errExited, p.err, p.tail(3000))
			}
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err == nil {
			last = "node conditions:"
			ready := false
			for _, c := range node.Status.Conditions {
				last += fmt.Sprintf(" %s=%s (%s)", c.Type, c.Status, c.Message)
				ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
			}
			if ready {
				if _, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err == nil {
					return nil
				}
				last = "node Ready, no default ServiceAccount yet (kube-controller-manager)"
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("node %s not Ready after %s: %s", NodeName, within, last)
}

// deletePods deletes every Pod at once (no grace) while the kubelet still
// runs, and waits until containerd runs no task: the kubelet then has
// stopped every sandbox, which tears down its network (CNI DEL) and
// unmounts its volumes.
func (n *Node) deletePods() {
	cs, err := kubernetes.NewForConfig(n.Config())
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	zero := int64(0)
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return // kube-apiserver is down: stopRuntime removes the containers
	}
	for _, ns := range nss.Items {
		_ = cs.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		// Controllers would make new Pods: remove them first.
		_ = cs.AppsV1().Deployments(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		_ = cs.AppsV1().ReplicaSets(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		_ = cs.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	}
	for ctx.Err() == nil {
		out, err := n.Ctr("tasks", "ls", "-q")
		if err == nil && strings.TrimSpace(out) == "" {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// stopComponents stops the kubelet, scheduler and controller manager.
func (n *Node) stopComponents() {
	for _, name := range []string{"kube-scheduler", "kube-controller-manager", "kubelet"} {
		n.mu.Lock()
		p := n.procs[name]
		n.mu.Unlock()
		if p != nil {
			p.stop(stopGrace)
		}
	}
}

// stopRuntime removes what is left of the containers, stops containerd,
// kills its shims and unmounts everything under the node's directory.
func (n *Node) stopRuntime() {
	n.mu.Lock()
	p := n.procs["containerd"]
	n.mu.Unlock()
	if p != nil && !p.exited() {
		if out, err := n.Ctr("tasks", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				_, _ = n.Ctr("tasks", "kill", "-s", "SIGKILL", id)
				_, _ = n.Ctr("tasks", "delete", "-f", id)
			}
		}
		if out, err := n.Ctr("containers", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				_, _ = n.Ctr("containers", "delete", id)
			}
		}
		p.stop(stopGrace)
	}
	killShims(n.sock)
	unmountUnder(n.dir)
	removeCgroups()
}

// removeCgroups removes the kubelet's kubepods cgroups (cgroup v1: one
// tree per controller), deepest first; only empty ones can go.
func removeCgroups() {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods*")
	for _, root := range roots {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(dirs[i])
		}
	}
}

// killShims kills the containerd shims serving the socket sock (their
// command line names it) and waits briefly for them to go.
func killShims(sock string) {
	if sock == "" {
		return
	}
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") && strings.Contains(string(b), sock) {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// unmountUnder unmounts every mount point under dir, deepest first.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			points = append(points, fields[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}
