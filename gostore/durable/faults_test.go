package durable_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/backup/faultbackup"
	"github.com/millpond/millpond/gostore/durable"
)

// runUntilError runs epochs from..to and returns the first error of a
// Write or CloseEpoch, if any.
func (h *harness) runUntilError(run *durable.Run, workers int, from, to int64, g gen) error {
	for e := from; e <= to; e++ {
		if err := h.epoch(run, workers, e, g(e)); err != nil {
			return err
		}
	}
	return nil
}

// A segment upload that always fails stops the run with an error naming
// the object; nothing past it commits; a new run resumes from the newest
// committed epoch.
func TestPermanentSegmentUploadFailure(t *testing.T) {
	for _, wipe := range []bool{false, true} {
		t.Run(fmt.Sprintf("wipe=%v", wipe), func(t *testing.T) {
			h := newHarness(t)
			g := updatesGen(200, 0.2, true)
			bad := testFlow + "/segments/000000/w0001-e0000000004-"
			fb := faultbackup.New(h.bk, faultbackup.FromNth(faultbackup.OpUpload, 1, nil).WithKeyPrefix(bad))
			run, _ := h.open(h.config(2, func(c *durable.Config) { c.Backup = fb }))
			err := h.runUntilError(run, 2, 1, 12, g)
			ferr := run.Finish(false)
			require.Error(t, ferr)
			assert.Contains(t, ferr.Error(), bad)
			if err != nil {
				assert.Contains(t, err.Error(), bad)
			}
			assert.Positive(t, fb.Failures(faultbackup.OpUpload))
			// Epoch 3 may or may not have committed before the failure
			// stopped the pipeline; nothing past it may have.
			committed := readState(t, h.bk).Commit.Epoch
			assert.LessOrEqual(t, committed, int64(3), "commits must stop before the failed epoch")
			require.NoError(t, run.Close())

			if wipe {
				h.wipeLocal()
			}
			run, _ = h.open(h.config(2))
			assert.Equal(t, committed+1, run.ResumeEpoch())
			requireModel(t, h.hist.at[committed], stateOf(t, run, 2, h.kgc))
			h.rollback(committed)
			h.epochs(run, 2, committed+1, 6, g)
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			h.wipeLocal()
			run, _ = h.open(h.config(2))
			requireModel(t, h.hist.at[6], stateOf(t, run, 2, h.kgc))
		})
	}
}

// Transient failures (each fails once) are retried and everything commits.
func TestTransientUploadFailuresAreRetried(t *testing.T) {
	cases := []struct {
		name string
		rule faultbackup.Rule
	}{
		{"segment", faultbackup.Nth(faultbackup.OpUpload, 3, nil).WithKeyPrefix(testFlow + "/segments/")},
		{"segment acknowledged lost", faultbackup.Nth(faultbackup.OpUpload, 2, nil).WithKeyPrefix(testFlow + "/segments/").WithCallThrough()},
		{"every 4th segment", faultbackup.EveryNth(faultbackup.OpUpload, 4, nil).WithKeyPrefix(testFlow + "/segments/")},
		{"commit record", faultbackup.Nth(faultbackup.OpUpload, 2, nil).WithKeyPrefix(testFlow + "/commits/")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			g := updatesGen(100, 0.3, true)
			fb := faultbackup.New(h.bk, c.rule)
			run, _ := h.open(h.config(2, func(cfg *durable.Config) { cfg.Backup = fb; cfg.UploadAttempts = 5 }))
			h.epochs(run, 2, 1, 5, g)
			require.NoError(t, run.Finish(false))
			assert.Equal(t, 1, min(fb.Failures(faultbackup.OpUpload), 1))
			assert.Equal(t, int64(5), readState(t, h.bk).Commit.Epoch)
			m := run.Metrics()
			assert.Equal(t, int64(fb.Failures(faultbackup.OpUpload)), m.UploadRetries, "every failed upload was retried once")
			var counted int64
			for _, n := range m.CommitLatencyBuckets {
				counted += n
			}
			assert.Equal(t, m.Commits, counted, "every commit is in the latency histogram")
			assert.Greater(t, m.CommitLatencySum, 0.0)
			require.NoError(t, run.Close())
			h.wipeLocal()
			run, _ = h.open(h.config(2))
			requireModel(t, h.hist.at[5], stateOf(t, run, 2, h.kgc))
		})
	}
}

func TestFailingListAtOpen(t *testing.T) {
	h := newHarness(t)
	fb := faultbackup.New(h.bk, faultbackup.FromNth(faultbackup.OpList, 1, errors.New("connection refused")))
	_, err := durable.Open(context.Background(), h.config(1, func(c *durable.Config) { c.Backup = fb }))
	require.Error(t, err)
	assert.Contains(t, err.Error(), testFlow)
	assert.Contains(t, err.Error(), "list")
	assert.Contains(t, err.Error(), "connection refused")
	assert.Contains(t, err.Error(), h.bk.String())
}

