// Package errors declares the SDK error type flannel's tencentvpc backend checks for; see ../../README.md.
package errors

// TencentCloudSDKError is the error every call of the stand-in SDK returns.
type TencentCloudSDKError struct {
	Code    string
	Message string
}

func (e *TencentCloudSDKError) Error() string { return e.Code + ": " + e.Message }
