package durable_test

import (
	"context"
	"fmt"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// carriedEpoch writes one epoch's rows on every worker with WriteCarried
// (whole when asked) and closes it everywhere, updating the model; it
// returns what each worker's WriteCarried reported as carried.
func (h *harness) carriedEpoch(run *durable.Run, workers int, e int64, rows []rowbatch.Row, whole bool) []int {
	h.t.Helper()
	ctx := context.Background()
	parts := route(rows, workers, h.kgc)
	carried := make([]int, workers)
	for w := 0; w < workers; w++ {
		b := rowbatch.NewBatch(e, parts[w], false)
		n := 0
		var err error
		if whole {
			n, carried[w], err = run.WriteCarried(ctx, w, b)
		} else {
			n, err = run.Write(ctx, w, b)
			carried[w] = -1
		}
		require.NoError(h.t, err)
		if carried[w] < 0 {
			require.Equal(h.t, len(parts[w]), n)
		}
	}
	h.m.apply(rows)
	h.hist.record(e, h.m)
	for w := 0; w < workers; w++ {
		require.NoError(h.t, run.CloseEpoch(w, e))
	}
	return carried
}

// flowWholeEpoch writes rows as worker 0's whole state at epoch e, as the
// flow does when the run carries nothing, and closes the epoch.
func (h *harness) flowWholeEpoch(run *durable.Run, e int64, rows []rowbatch.Row) {
	h.t.Helper()
	_, err := run.Write(context.Background(), 0, rowbatch.NewBatch(e, rows, true))
	require.NoError(h.t, err)
	h.m.apply(rows)
	h.hist.record(e, h.m)
	require.NoError(h.t, run.CloseEpoch(0, e))
}

// randomRows changes a random share of keys 0..keys-1 (of two steps),
// deleting some, and repeats one key now and then (its last row wins).
func randomRows(rng *rand.Rand, keys int, e int64) []rowbatch.Row {
	var rows []rowbatch.Row
	share := rng.Float64()
	for k := 0; k < keys; k++ {
		if rng.Float64() >= share {
			continue
		}
		r := rowbatch.Row{StepID: []string{"count", "window"}[k%2], Key: fmt.Sprintf("key-%04d", k)}
		if rng.Intn(6) == 0 {
			r.Deleted = true
		} else {
			r.Value = []byte(fmt.Sprintf("v%d-e%d-%s", k, e, "xxxxxxxx"[:rng.Intn(8)]))
		}
		rows = append(rows, r)
	}
	if len(rows) > 0 && rng.Intn(3) == 0 {
		again := rows[rng.Intn(len(rows))]
		again.Deleted, again.Value = false, []byte(fmt.Sprintf("again-e%d", e))
		rows = append(rows, again)
	}
	rng.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	return rows
}

// Epochs written whole from the carried state hold exactly the state:
// the live stores, the committed state a resume reads locally, and the
// state rebuilt from the backup all equal the model, at random shares of
// keys touched, deleted and written whole, with batches small enough to
// fold into the base now and then and large enough to start generations.
func TestCarriedWholeEpochsHoldTheState(t *testing.T) {
	for _, c := range []struct {
		name          string
		workers, keys int
		generationMin int
	}{
		{"one worker, in place", 1, 300, 0},
		{"two workers, generations", 2, 3000, 1},
		{"three workers, folds", 3, 12000, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			for seed := int64(1); seed <= 3; seed++ {
				rng := rand.New(rand.NewSource(seed))
				h := newHarness(t)
				cfg := h.config(c.workers, func(cfg *durable.Config) { cfg.GenerationMinRows = c.generationMin })
				run, _ := h.open(cfg)
				for w := 0; w < c.workers; w++ {
					require.True(t, run.Carries(w), "a fresh run carries worker %d", w)
				}
				wholes := 0
				for e := int64(1); e <= 12; e++ {
					whole := rng.Intn(2) == 0
					carried := h.carriedEpoch(run, c.workers, e, randomRows(rng, c.keys, e), whole)
					for w, n := range carried {
						if whole {
							require.GreaterOrEqual(t, n, 0, "seed %d epoch %d worker %d written whole", seed, e, w)
						}
					}
					if whole {
						wholes++
					}
				}
				require.NoError(t, run.Finish(false))
				requireModel(t, h.m, stateOf(t, run, c.workers, h.kgc))
				assert.Positive(t, run.Metrics().WholeEpochs, "seed %d: %d epochs asked to be whole", seed, wholes)
				run.Close()

				again, infos := h.open(h.config(c.workers))
				assert.Equal(t, repeat("fast", c.workers), kinds(infos))
				requireModel(t, h.m, stateOf(t, again, c.workers, h.kgc))
				for w := 0; w < c.workers; w++ {
					assert.False(t, again.Carries(w), "a resumed worker's state is carried from its first whole batch")
				}
				again.Close()

				h.wipeLocal()
				rebuilt, infos := h.open(h.config(c.workers))
				assert.Equal(t, repeat("full", c.workers), kinds(infos))
				requireModel(t, h.m, stateOf(t, rebuilt, c.workers, h.kgc))
				rebuilt.Close()
			}
		})
	}
}

