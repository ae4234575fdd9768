package discovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvrouter/internal/config"
)

// secretTimeout bounds one Secret read.
const secretTimeout = 10 * time.Second

// secretEntry is the last read of one Secret key.
type secretEntry struct {
	key  string    // the API key; "" when never read successfully
	read time.Time // when it was last read (successfully or not)
}

// secrets reads the API keys that engines' config.EngineSettings.APIKeySecret name,
// with a get on each Secret (RBAC get secrets, one namespace). Only the
// Source's Run goroutine uses it.
type secrets struct {
	s     *Source
	cache map[config.SecretRef]*secretEntry
	now   func() time.Time
}

// errSecretRefused is returned (wrapped) when the first read of a Secret
// is forbidden or unauthorized before the first snapshot.
var errSecretRefused = errors.New("api key secret refused")

// resolve fills each engine's APIKey from its Secret, reading a reference
// seen for the first time at once and the others again when older than
// config.Discovery.SecretRefresh. A read that fails keeps the key read before; an
// engine whose key was never read is left out (logged once, counted). In
// the first snapshot (first true) a read refused as forbidden or
// unauthorized is returned as an error instead, as an informer's list is.
func (c *secrets) resolve(ctx context.Context, engines []Engine, first bool) ([]Engine, error) {
	used := map[config.SecretRef]bool{}
	out := engines[:0:0]
	for _, e := range engines {
		ref := e.Settings.APIKeySecret
		if ref.Name == "" {
			out = append(out, e)
			continue
		}
		used[ref] = true
		ent := c.cache[ref]
		if ent == nil || c.now().Sub(ent.read) >= c.s.cfg.SecretRefresh {
			if ent == nil {
				ent = &secretEntry{}
				c.cache[ref] = ent
			}
			key, err := c.read(ctx, ref)
			ent.read = c.now()
			switch {
			case err == nil:
				if ent.key != "" && ent.key != key {
					c.s.log.Info("engine API key changed", "secret", ref.Name, "key", ref.Key)
				}
				ent.key = key
			case first && (apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)):
				return nil, fmt.Errorf("discovery: %w: engine %s (%s %s/%s) in namespace %s: %w",
					errSecretRefused, e.Name, AnnotationAPIKeySecret, ref.Name, ref.Key, c.s.cfg.Namespace, err)
			default:
				c.s.m.secretErrors.Inc()
				c.s.log.Warn("discovery: cannot read an engine's API key", "engine", e.Name, "secret", ref.Name, "key", ref.Key,
					"kept_previous", ent.key != "", "err", err)
			}
		}
		if ent.key == "" {
			c.s.skipped("engine "+e.Name, "its API key "+ref.Name+"/"+ref.Key+" could not be read")
			continue
		}
		e.APIKey = ent.key
		out = append(out, e)
	}
	for ref := range c.cache {
		if !used[ref] {
			delete(c.cache, ref)
		}
	}
	return out, nil
}

// read gets one key of one Secret: its value with surrounding white space
// (a file's trailing newline) trimmed; missing or empty is an error.
func (c *secrets) read(ctx context.Context, ref config.SecretRef) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, secretTimeout)
	defer cancel()
	sec, err := c.s.client.CoreV1().Secrets(c.s.cfg.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	v, ok := sec.Data[ref.Key]
	if !ok {
		return "", fmt.Errorf("secret %s has no key %q", ref.Name, ref.Key)
	}
	key := strings.TrimSpace(string(v))
	if key == "" {
		return "", fmt.Errorf("secret %s key %q is empty", ref.Name, ref.Key)
	}
	return key, nil
}

// inUse reports whether any Secret is referenced (Run then rebuilds every
// SecretRefresh to follow rotated keys).
func (c *secrets) inUse() bool { return len(c.cache) > 0 }
