package snapfile

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
)

// base writes n keys of 200-byte values at epoch 1, so that later small
// batches are small next to the store and go to the recent table.
func base(t *testing.T, f *File, n int) {
	t.Helper()
	rows := make([]rowbatch.Row, n)
	for i := range rows {
		rows[i] = rowbatch.Row{StepID: "s", Key: fmt.Sprintf("k%05d", i), Epoch: 1, Value: make([]byte, 200)}
	}
	_, err := f.Write(context.Background(), rows)
	require.NoError(t, err)
	require.Zero(t, f.RecentRows(), "a batch as large as the store goes to snaps")
}

func TestSmallBatchesAreBufferedAndReadsMergeBothTables(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	base(t, f, 2000)
	_, err := f.Write(ctx, []rowbatch.Row{row("s", "k00007", 2, "seven"), del("s", "k00008", 2), row("t", "new", 2, "n")})
	require.NoError(t, err)
	assert.Equal(t, int64(3), f.RecentRows())

	r, found, err := f.Get(ctx, "s", "k00007", 0)
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, "seven", string(r.Value))
	r, _, err = f.Get(ctx, "s", "k00007", 2) // before epoch 2: the base row
	require.NoError(t, err)
	assert.Equal(t, 200, len(r.Value))
	r, _, err = f.Get(ctx, "s", "k00008", 0)
	require.NoError(t, err)
	assert.True(t, r.Deleted)

	steps, err := f.Steps(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"s", "t"}, steps)
	got := scanAll(t, f, ScanOptions{ChunkRows: 64})
	assert.Len(t, got, 2000)
	assert.Equal(t, "seven", got["s/k00007"])
	assert.Equal(t, "n", got["t/new"])
	assert.NotContains(t, got, "s/k00008")
	st, err := f.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2003), st.Rows)
	assert.Equal(t, int64(2), st.MaxEpoch)

	moved, err := f.FoldRecent(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(3), moved)
	assert.Zero(t, f.RecentRows())
	assert.Equal(t, got, scanAll(t, f, ScanOptions{ChunkRows: 64}), "folding changes no reading")
}

// A key rewritten within one epoch (immediate mode writes every batch) may
// have its older write in snaps and its newer one in recent: the newer
// wins in every read, before and after the fold.
func TestNewerWriteInRecentWinsOverSameEpochInSnaps(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	base(t, f, 2000)
	_, err := f.Write(ctx, []rowbatch.Row{row("s", "k00001", 1, "rewritten")})
	require.NoError(t, err)
	require.Equal(t, int64(1), f.RecentRows())
	check := func() {
		r, _, err := f.Get(ctx, "s", "k00001", 0)
		require.NoError(t, err)
		assert.Equal(t, "rewritten", string(r.Value))
		assert.Equal(t, "rewritten", scanAll(t, f, ScanOptions{ChunkRows: 7})["s/k00001"])
	}
	check()
	_, err = f.FoldRecent(ctx)
	require.NoError(t, err)
	check()
}

func TestLargeBatchFoldsTheBufferFirst(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	base(t, f, 2000)
	_, err := f.Write(ctx, []rowbatch.Row{row("s", "k00001", 2, "small")})
	require.NoError(t, err)
	big := make([]rowbatch.Row, 2000)
	for i := range big {
		big[i] = rowbatch.Row{StepID: "s", Key: fmt.Sprintf("k%05d", i), Epoch: 2, Value: make([]byte, 300)}
	}
	big[1].Value = []byte("big")
	_, err = f.Write(ctx, big)
	require.NoError(t, err)
	assert.Zero(t, f.RecentRows())
	r, _, err := f.Get(ctx, "s", "k00001", 0)
	require.NoError(t, err)
	assert.Equal(t, "big", string(r.Value), "the later write wins")
}

