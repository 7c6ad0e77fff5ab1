//go:build tools

// Package tools pins the Kubernetes control plane that zerohop's Kubernetes tests run
// against: `cargo xtask kube` builds kube-apiserver and kubectl from this module (see
// go.mod: k8s.io/kubernetes with each staging module replaced by its published version).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
