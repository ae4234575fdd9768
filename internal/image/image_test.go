package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readTar returns the regular files of a tar by name.
func readTar(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		}
	}
}

// The archive is an OCI layout whose blobs match their digests, with the
// names ctr, docker and skopeo read, and a layer holding the binary.
func TestWriteArchive(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "prog")
	content := []byte("\x7fELF not really a binary")
	if err := os.WriteFile(bin, content, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Binary: bin, Path: "/usr/local/bin/kvrouter", Ref: "kvrouter:0.1.0", Cmd: []string{"serve"}, ExposedPorts: []string{"8080/tcp"}, Arch: "amd64"}
	var a, b bytes.Buffer
	if err := Write(&a, spec); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, spec); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two archives of the same binary differ")
	}
	files := readTar(t, &a)
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Fatalf("oci-layout %q", files["oci-layout"])
	}
	for name, data := range files {
		if hexd, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			sum := sha256.Sum256(data)
			if hex.EncodeToString(sum[:]) != hexd {
				t.Fatalf("blob %s has digest %x", name, sum)
			}
		}
	}
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Platform    map[string]string `json:"platform"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", files["index.json"], err)
	}
	m := index.Manifests[0]
	if m.Annotations["io.containerd.image.name"] != "docker.io/library/kvrouter:0.1.0" || m.Annotations["org.opencontainers.image.ref.name"] != "0.1.0" || m.Platform["architecture"] != "amd64" {
		t.Fatalf("index entry %+v", m)
	}
	var manifest struct {
		MediaType string                  `json:"mediaType"`
		Config    struct{ Digest string } `json:"config"`
		Layers    []struct {
			MediaType, Digest string
		} `json:"layers"`
	}
	if err := json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(m.Digest, "sha256:")], &manifest); err != nil {
		t.Fatal(err)
	}
	if manifest.MediaType != "application/vnd.oci.image.manifest.v1+json" || len(manifest.Layers) != 1 || manifest.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
		t.Fatalf("manifest %+v", manifest)
	}
	var config struct {
		Architecture, OS string
		Config           struct {
			Entrypoint, Cmd []string
			User            string
			ExposedPorts    map[string]struct{}
		} `json:"config"`
	}
	if err := json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(manifest.Config.Digest, "sha256:")], &config); err != nil {
		t.Fatal(err)
	}
	if config.OS != "linux" || config.Architecture != "amd64" || strings.Join(config.Config.Entrypoint, " ") != "/usr/local/bin/kvrouter" ||
		strings.Join(config.Config.Cmd, " ") != "serve" || config.Config.User != "65532:65532" {
		t.Fatalf("config %+v", config)
	}
	if _, ok := config.Config.ExposedPorts["8080/tcp"]; !ok {
		t.Fatalf("exposed ports %v", config.Config.ExposedPorts)
	}
	zr, err := gzip.NewReader(bytes.NewReader(files["blobs/sha256/"+strings.TrimPrefix(manifest.Layers[0].Digest, "sha256:")]))
	if err != nil {
		t.Fatal(err)
	}
	layer := readTar(t, zr)
	if !bytes.Equal(layer["usr/local/bin/kvrouter"], content) || !strings.Contains(string(layer["etc/passwd"]), "nonroot:x:65532:65532:") {
		t.Fatalf("layer files %v", keys(layer))
	}
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &docker); err != nil || len(docker) != 1 || docker[0].RepoTags[0] != "kvrouter:0.1.0" ||
		files[docker[0].Config] == nil || files[docker[0].Layers[0]] == nil {
		t.Fatalf("manifest.json %s: %v", files["manifest.json"], err)
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Bad specs are refused with the part named.
func TestWriteErrors(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{Binary: "/nonexistent", Path: "/x", Ref: "a:b"}, "image: binary"},
		{Spec{Binary: "/dev/null", Path: "/x", Ref: "nameonly"}, "want NAME:TAG"},
		{Spec{Binary: "/dev/null", Path: "/x", Ref: "host:5000/name"}, "want NAME:TAG"},
		{Spec{Binary: "/dev/null", Path: "x", Ref: "a:b"}, "absolute path"},
	} {
		err := Write(io.Discard, tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.spec, err, tc.want)
		}
	}
	if fullName("registry.example:5000/team/kvrouter") != "registry.example:5000/team/kvrouter" || fullName("team/kvrouter") != "docker.io/team/kvrouter" {
		t.Error("fullName")
	}
}
