package durable_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// A local store left behind on one machine holds epochs that never
// committed there; another machine then commits those epochs with other
// data. Back on the first machine, the local store reaches the committed
// epoch but must not be trusted: its rows are not the committed ones.
func TestStaleLocalStoreFromAnotherMachine(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	g := updatesGen(100, 0.3, false)
	machineA := h.local
	machineB := t.TempDir()

	run, _ := h.open(h.config(1))
	h.epochs(run, 1, 1, 3, g)
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())

	// Machine A writes epochs 4 and 5 locally and dies before they commit.
	run, _ = h.open(h.config(1))
	for e := int64(4); e <= 5; e++ {
		_, err := run.Write(ctx, 0, rowbatch.NewBatch(e, rowsOf([]string{"key-00001", "key-00002", "only-on-a"}, "A-uncommitted", false), false))
		require.NoError(t, err)
	}
	require.NoError(t, run.Close())
	assert.Equal(t, int64(3), readState(t, h.bk).Commit.Epoch)

	// Machine B resumes and commits epochs 4 and 5 with other data.
	run, infos := h.open(h.config(1, func(c *durable.Config) { c.LocalDir = machineB }))
	assert.Equal(t, []string{durable.ResumeFull}, kinds(infos))
	h.epochs(run, 1, 4, 5, g)
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())

	// Back on machine A.
	run, infos = h.open(h.config(1, func(c *durable.Config) { c.LocalDir = machineA }))
	assert.Equal(t, int64(6), run.ResumeEpoch())
	assert.Equal(t, []string{durable.ResumeFull}, kinds(infos), "a local store last opened before the newest commit's execution must be rebuilt")
	requireModel(t, h.hist.at[5], stateOf(t, run, 1, h.kgc))
}

// gatedDownloads blocks the download of one key until released.
type gatedDownloads struct {
	backup.Backup
	key     string
	reached chan struct{}
	release chan struct{}
}

func (b *gatedDownloads) Download(ctx context.Context, key, path string) error {
	if key == b.key {
		close(b.reached)
		<-b.release
	}
	return b.Backup.Download(ctx, key, path)
}

// A full resume killed half way leaves a local store that may already
// reach the committed epoch; the next resume must not take it as current.
// The kill is simulated by copying the worker's directory while the
// rebuild waits for its last object, and putting the copy back later.
func TestInterruptedRebuildIsNotTrusted(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	run, _ := h.open(h.config(2))
	h.epochs(run, 2, 1, 4, updatesGen(100, 0.3, false))
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())
	h.wipeLocal()

	// Rebuilding on 1 worker applies the epoch-4 segments of old workers 0
	// and 1 last; hold the very last one.
	var last durable.ObjectRef
	for _, o := range readState(t, h.bk).Commit.Objects {
		if o.LastEpoch > last.LastEpoch || (o.LastEpoch == last.LastEpoch && o.Worker >= last.Worker) {
			last = o
		}
	}
	require.Equal(t, int64(4), last.LastEpoch)
	gb := &gatedDownloads{Backup: h.bk, key: last.Key, reached: make(chan struct{}), release: make(chan struct{})}
	run, err := durable.Open(ctx, h.config(1, func(c *durable.Config) { c.Backup = gb }))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := run.Restore(ctx, 0); done <- err }()
	<-gb.reached
	wdir := localstore.WorkerDir(h.local, testFlow, 0)
	image := filepath.Join(t.TempDir(), "image")
	require.NoError(t, os.CopyFS(image, os.DirFS(wdir)))
	close(gb.release)
	require.NoError(t, <-done)
	require.NoError(t, run.Close())
	// The machine comes back with the disk as it was at the kill.
	require.NoError(t, os.RemoveAll(wdir))
	require.NoError(t, os.CopyFS(wdir, os.DirFS(image)))
	os.Remove(filepath.Join(wdir, "LOCK"))

	run, infos := h.open(h.config(1))
	assert.Equal(t, []string{durable.ResumeFull}, kinds(infos), infos[0].Reason)
	requireModel(t, h.hist.at[4], stateOf(t, run, 1, h.kgc))
}
