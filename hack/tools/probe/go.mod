module netcm.local/hack/tools/probe

go 1.26.0
