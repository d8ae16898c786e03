package durable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// TestNewerExecutionFencesOffTheOlder starts the same flow twice against one
// backup from two local directories: the older run must stop before its
// next commit, and the backup keeps the newer run's lineage only.
func TestNewerExecutionFencesOffTheOlder(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	older, _ := h.open(h.config(1))
	require.NoError(t, h.epoch(older, 1, 1, rowsOf([]string{"a"}, "old-1", false)))
	require.Eventually(t, func() bool { return older.Committed() == 1 }, waitFor, time.Millisecond)

	// The same flow again, elsewhere: its own local state directory.
	newer, _ := h.open(h.config(1, func(c *durable.Config) { c.LocalDir = t.TempDir() }))
	assert.Equal(t, int64(2), newer.ResumeEpoch())

	// The older run goes on: its next commit is refused.
	_, err := older.Write(ctx, 0, rowbatch.NewBatch(2, []rowbatch.Row{{StepID: "s", Key: "a", Value: []byte("old-2")}}, false))
	require.NoError(t, err)
	require.NoError(t, older.CloseEpoch(0, 2))
	err = older.Finish(false)
	require.ErrorIs(t, err, durable.ErrSuperseded)
	assert.Contains(t, err.Error(), "execution 1 started")
	assert.Equal(t, int64(1), older.Committed())
	require.NoError(t, older.Close())

	// The newer run commits epoch 2 with its own rows.
	_, err = newer.Write(ctx, 0, rowbatch.NewBatch(2, []rowbatch.Row{{StepID: "s", Key: "a", Value: []byte("new-2")}}, false))
	require.NoError(t, err)
	require.NoError(t, newer.CloseEpoch(0, 2))
	require.NoError(t, newer.Finish(false))
	r, found, err := newer.Store(0).Get(ctx, "s", "a")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, "new-2", string(r.Value))
	require.NoError(t, newer.Close())
	st := readState(t, h.bk)
	assert.Equal(t, int64(2), st.Commit.Epoch)
	assert.Equal(t, int64(1), st.Commit.Execution)
}
