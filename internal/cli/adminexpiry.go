package cli

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/shellword"
)

// operatorWarnAhead is how long before its expiry an operator identity is
// warned about on every admin command (DESIGN.md: 7 days).
const operatorWarnAhead = 7 * 24 * time.Hour

// expiryWarning is the line an admin command prints to standard error
// about the operator identity it uses, or "" while it is far from expiry.
// An identity that has expired cannot renew itself: the line names
// another operator's admin add and the break-glass command instead, with
// data the data directory this command was given ("" when none) and an
// --out beside the expired file (the default NAME.pem is often that very
// file, which admin add never overwrites). renewArgs are the flags that
// found this identity (adminFlags.renewArgs), so the renewal it names
// renews this file and not the data directory's operator.pem. untrusted:
// the authority does not accept this identity (its certificate does not
// chain to the identity's roots, or the authority refused the identity's
// own: the root it is under is one a root rotation in standby no longer
// trusts), so admin renew, which needs that identity accepted, cannot
// work: the line names the command untrustedAuthorityHint's refusal
// names instead. The break-glass admin add is named with the binary that
// opens the data directory's keys (breakGlassBin).
func expiryWarning(path string, id *identity.Identity, name, data, renewArgs string, untrusted bool, now time.Time) string {
	notAfter := id.Leaf().NotAfter
	bin, where := breakGlassBin(data)
	switch left := notAfter.Sub(now); {
	case left <= 0:
		out := shellword.Quote(filepath.Join(filepath.Dir(path), name+"-new.pem"))
		return fmt.Sprintf("warning: the operator identity %s (%s) expired at %s; another operator issues a new one with muster admin add %s --out %s, or, where the authority's data directory is, %s admin add %s --offline --data %s --out %s%s",
			path, name, notAfter.UTC().Format(time.RFC3339), name, out, bin, name, shellword.Quote(firstOf(data, "DIR")), out, where)
	case left <= operatorWarnAhead && untrusted:
		return fmt.Sprintf("warning: the operator identity %s (%s) expires at %s, in %s; muster admin renew cannot renew it while the authority does not accept it (a root rotation in standby no longer trusts its root): get a new one where the authority's data directory is: %s admin add %s --offline --data %s --out %s%s",
			path, name, notAfter.UTC().Format(time.RFC3339), roundLeft(left), bin, name, shellword.Quote(firstOf(data, "DIR")), shellword.Quote(name+"-new.pem"), where)
	case left <= operatorWarnAhead:
		return fmt.Sprintf("warning: the operator identity %s (%s) expires at %s, in %s; renew it with muster admin renew",
			path, name, notAfter.UTC().Format(time.RFC3339), roundLeft(left)) + renewArgs
	}
	return ""
}

// breakGlassBin is the binary whose admin add --offline opens the keys of
// the data directory data: muster-pkcs11 where its authority.json records
// a PKCS#11 token (the static muster refuses to open one), muster where
// it records none. A directory not given or not readable here (the
// command may run where the data directory is not) is named with muster
// and, in where, the case that needs muster-pkcs11 instead.
func breakGlassBin(data string) (bin, where string) {
	if data == "" {
		return "muster", " (muster-pkcs11 in place of muster where the authority's keys are in a PKCS#11 token, docs/hsm.md)"
	}
	info, err := datadir.Dir(data).ReadInfo()
	switch {
	case err != nil:
		return "muster", " (muster-pkcs11 in place of muster where the authority's keys are in a PKCS#11 token, docs/hsm.md)"
	case info.Custody != nil:
		return "muster-pkcs11", ""
	}
	return "muster", ""
}

// warnExpiry prints expiryWarning, if any, to standard error.
func warnExpiry(env *Env, path string, id *identity.Identity, name, data, renewArgs string, untrusted bool, now time.Time) {
	if w := expiryWarning(path, id, name, data, renewArgs, untrusted, now); w != "" {
		fmt.Fprintf(env.Stderr, "muster: %s\n", w)
	}
}

// roundLeft prints a remaining time to a useful precision: days and hours,
// or minutes and seconds when little is left.
func roundLeft(d time.Duration) string {
	switch {
	case d >= 24*time.Hour:
		days := d / (24 * time.Hour)
		return fmt.Sprintf("%dd%dh", days, (d-days*24*time.Hour)/time.Hour)
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	}
	return d.Round(time.Second).String()
}
