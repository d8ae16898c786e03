package durable_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
)

func TestFreshStartThenFastResume(t *testing.T) {
	for _, mode := range []durable.SnapshotMode{durable.SnapshotBatch, durable.SnapshotImmediate} {
		t.Run(modeName(mode), func(t *testing.T) {
			h := newHarness(t)
			g := updatesGen(200, 0.2, true)
			cfg := h.config(2, func(c *durable.Config) { c.Mode = mode })

			run, infos := h.open(cfg)
			assert.Equal(t, int64(0), run.Execution())
			assert.Equal(t, int64(1), run.ResumeEpoch())
			assert.Equal(t, repeat(durable.ResumeFresh, 2), kinds(infos))
			h.epochs(run, 2, 1, 5, g)
			require.NoError(t, run.Finish(false))
			requireModel(t, h.m, stateOf(t, run, 2, h.kgc))
			require.NoError(t, run.Close())

			st := readState(t, h.bk)
			assert.Equal(t, int64(5), st.Commit.Epoch)
			assert.Equal(t, int64(0), st.LastExecution)
			assert.Len(t, list(t, h.bk, "executions/"), 1)

			run, infos = h.open(cfg)
			assert.Equal(t, int64(1), run.Execution())
			assert.Equal(t, int64(6), run.ResumeEpoch())
			assert.Equal(t, repeat(durable.ResumeFast, 2), kinds(infos))
			requireModel(t, h.hist.at[5], stateOf(t, run, 2, h.kgc))
			h.epochs(run, 2, 6, 8, g)
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())

			st = readState(t, h.bk)
			assert.Equal(t, int64(8), st.Commit.Epoch)
			assert.Equal(t, int64(1), st.LastExecution)
			assert.Len(t, list(t, h.bk, "executions/"), 2)
		})
	}
}

func modeName(m durable.SnapshotMode) string {
	if m == durable.SnapshotImmediate {
		return "immediate"
	}
	return "batch"
}

// Full resumes: the local store is lost, damaged, or the layout changed.
func TestFullResume(t *testing.T) {
	cases := []struct {
		name          string
		before, after int
		damage        func(h *harness)
		wantKind      string
	}{
		{"lost local dir", 2, 2, func(h *harness) { h.wipeLocal() }, durable.ResumeFull},
		{"corrupt store file", 2, 2, func(h *harness) {
			for w := 0; w < 2; w++ {
				p := filepath.Join(localstore.WorkerDir(h.local, testFlow, w), localstore.FileName)
				require.NoError(t, os.WriteFile(p, []byte("this is not sqlite at all, not even close......"), 0o644))
			}
		}, durable.ResumeFull},
		{"rescale 1 to 3", 1, 3, nil, durable.ResumeFull},
		{"rescale 3 to 2", 3, 2, nil, durable.ResumeFull},
		{"unchanged", 2, 2, nil, durable.ResumeFast},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			g := updatesGen(300, 0.1, true)
			run, _ := h.open(h.config(c.before))
			h.epochs(run, c.before, 1, 6, g)
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			if c.damage != nil {
				c.damage(h)
			}

			run, infos := h.open(h.config(c.after))
			assert.Equal(t, int64(7), run.ResumeEpoch())
			assert.Equal(t, repeat(c.wantKind, c.after), kinds(infos))
			requireModel(t, h.hist.at[6], stateOf(t, run, c.after, h.kgc))
			if c.wantKind == durable.ResumeFull {
				// A rebuilt store holds the newest row of each live key and
				// nothing else: no older version or deletion is left to GC.
				var rows int64
				for w := 0; w < c.after; w++ {
					st, err := run.Store(w).Stats(context.Background())
					require.NoError(t, err)
					assert.Zero(t, st.Deletions)
					assert.Equal(t, int64(6), run.Store(w).Meta().GCEpoch)
					rows += st.Rows
				}
				assert.Equal(t, int64(len(h.hist.at[6])), rows)
			}
			if c.before == c.after {
				return
			}
			// Keep going on the new layout, then resume once more.
			h.epochs(run, c.after, 7, 9, g)
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			h.wipeLocal()
			run, infos = h.open(h.config(c.after))
			assert.Equal(t, repeat(durable.ResumeFull, c.after), kinds(infos))
			requireModel(t, h.hist.at[9], stateOf(t, run, c.after, h.kgc))
			require.NoError(t, run.Close())
		})
	}
}

