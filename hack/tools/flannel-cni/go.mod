module netcm.local/hack/tools/flannel-cni

go 1.26.0

require github.com/containernetworking/cni v1.3.0

require (
	github.com/vishvananda/netns v0.0.4 // indirect
	golang.org/x/sys v0.23.0 // indirect
)
