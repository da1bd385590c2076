// A stand-in for github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc; see ../README.md.
module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc

go 1.21

require github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/common v1.3.190
