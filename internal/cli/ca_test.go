package cli

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

func TestPrintCAStatusKeyCustody(t *testing.T) {
	at := time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	s := caStatusOf(&musterv1.GetCAStatusResponse{BundleDigest: "d", ConnectedAgents: 3, AwayAgents: 2, Certificates: []*musterv1.CACertificateStatus{
		{Kind: "root", State: "active", Serial: "1", NotAfter: timestamppb.New(at), KeyCustody: "offline", AgentsHolding: 3, AgentsAwayHolding: 1},
		{Kind: "intermediate", Role: "agent", State: "active", Serial: "2", NotAfter: timestamppb.New(at), KeyCustody: "pkcs11:token=muster;object=muster-ca/agent/2"},
		{Kind: "intermediate", Role: "server", State: "retiring", Serial: "3", NotAfter: timestamppb.New(at), KeyCustody: "sealed"},
		{Kind: "cross", State: "active", Serial: "4", NotAfter: timestamppb.New(at)},
	}})
	if err := printCAStatus(&b, s); err != nil {
		t.Fatal(err)
	}
	want := `Root key: offline
Trust bundle: d
Connected agents: 3
Agents away (seen before, certificate still valid): 2

KIND          ROLE    STATE     SERIAL  NOT AFTER             AGENTS HOLDING  AWAY HOLDING  KEY CUSTODY
root          -       active    1       2026-03-09T12:00:00Z  3               1             offline
intermediate  agent   active    2       2026-03-09T12:00:00Z  0               0             pkcs11:token=muster;object=muster-ca/agent/2
intermediate  server  retiring  3       2026-03-09T12:00:00Z  0               0             sealed
cross         -       active    4       2026-03-09T12:00:00Z  0               0             -
`
	if b.String() != want {
		t.Errorf("printed:\n%s\nwant:\n%s", b.String(), want)
	}
	if s.Certificates[1].KeyCustody != "pkcs11:token=muster;object=muster-ca/agent/2" || s.Certificates[3].KeyCustody != "" {
		t.Errorf("json key_custody: %+v", s.Certificates)
	}
}
