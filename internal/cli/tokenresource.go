package cli

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// tokenResource is a bound-keypair token as DESIGN.md's token resource:
// what `token get NAME -o yaml` prints and `token apply -f` takes back
// (the status is the authority's: apply ignores it). The JSON tags name
// the fields as the YAML ones do, since -o yaml renders the JSON shape.
type tokenResource struct {
	Kind     string        `json:"kind" yaml:"kind"`
	Metadata tokenMetadata `json:"metadata" yaml:"metadata"`
	Spec     tokenSpec     `json:"spec" yaml:"spec"`
	Status   *tokenStatus  `json:"status,omitempty" yaml:"status,omitempty"`
}

type tokenMetadata struct {
	Name string `json:"name" yaml:"name"`
}

type tokenSpec struct {
	JoinMethod   string           `json:"join_method" yaml:"join_method"`
	Node         string           `json:"node" yaml:"node"`
	BoundKeypair tokenSpecKeypair `json:"bound_keypair" yaml:"bound_keypair"`
	// SVIDUsage is client,server for a token whose agent's certificates
	// may serve TLS; empty (or client) for client authentication only.
	SVIDUsage string `json:"svid_usage,omitempty" yaml:"svid_usage,omitempty"`
}

type tokenSpecKeypair struct {
	Onboarding  tokenOnboarding `json:"onboarding" yaml:"onboarding"`
	Recovery    tokenRecovery   `json:"recovery" yaml:"recovery"`
	RotateAfter string          `json:"rotate_after" yaml:"rotate_after"`
}

type tokenOnboarding struct {
	InitialPublicKey   string `json:"initial_public_key" yaml:"initial_public_key"`
	RegistrationSecret string `json:"registration_secret" yaml:"registration_secret"`
	MustRegisterBefore string `json:"must_register_before" yaml:"must_register_before"`
}

type tokenRecovery struct {
	Limit *int64 `json:"limit" yaml:"limit"`
	Mode  string `json:"mode" yaml:"mode"`
}

type tokenStatus struct {
	State        string             `json:"state" yaml:"state"`
	CreatedBy    string             `json:"created_by" yaml:"created_by"`
	CreatedAt    time.Time          `json:"created_at" yaml:"created_at"`
	BoundKeypair tokenStatusKeypair `json:"bound_keypair" yaml:"bound_keypair"`
}

type tokenStatusKeypair struct {
	RegistrationSecret  string     `json:"registration_secret,omitempty" yaml:"registration_secret,omitempty"`
	BoundPublicKey      string     `json:"bound_public_key" yaml:"bound_public_key"`
	BoundKeyFingerprint string     `json:"bound_key_fingerprint" yaml:"bound_key_fingerprint"`
	BoundInstanceID     string     `json:"bound_instance_id" yaml:"bound_instance_id"`
	RecoveryCount       int64      `json:"recovery_count" yaml:"recovery_count"`
	RecoverySequence    int64      `json:"recovery_sequence" yaml:"recovery_sequence"`
	RecoveriesRemaining int64      `json:"recoveries_remaining" yaml:"recoveries_remaining"`
	LastRecoveredAt     *time.Time `json:"last_recovered_at" yaml:"last_recovered_at"`
	LastRotatedAt       *time.Time `json:"last_rotated_at" yaml:"last_rotated_at"`
	Epoch               string     `json:"epoch,omitempty" yaml:"epoch,omitempty"`
}

// tokenFile is token.yaml as apply reads it: the resource, with any
// status (token get prints one) accepted and ignored.
type tokenFile struct {
	Kind     string        `yaml:"kind"`
	Metadata tokenMetadata `yaml:"metadata"`
	Spec     tokenSpec     `yaml:"spec"`
	Status   yaml.Node     `yaml:"status"`
}

