//go:build pkcs11 && cgo

package custody

// DropSessions closes every session the module has open for the token,
// as a token pulled and re-inserted would.
func (t *Token) DropSessions() error {
	t.mu.Lock()
	slot := t.slot
	t.mu.Unlock()
	return t.mod.CloseAllSessions(slot)
}

// SetPIN changes the PIN the token logs in with, as a PIN changed on the
// token (or a token swapped for another) would look to the authority.
func (t *Token) SetPIN(pin string) {
	t.mu.Lock()
	t.pin = pin
	t.mu.Unlock()
}

// SetOpenFails makes every new session fail as if the token were pulled
// out (true) or lets them open again (false).
func (t *Token) SetOpenFails(fail bool) {
	t.mu.Lock()
	t.openFails = fail
	t.mu.Unlock()
}

// SetAfterFind runs fn in every key lookup once the key's objects are
// found, before they are read (nil: nothing).
func (t *Token) SetAfterFind(fn func()) {
	t.mu.Lock()
	t.afterFind = fn
	t.mu.Unlock()
}
