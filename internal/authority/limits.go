package authority

// The unauthenticated RPCs allow each source a burst of 20 requests and 5
// per second after it: ample for a fleet behind one NAT rebooting at once,
// and it keeps one source from guessing secrets or burning CPU on
// signatures.
const (
	bootstrapRate  = 5
	bootstrapBurst = 20
)
