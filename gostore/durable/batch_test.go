package durable_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/durable"
)

// A run reads the rows it was handed until every part of the pipeline is
// done with them (local store writes, segments, held deletions, staged
// generations), frees each batch exactly once, and never reads a batch
// after it was freed: the state after a resume, fast and full, is exactly
// what was written.
func TestBatchMemoryIsFreedOnceAfterEveryReader(t *testing.T) {
	for _, mode := range []durable.SnapshotMode{durable.SnapshotBatch, durable.SnapshotImmediate} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t)
			const workers = 2
			cfg := h.config(workers, func(c *durable.Config) { c.Mode = mode; c.GenerationMinRows = 10 })
			run, _ := h.open(cfg)
			var freed atomic.Int64
			batches := int64(0)
			g := updatesGen(400, 0.3, true)
			for e := int64(1); e <= 8; e++ {
				rows := g(e)
				whole := e%3 == 0 // epochs 3 and 6 rewrite (or delete) every key
				if whole {
					rows = wholeRows(h.m, e)
				}
				parts := route(rows, workers, h.kgc)
				for w := 0; w < workers; w++ {
					_, err := run.Write(ctx, w, durable.Packed(t, e, parts[w], whole, &freed))
					require.NoError(t, err)
					batches++
				}
				for w := 0; w < workers; w++ {
					require.NoError(t, run.CloseEpoch(w, e))
				}
				h.m.apply(rows)
				h.hist.record(e, h.m)
			}
			require.NoError(t, run.Finish(false))
			require.NoError(t, run.Close())
			assert.Equal(t, batches, freed.Load(), "every batch freed exactly once")

			fast, infos := h.open(h.config(workers))
			assert.Equal(t, repeat(durable.ResumeFast, workers), kinds(infos))
			requireModel(t, h.m, stateOf(t, fast, workers, h.kgc))
			require.NoError(t, fast.Close())
			h.wipeLocal()
			full, infos := h.open(h.config(workers))
			assert.Equal(t, repeat(durable.ResumeFull, workers), kinds(infos))
			requireModel(t, h.m, stateOf(t, full, workers, h.kgc))
		})
	}
}

// A run that stops without closing an epoch it was given batches for (an
// abort) still frees every batch.
func TestBatchMemoryIsFreedWhenTheRunStopsMidEpoch(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	run, _ := h.open(h.config(1))
	var freed atomic.Int64
	rows := append(rowsOf([]string{"a", "b"}, "1", false), rowsOf([]string{"c"}, "", true)...)
	_, err := run.Write(ctx, 0, durable.Packed(t, 1, rows, true, &freed))
	require.NoError(t, err)
	require.NoError(t, run.Finish(true))
	require.NoError(t, run.Close())
	assert.Equal(t, int64(1), freed.Load())
}
