package discoveryd

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/store"
)

// rawCodec sends a []byte as the request body as it is, so a test can send
// what no protobuf encoder would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (rawCodec) Unmarshal([]byte, any) error   { return nil }
func (rawCodec) Name() string                  { return "proto" }

// TestUnreadableRequestsAreRefusedAndAudited: a body that is not a
// protobuf message of the method's type is INVALID_ARGUMENT (gRPC would
// say INTERNAL), one over MaxRequestSize RESOURCE_EXHAUSTED, an unknown
// method or service UNIMPLEMENTED; each is audited (api.access, through
// the flood guard) as the handlers' own refusals are.
func TestUnreadableRequestsAreRefusedAndAudited(t *testing.T) {
	e := start(t)
	call := func(method string, body []byte) error {
		var out []byte
		return e.conn.Invoke(ctxT(t), method, body, &out, grpc.ForceCodec(rawCodec{}))
	}
	const lookup = "/muster.v1.DiscoveryService/LookupAuthority"
	for _, c := range []struct {
		method string
		body   []byte
		code   codes.Code
		msg    string
	}{
		{lookup, []byte{0x0a, 0xff, 0x01}, codes.InvalidArgument, "not a valid protobuf message"},
		{lookup, make([]byte, MaxRequestSize+1), codes.ResourceExhausted, "larger than"},
		{"/muster.v1.DiscoveryService/NoSuchMethod", nil, codes.Unimplemented, "unknown method NoSuchMethod"},
		{"/muster.v1.NoSuchService/X", nil, codes.Unimplemented, "unknown service muster.v1.NoSuchService"},
	} {
		err := call(c.method, c.body)
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.msg) {
			t.Errorf("%s: %v, want %s containing %q", c.method, err, c.code, c.msg)
		}
		// gRPC answers a too large request before the handler's record
		// is written: wait for it.
		found := false
		for deadline := time.Now().Add(10 * time.Second); !found && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			recs, err := e.st.ListAudit(ctxT(t), store.AuditFilter{Action: "api.access"})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if r.Target == c.method && r.Result == audit.ResultDenied && strings.Contains(r.Reason, c.msg) && r.Source != "" {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("%s refused with %q: no api.access record says so", c.method, c.msg)
		}
	}
}
