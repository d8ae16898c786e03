package durable_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// TestRacingStartsNeverShareAnExecution opens the same flow twice from two
// local directories before either records its execution: both want the
// same number, and exactly one may have it.
func TestRacingStartsNeverShareAnExecution(t *testing.T) {
	for round := 0; round < 20; round++ {
		h := newHarness(t)
		ctx := context.Background()
		var runs [2]*durable.Run
		for i := range runs {
			cfg := h.config(1, func(c *durable.Config) { c.LocalDir = t.TempDir() })
			run, err := durable.Open(ctx, cfg)
			require.NoError(t, err)
			_, err = run.Restore(ctx, 0)
			require.NoError(t, err)
			t.Cleanup(func() { run.Close() })
			runs[i] = run
		}
		require.Equal(t, runs[0].Execution(), runs[1].Execution())
		var wg sync.WaitGroup
		errs := make([]error, len(runs))
		for i, run := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = run.Start()
			}()
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			if err == nil {
				won++
				continue
			}
			require.ErrorIs(t, err, durable.ErrRaced)
			assert.Contains(t, err.Error(), "another run")
		}
		require.Equal(t, 1, won, "round %d: exactly one start may win: %v", round, errs)
	}
}

// TestEmptiedBackupIsRefused empties the backup of a flow whose local store
// saw epochs committed: the next run must stop, name both places, change
// nothing, and start over only once the local state is removed.
func TestEmptiedBackupIsRefused(t *testing.T) {
	h := newHarness(t)
	run, _ := h.open(h.config(1))
	h.epochs(run, 1, 1, 4, updatesGen(50, 0.2, false))
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())

	entries, err := os.ReadDir(h.bdir)
	require.NoError(t, err)
	for _, e := range entries {
		require.NoError(t, os.RemoveAll(filepath.Join(h.bdir, e.Name())))
	}
	storePath := filepath.Join(localstore.WorkerDir(h.local, testFlow, 0), localstore.FileName)
	before, err := os.Stat(storePath)
	require.NoError(t, err)

	_, err = durable.Open(context.Background(), h.config(1))
	require.ErrorIs(t, err, durable.ErrBackupLost)
	assert.Contains(t, err.Error(), "committed epoch 4")
	assert.Contains(t, err.Error(), filepath.Join(h.local, testFlow))
	after, err := os.Stat(storePath)
	require.NoError(t, err, "the local store must be left alone")
	assert.Equal(t, before.Size(), after.Size())

	// Starting over on purpose: remove the flow's local state.
	h.wipeLocal()
	h.rollback(0)
	run, infos := h.open(h.config(1))
	assert.Equal(t, durable.ResumeFresh, infos[0].Kind)
	h.epochs(run, 1, 1, 2, updatesGen(50, 0.2, false))
	require.NoError(t, run.Finish(false))
}

// TestLostObjectsAreRebuiltBeforeTheNextCommit deletes committed objects
// from the backup while the flow runs: the next commit must not name them;
// they are rebuilt from the local store, and a full resume from the backup
// alone then gives the exact state.
func TestLostObjectsAreRebuiltBeforeTheNextCommit(t *testing.T) {
	h := newHarness(t)
	run, _ := h.open(h.config(2))
	g := updatesGen(200, 0.1, true)
	h.epochs(run, 2, 1, 3, g)
	require.Eventually(t, func() bool { return run.Committed() == 3 }, waitFor, tick)

	lost := readState(t, h.bk).Commit.Objects
	require.NotEmpty(t, lost)
	for _, o := range lost {
		require.NoError(t, os.Remove(h.objectPath(o.Key)))
	}
	h.epochs(run, 2, 4, 5, g)
	require.NoError(t, run.Finish(false))
	assert.Equal(t, int64(1), run.Metrics().Heals)
	require.NoError(t, run.Close())

	probs, err := durable.Verify(context.Background(), h.bk, testFlow, nil)
	require.NoError(t, err)
	assert.Empty(t, probs, "the newest commit names only objects that exist")
	st := readState(t, h.bk)
	for _, o := range st.Commit.Objects {
		_, err := os.Stat(h.objectPath(o.Key))
		require.NoError(t, err, "%s is named by the newest commit", o.Key)
	}

	h.wipeLocal()
	run, infos := h.open(h.config(2))
	assert.Equal(t, repeat(durable.ResumeFull, 2), kinds(infos))
	requireModel(t, h.hist.at[5], stateOf(t, run, 2, h.kgc))
}

