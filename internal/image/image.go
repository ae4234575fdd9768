package image

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Spec describes a one-binary image.
type Spec struct {
	// Binary is the path of the (static) binary on this machine.
	Binary string
	// Path is where the binary goes in the image, e.g. /usr/local/bin/kvrouter.
	Path string
	// Entrypoint and Cmd are the image config's; Entrypoint defaults to [Path].
	Entrypoint []string
	Cmd        []string
	// User is "UID:GID"; default "65532:65532" (named nonroot in /etc/passwd).
	User string
	// ExposedPorts are e.g. "8080/tcp".
	ExposedPorts []string
	// Ref names the image, "NAME:TAG" (e.g. kvrouter:0.1.0); required. It is
	// written as index.json's io.containerd.image.name (the full reference,
	// docker.io/library/ added to a bare name as Docker does) and
	// org.opencontainers.image.ref.name (the tag), and as manifest.json's
	// RepoTags.
	Ref string
	// CACerts, when set, is a PEM bundle copied to /etc/ssl/certs/ca-certificates.crt.
	CACerts string
	// Arch is the image's architecture; default runtime.GOARCH (the binary's
	// own must match it).
	Arch string
	// Created is the config's creation time; zero means the Unix epoch, so
	// the digest depends on the content only.
	Created time.Time
	// Labels are the config's labels (e.g. org.opencontainers.image.version).
	Labels map[string]string
}

// epoch is the time of every tar entry: a fixed time keeps digests stable.
var epoch = time.Unix(0, 0).UTC()

// Write writes the archive of s to w. Errors name the part that failed
// (reading the binary, a bad Ref, ...).
func Write(w io.Writer, s Spec) error {
	name, tag, err := splitRef(s.Ref)
	if err != nil {
		return err
	}
	img, err := build(s)
	if err != nil {
		return err
	}
	return writeArchive(w, img, name, tag)
}

// WriteFile writes the archive of s to file (replaced atomically).
func WriteFile(file string, s Spec) error {
	tmp := file + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := Write(f, s); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, file)
}

// splitRef splits "NAME:TAG" (NAME may hold a registry with a port).
func splitRef(ref string) (name, tag string, err error) {
	i := strings.LastIndexByte(ref, ':')
	if i <= 0 || i == len(ref)-1 || strings.Contains(ref[i:], "/") {
		return "", "", fmt.Errorf("image: reference %q: want NAME:TAG", ref)
	}
	return ref[:i], ref[i+1:], nil
}

// fullName adds Docker's implied docker.io/library/ to a bare name.
func fullName(name string) string {
	first, _, hasSlash := strings.Cut(name, "/")
	switch {
	case !hasSlash:
		return "docker.io/library/" + name
	case strings.ContainsAny(first, ".:") || first == "localhost":
		return name
	default:
		return "docker.io/" + name
	}
}

// build makes the image: the layer on an empty base, OCI media types.
func build(s Spec) (v1.Image, error) {
	if s.Path == "" || !path.IsAbs(s.Path) {
		return nil, fmt.Errorf("image: path in the image %q: want an absolute path", s.Path)
	}
	layerTar, err := layerContent(s)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer})
	if err != nil {
		return nil, fmt.Errorf("image: append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = s.Arch
	if cf.Architecture == "" {
		cf.Architecture = runtime.GOARCH
	}
	created := s.Created
	if created.IsZero() {
		created = epoch
	}
	cf.Created = v1.Time{Time: created}
	cf.Config.Entrypoint = s.Entrypoint
	if len(cf.Config.Entrypoint) == 0 {
		cf.Config.Entrypoint = []string{s.Path}
	}
	cf.Config.Cmd = s.Cmd
	cf.Config.User = s.User
	if cf.Config.User == "" {
		cf.Config.User = "65532:65532"
	}
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	if s.CACerts != "" {
		cf.Config.Env = append(cf.Config.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt")
	}
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = s.Labels
	if len(s.ExposedPorts) > 0 {
		cf.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range s.ExposedPorts {
			cf.Config.ExposedPorts[p] = struct{}{}
		}
	}
	return mutate.ConfigFile(img, cf)
}

// layerContent is the uncompressed layer: directories, the binary,
// passwd/group, CA certificates.
func layerContent(s Spec) ([]byte, error) {
	bin, err := os.ReadFile(s.Binary)
	if err != nil {
		return nil, fmt.Errorf("image: binary: %w", err)
	}
	var certs []byte
	if s.CACerts != "" {
		if certs, err = os.ReadFile(s.CACerts); err != nil {
			return nil, fmt.Errorf("image: CA certificates: %w", err)
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	var addDirs func(p string) error
	addDirs = func(p string) error {
		if p == "/" || p == "." || dirs[p] {
			return nil
		}
		if err := addDirs(path.Dir(p)); err != nil {
			return err
		}
		dirs[p] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(p, "/") + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
	}
	addFile := func(p string, mode int64, content []byte) error {
		if err := addDirs(path.Dir(p)); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: mode, Size: int64(len(content)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(content)
		return err
	}
	uid, gid, _ := strings.Cut(s.User, ":")
	if s.User == "" {
		uid, gid = "65532", "65532"
	}
	if gid == "" {
		gid = uid
	}
	passwd := "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:" + uid + ":" + gid + ":nonroot:/home/nonroot:/sbin/nologin\n"
	group := "root:x:0:\nnonroot:x:" + gid + ":\n"
	errs := []error{
		addFile("/etc/passwd", 0o644, []byte(passwd)),
		addFile("/etc/group", 0o644, []byte(group)),
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: epoch, Format: tar.FormatPAX}),
		addFile(s.Path, 0o755, bin),
	}
	if certs != nil {
		errs = append(errs, addFile("/etc/ssl/certs/ca-certificates.crt", 0o644, certs))
	}
	errs = append(errs, tw.Close())
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	return buf.Bytes(), nil
}

// writeArchive writes the OCI layout and Docker's manifest.json as one tar.
func writeArchive(w io.Writer, img v1.Image, name, tag string) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	arch := cf.Architecture
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	mdigest, err := img.Digest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cdigest, err := img.ConfigName()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	put := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	var layerPaths []string
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("image: compress layer: %w", err)
		}
		if err := put(blob(d), b); err != nil {
			return err
		}
		layerPaths = append(layerPaths, blob(d))
	}
	if err := put(blob(cdigest), config); err != nil {
		return err
	}
	if err := put(blob(mdigest), manifest); err != nil {
		return err
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     types.OCIImageIndex,
		"manifests": []map[string]any{{
			"mediaType": types.OCIManifestSchema1,
			"digest":    mdigest.String(),
			"size":      len(manifest),
			"platform":  map[string]string{"architecture": arch, "os": "linux"},
			"annotations": map[string]string{
				"io.containerd.image.name":          fullName(name) + ":" + tag,
				"org.opencontainers.image.ref.name": tag,
			},
		}},
	})
	if err != nil {
		return err
	}
	dockerManifest, err := json.Marshal([]map[string]any{{
		"Config":   blob(cdigest),
		"RepoTags": []string{name + ":" + tag},
		"Layers":   layerPaths,
	}})
	if err != nil {
		return err
	}
	return errors.Join(
		put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)),
		put("index.json", index),
		put("manifest.json", dockerManifest),
		tw.Close(),
	)
}
