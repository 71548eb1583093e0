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
