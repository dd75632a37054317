//go:build tools

// Package tools records KEDA's operator and metrics API server, built by tests/tools/build.sh from
// their own module so KEDA's dependency versions never move the pinned Kubernetes tools.
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)