func TestRollbackAndGCCoverTheBuffer(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	base(t, f, 2000)
	_, err := f.Write(ctx, []rowbatch.Row{row("s", "k00001", 2, "two"), row("s", "k00002", 3, "three")})
	require.NoError(t, err)
	n, err := f.DeleteFrom(ctx, 3)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	got := scanAll(t, f, ScanOptions{})
	assert.Equal(t, "two", got["s/k00001"])
	assert.Len(t, got["s/k00002"], 200)

	removed, err := f.GC(ctx, 1, 2)
	require.NoError(t, err)
	assert.Equal(t, int64(1), removed, "the epoch-1 row of k00001")
	assert.Zero(t, f.RecentRows(), "GC folds first")
	st, err := f.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2000), st.Rows)
}

func TestBufferSurvivesReopenAndOldStoresGetIt(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.sqlite")
	f, err := Create(ctx, path, testMeta(), Options{})
	require.NoError(t, err)
	base(t, f, 2000)
	_, err = f.Write(ctx, []rowbatch.Row{row("s", "k00003", 2, "buffered")})
	require.NoError(t, err)
	require.NoError(t, f.Close())

	f, err = Open(ctx, path, Options{})
	require.NoError(t, err)
	assert.Equal(t, int64(1), f.RecentRows())
	assert.Equal(t, "buffered", scanAll(t, f, ScanOptions{})["s/k00003"])
	// A store from before the buffer existed: no recent table until its
	// first buffered write.
	_, err = f.FoldRecent(ctx)
	require.NoError(t, err)
	_, err = f.db.ExecContext(ctx, `DROP TABLE recent`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	f, err = Open(ctx, path, Options{})
	require.NoError(t, err)
	defer f.Close()
	assert.False(t, f.hasRecent)
	assert.Equal(t, "buffered", scanAll(t, f, ScanOptions{})["s/k00003"])
	_, err = f.Write(ctx, []rowbatch.Row{row("s", "k00003", 3, "again")})
	require.NoError(t, err)
	assert.True(t, f.hasRecent)
	assert.Equal(t, "again", scanAll(t, f, ScanOptions{})["s/k00003"])
}

// Random writes (small ones buffered, large ones not), folds, GCs,
// rollbacks and reopens, checked against a map of every row.
//
// Six seeds; two under the race detector, where each takes some ten
// seconds (`make test` also runs this test without it, every seed).
func TestBufferedStoreMatchesAModel(t *testing.T) {
	ctx := context.Background()
	seeds := uint64(6)
	if raceDetector {
		seeds = 2
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			path := filepath.Join(t.TempDir(), "s.sqlite")
			f, err := Create(ctx, path, testMeta(), Options{})
			require.NoError(t, err)
			defer func() { f.Close() }()
			// Odd seeds collect and fold a few keys at a time, across
			// chunks.
			chunk := 0
			if seed%2 == 1 {
				chunk = 1 + int(seed)
			}
			f.gcChunk, f.foldChunk = chunk, chunk
			type pk struct {
				key   string
				epoch int64
			}
			model := map[pk]string{} // "" is a deletion
			epoch, committed, gcSince := int64(1), int64(0), int64(0)
			buffered := 0
			for op := 0; op < 60; op++ {
				switch x := rng.IntN(10); {
				case x < 6: // write a batch at the current epoch
					n := 1 + rng.IntN(20)
					if rng.IntN(5) == 0 {
						n = 300 + rng.IntN(300) // large: straight to snaps
					}
					rows := make([]rowbatch.Row, n)
					for i := range rows {
						k := fmt.Sprintf("k%03d", rng.IntN(400))
						v := fmt.Sprintf("%s@%d#%d.%d-%s", k, epoch, op, i, string(make([]byte, rng.IntN(300))))
						if rng.IntN(8) == 0 {
							rows[i] = del("s", k, epoch)
							model[pk{k, epoch}] = ""
						} else {
							rows[i] = row("s", k, epoch, v)
							model[pk{k, epoch}] = v
						}
					}
					before := f.RecentRows()
					_, err := f.Write(ctx, rows)
					require.NoError(t, err)
					if f.RecentRows() > before {
						buffered++
					}
					if rng.IntN(2) == 0 {
						committed = epoch
						epoch++
					}
				case x == 6:
					_, err := f.FoldRecent(ctx)
					require.NoError(t, err)
				case x == 7 && committed > gcSince:
					_, err := f.GC(ctx, gcSince, committed)
					require.NoError(t, err)
					// what GC may drop: versions older than a key's newest
					// at or before committed, and deletions at or before it
					newest := map[string]int64{}
					for p := range model {
						if p.epoch <= committed && p.epoch > newest[p.key] {
							newest[p.key] = p.epoch
						}
					}
					for p, v := range model {
						if p.epoch < newest[p.key] || (p.epoch <= committed && v == "") {
							delete(model, p)
						}
					}
					gcSince = committed
					// And nothing more is left: every superseded row went.
					var rows int
					require.NoError(t, f.db.QueryRowContext(ctx, `SELECT count(*) FROM snaps`).Scan(&rows))
					require.Equal(t, len(model), rows, "rows left after GC, op %d", op)
				case x == 8: // roll back the epochs after the committed one
					_, err := f.DeleteFrom(ctx, committed+1)
					require.NoError(t, err)
					for p := range model {
						if p.epoch > committed {
							delete(model, p)
						}
					}
					epoch = committed + 1
				case x == 9:
					require.NoError(t, f.Close())
					f, err = Open(ctx, path, Options{})
					require.NoError(t, err)
					f.gcChunk, f.foldChunk = chunk, chunk
				}
				// Reads: the newest row per key, live or deleted.
				want := map[string]string{}
				newest := map[string]int64{}
				for p, v := range model {
					if e, ok := newest[p.key]; !ok || p.epoch > e {
						newest[p.key] = p.epoch
						want["s/"+p.key] = v
					}
				}
				for k, v := range want {
					if v == "" {
						delete(want, k)
					}
				}
				got := scanAll(t, f, ScanOptions{ChunkRows: 1 + rng.IntN(50)})
				require.Equal(t, want, got, "op %d", op)
				k := fmt.Sprintf("k%03d", rng.IntN(400))
				r, found, err := f.Get(ctx, "s", k, 0)
				require.NoError(t, err)
				if v, ok := want["s/"+k]; ok {
					require.True(t, found)
					require.Equal(t, v, string(r.Value))
				} else if found {
					require.True(t, r.Deleted, "key %s", k)
				}
			}
			assert.Positive(t, buffered, "some writes went through the buffer")
		})
	}
}

