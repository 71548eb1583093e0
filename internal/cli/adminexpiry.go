package cli

import (
	"fmt"
	"path/filepath"
	"time"

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
// names instead.
func expiryWarning(path string, id *identity.Identity, name, data, renewArgs string, untrusted bool, now time.Time) string {
	notAfter := id.Leaf().NotAfter
	switch left := notAfter.Sub(now); {
	case left <= 0:
		out := shellword.Quote(filepath.Join(filepath.Dir(path), name+"-new.pem"))
		return fmt.Sprintf("warning: the operator identity %s (%s) expired at %s; another operator issues a new one with muster admin add %s --out %s, or, where the authority's data directory is, muster admin add %s --offline --data %s --out %s",
			path, name, notAfter.UTC().Format(time.RFC3339), name, out, name, shellword.Quote(firstOf(data, "DIR")), out)
	case left <= operatorWarnAhead && untrusted:
		return fmt.Sprintf("warning: the operator identity %s (%s) expires at %s, in %s; muster admin renew cannot renew it while the authority does not accept it (a root rotation in standby no longer trusts its root): get a new one where the authority's data directory is: muster admin add %s --offline --data %s --out %s",
			path, name, notAfter.UTC().Format(time.RFC3339), roundLeft(left), name, shellword.Quote(firstOf(data, "DIR")), shellword.Quote(name+"-new.pem"))
	case left <= operatorWarnAhead:
		return fmt.Sprintf("warning: the operator identity %s (%s) expires at %s, in %s; renew it with muster admin renew",
			path, name, notAfter.UTC().Format(time.RFC3339), roundLeft(left)) + renewArgs
	}
	return ""
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
