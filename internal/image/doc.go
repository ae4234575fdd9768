// Package image writes an OCI image archive holding one static binary, built
// without a container daemon: a single layer (the binary, /etc/passwd and
// /etc/group naming the non-root user, an empty /tmp, optional CA
// certificates) on an empty base, with the entrypoint, user and ports set.
//
// The archive is a tar of an OCI image layout (oci-layout, index.json,
// blobs/sha256/...) that also carries Docker's manifest.json, the same shape
// `docker save` writes since Docker 25, so one file loads with `ctr import`,
// `docker load`, `podman load` and `skopeo copy oci-archive:FILE ...`.
// Entries carry a fixed time and owner, so the same binary gives the same
// image digest.
//
// Nothing here starts goroutines or keeps state between calls.
package image