// A fold moves the recent table a chunk of rows per statement: whatever
// the chunk size, every row moves once, across steps, keys and epochs, a
// row in recent replaces the snaps row of the same key and epoch, and
// nothing else of snaps changes.
func TestFoldMovesEveryChunk(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct{ rows, chunk int }{
		{1, 1}, {2, 1}, {5, 2}, {6, 2}, {7, 3}, {9, 3}, {10, 3}, {255, 256}, {256, 256}, {257, 256}, {600, 256},
	} {
		t.Run(fmt.Sprintf("%d rows, chunks of %d", tc.rows, tc.chunk), func(t *testing.T) {
			f := newFile(t)
			base(t, f, 2000)
			f.foldChunk = tc.chunk
			want := scanAll(t, f, ScanOptions{ChunkRows: 500})
			rows := make([]rowbatch.Row, 0, tc.rows)
			for i := 0; len(rows) < tc.rows; i++ {
				// Two steps, some keys of the base (epoch 1 replaced in
				// place, or a newer epoch), some new, a deletion now and then.
				step, key, epoch := "s", fmt.Sprintf("k%05d", (i*7)%2000), int64(1+i%3)
				if i%5 == 4 {
					step, key = "t", fmt.Sprintf("n%04d", i)
				}
				v := fmt.Sprintf("%s/%s@%d", step, key, epoch)
				if i%11 == 10 {
					rows = append(rows, del(step, key, epoch))
				} else {
					rows = append(rows, row(step, key, epoch, v))
				}
			}
			// Small batches, so that every row goes to the recent table.
			for start := 0; start < len(rows); start += 20 {
				batch := rows[start:min(start+20, len(rows))]
				_, err := f.Write(ctx, batch)
				require.NoError(t, err)
			}
			require.Equal(t, int64(len(rows)), f.RecentRows())
			before := scanAll(t, f, ScanOptions{ChunkRows: 500})

			moved, err := f.FoldRecent(ctx)
			require.NoError(t, err)
			assert.Equal(t, int64(len(rows)), moved)
			var left int
			require.NoError(t, f.db.QueryRowContext(ctx, `SELECT count(*) FROM recent`).Scan(&left))
			assert.Zero(t, left)
			assert.Equal(t, before, scanAll(t, f, ScanOptions{ChunkRows: 500}), "folding changes no reading")
			// What changed against the base is exactly what was written.
			for _, r := range rows {
				if r.Deleted {
					delete(want, r.StepID+"/"+r.Key)
				} else {
					want[r.StepID+"/"+r.Key] = string(r.Value)
				}
			}
			assert.Equal(t, want, before)
		})
	}
}

