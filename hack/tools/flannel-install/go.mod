module netcm.local/hack/tools/flannel-install

go 1.26.0
