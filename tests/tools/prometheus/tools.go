//go:build tools

// Package tools records the Prometheus built for the real node's tests, whose Kubernetes service
// discovery finds the worker Pods (Debian's Prometheus is built without it).
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
)
