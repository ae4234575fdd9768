package discovery

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// trimPod keeps what fromPods and the annotations need of a Pod (its
// name, labels, annotations, deletion timestamp, container ports, IP,
// phase and conditions), so that a Pod informer over a large namespace
// caches a fraction of each object. Anything else passes unchanged (an
// informer's transform may see other types, e.g. tombstones).
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	t := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, Annotations: p.Annotations, DeletionTimestamp: p.DeletionTimestamp,
		},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, Conditions: p.Status.Conditions},
	}
	for _, c := range p.Spec.Containers {
		if len(c.Ports) > 0 {
			t.Spec.Containers = append(t.Spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	return t, nil
}
