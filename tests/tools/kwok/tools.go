//go:build tools

// Package tools records kwok, the scale benchmark's kubelet for Pods that run nothing. It is its
// own module so that kwok's Kubernetes libraries never move the pinned control plane's.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
