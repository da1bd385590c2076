// A stand-in for github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/common; see ../README.md.
module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/common

go 1.21
