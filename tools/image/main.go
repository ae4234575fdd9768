// Command image writes an OCI image archive of one static binary without a
// container daemon (internal/image); `make image` runs it for kvrouter.
//
//	go run ./tools/image -binary bin/kvrouter-linux -path /usr/local/bin/kvrouter \
//	    -ref kvrouter:0.1.0 -o bin/kvrouter-0.1.0.oci.tar -port 8080/tcp \
//	    -cmd serve,--listen,:8080,--config,/etc/kvrouter/router.yaml
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"kvrouter/internal/image"
)

func main() {
	var (
		s     image.Spec
		out   = flag.String("o", "", "archive to write (required)")
		cmd   = flag.String("cmd", "", "the image's Cmd, comma-separated")
		ports = flag.String("port", "", "exposed ports, comma-separated, e.g. 8080/tcp")
		ver   = flag.String("version", "", "org.opencontainers.image.version label")
	)
	flag.StringVar(&s.Binary, "binary", "", "static binary to put in the image (required)")
	flag.StringVar(&s.Path, "path", "/usr/local/bin/kvrouter", "the binary's path in the image (the entrypoint)")
	flag.StringVar(&s.Ref, "ref", "", "image name NAME:TAG (required)")
	flag.StringVar(&s.User, "user", "65532:65532", "UID:GID the image runs as")
	flag.StringVar(&s.CACerts, "ca-certs", "", "PEM bundle copied to /etc/ssl/certs/ca-certificates.crt")
	flag.StringVar(&s.Arch, "arch", "", "image architecture (default this machine's)")
	flag.Parse()
	if *out == "" || s.Binary == "" || s.Ref == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: image -binary FILE -ref NAME:TAG -o ARCHIVE [-path P] [-cmd A,B] [-port 8080/tcp] [-user UID:GID] [-ca-certs PEM]")
		os.Exit(2)
	}
	if *cmd != "" {
		s.Cmd = strings.Split(*cmd, ",")
	}
	if *ports != "" {
		s.ExposedPorts = strings.Split(*ports, ",")
	}
	if *ver != "" {
		s.Labels = map[string]string{"org.opencontainers.image.version": *ver}
	}
	if err := image.WriteFile(*out, s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
