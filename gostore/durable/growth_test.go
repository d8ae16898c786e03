package durable_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// Batch mode cuts one segment per worker per epoch; immediate mode one per
// non-empty Write.
func TestSnapshotModesSegmentCounts(t *testing.T) {
	const workers, epochs, batches = 2, 3, 3
	cases := []struct {
		mode durable.SnapshotMode
		want int
	}{
		{durable.SnapshotBatch, workers * epochs},
		{durable.SnapshotImmediate, workers * epochs * batches},
	}
	for _, c := range cases {
		t.Run(modeName(c.mode), func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			cfg := h.config(workers, func(cfg *durable.Config) { cfg.Mode = c.mode })
			run, _ := h.open(cfg)
			g := updatesGen(90, 1, false)
			for e := int64(1); e <= epochs; e++ {
				parts := route(g(e), workers, h.kgc)
				for w := 0; w < workers; w++ {
					require.NotEmpty(t, parts[w])
					n := len(parts[w])
					for b := 0; b < batches; b++ {
						chunk := parts[w][b*n/batches : (b+1)*n/batches]
						require.NotEmpty(t, chunk)
						_, err := run.Write(ctx, w, rowbatch.NewBatch(e, chunk, false))
						require.NoError(t, err)
					}
					// An empty batch makes no segment in either mode.
					_, err := run.Write(ctx, w, rowbatch.NewBatch(e, nil, false))
					require.NoError(t, err)
				}
				for w := 0; w < workers; w++ {
					require.NoError(t, run.CloseEpoch(w, e))
				}
				h.m.apply(g(e))
				h.hist.record(e, h.m)
			}
			require.NoError(t, run.Finish(false))
			m := run.Metrics()
			assert.Equal(t, int64(c.want), m.SegmentsUploaded)
			assert.Equal(t, int64(epochs), m.CommittedEpoch)
			assert.Positive(t, m.BytesUploaded)
			assert.Len(t, list(t, h.bk, "segments/"), c.want)
			st := readState(t, h.bk)
			assert.Len(t, st.Commit.Objects, c.want)
			var rows int64
			for _, o := range st.Commit.Objects {
				assert.Equal(t, durable.KindSegment, o.Kind)
				rows += o.Rows
			}
			assert.Equal(t, int64(90*epochs), rows)
			require.NoError(t, run.Close())

			h.wipeLocal()
			run, infos := h.open(cfg)
			assert.Equal(t, repeat(durable.ResumeFull, workers), kinds(infos))
			requireModel(t, h.m, stateOf(t, run, workers, h.kgc))
		})
	}
}

