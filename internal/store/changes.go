package store

// ChangeKind says what a committed change means to an open agent stream,
// so that it re-checks only that: its standing, the verifier set or its
// tasks. Kinds combine as bits.
type ChangeKind uint8

const (
	// ChangeStanding: a lock, a node's deletion or supersession.
	ChangeStanding ChangeKind = 1 << iota
	// ChangeSigners: a signer step, so a new verifier set.
	ChangeSigners
	// ChangeTasks: a task queued.
	ChangeTasks
	// ChangeCA: a CA certificate prepared, activated or retired, so new
	// active intermediates and a new trust bundle (for every node).
	ChangeCA
	// ChangeStream: a new stream of the node was recorded, perhaps by
	// another replica; the node's older stream, wherever it is, ends.
	ChangeStream
	// ChangeSettings: a shared setting written (store.SettingStore), so
	// every replica reads the settings again. No stream has anything to
	// do for it.
	ChangeSettings

	// ChangeAll is what a watcher announces once it listens: changes
	// before may have gone unseen.
	ChangeAll = ChangeStanding | ChangeSigners | ChangeTasks | ChangeCA | ChangeStream | ChangeSettings
)

// Change is a committed change as a store announces it to its watchers:
// what changed, for which node IDs (nil: every node).
type Change struct {
	Kind  ChangeKind
	Nodes []string
}
