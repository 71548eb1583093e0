package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/store"
)

// rotateOfflineActor is the audit actor of muster ca rotate --offline: no
// operator certificate vouches for it, the storage key does.
const rotateOfflineActor = "muster ca rotate --offline"

// rotateLostOffline is muster ca rotate ROLE --offline (docs/hsm.md "A
// lost token"): on the machine with the data directory, with no running
// authority needed, it replaces role's active intermediate whose key is
// gone from the token, or whose certificate has expired (docs/ca-lifecycle.md
// "An expired intermediate"), by a new one under the root, active at once.
func rotateLostOffline(cmd *cobra.Command, env *Env, data, storeURL, configFile, roleName, rootKeyPath string, access tokenAccess, out output) error {
	ctx := cmd.Context()
	role := ca.Role(roleName)
	switch role {
	case ca.RoleBootstrap, ca.RoleServer, ca.RoleAgent, ca.RoleAdmin:
	default:
		return fmt.Errorf("ca rotate --offline: ROLE is bootstrap, server, agent or admin, not %q", roleName)
	}
	od, err := loadOfflineDir(env, data, configFile)
	if err != nil {
		return fmt.Errorf("ca rotate --offline: %w", err)
	}
	od.token = readTokenAccess(env, access.module, access.pinFile)
	dir, cfg := od.dir, od.cfg
	ttl := ca.IntermediateTTL
	if t := cfg.CA.IntermediateTTL; t != "" {
		if ttl, err = parseCAIntermediateTTL(t); err != nil {
			return fmt.Errorf("ca rotate --offline: %w", err)
		}
	}
	m := authority.LostKeyRotation{Role: role, Actor: rotateOfflineActor, IntermediateTTL: ttl}
	if rootKeyPath != "" {
		k, err := readRootKey(rootKeyPath)
		if err != nil {
			return fmt.Errorf("ca rotate --offline: %w", err)
		}
		m.RootKey = k.key
	}
	st, d, err := openOfflineStore(ctx, od, od.storeURL(env, storeURL))
	if err != nil {
		return fmt.Errorf("ca rotate --offline: %w", err)
	}
	defer st.Close()
	logger, err := newAuditLogger(st, d.sk, dir, od.configPath, nil)
	if err != nil {
		return fmt.Errorf("ca rotate --offline: %w", err)
	}
	if err := logger.CheckHead(ctx); err != nil {
		return fmt.Errorf("ca rotate --offline: %w", err)
	}
	// The intermediate's lifetime is the store's, as the authority would
	// use.
	if m.IntermediateTTL, err = (offlineShared{authority.SettingCAIntermediateTTL, ttl, cfg.CA.IntermediateTTL != "", ""}).fromStore(ctx, st, od.configPath, string(dir)); err != nil {
		return fmt.Errorf("ca rotate --offline: %w", err)
	}
	// The token as the authority opens it (the store's record and
	// authority.json, the module and PIN file given as to the authority):
	// the new key is made there.
	rec, err := storeCustody(ctx, st, od, d.info.Custody, od.token.module)
	if err != nil {
		return fmt.Errorf("ca rotate --offline: %w", err)
	}
	token, err := openToken(rec, od.token.module, od.token.pinFile)
	if err != nil {
		return fmt.Errorf("ca rotate --offline: the authority's PKCS#11 token: %w", err)
	}
	if token != nil {
		defer token.Close()
	}
	m.Store, m.CA, m.StorageKey, m.Token, m.Audit = st, d.ca, d.sk, token, logger
	res, err := authority.RotateLostIntermediate(ctx, m)
	if err != nil {
		return fmt.Errorf("ca rotate --offline: %w", err)
	}
	if out.json() {
		return out.write(env.Stdout, map[string]any{"intermediate": lostRotationJSON(res.Active),
			"previous": lostRotationJSON(res.Previous), "reused_prepared": res.Reused})
	}
	printLostRotation(env.Stdout, res, od, token != nil)
	return nil
}

func lostRotationJSON(r store.CACert) map[string]any {
	return map[string]any{"role": r.Role, "serial": r.Serial, "state": r.State, "not_after": r.NotAfter.UTC(), "key_custody": custody.Where(r.KeyRef)}
}

// od is the data directory and settings file of the authority to start.
func printLostRotation(w io.Writer, res authority.LostKeyRotationResult, od offlineDir, pkcs11 bool) {
	if res.PreparedOnly {
		fmt.Fprintf(w, "Prepared the %s intermediate %s (key %s), valid until %s, in place of the prepared one whose key is gone; the active one, %s, signs on until the leader activates it.\n",
			res.Active.Role, res.Active.Serial, custody.Where(res.Active.KeyRef), res.Active.NotAfter.UTC().Format(time.RFC3339), res.Previous.Serial)
		return
	}
	how := "made under the root"
	if res.Reused {
		how = "the prepared successor, whose key opens"
	}
	previous := fmt.Sprintf("The one whose key is gone, %s, is retiring: it stays in the trust bundle, keyless, until its last certificate expires.\n", res.Previous.Serial)
	if res.Expired {
		previous = fmt.Sprintf("The one that expired at %s, %s, is retiring: the leader retires it.\n", res.Previous.NotAfter.UTC().Format(time.RFC3339), res.Previous.Serial)
	}
	fmt.Fprintf(w, "Activated the %s intermediate %s (%s; key %s), valid until %s: it signs every new %s certificate from now on.\n",
		res.Active.Role, res.Active.Serial, how, custody.Where(res.Active.KeyRef), res.Active.NotAfter.UTC().Format(time.RFC3339), res.Active.Role)
	fmt.Fprint(w, previous)
	bin := "muster"
	if pkcs11 {
		bin = "muster-pkcs11"
	}
	fmt.Fprintf(w, `Next: start the authority (a running one reads the change within seconds):
       %s authority --data %s%s
`, bin, od.quoted(), od.configArg())
}
