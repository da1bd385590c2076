// Package v20170312 declares the VPC route-table calls flannel's tencentvpc backend makes; each fails,
// because this build has no Tencent Cloud SDK (see ../../README.md).
package v20170312

import "github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/common/errors"

var errUnavailable = &errors.TencentCloudSDKError{
	Code:    "NotBuiltIn",
	Message: "this flanneld was built without the Tencent Cloud SDK (netcm test build); the tencent-vpc backend is unavailable",
}

// Client stands in for the VPC API client.
type Client struct{}

// NewClientWithSecretId returns a client whose every call fails.
func NewClientWithSecretId(secretID, secretKey, region string) (*Client, error) {
	return &Client{}, errUnavailable
}

// Filter selects route tables.
type Filter struct {
	Name   *string
	Values []*string
}

// Route is one route-table entry.
type Route struct {
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string
	RouteId              *uint64
	RouteType            *string
	Enabled              *bool
}

// RouteTable is a VPC route table.
type RouteTable struct {
	RouteTableId *string
	RouteSet     []*Route
}

// DescribeRouteTablesRequest lists route tables.
type DescribeRouteTablesRequest struct{ Filters []*Filter }

// DescribeRouteTablesResponse is never returned.
type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

// DeleteRoutesRequest deletes routes.
type DeleteRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

// DeleteRoutesResponse is never returned.
type DeleteRoutesResponse struct{}

// CreateRoutesRequest creates routes.
type CreateRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

// CreateRoutesResponse is never returned.
type CreateRoutesResponse struct{}

// NewDescribeRouteTablesRequest returns an empty request.
func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest { return &DescribeRouteTablesRequest{} }

// NewDeleteRoutesRequest returns an empty request.
func NewDeleteRoutesRequest() *DeleteRoutesRequest { return &DeleteRoutesRequest{} }

// NewCreateRoutesRequest returns an empty request.
func NewCreateRoutesRequest() *CreateRoutesRequest { return &CreateRoutesRequest{} }

// DescribeRouteTables fails.
func (c *Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, errUnavailable
}

// DeleteRoutes fails.
func (c *Client) DeleteRoutes(*DeleteRoutesRequest) (*DeleteRoutesResponse, error) {
	return nil, errUnavailable
}

// CreateRoutes fails.
func (c *Client) CreateRoutes(*CreateRoutesRequest) (*CreateRoutesResponse, error) {
	return nil, errUnavailable
}
