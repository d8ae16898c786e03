package durable_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// wholeRows rewrites every key of m at epoch e and deletes every fifth:
// an epoch that holds a worker's whole state.
func wholeRows(m model, e int64) []rowbatch.Row {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	rows := make([]rowbatch.Row, 0, len(keys))
	for i, k := range keys {
		step, key, _ := strings.Cut(k, "\x00")
		r := rowbatch.Row{StepID: step, Key: key, Deleted: i%5 == 4}
		if !r.Deleted {
			r.Value = []byte(fmt.Sprintf("whole-%s-e%d", key, e))
		}
		rows = append(rows, r)
	}
	return rows
}

// A batch-mode epoch in which every worker wrote its whole state is
// committed as compacted state in place of every older object, and the
// state restored from it is the state a run that compacted would have.
func TestWholeEpochTakesThePlaceOfOlderObjects(t *testing.T) {
	// generationMin 1: the whole batches start local store generations;
	// 0 (the default, 1024 rows): these small ones are written in place.
	cases := []struct {
		name          string
		workers       int
		mode          durable.SnapshotMode
		marked        func(w int) bool
		promoted      bool
		generationMin int
	}{
		{"every worker whole", 2, durable.SnapshotBatch, func(int) bool { return true }, true, 1},
		{"every worker whole, written in place", 2, durable.SnapshotBatch, func(int) bool { return true }, true, 0},
		{"one worker", 1, durable.SnapshotBatch, func(int) bool { return true }, true, 1},
		{"one of three workers not whole", 3, durable.SnapshotBatch, func(w int) bool { return w != 1 }, false, 1},
		{"immediate mode", 2, durable.SnapshotImmediate, func(int) bool { return true }, false, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t)
			// No compaction by size: only a whole epoch may replace objects.
			cfg := h.config(c.workers, func(cfg *durable.Config) {
				cfg.Mode = c.mode
				cfg.CompactMinBytes = 1 << 40
				cfg.GenerationMinRows = c.generationMin
			})
			g := updatesGen(240, 0.2, true)
			run, _ := h.open(cfg)
			h.epochs(run, c.workers, 1, 3, g)

			rows := wholeRows(h.m, 4)
			for w, part := range route(rows, c.workers, h.kgc) {
				require.NotEmpty(t, part, "worker %d", w)
				_, err := run.Write(ctx, w, rowbatch.NewBatch(4, part, c.marked(w)))
				require.NoError(t, err)
			}
			for w := 0; w < c.workers; w++ {
				require.NoError(t, run.CloseEpoch(w, 4))
			}
			h.m.apply(rows)
			h.hist.record(4, h.m)
			h.epochs(run, c.workers, 5, 6, g)
			require.NoError(t, run.Finish(false))
			wantWhole := int64(0)
			if c.promoted {
				wantWhole = 1
			}
			assert.Equal(t, wantWhole, run.Metrics().WholeEpochs)
			require.NoError(t, run.Close())

			rec := readState(t, h.bk).Commit
			var upTo4, compacted int
			for _, o := range rec.Objects {
				if o.LastEpoch <= 4 {
					upTo4++
				}
				if o.Kind == durable.KindCompacted {
					compacted++
					assert.Equal(t, int64(4), o.LastEpoch, o.Key)
				}
			}
			if c.promoted {
				assert.Equal(t, c.workers, upTo4, "objects up to the whole epoch: one per worker")
				assert.Equal(t, c.workers, compacted)
			} else {
				assert.Zero(t, compacted)
				assert.Greater(t, upTo4, c.workers, "segments of epochs 1-4 are all still named")
			}
			assertNoGarbage(t, h.bk)

			// Full resume reads the objects; fast resume the local store.
			// Both must give the state as of epoch 6.
			run, infos := h.open(h.config(c.workers))
			assert.Equal(t, repeat(durable.ResumeFast, c.workers), kinds(infos))
			requireModel(t, h.hist.at[6], stateOf(t, run, c.workers, h.kgc))
			require.NoError(t, run.Close())
			h.wipeLocal()
			run, infos = h.open(h.config(c.workers))
			assert.Equal(t, repeat(durable.ResumeFull, c.workers), kinds(infos))
			requireModel(t, h.hist.at[6], stateOf(t, run, c.workers, h.kgc))
		})
	}
}

