package cli

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A call that reaches a gRPC server other than the one wanted says so,
// not "UNIMPLEMENTED: unknown service".
func TestDescribeUnknownService(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.Unimplemented, "unknown service muster.v1.BootstrapService"), "is not a muster authority: it does not serve muster.v1.BootstrapService"},
		{fmt.Errorf("status: %w", status.Error(codes.Unimplemented, "unknown service muster.v1.AdminService")), "is not a muster authority's API address"},
		{status.Error(codes.Unimplemented, "unknown service muster.v1.DiscoveryService"), "is not a muster discovery service"},
		{status.Error(codes.Unimplemented, "unknown method Foo for service muster.v1.AdminService"), "UNIMPLEMENTED: unknown method Foo"},
	} {
		got := describe(c.err)
		if !strings.Contains(got, c.want) {
			t.Errorf("describe(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
