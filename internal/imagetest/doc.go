// Package imagetest checks the floodgate container image: its test runs
// the image that scripts/image built, with runc on a bundle made from it,
// and checks what a Kubernetes user relies on (the endpoints on the
// embedded store and on Redis, a non-root user, a read-only root, a quick
// stop on SIGTERM, the size).
//
// The test runs only with FLOODGATE_IMAGE_TEST=1 (scripts/test sets it
// after building the image); FLOODGATE_IMAGE names the image, by default
// localhost/floodgate:dev. It needs buildah and runc, and root.
package imagetest
