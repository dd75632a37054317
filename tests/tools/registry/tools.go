//go:build tools

// Package tools records the registry command, so go mod tidy keeps it.
package tools

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
