// Package k8stest runs a real Kubernetes control plane and real engine
// hosts for tests; only test code imports it.
//
// Start runs etcd and kube-apiserver (KubeVersion) on free loopback ports in
// a temporary directory, with static token authentication and either
// AlwaysAllow or RBAC authorization, waits for /readyz and hands out
// rest.Configs: Config for an administrator (group system:masters, allowed
// everything in either mode) and ServiceAccountConfig for a ServiceAccount
// token from the TokenRequest API. StopAPIServer and StartAPIServer restart
// kube-apiserver on the same port over the same etcd; EtcdDelete deletes a
// key behind its back. Everything stops and is removed on t.Cleanup.
//
// NewNetNS makes a network namespace joined to the root namespace by a veth
// pair on a subnet of its own, 10.213.X.0/24 (host side .1, namespace side
// .2), so that an engine can listen on an address Kubernetes accepts in an
// EndpointSlice (it refuses loopback). Listen opens a socket inside it from
// this process; Command runs a program inside it (ip netns exec). The
// namespace and its links are deleted on t.Cleanup.
//
// StartNode adds kube-controller-manager, kube-scheduler and a kubelet with
// its own containerd (runc, the CNI bridge plugin on 10.214.0.0/24, a DNAT
// rule for the kubernetes Service) to such a control plane, so that Pods
// of imported images run; one node at a time per machine.
//
// The binaries come from tools/k8s-testenv/setup.sh (make k8s-testenv):
// etcd from PATH (Debian's etcd-server) or $KVROUTER_ETCD, kube-apiserver
// from $KVROUTER_KUBE_APISERVER or the cache the script fills,
// ${KVROUTER_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvrouter/k8s}/<version>/.
// A test whose binaries are missing, or that needs root for network
// namespaces and is not root, is skipped with one line; with
// KVROUTER_K8S_REQUIRED=1 it fails instead.
//
// Helpers start their processes from the calling goroutine and own them;
// a Cluster's methods are safe for concurrent use.
package k8stest