// gatedBackup holds back uploads of keys containing hold until open is
// closed.
type gatedBackup struct {
	backup.Backup
	hold string
	open chan struct{}
	// fail, when set, is what the held uploads return once let through.
	fail error
}

func (g gatedBackup) Upload(ctx context.Context, path, key string) error {
	if strings.Contains(key, g.hold) {
		select {
		case <-g.open:
		case <-ctx.Done():
			return ctx.Err()
		}
		if g.fail != nil {
			return g.fail
		}
	}
	return g.Backup.Upload(ctx, path, key)
}

// A whole epoch committed in one record with the epochs around it replaces
// only what is older than itself: the later epochs stay named.
func TestWholeEpochCommittedWithLaterEpochs(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	gate := gatedBackup{Backup: h.bk, hold: "-e0000000003-", open: make(chan struct{})}
	cfg := h.config(2, func(cfg *durable.Config) {
		cfg.CompactMinBytes = 1 << 40
		cfg.Backup = gate
		cfg.GenerationMinRows = 1
	})
	g := updatesGen(120, 0.25, true)
	run, _ := h.open(cfg)
	h.epochs(run, 2, 1, 2, g)
	require.Eventually(t, func() bool { return run.Committed() == 2 }, waitFor, tick)
	// Epoch 3's segments wait at the gate, so epochs 3-6 commit together.
	for e := int64(3); e <= 6; e++ {
		rows := g(e)
		if e == 4 {
			rows = wholeRows(h.m, e)
		}
		for w, part := range route(rows, 2, h.kgc) {
			_, err := run.Write(ctx, w, rowbatch.NewBatch(e, part, e == 4))
			require.NoError(t, err)
		}
		for w := 0; w < 2; w++ {
			require.NoError(t, run.CloseLastEpoch(w, e))
		}
		h.m.apply(rows)
		h.hist.record(e, h.m)
	}
	assert.Equal(t, int64(2), run.Committed())
	close(gate.open)
	require.NoError(t, run.Finish(false))
	assert.Equal(t, int64(1), run.Metrics().WholeEpochs)
	require.NoError(t, run.Close())
	rec := readState(t, h.bk).Commit
	require.Equal(t, int64(6), rec.Epoch)
	for _, o := range rec.Objects {
		assert.GreaterOrEqual(t, o.LastEpoch, int64(4), "%s is older than the whole epoch", o.Key)
		assert.Equal(t, o.LastEpoch == 4, o.Kind == durable.KindCompacted, o.Key)
	}
	h.wipeLocal()
	run, _ = h.open(h.config(2))
	requireModel(t, h.hist.at[6], stateOf(t, run, 2, h.kgc))
}

