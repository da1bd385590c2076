//go:build tools

// Package tools pins flanneld, which hack/controlplane.sh builds for the e2e tests that run netcm beside
// real flannel agents.
package tools

import (
	_ "github.com/flannel-io/flannel"
)
