//go:build tools

// Package tools pins the Kubernetes control plane that zerohop's Kubernetes tests run
// against: `cargo xtask kube` builds kube-apiserver from this module (see go.mod:
// k8s.io/kubernetes with each staging module replaced by its published version). kubectl
// stays pinned here, at the same version, for whoever wants it by hand (`go build
// k8s.io/kubernetes/cmd/kubectl` in this folder); the tests do not use it.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
