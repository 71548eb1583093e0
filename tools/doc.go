// Package tools pins the build tools muster's packaging scripts run with
// `go tool` (nfpm for the Debian package, govulncheck for scripts/vulncheck). They live in their own module so
// that their many dependencies stay out of muster's go.mod and binary.
package tools
