package custody

import (
	"errors"

	"github.com/muster-dev/muster/internal/shellword"
)

// ErrModuleFailed: the PKCS#11 module answered CKR_GENERAL_ERROR while
// the token was being opened. The module says only that it cannot work,
// not why; the error carrying it says what that most often means
// (GeneralCause).
var ErrModuleFailed = errors.New("custody: the PKCS#11 module cannot work (CKR_GENERAL_ERROR)")

// GeneralCause is what CKR_GENERAL_ERROR from module most often means
// when a token is opened, and the way out: the module's own setup, not
// the PIN or a key. SoftHSM2 answers it from C_Initialize when it cannot
// read its configuration or token directory; a hardware HSM's module
// when its client cannot reach the HSM, the slot holds no initialised
// token, or the module is not the client's. The command it names shows
// what the module sees, run as the same user with the same environment.
func GeneralCause(module string) string {
	if module == "" {
		module = UnknownModule
	}
	return "CKR_GENERAL_ERROR is the module saying it cannot work at all, not that the PIN or a key is wrong. " +
		"With SoftHSM2 it most often cannot read its configuration or its token directory: SOFTHSM2_CONF is not set for this process " +
		"(without it /etc/softhsm/softhsm2.conf is read, not the file the token was made with), or its directories.tokendir is missing, " +
		"or not readable and writable by this user (the packaged unit runs as muster, with a read-only file system but ReadWritePaths=; " +
		"docs/hsm.md \"Trying it with SoftHSM2\"). With a hardware or network HSM: its client is not configured or cannot reach the HSM, " +
		"the slot's token (partition) is not initialised, or this module is not the one of the HSM client's version. " +
		"See what the module sees, as this user and with this environment: `pkcs11-tool --module " + shellword.Quote(module) + " --list-token-slots` " +
		"(it fails the same way until the setup is fixed, then lists the token by its label)"
}