// Whole epochs every epoch, the way a flow that rewrites its state runs:
// a run stopped at any point (here after each epoch's close, before or
// after its commit) resumes fast to the committed state, and a finished
// run leaves each local store holding one row per live key.
func TestWholeEpochsStopAnywhereAndResume(t *testing.T) {
	ctx := context.Background()
	for stopAfter := int64(2); stopAfter <= 5; stopAfter++ {
		t.Run(fmt.Sprintf("stop after epoch %d", stopAfter), func(t *testing.T) {
			h := newHarness(t)
			g := updatesGen(150, 0.2, true)
			const workers = 2
			run, _ := h.open(h.config(workers, func(cfg *durable.Config) { cfg.GenerationMinRows = 1 }))
			h.epochs(run, workers, 1, 1, g)
			require.Eventually(t, func() bool { return run.Committed() == 1 }, waitFor, tick)
			for e := int64(2); e <= stopAfter; e++ {
				rows := wholeRows(h.m, e)
				for w, part := range route(rows, workers, h.kgc) {
					_, err := run.Write(ctx, w, rowbatch.NewBatch(e, part, true))
					require.NoError(t, err)
				}
				for w := 0; w < workers; w++ {
					require.NoError(t, run.CloseEpoch(w, e))
				}
				h.m.apply(rows)
				h.hist.record(e, h.m)
				if e < stopAfter {
					// An epoch interval longer than a commit takes: each
					// whole epoch finds the one before committed.
					require.Eventually(t, func() bool { return run.Committed() == e }, waitFor, tick)
				}
			}
			if stopAfter%2 == 0 {
				// Killed: whatever committed by now is what comes back.
				require.NoError(t, run.Close())
			} else {
				require.NoError(t, run.Finish(false))
				for w := 0; w < workers; w++ {
					st, err := run.Store(w).Stats(ctx)
					require.NoError(t, err)
					assert.Equal(t, st.Rows, st.Rows-st.Deletions, "no deletion kept")
				}
				require.NoError(t, run.Close())
			}
			committed := readState(t, h.bk).Commit.Epoch
			run, infos := h.open(h.config(workers))
			assert.Equal(t, repeat(durable.ResumeFast, workers), kinds(infos))
			assert.Equal(t, committed+1, run.ResumeEpoch())
			got := stateOf(t, run, workers, h.kgc)
			requireModel(t, h.hist.at[committed], got)
			var rows int64
			for w := 0; w < workers; w++ {
				st, err := run.Store(w).Stats(ctx)
				require.NoError(t, err)
				rows += st.Rows
			}
			if stopAfter%2 == 1 {
				assert.Equal(t, int64(len(got)), rows, "one row per live key")
			}
		})
	}
}