// An epoch written on some workers but not closed on all never commits: a
// crash there resumes at that epoch with its rows gone, fast or full.
func TestUncommittedEpochRolledBack(t *testing.T) {
	for _, wipe := range []bool{false, true} {
		name := "fast"
		if wipe {
			name = "full"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			g := updatesGen(200, 0.25, true)
			run, _ := h.open(h.config(3))
			h.epochs(run, 3, 1, 4, g)
			// Epoch 5: every worker writes, only workers 0 and 1 close.
			rows := route(g(5), 3, h.kgc)
			for w := 0; w < 3; w++ {
				_, err := run.Write(ctx, w, rowbatch.NewBatch(5, rows[w], false))
				require.NoError(t, err)
			}
			require.NoError(t, run.CloseEpoch(0, 5))
			require.NoError(t, run.CloseEpoch(1, 5))
			// Wait for epoch 4 to commit, so the crash point is known.
			require.Eventually(t, func() bool { return run.Committed() == 4 }, waitFor, tick)
			require.NoError(t, run.Close()) // a crash: no Finish
			assert.Equal(t, int64(4), readState(t, h.bk).Commit.Epoch)
			if wipe {
				h.wipeLocal()
			}

			run, infos := h.open(h.config(3))
			assert.Equal(t, int64(5), run.ResumeEpoch())
			want := durable.ResumeFast
			if wipe {
				want = durable.ResumeFull
			}
			assert.Equal(t, repeat(want, 3), kinds(infos))
			requireModel(t, h.hist.at[4], stateOf(t, run, 3, h.kgc))
			// Epoch 5 again, with other rows: nothing of the first try leaks.
			h.epochs(run, 3, 5, 6, updatesGen(200, 0.3, false))
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			h.wipeLocal()
			run, _ = h.open(h.config(3))
			requireModel(t, h.hist.at[6], stateOf(t, run, 3, h.kgc))
		})
	}
}

// Deleted keys stay deleted across fast and full resumes and compaction.
func TestDeletionsNeverResurface(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	cfg := h.config(2, func(c *durable.Config) { c.CompactMinBytes = 1; c.RetainEpochs = 1 })
	run, _ := h.open(cfg)
	var all []string
	for i := 0; i < 60; i++ {
		all = append(all, "k"+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	set := func(keys []string, v string) []rowbatchRow { return rowsOf(keys, v, false) }
	del := func(keys []string) []rowbatchRow { return rowsOf(keys, "", true) }
	require.NoError(t, h.epoch(run, 2, 1, set(all, "one")))
	require.NoError(t, h.epoch(run, 2, 2, del(all[:20])))          // deleted, then compacted away
	require.NoError(t, h.epoch(run, 2, 3, set(all[40:], "three"))) // compaction may run here
	require.NoError(t, h.epoch(run, 2, 4, del(all[40:50])))
	require.NoError(t, h.epoch(run, 2, 5, set(all[10:15], "back"))) // some deleted keys come back
	require.NoError(t, h.epoch(run, 2, 6, del(all[10:12])))
	require.NoError(t, run.Finish(false))
	assert.Positive(t, run.Metrics().Compactions)
	requireModel(t, h.m, stateOf(t, run, 2, h.kgc))
	for _, k := range all[:10] {
		for _, step := range []string{"s"} {
			for w := 0; w < 2; w++ {
				r, found, err := run.Store(w).Get(ctx, step, k)
				require.NoError(t, err)
				assert.True(t, !found || r.Deleted, "deleted key %s found live", k)
			}
		}
	}
	require.NoError(t, run.Close())

	for _, wipe := range []bool{false, true} {
		if wipe {
			h.wipeLocal()
		}
		run, _ = h.open(cfg)
		requireModel(t, h.hist.at[6], stateOf(t, run, 2, h.kgc))
		require.NoError(t, run.Close())
	}
	// Rescaled, from compacted objects.
	run, _ = h.open(h.config(3))
	requireModel(t, h.hist.at[6], stateOf(t, run, 3, h.kgc))
	require.NoError(t, run.Close())
}

// A worker without changes in an epoch still closes it; its local store is
// current for a fast resume whether or not it got an empty Write.
func TestIdleWorkerStillFastResumes(t *testing.T) {
	for _, emptyWrite := range []bool{true, false} {
		t.Run(map[bool]string{true: "empty write", false: "no write"}[emptyWrite], func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			run, _ := h.open(h.config(2))
			h.epochs(run, 2, 1, 2, updatesGen(60, 0.5, false))
			// Epoch 3: only worker 0 has changes.
			rows := route(rowsOf([]string{"a", "b", "c", "d", "e", "f", "g", "h"}, "three", false), 2, h.kgc)
			require.NotEmpty(t, rows[0])
			_, err := run.Write(ctx, 0, rowbatch.NewBatch(3, rows[0], false))
			require.NoError(t, err)
			if emptyWrite {
				_, err = run.Write(ctx, 1, rowbatch.NewBatch(3, nil, false))
				require.NoError(t, err)
			}
			require.NoError(t, run.CloseEpoch(0, 3))
			require.NoError(t, run.CloseEpoch(1, 3))
			h.m.apply(rows[0])
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			assert.Equal(t, int64(3), readState(t, h.bk).Commit.Epoch)

			run, infos := h.open(h.config(2))
			assert.Equal(t, repeat(durable.ResumeFast, 2), kinds(infos), infos[1].Reason)
			requireModel(t, h.m, stateOf(t, run, 2, h.kgc))
		})
	}
}
