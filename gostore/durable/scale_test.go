package durable_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// Bounded growth at scale: 300 epochs in which 10% of 100k keys change
// leave a durable footprint of at most 3x the serialized live state, and a
// local store of about 2x (2.25x allowed, for a loaded machine); a full
// resume from the backup alone then gives the final values.
//
// Retention is the minimum (RetainEpochs 1): what is measured is the
// pipeline's own overhead, not history a user asked to keep. While the run
// goes on, sizes swing between compactions and checkpoints (an old
// compacted object lives until its retention ends, a write-ahead log until
// its checkpoint), so the peaks are checked against looser bounds that
// still catch unbounded growth. Epochs are paced as a real epoch interval
// would pace them (20 ms of "processing" each), so background compaction
// and GC get their turn.
//
// The live state is measured the way the stores hold it: written once to
// a fresh flow in two epochs (the second under half of the keys, so the
// local store keeps the epoch index a store taking partial epochs has).
func TestBoundedGrowthAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("a scale test (about a minute): run without -short")
	}
	const keys, changed, epochs = 100_000, 10_000, 300
	ctx := context.Background()
	h := newHarness(t)
	cfg := h.config(1, func(c *durable.Config) { c.RetainEpochs = 1 })
	run, _ := h.open(cfg)
	rng := rand.New(rand.NewSource(300))
	final := make(map[string]string, keys)
	value := func(k, e int) string { return fmt.Sprintf("(%d, %q)", k+e, strings.Repeat("v", 60)) }
	var maxDurable, maxLocal int64
	started := time.Now()
	for e := 1; e <= epochs; e++ {
		var rows []rowbatch.Row
		if e == 1 {
			rows = make([]rowbatch.Row, 0, keys)
			for k := 0; k < keys; k++ {
				rows = append(rows, scaleRow(k, value(k, 0), final))
			}
		} else {
			rows = make([]rowbatch.Row, 0, changed)
			for _, k := range rng.Perm(keys)[:changed] {
				rows = append(rows, scaleRow(k, value(k, e), final))
			}
		}
		_, err := run.Write(ctx, 0, rowbatch.NewBatch(int64(e), rows, e == 1))
		require.NoError(t, err)
		require.NoError(t, run.CloseEpoch(0, int64(e)))
		time.Sleep(20 * time.Millisecond)
		if e > 20 && e%10 == 0 { // past the first compaction cycle
			maxDurable = max(maxDurable, dirBytes(t, h.bdir, "*"))
			maxLocal = max(maxLocal, localBytes(t, h.local))
		}
	}
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())
	elapsed := time.Since(started)
	endDurable, endLocal := dirBytes(t, h.bdir, "*"), localBytes(t, h.local)
	refSegments, refLocal := scaleReference(t, final)
	report := fmt.Sprintf("%d epochs in %.1f s; live state %d B serialized, %d B as a local store; "+
		"durable max %d (%.2fx) end %d (%.2fx); local max %d (%.2fx) end %d (%.2fx)",
		epochs, elapsed.Seconds(), refSegments, refLocal,
		maxDurable, ratio(maxDurable, refSegments), endDurable, ratio(endDurable, refSegments),
		maxLocal, ratio(maxLocal, refLocal), endLocal, ratio(endLocal, refLocal))
	t.Log(report)
	assert.LessOrEqual(t, endDurable, 3*refSegments, report)
	// 1.74-1.88x on a quiet machine; 2.02x in a CI run whose test lanes
	// ran beside it, where Finish cut a slower GC round short (the next
	// run collects what it left).
	assert.LessOrEqual(t, endLocal, 9*refLocal/4, report)
	assert.LessOrEqual(t, maxDurable, 4*refSegments, report)
	assert.LessOrEqual(t, maxLocal, 8*refLocal, report)

	h.wipeLocal()
	run, infos := h.open(h.config(1))
	assert.Equal(t, []string{durable.ResumeFull}, kinds(infos))
	assert.Equal(t, int64(epochs+1), run.ResumeEpoch())
	got := stateOf(t, run, 1, h.kgc)
	require.Len(t, got, keys)
	for _, k := range rng.Perm(keys)[:500] {
		key := fmt.Sprintf("key%06d", k)
		assert.Equal(t, final[key], got[mkey("state", key)])
	}
}

func scaleRow(k int, v string, final map[string]string) rowbatch.Row {
	key := fmt.Sprintf("key%06d", k)
	final[key] = v
	return rowbatch.Row{StepID: "state", Key: key, Value: []byte(v)}
}

// scaleReference writes final once to a fresh flow and returns the bytes
// of its segments and of its local store.
func scaleReference(t *testing.T, final map[string]string) (segments, local int64) {
	t.Helper()
	ctx := context.Background()
	h := newHarness(t)
	run, _ := h.open(h.config(1, func(c *durable.Config) { c.CompactMinBytes = 1 << 40 }))
	rows := make([]rowbatch.Row, 0, len(final))
	for k, v := range final {
		rows = append(rows, rowbatch.Row{StepID: "state", Key: k, Value: []byte(v)})
	}
	cut := len(rows) * 3 / 5
	for e, part := range [][]rowbatch.Row{rows[:cut], rows[cut:]} {
		_, err := run.Write(ctx, 0, rowbatch.NewBatch(int64(e+1), part, false))
		require.NoError(t, err)
		require.NoError(t, run.CloseEpoch(0, int64(e+1)))
	}
	require.NoError(t, run.Finish(false))
	require.NoError(t, run.Close())
	return dirBytes(t, filepath.Join(h.bdir, testFlow, "segments"), "*"), localBytes(t, h.local)
}

// dirBytes sums the sizes of the files under dir whose names match pattern.
func dirBytes(t *testing.T, dir, pattern string) int64 {
	t.Helper()
	var n int64
	// The run's uploads and GC go on while the test samples sizes, so a
	// temporary file can be renamed or a segment deleted between the
	// listing and the stat; such a file no longer counts.
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || d.IsDir() {
			return err
		}
		if ok, _ := filepath.Match(pattern, d.Name()); ok {
			info, err := d.Info()
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	require.NoError(t, err)
	return n
}

// localBytes is the size of worker 0's local store with its write-ahead log.
func localBytes(t *testing.T, local string) int64 {
	return dirBytes(t, filepath.Join(local, testFlow, "worker-0000"), "store.sqlite*")
}

func ratio(a, b int64) float64 { return float64(a) / float64(b) }
