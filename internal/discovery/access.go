package discovery

import (
	"context"
	"errors"
	"fmt"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// access is one API call discovery makes: verb on resource (of group) in
// the source's namespace, on object name when set.
type access struct {
	group, resource, verb, name string
}

func (a access) String() string {
	r := a.resource
	if a.group != "" {
		r += "." + a.group
	}
	if a.name != "" {
		r += " " + a.name
	}
	return a.verb + " " + r
}

// calls lists what Run will call: list and watch on EndpointSlices (with
// a Service) and on Pods (with annotations or a selector), and get on the
// defaults' API-key Secret. Secrets named only by annotations are known
// later; their first read is checked as it happens.
func (s *Source) calls() []access {
	var out []access
	if s.cfg.Service != "" {
		out = append(out, access{"discovery.k8s.io", "endpointslices", "list", ""}, access{"discovery.k8s.io", "endpointslices", "watch", ""})
	}
	if s.cfg.PodAnnotations {
		out = append(out, access{"", "pods", "list", ""}, access{"", "pods", "watch", ""})
	}
	if ref := s.cfg.Defaults.APIKeySecret; ref.Name != "" {
		out = append(out, access{"", "secrets", "get", ref.Name})
	}
	return out
}

// checkAccess asks the API server (SelfSubjectAccessReview, which every
// authenticated user may create) whether this client may make each call
// Run will make, and returns one error naming every call denied. A review
// that cannot be made (an old or locked-down API server) is no answer and
// is logged; the informers then find out for themselves. Without this
// check a Role lacking watch is found only by the watch that follows the
// first list, which races with the sync: after it, the error is only
// logged and retried, and discovery keeps the first list without seeing
// a change. The check is deterministic and names every missing call.
func (s *Source) checkAccess(ctx context.Context) error {
	var denied []string
	for _, a := range s.calls() {
		r, err := s.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: s.cfg.Namespace, Group: a.group, Resource: a.resource, Verb: a.verb, Name: a.name,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Info("discovery: cannot review its own access, going on", "call", a.String(), "err", err)
			continue
		}
		if !r.Status.Allowed || r.Status.Denied {
			msg := a.String()
			if r.Status.Reason != "" {
				msg += " (" + r.Status.Reason + ")"
			}
			denied = append(denied, msg)
		}
	}
	if len(denied) == 0 {
		return nil
	}
	return fmt.Errorf("discovery: %w in namespace %s: %s (the Role needs: %s; docs/kubernetes.md RBAC)",
		ErrForbidden, s.cfg.Namespace, strings.Join(denied, ", "), s.needed())
}

// ErrForbidden is wrapped by Run's error when the API server's
// authorization (RBAC) refuses a call discovery needs.
var ErrForbidden = errors.New("not allowed")

// needed renders calls() for an error message.
func (s *Source) needed() string {
	var w []string
	for _, a := range s.calls() {
		w = append(w, a.String())
	}
	return strings.Join(w, ", ")
}