// A run that fails while a whole batch waits for its segment (the pipe
// cuts no more) lets the local store write the batch's rows itself: reads
// of the store do not hang until the run is finished.
func TestFailedRunDoesNotHoldUpTheLocalStore(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	gate := gatedBackup{Backup: h.bk, hold: "-e0000000001-", open: make(chan struct{}), fail: errors.New("disk full")}
	run, _ := h.open(h.config(1, func(cfg *durable.Config) {
		cfg.Backup = gate
		cfg.UploadAttempts = 1
		cfg.GenerationMinRows = 1
	}))
	require.NoError(t, h.epoch(run, 1, 1, rowsOf([]string{"a", "b"}, "1", false)))
	// Epoch 2's segment is not cut before its close, which comes after the
	// failure.
	_, err := run.Write(ctx, 0, rowbatch.NewBatch(2, rowsOf([]string{"a", "b"}, "2", false), true))
	require.NoError(t, err)
	close(gate.open)
	require.Eventually(t, func() bool { return run.Err() != nil }, waitFor, tick)
	done := make(chan error, 1)
	go func() {
		r, found, err := run.Store(0).Get(ctx, "s", "a")
		if err == nil && (!found || string(r.Value) != "2-a") {
			err = fmt.Errorf("read %v %q", found, r.Value)
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("a read of the local store waits for a segment the failed run never cuts")
	}
	require.ErrorContains(t, run.CloseEpoch(0, 2), "disk full")
}

// In a batch-mode epoch that is every worker's whole state, deletions are
// held back until each worker closes the epoch and then dropped: compacted
// state holds nothing older for them to hide. A worker left with no key
// cuts no segment at all. Workers that close before the others wrote keep
// their deletions (it is not known yet that the epoch is whole), and the
// state restored is right in every case.
func TestWholeEpochDropsItsDeletions(t *testing.T) {
	cases := []struct {
		name          string
		workers       int
		emptied       func(w int) bool // the worker's batch deletes every key it has
		interleave    bool             // each worker closes before the next writes
		generationMin int
	}{
		{"every worker emptied", 2, func(int) bool { return true }, false, 1},
		{"every worker emptied, written in place", 2, func(int) bool { return true }, false, 0},
		{"one worker emptied", 2, func(w int) bool { return w == 0 }, false, 1},
		{"one worker, some deletions", 1, func(int) bool { return false }, false, 1},
		{"closes interleaved with writes", 3, func(int) bool { return false }, true, 1},
		{"closes interleaved, first worker emptied", 2, func(w int) bool { return w == 0 }, true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t)
			cfg := h.config(c.workers, func(cfg *durable.Config) {
				cfg.CompactMinBytes = 1 << 40
				cfg.GenerationMinRows = c.generationMin
			})
			g := updatesGen(240, 0.2, true)
			run, _ := h.open(cfg)
			h.epochs(run, c.workers, 1, 3, g)

			parts := route(wholeRows(h.m, 4), c.workers, h.kgc)
			var all []rowbatch.Row
			live := make([]int64, c.workers)
			deleted := make([]int64, c.workers)
			for w, part := range parts {
				require.NotEmpty(t, part, "worker %d", w)
				for i := range part {
					if c.emptied(w) {
						part[i].Deleted, part[i].Value = true, nil
					}
					if part[i].Deleted {
						deleted[w]++
					} else {
						live[w]++
					}
				}
				require.NotZero(t, deleted[w], "worker %d", w)
				all = append(all, part...)
			}
			for w, part := range parts {
				_, err := run.Write(ctx, w, rowbatch.NewBatch(4, part, true))
				require.NoError(t, err)
				if c.interleave {
					require.NoError(t, run.CloseEpoch(w, 4))
				}
			}
			if !c.interleave {
				for w := 0; w < c.workers; w++ {
					require.NoError(t, run.CloseEpoch(w, 4))
				}
			}
			h.m.apply(all)
			h.hist.record(4, h.m)
			require.Eventually(t, func() bool { return run.Committed() == 4 }, waitFor, tick)
			assert.Equal(t, int64(1), run.Metrics().WholeEpochs)

			rec := readState(t, h.bk).Commit
			got := map[int]durable.ObjectRef{}
			for _, o := range rec.Objects {
				require.Equal(t, int64(4), o.LastEpoch, o.Key)
				assert.Equal(t, durable.KindCompacted, o.Kind, o.Key)
				got[o.Worker] = o
			}
			for w := 0; w < c.workers; w++ {
				// Only the last worker to write is sure to know the epoch
				// whole when it closes, if closes interleave.
				dropped := !c.interleave || w == c.workers-1
				o, ok := got[w]
				switch {
				case dropped && live[w] == 0:
					assert.False(t, ok, "worker %d has no key left: no segment", w)
				case dropped:
					require.True(t, ok, "worker %d", w)
					assert.Equal(t, live[w], o.Rows, "worker %d: its deletions dropped", w)
				default:
					require.True(t, ok, "worker %d", w)
					assert.Equal(t, live[w]+deleted[w], o.Rows, "worker %d: closed before the epoch was known whole", w)
				}
			}

			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			assertNoGarbage(t, h.bk)
			resumeBoth := func(at int64) {
				for _, wipe := range []bool{false, true} {
					if wipe {
						h.wipeLocal()
					}
					run, _ := h.open(h.config(c.workers))
					requireModel(t, h.hist.at[at], stateOf(t, run, c.workers, h.kgc))
					require.NoError(t, run.Close())
				}
			}
			// The whole epoch itself, with the emptied workers empty; then
			// the epochs after it on top.
			resumeBoth(4)
			run, _ = h.open(h.config(c.workers))
			h.epochs(run, c.workers, 5, 6, g)
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			resumeBoth(6)
		})
	}
}