// Crash points: the backup fails from some call on, the run dies (Close
// without Finish), and the next run resumes at the newest committed epoch
// with intact state.
func TestCrashPoints(t *testing.T) {
	cases := []struct {
		name string
		rule faultbackup.Rule
		// runFails: the fault stops the run (commit records); otherwise it
		// only hurts background maintenance and the run finishes.
		runFails bool
		check    func(t *testing.T, run *durable.Run, fb *faultbackup.FaultBackup)
	}{
		{
			name: "between upload and commit", runFails: true,
			rule: faultbackup.FromNth(faultbackup.OpUpload, 5, nil).WithKeyPrefix(testFlow + "/commits/"),
		},
		{
			name: "commit uploaded but not acknowledged", runFails: true,
			rule: faultbackup.FromNth(faultbackup.OpUpload, 5, nil).WithKeyPrefix(testFlow + "/commits/").WithCallThrough(),
		},
		{
			name: "during compaction",
			rule: faultbackup.FromNth(faultbackup.OpUpload, 1, nil).WithKeyPrefix(testFlow + "/compacted/"),
			check: func(t *testing.T, run *durable.Run, fb *faultbackup.FaultBackup) {
				assert.Zero(t, run.Metrics().Compactions)
				assert.Positive(t, fb.Failures(faultbackup.OpUpload))
			},
		},
		{
			name: "compacted uploaded but not acknowledged",
			rule: faultbackup.FromNth(faultbackup.OpUpload, 1, nil).WithKeyPrefix(testFlow + "/compacted/").WithCallThrough(),
			check: func(t *testing.T, run *durable.Run, fb *faultbackup.FaultBackup) {
				assert.Zero(t, run.Metrics().Compactions)
			},
		},
		{
			name: "during gc",
			rule: faultbackup.FromNth(faultbackup.OpDelete, 3, nil),
			check: func(t *testing.T, run *durable.Run, fb *faultbackup.FaultBackup) {
				assert.Positive(t, fb.Failures(faultbackup.OpDelete))
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			g := updatesGen(150, 0.2, true)
			fb := faultbackup.New(h.bk, c.rule)
			cfg := h.config(2, func(cfg *durable.Config) {
				cfg.Backup = fb
				cfg.CompactMinBytes = 1
				cfg.RetainEpochs = 1
			})
			run, _ := h.open(cfg)
			err := h.runUntilError(run, 2, 1, 8, g)
			if c.runFails {
				if err == nil {
					err = run.Finish(false)
				}
				require.ErrorIs(t, err, faultbackup.ErrInjected)
				assert.Contains(t, err.Error(), "/commits/")
			} else {
				require.NoError(t, err)
				require.NoError(t, run.Finish(false))
				requireModel(t, h.m, stateOf(t, run, 2, h.kgc))
			}
			if c.check != nil {
				c.check(t, run, fb)
			}
			require.NoError(t, run.Close())
			st := readState(t, h.bk)
			committed := st.Commit.Epoch
			if c.runFails {
				// A record whose upload landed but was reported failed
				// (call-through) is committed all the same.
				assert.LessOrEqual(t, committed, int64(8))
			} else {
				assert.Equal(t, int64(8), committed)
			}
			assertCommitComplete(t, h.bk, st)

			for _, wipe := range []bool{false, true} {
				if wipe {
					h.wipeLocal()
				}
				run, _ = h.open(h.config(2))
				assert.Equal(t, committed+1, run.ResumeEpoch())
				requireModel(t, h.hist.at[committed], stateOf(t, run, 2, h.kgc))
				require.NoError(t, run.Close())
			}
			// The store keeps working after the crash, and its garbage goes.
			h.rollback(committed)
			run, _ = h.open(h.config(2, func(c *durable.Config) { c.CompactMinBytes = 1; c.RetainEpochs = 1 }))
			h.epochs(run, 2, committed+1, max(committed+2, 9), g) // past every epoch the crashed run uploaded
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			st = readState(t, h.bk)
			assertCommitComplete(t, h.bk, st)
			// Whatever the crash left (uploaded but never committed
			// segments, compacted objects no record names) is collected.
			assertNoGarbage(t, h.bk)
			assertRetainedRecordsComplete(t, h.bk)
			h.wipeLocal()
			run, _ = h.open(h.config(3))
			requireModel(t, h.m, stateOf(t, run, 3, h.kgc))
		})
	}
}

