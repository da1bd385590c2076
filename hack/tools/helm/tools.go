//go:build tools

// Package tools pins the helm command that hack/verify-chart.sh builds.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
