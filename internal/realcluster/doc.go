// Package realcluster holds only a test: the project's chart and image on a
// real single-node Kubernetes cluster (internal/k8stest StartNode: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, a kubelet with
// containerd, runc and the CNI bridge plugin). It builds the kvrouter image
// as `make image` does, imports it, runs engine-sims as Pods and installs
// the chart with helm, then checks serving, affinity, scaling, Pod deletion
// under load, a rolling update of the routers and an API-server restart
// through the Pods' own addresses.
//
// It is a package of its own so that `go test ./...` runs it beside the
// others; it skips with one line (fails with KVROUTER_K8S_REQUIRED=1) when
// the node's programs are missing or the process is not root.
package realcluster