// TestAuthenticatedRecords: with a key, records carry an HMAC; a record
// written without the key, or forged, is refused by name, and so is a
// keyed record read without a key.
func TestAuthenticatedRecords(t *testing.T) {
	key := durable.Key("0123456789abcdef-test-key")
	ctx := context.Background()

	t.Run("a keyed flow resumes with its key", func(t *testing.T) {
		h := newHarness(t)
		run, _ := h.open(h.config(1, func(c *durable.Config) { c.Key = key }))
		h.epochs(run, 1, 1, 2, updatesGen(30, 0.5, false))
		require.NoError(t, run.Finish(false))
		require.NoError(t, run.Close())
		data, err := os.ReadFile(h.objectPath(testFlow + "/commits/0000000002.json"))
		require.NoError(t, err)
		assert.Contains(t, string(data), durable.AuthHMAC)

		h.wipeLocal()
		run, infos := h.open(h.config(1, func(c *durable.Config) { c.Key = key }))
		assert.Equal(t, durable.ResumeFull, infos[0].Kind)
		requireModel(t, h.hist.at[2], stateOf(t, run, 1, h.kgc))

		_, err = durable.Open(ctx, h.config(1))
		require.ErrorIs(t, err, durable.ErrUnauthenticated)
		assert.Contains(t, err.Error(), "MILLPOND_BACKUP_KEY")
	})

	t.Run("records without the key are refused", func(t *testing.T) {
		h := newHarness(t)
		run, _ := h.open(h.config(1))
		h.epochs(run, 1, 1, 1, updatesGen(30, 0.5, false))
		require.NoError(t, run.Finish(false))
		require.NoError(t, run.Close())
		_, err := durable.Open(ctx, h.config(1, func(c *durable.Config) { c.Key = key }))
		require.ErrorIs(t, err, durable.ErrUnauthenticated)
		assert.Contains(t, err.Error(), "commits/0000000001.json")
		assert.Contains(t, err.Error(), "not authenticated")
	})

	t.Run("a forged record is refused", func(t *testing.T) {
		h := newHarness(t)
		run, _ := h.open(h.config(1, func(c *durable.Config) { c.Key = key }))
		h.epochs(run, 1, 1, 1, updatesGen(30, 0.5, false))
		require.NoError(t, run.Finish(false))
		require.NoError(t, run.Close())
		path := h.objectPath(testFlow + "/commits/0000000001.json")
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		var rec map[string]any
		require.NoError(t, json.Unmarshal(data, &rec))
		rec["key_group_count"] = float64(testKGC) // unchanged content, forged seal below
		rec["checksum"] = strings.Repeat("0", 64)
		forged, err := json.Marshal(rec)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, forged, 0o600))
		_, err = durable.Open(ctx, h.config(1, func(c *durable.Config) { c.Key = key }))
		require.ErrorIs(t, err, durable.ErrUnauthenticated)
		assert.Contains(t, err.Error(), "commits/0000000001.json")
		probs, err := durable.Verify(ctx, h.bk, testFlow, key)
		require.NoError(t, err)
		require.NotEmpty(t, probs)
	})

	t.Run("a short key is refused", func(t *testing.T) {
		h := newHarness(t)
		_, err := durable.Open(ctx, h.config(1, func(c *durable.Config) { c.Key = durable.Key("short") }))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "at least 16")
	})
}

