// Package layering holds the test that keeps muster's layers apart: domain
// packages know nothing of RPC, HTTP or SQL, so every rule they hold can be
// tested without a transport or a database, and the service layer stays
// the one place that maps errors to status codes.
package layering

import (
	"os/exec"
	"strings"
	"testing"
)

// domain packages, and the identity helpers they build on.
var domain = []string{
	"atomicfile", "audit", "boundkeypair", "ca", "crl", "custody", "discovery", "enroll", "identity", "jointoken", "joinuri", "pagetoken", "psk", "ratelimit",
	"referral", "seal", "signer", "spiffeid", "store", "task", "trustbundle",
}

// forbidden import path prefixes for domain packages.
var forbidden = []string{
	"database/sql",
	"net/http",
	"google.golang.org/grpc",
	"connectrpc.com",
	"github.com/jackc/pgx",
	"modernc.org/sqlite",
	"github.com/muster-dev/muster/proto",
	"github.com/muster-dev/muster/internal/authority",
	"github.com/muster-dev/muster/internal/cli",
	"github.com/muster-dev/muster/internal/store/",
}

// allowed are dependencies under a forbidden prefix that reach neither a
// database nor the network.
var allowed = map[string]bool{
	// Interfaces only; google/uuid imports it to implement Scanner and
	// Valuer on its UUID type.
	"database/sql/driver": true,
}

func TestDomainPackagesStayFreeOfTransportAndSQL(t *testing.T) {
	for _, pkg := range domain {
		t.Run(pkg, func(t *testing.T) {
			path := "github.com/muster-dev/muster/internal/" + pkg
			out, err := exec.Command("go", "list", "-deps", path).CombinedOutput()
			if err != nil {
				t.Fatalf("go list %s: %v\n%s", path, err, out)
			}
			for _, dep := range strings.Fields(string(out)) {
				if allowed[dep] {
					continue
				}
				for _, f := range forbidden {
					if strings.HasPrefix(dep, f) {
						t.Errorf("%s depends on %s", path, dep)
					}
				}
			}
		})
	}
}
