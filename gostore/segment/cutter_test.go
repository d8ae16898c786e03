package segment

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

func rows(keys ...string) []rowbatch.Row {
	out := make([]rowbatch.Row, len(keys))
	for i, k := range keys {
		out[i] = rowbatch.Row{StepID: "s", Key: k, Value: []byte(k)}
	}
	return out
}

func meta() snapfile.Meta {
	return snapfile.Meta{FlowID: "f", WorkerIndex: 0, WorkerCount: 1, KeyGroupCount: 8, Execution: 2}
}

func TestModes(t *testing.T) {
	log := []Event{
		{Epoch: 1, Rows: rows("a", "b")},
		{Epoch: 1, Rows: rows("c")},
		{Epoch: 1, Close: true},
		{Epoch: 2, Close: true}, // an empty epoch
		{Epoch: 3, Rows: rows("a")},
		{Epoch: 3, Close: true},
	}
	cases := []struct {
		mode     Mode
		segments []int64 // rows per emitted segment
		epochs   []int64
	}{
		{PerEpoch, []int64{3, 1}, []int64{1, 3}},
		{PerBatch, []int64{2, 1, 1}, []int64{1, 1, 3}},
	}
	for _, c := range cases {
		t.Run(c.mode.String(), func(t *testing.T) {
			ctx := context.Background()
			var got []Segment
			cut, err := NewCutter(Config{Mode: c.mode, Dir: t.TempDir(), Meta: meta(),
				Emit: func(s Segment) error { got = append(got, s); return nil }})
			require.NoError(t, err)
			for _, ev := range log {
				require.NoError(t, cut.Apply(ctx, ev))
			}
			require.NoError(t, cut.Close())
			require.Len(t, got, len(c.segments))
			for i, s := range got {
				assert.Equal(t, c.segments[i], s.Rows)
				assert.Equal(t, int64(i), s.Seq)
				f, err := snapfile.Open(ctx, s.Path, snapfile.Options{Segment: true})
				require.NoError(t, err, "a finished segment is sealed and readable")
				m := f.Meta()
				assert.Equal(t, snapfile.KindSegment, m.Kind)
				assert.Equal(t, c.epochs[i], m.FirstEpoch)
				assert.Equal(t, c.epochs[i], m.LastEpoch)
				assert.Equal(t, int64(2), m.Execution)
				st, err := f.Stats(ctx)
				require.NoError(t, err)
				assert.Equal(t, s.Rows, st.Rows)
				require.NoError(t, f.Close())
			}
		})
	}
}

func TestCloseDiscardsUnfinishedSegment(t *testing.T) {
	dir := t.TempDir()
	cut, err := NewCutter(Config{Mode: PerEpoch, Dir: dir, Meta: meta(), Emit: func(Segment) error { return nil }})
	require.NoError(t, err)
	require.NoError(t, cut.Apply(context.Background(), Event{Epoch: 1, Rows: rows("a")}))
	require.NoError(t, cut.Close())
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	assert.Empty(t, left)
}

func TestConfigErrors(t *testing.T) {
	_, err := NewCutter(Config{Mode: PerEpoch})
	require.ErrorContains(t, err, "directory")
	_, err = NewCutter(Config{Mode: Mode(7), Dir: t.TempDir(), Emit: func(Segment) error { return nil }})
	require.ErrorContains(t, err, "unknown mode")
}

// A segment whose first batch is large gets large pages; a small one keeps
// small pages, so a quiet epoch's segment stays a few KiB.
func TestSegmentPageSizeFollowsTheFirstBatch(t *testing.T) {
	cases := []struct {
		name string
		rows int
		page int
	}{
		{"small batch", 10, 1024},
		{"large batch", snapfile.LargePageRows, snapfile.LargePageSize},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			keys := make([]string, c.rows)
			for i := range keys {
				keys[i] = fmt.Sprintf("k%06d", i)
			}
			var got []Segment
			cut, err := NewCutter(Config{Mode: PerEpoch, Dir: t.TempDir(), Meta: meta(),
				Emit: func(s Segment) error { got = append(got, s); return nil }})
			require.NoError(t, err)
			require.NoError(t, cut.Apply(ctx, Event{Epoch: 1, Rows: rows(keys...)}))
			require.NoError(t, cut.Apply(ctx, Event{Epoch: 1, Close: true}))
			require.NoError(t, cut.Close())
			require.Len(t, got, 1)
			db, err := sql.Open("sqlite", got[0].Path)
			require.NoError(t, err)
			defer db.Close()
			var page, vacuum int
			require.NoError(t, db.QueryRow(`PRAGMA page_size`).Scan(&page))
			assert.Equal(t, c.page, page)
			// A large segment can become a local store, which gives freed
			// pages back to the disk (incremental auto-vacuum, 2).
			require.NoError(t, db.QueryRow(`PRAGMA auto_vacuum`).Scan(&vacuum))
			assert.Equal(t, c.page == snapfile.LargePageSize, vacuum == 2)
		})
	}
}

// A segment counts its deletion records, whichever way it was written
// (built from a large first batch, or INSERTed), so that a local store
// adopting a copy drops them only when there are some: the count may
// only exceed the records the file holds, never fall short of them.
func TestSegmentsCountTheirDeletions(t *testing.T) {
	batch := func(n, deleted int) []rowbatch.Row {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%06d", i)
		}
		out := rows(keys...)
		for i := 0; i < deleted; i++ {
			out[i*7%n] = rowbatch.Row{StepID: "s", Key: out[i*7%n].Key, Deleted: true}
		}
		return out
	}
	cases := []struct {
		name    string
		mode    Mode
		batches [][]rowbatch.Row
		want    []int64 // deletions per emitted segment
	}{
		{"small, none", PerEpoch, [][]rowbatch.Row{batch(10, 0)}, []int64{0}},
		{"small, some", PerEpoch, [][]rowbatch.Row{batch(10, 3)}, []int64{3}},
		{"built, none", PerEpoch, [][]rowbatch.Row{batch(snapfile.LargePageRows, 0)}, []int64{0}},
		{"built, some", PerEpoch, [][]rowbatch.Row{batch(snapfile.LargePageRows, 5)}, []int64{5}},
		{"built, then a batch with some", PerEpoch, [][]rowbatch.Row{batch(snapfile.LargePageRows, 0), batch(4, 2)}, []int64{2}},
		{"per batch", PerBatch, [][]rowbatch.Row{batch(10, 1), batch(10, 0)}, []int64{1, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			var got []Segment
			cut, err := NewCutter(Config{Mode: c.mode, Dir: t.TempDir(), Meta: meta(),
				Emit: func(s Segment) error { got = append(got, s); return nil }})
			require.NoError(t, err)
			for _, b := range c.batches {
				require.NoError(t, cut.Apply(ctx, Event{Epoch: 1, Rows: b}))
			}
			require.NoError(t, cut.Apply(ctx, Event{Epoch: 1, Close: true}))
			require.NoError(t, cut.Close())
			require.Len(t, got, len(c.want))
			for i, s := range got {
				assert.Equal(t, c.want[i], s.Deletions)
				db, err := sql.Open("sqlite", "file:"+s.Path+"?mode=ro")
				require.NoError(t, err)
				var held int64
				require.NoError(t, db.QueryRow(`SELECT count(*) FROM snaps WHERE value IS NULL`).Scan(&held))
				require.NoError(t, db.Close())
				assert.LessOrEqual(t, held, s.Deletions, "the file holds no deletion the count misses")
				assert.Equal(t, c.want[i] > 0, held > 0)
			}
		})
	}
}