// TestDamagedLocalStoreIsNeverUsed flips bytes of a worker's local store
// after a run: the next run either rebuilds it at once (damage found at
// open) or stops before it commits anything (damage found by the
// background check), and the run after that rebuilds it from the backup.
// Either way the state is the committed one, exactly.
func TestDamagedLocalStoreIsNeverUsed(t *testing.T) {
	for _, where := range []string{"value", "header", "middle"} {
		t.Run(where, func(t *testing.T) {
			h := newHarness(t)
			run, _ := h.open(h.config(1))
			g := updatesGen(400, 0.2, true)
			h.epochs(run, 1, 1, 3, g)
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())

			path := filepath.Join(localstore.WorkerDir(h.local, testFlow, 0), localstore.FileName)
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			switch where {
			case "value":
				i := strings.LastIndex(string(data), "v1")
				require.Positive(t, i)
				data[i] ^= 0x01
			case "header":
				data[20] ^= 0x40
			case "middle":
				data[len(data)/2] ^= 0x10
			}
			require.NoError(t, os.WriteFile(path, data, 0o600))

			ctx := context.Background()
			run2, err := durable.Open(ctx, h.config(1))
			require.NoError(t, err)
			info, err := run2.Restore(ctx, 0)
			require.NoError(t, err)
			require.NoError(t, run2.Start())
			t.Logf("flip in the %s: %s resume (%s)", where, info.Kind, info.Reason)
			if info.Kind == durable.ResumeFull {
				assert.Contains(t, info.Reason, "damaged")
				requireModel(t, h.hist.at[3], stateOf(t, run2, 1, h.kgc))
				require.NoError(t, run2.Close())
				return
			}
			// Fast resume: the background check must find it before any
			// commit of this run.
			_, werr := run2.Write(ctx, 0, rowbatch.NewBatch(4, rowsOf([]string{"z"}, "z", false), false))
			cerr := run2.CloseEpoch(0, 4)
			ferr := run2.Finish(false)
			if werr == nil && cerr == nil && ferr == nil {
				// Undamaged where it matters (a free page, say): the
				// check passed and the state must be exact.
				h.m = h.hist.at[3].clone()
				h.m.apply(rowsOf([]string{"z"}, "z", false))
				requireModel(t, h.m, stateOf(t, run2, 1, h.kgc))
				require.NoError(t, run2.Close())
				return
			}
			assert.Equal(t, int64(3), run2.Committed(), "nothing commits on a damaged store")
			err = ferr
			if err == nil {
				err = cerr
			}
			require.ErrorIs(t, err, localstore.ErrDamaged)
			t.Logf("the run stopped: %v", err)
			require.NoError(t, run2.Close())
			run3, infos := h.open(h.config(1))
			assert.Equal(t, durable.ResumeFull, infos[0].Kind)
			assert.Contains(t, infos[0].Reason, "damaged")
			requireModel(t, h.hist.at[3], stateOf(t, run3, 1, h.kgc))
		})
	}
}

// TestInterruptStopsWaits cancels the context a run was opened with while
// the flow waits for commits that cannot happen: the wait ends at once.
func TestInterruptStopsWaits(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	run, err := durable.Open(ctx, h.config(1, func(c *durable.Config) { c.MaxEpochsInFlight = 1 }))
	require.NoError(t, err)
	_, err = run.Restore(ctx, 0)
	require.NoError(t, err)
	require.NoError(t, run.Start())
	defer run.Close()
	go func() {
		time.Sleep(50 * time.Millisecond)
		cancel()
	}()
	start := time.Now()
	var lastErr error
	for e := int64(1); e < 1000 && lastErr == nil; e++ {
		lastErr = h.epoch(run, 1, e, rowsOf([]string{"a"}, "v", false))
	}
	if lastErr == nil {
		lastErr = run.Finish(false)
	}
	require.ErrorIs(t, lastErr, context.Canceled)
	assert.Less(t, time.Since(start), 5*time.Second)
}