// resourceOf is a bound-keypair token as its resource, or nil for a
// token of another method.
func resourceOf(t *musterv1.Token) *tokenResource {
	sp, st := t.GetBoundKeypair(), t.GetBoundKeypairStatus()
	if sp == nil {
		return nil
	}
	when := func(ts interface{ AsTime() time.Time }, set bool) string {
		if !set {
			return ""
		}
		return ts.AsTime().UTC().Format(time.RFC3339)
	}
	limit := sp.GetRecoveryLimit()
	return &tokenResource{
		Kind:     "token",
		Metadata: tokenMetadata{Name: t.GetId()},
		Spec: tokenSpec{JoinMethod: t.GetJoinMethod(), Node: t.GetNodeId(), BoundKeypair: tokenSpecKeypair{
			Onboarding: tokenOnboarding{InitialPublicKey: sp.GetInitialPublicKey(),
				MustRegisterBefore: when(sp.GetMustRegisterBefore(), sp.GetMustRegisterBefore() != nil)},
			Recovery:    tokenRecovery{Limit: &limit, Mode: sp.GetRecoveryMode()},
			RotateAfter: when(sp.GetRotateAfter(), sp.GetRotateAfter() != nil),
		}, SVIDUsage: serverUsage(t.GetSvidUsage())},
		Status: &tokenStatus{State: t.GetState(), CreatedBy: t.GetCreatedBy(), CreatedAt: t.GetCreatedAt().AsTime().UTC(),
			BoundKeypair: tokenStatusKeypair{RegistrationSecret: st.GetRegistrationSecret(), BoundPublicKey: st.GetBoundPublicKey(),
				BoundKeyFingerprint: st.GetBoundKeyFingerprint(), BoundInstanceID: st.GetBoundInstanceId(),
				RecoveryCount: st.GetRecoveryCount(), RecoverySequence: st.GetRecoverySequence(),
				RecoveriesRemaining: st.GetRecoveriesRemaining(), LastRecoveredAt: timePtr(st.GetLastRecoveredAt()),
				LastRotatedAt: timePtr(st.GetLastRotatedAt()), Epoch: st.GetEpoch()}},
	}
}

// serverUsage is usage when it lets certificates serve TLS, "" for the
// default (client only), which outputs leave out.
func serverUsage(usage string) string {
	if usage == "" || usage == "client" {
		return ""
	}
	return usage
}

// explainFileYAML is explainYAML for a file decoded strictly into into: an
// unknown key is named by its path with the keys valid where it stands,
// never with the Go type it missed.
func explainFileYAML(data []byte, err error, into any) error {
	err = explainYAML(data, err)
	msg := err.Error()
	const unknown = `unknown setting "`
	i := strings.Index(msg, unknown)
	if i < 0 {
		return err
	}
	var out []string
	for part := range strings.SplitSeq(msg, "; ") {
		if j := strings.Index(part, unknown); j >= 0 {
			path, _, _ := strings.Cut(part[j+len(unknown):], `"`)
			if valid := validKeys(reflect.TypeOf(into), path); len(valid) > 0 {
				part = fmt.Sprintf("%sunknown field %q; valid here: %s", part[:j], path, strings.Join(valid, ", "))
			}
		}
		out = append(out, part)
	}
	return errors.New(strings.Join(out, "; "))
}

// validKeys are the YAML keys of the mapping that holds the dotted path's
// last key, in t (a struct, or a pointer to one); none if the path leaves
// the structs.
func validKeys(t reflect.Type, path string) []string {
	keys := strings.Split(path, ".")
	for _, k := range keys[:len(keys)-1] {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		f, ok := fieldByKey(t, k)
		if !ok {
			return nil
		}
		t = f.Type
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeOf(yaml.Node{}) {
		return nil
	}
	var valid []string
	for f := range t.Fields() {
		if name := yamlKey(f); name != "" {
			valid = append(valid, name)
		}
	}
	slices.Sort(valid)
	return valid
}

func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for f := range t.Fields() {
		if yamlKey(f) == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func yamlKey(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	if name == "" {
		return strings.ToLower(f.Name)
	}
	return name
}
