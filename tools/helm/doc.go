// Package helm pins helm, which scripts/check-helm builds from the module
// proxy, in a module of its own: its Kubernetes dependencies would
// otherwise move the versions nfpm and go-containerregistry use.
package helm
