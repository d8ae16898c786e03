package durable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// Back-pressure never waits on work that only a later worker's close can
// let finish. The engine closes an epoch worker by worker; a whole-state
// batch's local write waits for its worker's segment, which is cut at that
// worker's close; compaction and local GC wait for the local writes. So
// if the first worker's close waited for maintenance, it would wait
// forever. Here compaction is due after every commit, so maintenance is
// always behind when a close asks.
func TestCloseEpochNeverWaitsOnAWorkerThatHasNotClosed(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	const workers = 2
	run, _ := h.open(h.config(workers, func(c *durable.Config) {
		c.CompactMinBytes, c.CompactRatio, c.GenerationMinRows = 1, 0.001, 1
	}))
	done := make(chan error, 1)
	go func() {
		g := updatesGen(200, 0.5, false)
		for e := int64(1); e <= 8; e++ {
			rows := g(e)
			whole := e%2 == 0
			if whole {
				rows = wholeRows(h.m, e)
			}
			parts := route(rows, workers, h.kgc)
			for w := 0; w < workers; w++ {
				if _, err := run.Write(ctx, w, rowbatch.NewBatch(e, parts[w], whole)); err != nil {
					done <- err
					return
				}
			}
			for w := 0; w < workers; w++ {
				if err := run.CloseEpoch(w, e); err != nil {
					done <- err
					return
				}
			}
			h.m.apply(rows)
		}
		done <- run.Finish(false)
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("the epochs did not close within 60 s: a close waited on maintenance that waited on a later close")
	}
	requireModel(t, h.m, stateOf(t, run, workers, h.kgc))
}