// assertCommitComplete checks that every object the newest commit names
// exists with its recorded size.
func assertCommitComplete(t *testing.T, b backup.Backup, st durable.State) {
	t.Helper()
	sizes := map[string]int64{}
	for _, o := range list(t, b, "") {
		sizes[o.Key] = o.Size
	}
	for _, o := range st.Commit.Objects {
		size, ok := sizes[o.Key]
		if assert.True(t, ok, "commit %d names missing %s", st.Commit.Epoch, o.Key) {
			assert.Equal(t, o.Size, size, o.Key)
		}
	}
}

// blockingBackup holds segment uploads until its gate opens.
type blockingBackup struct {
	backup.Backup
	gate    chan struct{}
	waiting atomic.Int32
}

func (b *blockingBackup) Upload(ctx context.Context, path, key string) error {
	if strings.Contains(key, "/segments/") {
		b.waiting.Add(1)
		select {
		case <-b.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return b.Backup.Upload(ctx, path, key)
}

// CloseEpoch waits once MaxEpochsInFlight epochs are closed but not
// committed, and the wait shows in the metrics.
func TestBackPressure(t *testing.T) {
	h := newHarness(t)
	bb := &blockingBackup{Backup: h.bk, gate: make(chan struct{})}
	run, _ := h.open(h.config(1, func(c *durable.Config) { c.Backup = bb; c.MaxEpochsInFlight = 2 }))
	g := updatesGen(50, 0.5, false)
	var closed atomic.Int64
	var wg sync.WaitGroup
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for e := int64(1); e <= 6; e++ {
			if runErr = h.epoch(run, 1, e, g(e)); runErr != nil {
				return
			}
			closed.Store(e)
		}
	}()
	require.Eventually(t, func() bool { return closed.Load() == 2 }, waitFor, tick)
	// The uploads reach the blocked backup in their own time: on a loaded
	// machine, later than epoch 2's close.
	require.Eventually(t, func() bool { return bb.waiting.Load() > 0 }, waitFor, tick)
	time.Sleep(500 * time.Millisecond)
	assert.Equal(t, int64(2), closed.Load(), "CloseEpoch of epoch 3 must wait while epochs 1 and 2 are in flight")
	assert.Equal(t, int64(0), run.Committed())
	close(bb.gate)
	wg.Wait()
	require.NoError(t, runErr)
	require.NoError(t, run.Finish(false))
	m := run.Metrics()
	assert.Equal(t, int64(6), m.CommittedEpoch)
	assert.GreaterOrEqual(t, m.BackpressureSeconds, 0.1)
	assert.NotEmpty(t, m.CommitLatencies)
	require.NoError(t, run.Close())
}

// Closing a run whose uploads hang must not hang forever.
func TestCloseWithHangingUpload(t *testing.T) {
	h := newHarness(t)
	bb := &blockingBackup{Backup: h.bk, gate: make(chan struct{})}
	defer close(bb.gate)
	run, _ := h.open(h.config(1, func(c *durable.Config) { c.Backup = bb }))
	require.NoError(t, h.epoch(run, 1, 1, updatesGen(20, 1, false)(1)))
	require.Eventually(t, func() bool { return bb.waiting.Load() > 0 }, waitFor, tick)
	done := make(chan error, 1)
	go func() { done <- run.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs on an upload in flight")
	}
	assert.Zero(t, readState(t, h.bk).Commit.Epoch)
	_ = os.Remove // keep imports stable
}

// Every commit record still in the backup names objects that exist:
// point-in-time restore of every retained epoch works.
func assertRetainedRecordsComplete(t *testing.T, b backup.Backup) {
	t.Helper()
	ctx := context.Background()
	present := map[string]bool{}
	for _, o := range list(t, b, "") {
		present[o.Key] = true
	}
	for _, o := range list(t, b, "commits/") {
		tmp := t.TempDir() + "/rec.json"
		require.NoError(t, b.Download(ctx, o.Key, tmp))
		data, err := os.ReadFile(tmp)
		require.NoError(t, err)
		var rec durable.CommitRecord
		require.NoError(t, json.Unmarshal(data, &rec))
		for _, ref := range rec.Objects {
			assert.True(t, present[ref.Key], "retained commit %s names deleted %s", o.Key, ref.Key)
		}
	}
}

// Durable GC reads the retained commit records to know what they protect;
// when reading one fails (a network error), it must not delete what that
// record names.
func TestGCKeepsObjectsOfUnreadableRecords(t *testing.T) {
	h := newHarness(t)
	fb := faultbackup.New(h.bk, faultbackup.FromNth(faultbackup.OpDownload, 1, nil).WithKeyPrefix(testFlow+"/commits/"))
	cfg := h.config(1, func(c *durable.Config) { c.Backup = fb; c.CompactMinBytes = 1; c.RetainEpochs = 3 })
	run, _ := h.open(cfg)
	h.epochs(run, 1, 1, 10, updatesGen(60, 0.3, true))
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())
	assert.Positive(t, fb.Failures(faultbackup.OpDownload))
	assertRetainedRecordsComplete(t, h.bk)
}
