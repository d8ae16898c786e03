package durable

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// segmentsOf writes each row set to a segment file and opens walks over
// them for keys in groups, up to epoch before (exclusive).
func segmentsOf(t *testing.T, sets [][]rowbatch.Row, groups keygroup.Range, before int64) []*objectRows {
	t.Helper()
	ctx := context.Background()
	var objs []*objectRows
	for i, rows := range sets {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("%d.sqlite", i))
		meta := snapfile.Meta{FlowID: "f", Kind: snapfile.KindSegment, WorkerCount: 1, KeyGroupCount: 16}
		f, err := snapfile.Create(ctx, path, meta, snapfile.Options{Segment: true})
		require.NoError(t, err)
		if len(rows) > 0 {
			_, err = f.Write(ctx, append([]rowbatch.Row(nil), rows...))
			require.NoError(t, err)
		}
		require.NoError(t, f.Seal())
		g, err := snapfile.Open(ctx, path, snapfile.Options{Segment: true})
		require.NoError(t, err)
		t.Cleanup(func() { g.Close() })
		objs = append(objs, &objectRows{name: path, f: g, opts: snapfile.ScanOptions{
			Groups: &groups, IncludeDeleted: true, Before: before, ChunkRows: 3,
		}})
	}
	return objs
}

func merged(t *testing.T, objs []*objectRows, chunk int) []rowbatch.Row {
	t.Helper()
	var out []rowbatch.Row
	require.NoError(t, mergeNewest(context.Background(), objs, chunk, func(rows []rowbatch.Row) error {
		assert.LessOrEqual(t, len(rows), chunk)
		out = append(out, rows...)
		return nil
	}))
	return out
}

func put(step, key string, epoch int64, v string) rowbatch.Row {
	return rowbatch.Row{StepID: step, Key: key, Epoch: epoch, Value: []byte(v)}
}

func gone(step, key string, epoch int64) rowbatch.Row {
	return rowbatch.Row{StepID: step, Key: key, Epoch: epoch, Deleted: true}
}

func TestMergeNewestPicksTheNewestRowPerKey(t *testing.T) {
	all := keygroup.Range{Lo: 0, Hi: 16}
	cases := []struct {
		name   string
		sets   [][]rowbatch.Row
		before int64
		want   []rowbatch.Row
	}{
		{"newer object wins", [][]rowbatch.Row{
			{put("s", "a", 1, "a1"), put("s", "b", 1, "b1")},
			{put("s", "a", 2, "a2")},
		}, 0, []rowbatch.Row{put("s", "a", 2, "a2"), put("s", "b", 1, "b1")}},
		{"same epoch: the later object wins", [][]rowbatch.Row{
			{put("s", "a", 3, "first")},
			{put("s", "a", 3, "second")},
		}, 0, []rowbatch.Row{put("s", "a", 3, "second")}},
		{"a newest deletion leaves the key out", [][]rowbatch.Row{
			{put("s", "a", 1, "a1"), put("s", "b", 1, "b1")},
			{gone("s", "a", 2)},
		}, 0, []rowbatch.Row{put("s", "b", 1, "b1")}},
		{"a key set again after its deletion comes back", [][]rowbatch.Row{
			{put("s", "a", 1, "a1")},
			{gone("s", "a", 2)},
			{put("s", "a", 3, "a3")},
		}, 0, []rowbatch.Row{put("s", "a", 3, "a3")}},
		{"rows past the bound are not read", [][]rowbatch.Row{
			{put("s", "a", 1, "a1")},
			{put("s", "a", 5, "a5"), put("s", "z", 5, "z5")},
		}, 5, []rowbatch.Row{put("s", "a", 1, "a1")}},
		{"steps in order, keys in order within them", [][]rowbatch.Row{
			{put("t", "a", 1, "ta"), put("s", "b", 1, "sb")},
			{put("s", "a", 2, "sa"), put("t", "0", 2, "t0")},
		}, 0, []rowbatch.Row{put("s", "a", 2, "sa"), put("s", "b", 1, "sb"), put("t", "0", 2, "t0"), put("t", "a", 1, "ta")}},
		{"no objects", nil, 0, nil},
		{"empty objects", [][]rowbatch.Row{{}, {}}, 0, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := merged(t, segmentsOf(t, c.sets, all, c.before), 2)
			require.Equal(t, len(c.want), len(got), "%v", got)
			for i := range c.want {
				assert.Equal(t, c.want[i].StepID, got[i].StepID)
				assert.Equal(t, c.want[i].Key, got[i].Key)
				assert.Equal(t, c.want[i].Epoch, got[i].Epoch)
				assert.Equal(t, string(c.want[i].Value), string(got[i].Value))
			}
		})
	}
}

// Random objects against a model: the last write of each key, in object
// order then row order, restricted to owned key groups.
func TestMergeNewestMatchesAModel(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		groups := keygroup.Range{Lo: rng.IntN(8), Hi: 8 + rng.IntN(9)}
		var sets [][]rowbatch.Row
		model := map[string]rowbatch.Row{}
		epoch := int64(0)
		for o := 0; o < 1+rng.IntN(5); o++ {
			epoch += int64(rng.IntN(2)) // immediate mode: several objects in one epoch
			seen := map[string]bool{}
			var rows []rowbatch.Row
			for n := 0; n < rng.IntN(40); n++ {
				step, key := fmt.Sprintf("s%d", rng.IntN(2)), fmt.Sprintf("k%02d", rng.IntN(30))
				if seen[step+"/"+key] {
					continue // one row per key and epoch in an object
				}
				seen[step+"/"+key] = true
				r := put(step, key, epoch+1, fmt.Sprintf("v%d-%d", o, n))
				if rng.IntN(4) == 0 {
					r = gone(step, key, epoch+1)
				}
				rows = append(rows, r)
				if groups.Contains(keygroup.Of(key, 16)) {
					model[step+"\x00"+key] = r
				}
			}
			sets = append(sets, rows)
		}
		got := map[string]rowbatch.Row{}
		var prev string
		for _, r := range merged(t, segmentsOf(t, sets, groups, 0), 1+rng.IntN(5)) {
			k := r.StepID + "\x00" + r.Key
			require.Greater(t, k, prev, "seed %d: rows out of order", seed)
			prev = k
			got[k] = r
		}
		for k, r := range model {
			if r.Deleted {
				assert.NotContains(t, got, k, "seed %d", seed)
				continue
			}
			if assert.Contains(t, got, k, "seed %d", seed) {
				assert.Equal(t, string(r.Value), string(got[k].Value), "seed %d key %q", seed, k)
			}
		}
		for k := range got {
			assert.Contains(t, model, k, "seed %d", seed)
		}
	}
}
