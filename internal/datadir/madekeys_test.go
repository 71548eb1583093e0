package datadir

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// keyLog records the keys a fake custody made and destroyed.
type keyLog struct {
	mu              sync.Mutex
	made, destroyed []string
}

func (l *keyLog) add(to *[]string, name string) {
	l.mu.Lock()
	*to = append(*to, name)
	l.mu.Unlock()
}

// fakeTokenCA stands for a token's CA custody: sealed keys, every Create
// and Destroy recorded.
type fakeTokenCA struct {
	custody.Custody
	log *keyLog
}

func (f fakeTokenCA) Create(ctx context.Context, name string, alg custody.Algorithm) (custody.Key, error) {
	k, err := f.Custody.Create(ctx, name, alg)
	if err == nil {
		f.log.add(&f.log.made, "ca/"+name)
	}
	return k, err
}

func (f fakeTokenCA) Destroy(ctx context.Context, name string, k custody.Key) error {
	f.log.add(&f.log.destroyed, "ca/"+name)
	return f.Custody.Destroy(ctx, name, k)
}

// fakeTokenSigners is the signers' side of it.
type fakeTokenSigners struct {
	*signer.InCustody
	log *keyLog
}

func (f fakeTokenSigners) Generate(ctx context.Context, versionID string) (signer.Key, error) {
	k, err := f.InCustody.Generate(ctx, versionID)
	if err == nil {
		f.log.add(&f.log.made, "signer/"+versionID)
	}
	return k, err
}

func (f fakeTokenSigners) Destroy(ctx context.Context, versionID string, k signer.Key) error {
	f.log.add(&f.log.destroyed, "signer/"+versionID)
	return f.InCustody.Destroy(ctx, versionID, k)
}

// failingCheckpoint is a store whose audit checkpoints fail: init's last
// step in the store, after every key was made.
type failingCheckpoint struct{ store.Store }

var errCheckpoint = errors.New("test: checkpoint refused")

func (failingCheckpoint) InsertAuditCheckpoint(context.Context, store.AuditCheckpoint) error {
	return errCheckpoint
}

// TestFailedInitDestroysTokenKeys: an init with key custody that fails
// after making the CA intermediates' and the first signer's keys (here at
// its audit checkpoint) destroys every one of them; one that succeeds
// destroys none.
func TestFailedInitDestroysTokenKeys(t *testing.T) {
	ctx := context.Background()
	run := func(fail bool) (*keyLog, error) {
		log := &keyLog{}
		dbDir := t.TempDir()
		o := InitOptions{Dir: Dir(filepath.Join(t.TempDir(), "a")), Name: "test", Now: time.Now(),
			CACustody: func(sk seal.StorageKey, _ *custody.Token) (custody.Custody, error) {
				c, err := custody.NewSealedCA(sk)
				return fakeTokenCA{Custody: c, log: log}, err
			},
			SignerCustody: func(sk seal.StorageKey, _ *custody.Token) (signer.Custody, error) {
				c, err := custody.NewSealed(sk, seal.InfoSigner, "muster-signer/")
				return fakeTokenSigners{InCustody: signer.NewInCustody(c), log: log}, err
			},
			OpenStore: func(ctx context.Context) (store.Store, error) {
				st, err := sqlite.Open(ctx, filepath.Join(dbDir, "muster.db"))
				if err != nil || !fail {
					return st, err
				}
				return failingCheckpoint{st}, nil
			},
		}
		_, err := Init(ctx, o)
		return log, err
	}
	log, err := run(true)
	if !errors.Is(err, errCheckpoint) {
		t.Fatalf("Init with a failing checkpoint: %v, want the checkpoint's error", err)
	}
	if len(log.made) != 5 || !strings.HasPrefix(log.made[4], "signer/") {
		t.Fatalf("made %q; want the four intermediates' keys and the first signer's before the failure", log.made)
	}
	got, want := slices.Sorted(slices.Values(log.destroyed)), slices.Sorted(slices.Values(log.made))
	if !slices.Equal(got, want) {
		t.Fatalf("a failed init destroyed %q; want every key it made, %q", log.destroyed, log.made)
	}

	log, err = run(false)
	if err != nil {
		t.Fatal(err)
	}
	if len(log.made) != 5 || len(log.destroyed) != 0 {
		t.Fatalf("a successful init made %q and destroyed %q; want five made, none destroyed", log.made, log.destroyed)
	}
}