// When the run carries no state (a resumed worker before its first whole
// batch, immediate mode, carrying turned off, a state past its budget) or
// the batch is its epoch's second, WriteCarried writes the batch as it is.
func TestWriteCarriedWithoutACarriedState(t *testing.T) {
	ctx := context.Background()
	rows := func(n int, v string) []rowbatch.Row {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("key-%04d", i)
		}
		return rowsOf(keys, v, false)
	}
	t.Run("immediate mode and turned off", func(t *testing.T) {
		for _, mod := range []func(*durable.Config){
			func(c *durable.Config) { c.Mode = durable.SnapshotImmediate },
			func(c *durable.Config) { c.CarryBytes = -1 },
		} {
			h := newHarness(t)
			run, _ := h.open(h.config(1, mod))
			assert.False(t, run.Carries(0))
			n, carried, err := run.WriteCarried(ctx, 0, rowbatch.NewBatch(1, rows(3, "a"), false))
			require.NoError(t, err)
			assert.Equal(t, []int{3, -1}, []int{n, carried})
			require.NoError(t, run.Finish(false))
		}
	})
	t.Run("stopped", func(t *testing.T) {
		h := newHarness(t)
		run, _ := h.open(h.config(1))
		assert.Equal(t, []int{0}, h.carriedEpoch(run, 1, 1, rows(10, "a"), true))
		run.Worker(0).StopCarrying()
		assert.False(t, run.Carries(0))
		assert.Equal(t, []int{-1}, h.carriedEpoch(run, 1, 2, rows(5, "b"), true))
		// A whole batch does not start carrying again.
		h.flowWholeEpoch(run, 3, rows(10, "c"))
		assert.False(t, run.Carries(0))
		require.NoError(t, run.Finish(false))
		requireModel(t, h.m, stateOf(t, run, 1, h.kgc))
	})
	t.Run("past the budget", func(t *testing.T) {
		h := newHarness(t)
		run, _ := h.open(h.config(1, func(c *durable.Config) { c.CarryBytes = 4096 }))
		carried := h.carriedEpoch(run, 1, 1, rows(10, "a"), true)
		assert.Equal(t, []int{0}, carried, "ten keys fit, all touched")
		assert.True(t, run.Carries(0))
		carried = h.carriedEpoch(run, 1, 2, rows(200, "b"), true)
		assert.Equal(t, []int{-1}, carried, "two hundred keys do not")
		assert.False(t, run.Carries(0))
		require.NoError(t, run.Finish(false))
		requireModel(t, h.m, stateOf(t, run, 1, h.kgc))
	})
	t.Run("resumed, until a whole batch", func(t *testing.T) {
		h := newHarness(t)
		run, _ := h.open(h.config(1))
		h.epoch(run, 1, 1, rows(20, "a"))
		require.NoError(t, run.Finish(false))
		run.Close()
		again, _ := h.open(h.config(1))
		assert.False(t, again.Carries(0))
		assert.Equal(t, []int{-1}, h.carriedEpoch(again, 1, 2, rows(5, "b"), true))
		// A whole batch (the flow's, every key) starts carrying again.
		h.flowWholeEpoch(again, 3, rows(20, "c"))
		assert.True(t, again.Carries(0))
		assert.Equal(t, []int{15}, h.carriedEpoch(again, 1, 4, rows(5, "d"), true), "15 of 20 keys carried")
		require.NoError(t, again.Finish(false))
		requireModel(t, h.m, stateOf(t, again, 1, h.kgc))
	})
	t.Run("an epoch's second batch", func(t *testing.T) {
		h := newHarness(t)
		run, _ := h.open(h.config(1))
		first := rows(10, "a")
		_, err := run.Write(ctx, 0, rowbatch.NewBatch(1, first, false))
		require.NoError(t, err)
		second := rows(4, "b")
		n, carried, err := run.WriteCarried(ctx, 0, rowbatch.NewBatch(1, second, false))
		require.NoError(t, err)
		assert.Equal(t, []int{4, -1}, []int{n, carried})
		h.m.apply(first)
		h.m.apply(second)
		h.hist.record(1, h.m)
		require.NoError(t, run.CloseEpoch(0, 1))
		assert.Equal(t, []int{6}, h.carriedEpoch(run, 1, 2, rows(4, "c"), true), "both batches carried")
		require.NoError(t, run.Finish(false))
		requireModel(t, h.m, stateOf(t, run, 1, h.kgc))
	})
}
