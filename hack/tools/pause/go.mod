module netcm.local/hack/tools/pause

go 1.26.0
