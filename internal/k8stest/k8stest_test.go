package k8stest

import (
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestNetNS serves HTTP inside a namespace and reaches it from the root
// namespace at Addr; Command runs inside it; cleanup deletes it.
func TestNetNS(t *testing.T) {
	var name string
	t.Run("serve", func(t *testing.T) {
		n := NewNetNS(t)
		name = n.Name
		ln, err := n.Listen(0)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "inside "+r.Host)
		})}
		go srv.Serve(ln)
		defer srv.Close()
		port := ln.Addr().(*net.TCPAddr).Port
		url := "http://" + n.Addr.String() + ":" + strconv.Itoa(port) + "/"
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := "inside " + n.Addr.String(); !strings.HasPrefix(string(body), want) {
			t.Fatalf("GET %s = %q, want prefix %q", url, body, want)
		}
		// The address is the namespace's, not the root namespace's.
		out, err := exec.Command("ip", "-4", "-o", "addr", "show").Output()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), " "+n.Addr.String()+"/") {
			t.Fatalf("%s is on a root-namespace interface:\n%s", n.Addr, out)
		}
		out, err = n.Command(context.Background(), "ip", "-4", "-o", "addr", "show").Output()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), " "+n.Addr.String()+"/24") {
			t.Fatalf("ip addr inside %s lacks %s:\n%s", n.Name, n.Addr, out)
		}
	})
	if name == "" {
		return // skipped
	}
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == name {
			t.Fatalf("namespace %s survived its test:\n%s", name, out)
		}
	}
	if err := exec.Command("ip", "link", "show", name+"h").Run(); err == nil {
		t.Fatalf("link %sh survived its test", name)
	}
}

// TestNetNSDistinct gives parallel namespaces distinct names and subnets.
func TestNetNSDistinct(t *testing.T) {
	a, b := NewNetNS(t), NewNetNS(t)
	if a.Name == b.Name || a.Addr == b.Addr {
		t.Fatalf("two namespaces share %s/%s and %s/%s", a.Name, a.Addr, b.Name, b.Addr)
	}
}

// TestCluster starts a control plane in RBAC mode: the administrator may
// do anything, a fresh ServiceAccount nothing; kube-apiserver restarts
// over the same etcd and port; EtcdDelete removes an object behind its back.
func TestCluster(t *testing.T) {
	c := Start(t, Options{RBAC: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(c.Config())
	sa, err := c.ServiceAccountConfig(ctx, "k8stest", "nobody")
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "k8stest"}}
	if _, err := admin.CoreV1().ConfigMaps("k8stest").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = kubernetes.NewForConfigOrDie(sa).CoreV1().ConfigMaps("k8stest").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("ServiceAccount without a Role listed configmaps: err = %v, want forbidden", err)
	}

	c.StopAPIServer()
	if _, err := admin.CoreV1().ConfigMaps("k8stest").Get(ctx, "cm", metav1.GetOptions{}); err == nil {
		t.Fatal("Get succeeded with kube-apiserver stopped")
	}
	if n, err := c.EtcdDelete(ctx, "/registry/configmaps/k8stest/cm"); err != nil || n != 1 {
		t.Fatalf("EtcdDelete = %d, %v; want 1 key", n, err)
	}
	if err := c.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	_, err = admin.CoreV1().ConfigMaps("k8stest").Get(ctx, "cm", metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("configmap deleted in etcd: Get after restart err = %v, want not found", err)
	}
}
