// Command flannel-install is the init container of the flannel DaemonSet (e2e/testdata/flannel): it puts
// flannel's CNI plugin and its conflist where the node's container runtime looks for them, as upstream's
// install-cni containers do with busybox's cp, but without a shell in the image.
//
//	flannel-install PLUGIN BIN_DIR TEMPLATE CONF_FILE NODE_DIR
//
// copies PLUGIN into BIN_DIR/flannel and writes TEMPLATE to CONF_FILE with every "__NODE_DIR__" replaced
// by NODE_DIR. The placeholder exists because several nodes of hack/cluster.sh share one filesystem: each
// node's subnet.env and CNI data live under its own directory, which the conflist must name as the host
// sees it. Both files are written to a temporary name and renamed, so a runtime never reads half of one
// and a plugin binary that is running is replaced, not rewritten ("text file busy").
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: flannel-install PLUGIN BIN_DIR TEMPLATE CONF_FILE NODE_DIR")
		os.Exit(2)
	}
	plugin, binDir, template, confFile, nodeDir := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5]
	bin, err := os.ReadFile(plugin)
	check(err)
	check(writeAtomic(filepath.Join(binDir, "flannel"), bin, 0o755))
	conf, err := os.ReadFile(template)
	check(err)
	check(writeAtomic(confFile, []byte(Render(string(conf), nodeDir)), 0o644))
	fmt.Printf("installed %s/flannel and %s\n", binDir, confFile)
}

// Render fills the conflist template for the node whose directory (as the host sees it) is nodeDir.
func Render(template, nodeDir string) string {
	return strings.ReplaceAll(template, "__NODE_DIR__", strings.TrimRight(nodeDir, "/"))
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "flannel-install:", err)
		os.Exit(1)
	}
}