// GC frees pages; Reclaim gives them back to the disk once they are a
// noticeable share of the file.
func TestReclaimShrinksTheFileAfterGC(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	var av int
	require.NoError(t, f.db.QueryRowContext(ctx, `PRAGMA auto_vacuum`).Scan(&av))
	require.Equal(t, 2, av, "local stores are created with incremental auto-vacuum")
	for e := int64(1); e <= 3; e++ {
		rows := make([]rowbatch.Row, 3000)
		for i := range rows {
			rows[i] = rowbatch.Row{StepID: "s", Key: fmt.Sprintf("k%05d", i), Epoch: e, Value: make([]byte, 300)}
		}
		_, err := f.Write(ctx, rows)
		require.NoError(t, err)
	}
	pages := func() (n int64) {
		require.NoError(t, f.db.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&n))
		return n
	}
	before := pages()
	_, err := f.GC(ctx, 0, 3)
	require.NoError(t, err)
	freed, err := f.Reclaim(ctx, false)
	require.NoError(t, err)
	assert.Greater(t, freed, before/2, "two of three versions went")
	assert.LessOrEqual(t, pages(), before-freed)
	assert.Len(t, scanAll(t, f, ScanOptions{}), 3000)
	freed, err = f.Reclaim(ctx, false)
	require.NoError(t, err)
	assert.Zero(t, freed, "nothing left to give back")
}

// A local store's first write goes in without the epoch index; the index
// is built after it (in the background by the store's owner, or by the
// first GC, rollback or second large write), and rows written before it
// are found by GC and rollback all the same.
func TestEpochIndexIsBuiltAfterTheFirstWrite(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	assert.True(t, f.IndexPending())
	base(t, f, 3000)
	assert.True(t, f.IndexPending(), "the first write skipped the index")
	require.NoError(t, f.EnsureIndex(ctx))
	assert.False(t, f.IndexPending())
	// The index sorts through temporary files; the connection then goes
	// back to keeping temporary data in memory (2).
	var store int
	require.NoError(t, f.db.QueryRowContext(ctx, `PRAGMA temp_store`).Scan(&store))
	assert.Equal(t, 2, store)

	g := newFile(t)
	base(t, g, 3000)
	big := make([]rowbatch.Row, 3000)
	for i := range big {
		big[i] = rowbatch.Row{StepID: "s", Key: fmt.Sprintf("k%05d", i), Epoch: 2, Value: []byte("two")}
	}
	_, err := g.Write(ctx, big)
	require.NoError(t, err)
	assert.False(t, g.IndexPending(), "a write into a non-empty snaps builds the index first")
	removed, err := g.GC(ctx, 0, 2)
	require.NoError(t, err)
	assert.Equal(t, int64(3000), removed, "the unindexed first write's rows are superseded")

	h := newFile(t)
	base(t, h, 3000)
	n, err := h.DeleteFrom(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, int64(3000), n)
	assert.False(t, h.IndexPending())
	assert.Empty(t, scanAll(t, h, ScanOptions{}))
}

