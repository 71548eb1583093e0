package cli

import (
	"log/slog"
	"time"
)

// migrationLog says on log that a store's opening migrates its schema,
// and then that it is done: a migration may take minutes on a large
// fleet (docs/install.md, "Upgrades"), and a command or server silent
// meanwhile reads as hung. Every opening that may migrate (the
// authority's start, discovery's and its commands', bench seed) says it
// in the same words.
type migrationLog struct {
	log *slog.Logger
	// then is what the migration holds up ("the authority serves once it
	// is done").
	then    string
	began   time.Time
	created bool
}

// migrating is the opening's hook (dataDir.migrating, openStoreWith).
func (m *migrationLog) migrating(from, to int) error {
	m.began, m.created = time.Now(), from == 0
	if m.created {
		// A new store (discovery's first start): nothing to migrate.
		m.log.Info("store: creating the schema; "+m.then, "to_version", to)
		return nil
	}
	m.log.Info("store: migrating the schema; "+m.then, "from_version", from, "to_version", to)
	return nil
}

// done says the migration ended, once the opening returned; nothing if
// none ran.
func (m *migrationLog) done() {
	if m.began.IsZero() {
		return
	}
	msg := "store: schema migrated"
	if m.created {
		msg = "store: schema created"
	}
	m.log.Info(msg, "took", time.Since(m.began).Round(time.Millisecond).String())
	m.began = time.Time{}
}