// With compaction and GC the durable store stays a small multiple of the
// live state however many epochs run, and a full resume from compacted
// objects gives the model state.
//
// Epochs are paced so that background maintenance keeps up (each epoch
// waits until maintenance picked up the previous commit), as it does with
// real epoch intervals; back to back, compaction lags commits by many
// epochs and the retained records then name a longer tail of segments.
func TestCompactionBoundsDurableFootprint(t *testing.T) {
	const keys, epochs, workers = 800, 30, 1
	ratio := 0.5
	if r := os.Getenv("COMPACT_RATIO"); r != "" {
		ratio, _ = strconv.ParseFloat(r, 64)
	}
	h := newHarness(t)
	cfg := h.config(workers, func(c *durable.Config) {
		c.CompactMinBytes = 64 << 10
		c.CompactRatio = ratio
		c.RetainEpochs = 2
	})
	run, _ := h.open(cfg)
	g := updatesGenPad(keys, 0.1, true, 200)
	var maxObjects int
	var maxBytes, steadyBytes int64
	for e := int64(1); e <= epochs; e++ {
		require.NoError(t, h.epoch(run, workers, e, g(e)))
		require.Eventually(t, func() bool {
			return run.Committed() == e && run.Store(0).Meta().GCEpoch == e
		}, waitFor, time.Millisecond, "epoch %d not committed and picked up by maintenance", e)
		n, b := footprint(t, h)
		if os.Getenv("DUMP") != "" {
			t.Logf("epoch %d: %d objects, %d bytes, compactions %d", e, n, b, run.Metrics().Compactions)
		}
		maxObjects, maxBytes = max(maxObjects, n), max(maxBytes, b)
		if e > 10 { // past the first cycle, whose segment of epoch 1 holds every key
			steadyBytes = max(steadyBytes, b)
		}
	}
	require.NoError(t, run.Finish(false))
	m := run.Metrics()
	requireModel(t, h.m, stateOf(t, run, workers, h.kgc))
	require.NoError(t, run.Close())

	live := compactedSize(t, h.m)
	objects, bytes := footprint(t, h)
	if os.Getenv("DUMP") != "" {
		for _, o := range list(t, h.bk, "") {
			t.Logf("%8d %s", o.Size, o.Key)
		}
	}
	t.Logf("compactions %d, objects deleted %d, uploaded %d bytes; objects max %d, now %d; footprint max %d (%.2fx), after epoch 10 %d (%.2fx), now %d (%.2fx) of the compacted live state %d",
		m.Compactions, m.ObjectsDeleted, m.BytesUploaded, maxObjects, objects, maxBytes, float64(maxBytes)/float64(live),
		steadyBytes, float64(steadyBytes)/float64(live), bytes, float64(bytes)/float64(live), live)
	assert.Positive(t, m.Compactions)
	assert.Positive(t, m.ObjectsDeleted)
	assert.Greater(t, m.BytesUploaded, 3*live, "the run must upload far more than the bound for the test to mean anything")
	assert.Less(t, maxObjects, 30, "objects in the backup must stay bounded")
	assert.LessOrEqual(t, float64(maxBytes), 3.5*float64(live), "durable footprint exceeded 3.5x the compacted live state")
	assert.LessOrEqual(t, float64(steadyBytes), 3*float64(live), "durable footprint exceeded 3x the compacted live state")
	assert.LessOrEqual(t, float64(bytes), 3*float64(live), "durable footprint exceeds 3x the compacted live state")
	assert.Len(t, list(t, h.bk, "executions/"), 1)

	assertRetainedRecordsComplete(t, h.bk)
	// The newest commit record names objects that exist.
	st := readState(t, h.bk)
	present := map[string]bool{}
	for _, o := range list(t, h.bk, "") {
		present[o.Key] = true
	}
	for _, o := range st.Commit.Objects {
		assert.True(t, present[o.Key], "newest commit names missing %s", o.Key)
	}

	h.wipeLocal()
	run, infos := h.open(cfg)
	assert.Equal(t, repeat(durable.ResumeFull, workers), kinds(infos))
	requireModel(t, h.m, stateOf(t, run, workers, h.kgc))
	require.NoError(t, run.Close())
	// And on another worker count.
	run, _ = h.open(h.config(3))
	requireModel(t, h.m, stateOf(t, run, 3, h.kgc))
}

func footprint(t *testing.T, h *harness) (int, int64) {
	var n int
	var b int64
	for _, o := range list(t, h.bk, "") {
		n++
		b += o.Size
	}
	return n, b
}

// compactedSize is the size of one snapshot file holding the model state,
// as the durable store keeps it (compressed).
func compactedSize(t *testing.T, m model) int64 {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "live.sqlite")
	f, err := snapfile.Create(ctx, path, snapfile.Meta{FlowID: testFlow, Kind: snapfile.KindCompacted, WorkerCount: 1, KeyGroupCount: testKGC},
		snapfile.Options{Segment: true})
	require.NoError(t, err)
	rows := make([]rowbatch.Row, 0, len(m))
	for k, v := range m {
		var step, key string
		for i := 0; i < len(k); i++ {
			if k[i] == 0 {
				step, key = k[:i], k[i+1:]
				break
			}
		}
		rows = append(rows, rowbatch.Row{StepID: step, Key: key, Epoch: 1, Value: []byte(v)})
	}
	_, err = f.Write(ctx, rows)
	require.NoError(t, err)
	require.NoError(t, f.Seal())
	size, err := durable.StoredSize(path)
	require.NoError(t, err)
	return size
}