// Where SQLite cannot write a temporary file (no writable temporary
// directory, a full one), the epoch index is sorted in memory instead; if
// that fails too, the error names the file, and the index stays pending.
func TestEpochIndexFallsBackToMemoryWithoutTemporaryFiles(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		failed map[string]bool
		built  bool
	}{
		{"files work", nil, true},
		{"no temporary directory", map[string]bool{"FILE": true}, true},
		{"neither works", map[string]bool{"FILE": true, "MEMORY": true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFile(t)
			base(t, f, 3000)
			var tried []string
			f.indexFaults = func(store string) error {
				tried = append(tried, store)
				if tc.failed[store] {
					return fmt.Errorf("unable to open a temporary file (%s)", store)
				}
				return nil
			}
			err := f.EnsureIndex(ctx)
			var store int
			require.NoError(t, f.db.QueryRowContext(ctx, `PRAGMA temp_store`).Scan(&store))
			assert.Equal(t, 2, store, "the connection keeps its journals in memory again")
			if !tc.built {
				require.Error(t, err)
				assert.Contains(t, err.Error(), f.path)
				assert.True(t, f.IndexPending())
				assert.Equal(t, []string{"FILE", "MEMORY"}, tried)
				return
			}
			require.NoError(t, err)
			assert.False(t, f.IndexPending())
			assert.Equal(t, "FILE", tried[0], "files first")
			var idx int
			require.NoError(t, f.db.QueryRowContext(ctx,
				`SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'snaps_by_epoch'`).Scan(&idx))
			assert.Equal(t, 1, idx)
			n, err := f.DeleteFrom(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, int64(3000), n, "the index serves a rollback")
		})
	}
}

// countingCtx counts the calls of Err and, once limit of them were
// answered, reports the context as cancelled.
type countingCtx struct {
	context.Context
	calls, limit int
}

func (c *countingCtx) Err() error {
	c.calls++
	if c.limit > 0 && c.calls > c.limit {
		return context.Canceled
	}
	return nil
}

// A GC cancelled while it goes through the keys stops there and rolls its
// round back: the end of a run does not wait for it, and the next round
// collects everything.
func TestGCStopsWhenCancelledAndRollsBack(t *testing.T) {
	fill := func() *File {
		f := newFile(t)
		for e := int64(1); e <= 2; e++ {
			rows := make([]rowbatch.Row, 5000)
			for i := range rows {
				rows[i] = rowbatch.Row{StepID: "s", Key: fmt.Sprintf("k%05d", i), Epoch: e, Value: []byte("v")}
			}
			_, err := f.Write(context.Background(), rows)
			require.NoError(t, err)
		}
		return f
	}
	// The last check of an uncancelled GC is in its loop over the keys
	// (5000 keys are checked every gcCheckEvery): cancelling there stops it
	// half-way.
	probe := &countingCtx{Context: context.Background()}
	removed, err := fill().GC(probe, 0, 2)
	require.NoError(t, err)
	require.Equal(t, int64(5000), removed)
	require.Greater(t, probe.calls, 5000/gcCheckEvery, "GC checks its context as it goes")

	f := fill()
	_, err = f.GC(&countingCtx{Context: context.Background(), limit: probe.calls - 1}, 0, 2)
	require.ErrorIs(t, err, context.Canceled)
	st, err := f.Stats(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(10000), st.Rows, "the cancelled round removed nothing")
	removed, err = f.GC(context.Background(), 0, 2)
	require.NoError(t, err)
	assert.Equal(t, int64(5000), removed, "the next round collects it all")
	assert.Len(t, scanAll(t, f, ScanOptions{}), 5000)
}
