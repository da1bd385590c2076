//go:build tools

// Package tools pins the Helm 4 command that hack/verify-chart.sh installs and upgrades the chart with,
// beside Helm 3.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