// In immediate mode one key can get several rows of one epoch in separate
// segments; the last one written wins, after compaction and on any layout.
func TestSameKeyTwiceInOneEpoch(t *testing.T) {
	for _, mode := range []durable.SnapshotMode{durable.SnapshotBatch, durable.SnapshotImmediate} {
		t.Run(modeName(mode), func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			cfg := h.config(1, func(c *durable.Config) { c.Mode = mode })
			run, _ := h.open(cfg)
			keys := []string{"a", "b", "c", "d"}
			batches := [][]rowbatch.Row{
				rowsOf(keys, "first", false),
				rowsOf(keys[:2], "", true),         // a, b deleted...
				rowsOf(keys[1:3], "second", false), // ...b back; c changed
				rowsOf(keys[3:], "", true),         // d deleted
			}
			for _, b := range batches {
				_, err := run.Write(ctx, 0, rowbatch.NewBatch(1, b, false))
				require.NoError(t, err)
				h.m.apply(b)
			}
			require.NoError(t, run.CloseEpoch(0, 1))
			h.hist.record(1, h.m)
			require.NoError(t, run.Finish(false))
			requireModel(t, h.m, stateOf(t, run, 1, h.kgc))
			require.NoError(t, run.Close())
			want := model{mkey("s", "b"): "second-b", mkey("s", "c"): "second-c"}
			requireModel(t, want, h.m)

			h.wipeLocal()
			run, _ = h.open(h.config(2, func(c *durable.Config) { c.Mode = mode; c.CompactMinBytes = 1 }))
			requireModel(t, want, stateOf(t, run, 2, h.kgc))
			h.epochs(run, 2, 2, 3, func(e int64) []rowbatch.Row { return rowsOf([]string{"z"}, "z", false) })
			require.NoError(t, run.Finish(false))
			assert.Positive(t, run.Metrics().Compactions)
			require.NoError(t, run.Close())
			h.wipeLocal()
			run, _ = h.open(h.config(3))
			requireModel(t, h.m, stateOf(t, run, 3, h.kgc))
		})
	}
}

// A compaction at an epoch already compacted is skipped: it would replace
// objects that a commit record names, and a crash before its own record
// would leave that record naming objects whose checksums do not match.
// (A maintenance round that compacted at the epoch it started with, after
// newer commits, did that.)
func TestCompactionNeverRewritesNamedObjects(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	run, _ := h.open(h.config(1, func(c *durable.Config) { c.CompactMinBytes = 1 << 40 })) // no compaction of its own
	h.epochs(run, 1, 1, 3, updatesGen(100, 0.5, false))
	require.Eventually(t, func() bool { return run.Committed() == 3 }, waitFor, tick)
	require.NoError(t, durable.CompactAt(ctx, run, 3))
	objs := list(t, h.bk, "compacted/")
	require.Len(t, objs, 1)
	before, err := os.ReadFile(h.objectPath(objs[0].Key))
	require.NoError(t, err)

	require.NoError(t, durable.CompactAt(ctx, run, 3))
	require.NoError(t, durable.CompactAt(ctx, run, 2))
	assert.Equal(t, int64(1), run.Metrics().Compactions, "the later compactions were skipped")
	after, err := os.ReadFile(h.objectPath(objs[0].Key))
	require.NoError(t, err)
	assert.Equal(t, before, after)
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())

	h.wipeLocal()
	run, _ = h.open(h.config(1))
	requireModel(t, h.m, stateOf(t, run, 1, h.kgc))
}
