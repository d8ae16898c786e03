package snapfile

import (
	"bytes"
	"compress/gzip"
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
)

// unpackRows decodes a packed page into rows of step, in page order.
func unpackRows(t *testing.T, step string, packed []byte) []rowbatch.Row {
	t.Helper()
	n, w := binary.Uvarint(packed)
	require.Positive(t, w, "count")
	b := packed[w:]
	rows := []rowbatch.Row{}
	for range n {
		kl, w := binary.Uvarint(b)
		require.Positive(t, w)
		key := string(b[w : w+int(kl)])
		b = b[w+int(kl):]
		epoch, w := binary.Uvarint(b)
		require.Positive(t, w)
		b = b[w:]
		tag, w := binary.Uvarint(b)
		require.Positive(t, w)
		b = b[w:]
		r := rowbatch.Row{StepID: step, Key: key, Epoch: int64(epoch), Deleted: tag == 0}
		if tag > 0 {
			r.Value = append([]byte{}, b[:tag-1]...)
			b = b[tag-1:]
		}
		rows = append(rows, r)
	}
	require.Empty(t, b, "bytes after the last entry")
	return rows
}

// getEach is GetManyPacked's model: Get on every distinct key, in key
// order, leaving out keys without a row.
func getEach(t *testing.T, f *File, step string, keys []string, before int64) []rowbatch.Row {
	t.Helper()
	keys = slices.Compact(slices.Sorted(slices.Values(keys)))
	rows := []rowbatch.Row{}
	for _, k := range keys {
		r, found, err := f.Get(context.Background(), step, k, before)
		require.NoError(t, err)
		if found {
			if r.Value == nil && !r.Deleted {
				r.Value = []byte{}
			}
			rows = append(rows, r)
		}
	}
	return rows
}

// getMany reads through GetManyPacked, checking that the reader
// connection of GetManyPackedConcurrent returns the same bytes.
func getMany(t *testing.T, f *File, step string, keys []string, before int64) []rowbatch.Row {
	t.Helper()
	packed, err := f.GetManyPacked(context.Background(), step, keys, before)
	require.NoError(t, err)
	if !f.opts.Segment {
		concurrent, err := f.GetManyPackedConcurrent(context.Background(), step, keys, before)
		require.NoError(t, err)
		require.Equal(t, packed, concurrent, "the reader connection reads what the bulk one does")
	}
	return unpackRows(t, step, packed)
}

// GetManyPackedConcurrent runs while batches are written through the
// file's other methods: each read sees the rows committed before it
// began, whole (every key of a batch at one epoch, never a mix), and a
// read after a write returns sees that write.
func TestGetManyPackedConcurrentReadsWhileTheFileIsWritten(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	keys := make([]string, 300)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%04d", i)
	}
	write := func(epoch int64, n int) {
		rows := make([]rowbatch.Row, 0, len(keys)+n)
		for _, k := range keys {
			rows = append(rows, row("s", k, epoch, fmt.Sprint(epoch)))
		}
		for i := range n { // other keys, so the write takes a while
			rows = append(rows, row("other", fmt.Sprintf("o%06d", i), epoch, "x"))
		}
		_, err := f.Write(ctx, rows)
		require.NoError(t, err)
	}
	write(1, 0)
	epochs := int64(30)
	if raceDetector {
		epochs = 8
	}
	done := make(chan struct{})
	var written atomic.Int64
	written.Store(1)
	go func() {
		defer close(done)
		for e := int64(2); e <= epochs; e++ {
			write(e, 5000)
			written.Store(e)
		}
	}()
	reads := 0
	for running := true; running; reads++ {
		select {
		case <-done:
			running = false
		default:
		}
		floor := written.Load()
		packed, err := f.GetManyPackedConcurrent(ctx, "s", keys, 0)
		require.NoError(t, err)
		rows := unpackRows(t, "s", packed)
		require.Len(t, rows, len(keys))
		for _, r := range rows {
			require.Equal(t, rows[0].Epoch, r.Epoch, "one read sees one batch for every key")
			require.Equal(t, fmt.Sprint(r.Epoch), string(r.Value))
		}
		require.GreaterOrEqual(t, rows[0].Epoch, floor, "a read sees every write that returned before it")
	}
	assert.Greater(t, reads, 1)
	got := getMany(t, f, "s", keys[:3], 0)
	require.Len(t, got, 3)
	assert.Equal(t, epochs, got[0].Epoch)
}

func TestGetManyPackedConcurrentRefusesASegment(t *testing.T) {
	f, err := Create(context.Background(), filepath.Join(t.TempDir(), "seg.sqlite"), testMeta(), Options{Segment: true})
	require.NoError(t, err)
	defer f.Close()
	_, err = f.GetManyPackedConcurrent(context.Background(), "s", []string{"k"}, 0)
	require.ErrorContains(t, err, "write-ahead-logged")
}

func TestGetManyPackedReturnsWhatGetReturnsPerKey(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	base(t, f, 2000) // k00000..k01999 at epoch 1, in snaps
	_, err := f.Write(ctx, []rowbatch.Row{
		row("s", "k00007", 2, "seven"), del("s", "k00008", 2), row("t", "k00007", 2, "other step"),
		row("s", "k00001", 1, "rewritten"), // ties with the snaps row at epoch 1
		row("s", "k00009", 3, ""),          // an empty value is a value, not a deletion
		row("s", "ключ-🦀", 2, "unicode"),
	})
	require.NoError(t, err)
	require.Equal(t, int64(6), f.RecentRows(), "the small batch went to the recent table")
	v200 := string(make([]byte, 200))

	type want struct {
		key     string
		epoch   int64
		val     string
		deleted bool
	}
	for _, tc := range []struct {
		name   string
		keys   []string
		before int64
		want   []want
	}{
		{"no keys", nil, 0, nil},
		{"only missing keys", []string{"nope", "k99999", ""}, 0, nil},
		{"found in snaps", []string{"k00100"}, 0, []want{{"k00100", 1, v200, false}}},
		{"newer in recent", []string{"k00007"}, 0, []want{{"k00007", 2, "seven", false}}},
		{"before bounds the epoch", []string{"k00007"}, 2, []want{{"k00007", 1, v200, false}}},
		{"before below every row", []string{"k00007", "k00100"}, 1, nil},
		{"a deletion is a deletion", []string{"k00008"}, 0, []want{{"k00008", 2, "", true}}},
		{"the deleted key before its deletion", []string{"k00008"}, 2, []want{{"k00008", 1, v200, false}}},
		{"recent wins a tie on epoch", []string{"k00001"}, 0, []want{{"k00001", 1, "rewritten", false}}},
		{"an empty value", []string{"k00009"}, 0, []want{{"k00009", 3, "", false}}},
		{"non-ascii key", []string{"ключ-🦀"}, 0, []want{{"ключ-🦀", 2, "unicode", false}}},
		{"key order, duplicates once, missing left out",
			[]string{"k00009", "missing", "k00001", "k00009", "k00008"}, 0,
			[]want{{"k00001", 1, "rewritten", false}, {"k00008", 2, "", true}, {"k00009", 3, "", false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := getMany(t, f, "s", tc.keys, tc.before)
			exp := []rowbatch.Row{}
			for _, w := range tc.want {
				r := rowbatch.Row{StepID: "s", Key: w.key, Epoch: w.epoch, Deleted: w.deleted}
				if !w.deleted {
					r.Value = []byte(w.val)
				}
				exp = append(exp, r)
			}
			assert.Equal(t, exp, got)
			assert.Equal(t, getEach(t, f, "s", tc.keys, tc.before), got, "as Get on each key")
		})
	}
	assert.Equal(t, []rowbatch.Row{{StepID: "t", Key: "k00007", Epoch: 2, Value: []byte("other step")}},
		getMany(t, f, "t", []string{"k00007", "k00008"}, 0), "only the step asked for")

	_, err = f.FoldRecent(ctx)
	require.NoError(t, err)
	assert.Equal(t, []rowbatch.Row{{StepID: "s", Key: "k00001", Epoch: 1, Value: []byte("rewritten")}},
		getMany(t, f, "s", []string{"k00001"}, 0), "the fold kept the newer write")
}

func TestGetManyPackedFailsOnADamagedRowAsGetDoes(t *testing.T) {
	ctx := context.Background()
	for _, table := range []string{"snaps", "recent"} {
		t.Run(table, func(t *testing.T) {
			f := newFile(t)
			base(t, f, 2000)
			_, err := f.Write(ctx, []rowbatch.Row{row("s", "k00005", 2, "five")})
			require.NoError(t, err)
			// Change a value behind the checksum's back: the file stays well
			// formed, only the row checksum can tell.
			_, err = f.db.ExecContext(ctx, `UPDATE `+table+` SET value = X'00' WHERE state_key = 'k00005'`)
			require.NoError(t, err)

			_, _, getErr := f.Get(ctx, "s", "k00005", 0)
			require.ErrorIs(t, getErr, ErrDamaged)
			_, err = f.GetManyPacked(ctx, "s", []string{"k00004", "k00005", "k00006"}, 0)
			require.ErrorIs(t, err, ErrDamaged)
			var ge, me *DamageError
			require.ErrorAs(t, getErr, &ge)
			require.ErrorAs(t, err, &me)
			assert.Equal(t, ge.Detail, me.Detail)
			assert.Contains(t, err.Error(), "checksum mismatch")

			// Damage to an older version is found too, as Get finds it.
			_, err = f.GetManyPacked(ctx, "s", []string{"k00005"}, 0)
			require.ErrorIs(t, err, ErrDamaged)
			// Keys that do not touch the damaged row still read, and the
			// connection is usable after the failure.
			assert.Len(t, getMany(t, f, "s", []string{"k00004", "k00006"}, 0), 2)
		})
	}
}

func TestGetManyPackedReadsLegacyFilesWithoutChecksums(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.sqlite")
	f, err := Create(ctx, path, testMeta(), Options{})
	require.NoError(t, err)
	_, err = f.Write(ctx, []rowbatch.Row{row("s", "a", 1, "a1"), row("s", "a", 2, "a2"), del("s", "b", 2), row("s", "c", 1, "c1")})
	require.NoError(t, err)
	require.NoError(t, f.Close())

	db, err := sql.Open("sqlite", "file:"+path)
	require.NoError(t, err)
	for _, q := range []string{
		`CREATE TABLE snaps2 (step_id TEXT NOT NULL, state_key TEXT NOT NULL, epoch INTEGER NOT NULL, key_group INTEGER NOT NULL, value BLOB, PRIMARY KEY (step_id, state_key, epoch)) WITHOUT ROWID`,
		`INSERT INTO snaps2 SELECT step_id, state_key, epoch, key_group, value FROM snaps UNION ALL SELECT step_id, state_key, epoch, key_group, value FROM recent`,
		`DROP TABLE snaps`, `DROP TABLE IF EXISTS recent`, `ALTER TABLE snaps2 RENAME TO snaps`,
		`DELETE FROM meta WHERE name IN ('meta_crc', 'committed_epoch')`,
		`UPDATE meta SET value = 'millpond-snapshot-1' WHERE name = 'format'`,
	} {
		_, err := db.Exec(q)
		require.NoError(t, err, q)
	}
	require.NoError(t, db.Close())

	f, err = Open(ctx, path, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	require.False(t, f.RowChecksums())
	keys := []string{"c", "b", "a", "z"}
	got := getMany(t, f, "s", keys, 0)
	assert.Equal(t, []rowbatch.Row{
		{StepID: "s", Key: "a", Epoch: 2, Value: []byte("a2")},
		{StepID: "s", Key: "b", Epoch: 2, Deleted: true},
		{StepID: "s", Key: "c", Epoch: 1, Value: []byte("c1")},
	}, got)
	assert.Equal(t, getEach(t, f, "s", keys, 0), got)
	assert.Equal(t, getEach(t, f, "s", keys, 2), getMany(t, f, "s", keys, 2))
}

// GetManyPacked equals Get on every key, over random histories of writes,
// deletions, rewrites within an epoch and folds, in both tables.
// rowModel is what a file holds, kept in memory: per step and key, the
// last row written at each epoch.
type rowModel map[string]map[int64]rowbatch.Row

func (m rowModel) write(rows []rowbatch.Row) {
	for _, r := range rows {
		id := r.StepID + "\x00" + r.Key
		if m[id] == nil {
			m[id] = map[int64]rowbatch.Row{}
		}
		if !r.Deleted && r.Value == nil {
			r.Value = []byte{}
		}
		m[id][r.Epoch] = r
	}
}

// get is what Get answers for every distinct key, in key order, leaving
// out keys without a row: the row of the newest epoch before before.
func (m rowModel) get(step string, keys []string, before int64) []rowbatch.Row {
	if before <= 0 {
		before = math.MaxInt64
	}
	rows := []rowbatch.Row{}
	for _, k := range slices.Compact(slices.Sorted(slices.Values(keys))) {
		var best *rowbatch.Row
		for e, r := range m[step+"\x00"+k] {
			if e < before && (best == nil || e > best.Epoch) {
				best = &r
			}
		}
		if best != nil {
			rows = append(rows, *best)
		}
	}
	return rows
}

// Get and GetManyPacked share their lookup; both are checked against a
// model of the rows written, over random writes (rewrites of an epoch,
// deletions, rows in the buffer table and folded from it) and queries.
func TestGetAndGetManyPackedAnswerWhatWasWrittenRandomized(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 8 {
		f := newFile(t)
		model := rowModel{}
		rows := make([]rowbatch.Row, 500)
		for i := range rows {
			rows[i] = rowbatch.Row{StepID: "s", Key: fmt.Sprintf("k%05d", i), Epoch: 1, Value: make([]byte, 200)}
		}
		_, err := f.Write(ctx, rows)
		require.NoError(t, err)
		model.write(rows)
		universe := make([]string, 700) // some keys never written
		for i := range universe {
			universe[i] = fmt.Sprintf("k%05d", i)
		}
		universe = append(universe, "", "é", "🦀", "a\x00b")
		for epoch := int64(1); epoch <= 6; epoch++ {
			var batch []rowbatch.Row
			for range rng.IntN(40) {
				k := universe[rng.IntN(len(universe))]
				e := epoch - int64(rng.IntN(2)) // sometimes rewrite the epoch before
				step := []string{"s", "s", "s", "t"}[rng.IntN(4)]
				if rng.IntN(4) == 0 {
					batch = append(batch, del(step, k, e))
				} else {
					batch = append(batch, row(step, k, e, fmt.Sprintf("v%d-%d", e, rng.IntN(1000))))
				}
			}
			_, err := f.Write(ctx, batch)
			require.NoError(t, err)
			model.write(batch)
			if rng.IntN(5) == 0 {
				_, err := f.FoldRecent(ctx)
				require.NoError(t, err)
			}
		}
		sortedUniverse := slices.Sorted(slices.Values(universe))
		for q := range 40 {
			keys := make([]string, rng.IntN(60))
			for i := range keys {
				keys[i] = universe[rng.IntN(len(universe))]
			}
			if q%2 == 1 {
				// Runs of neighbours, with gaps of every length between
				// them: the walk steps through the runs and seeks across
				// the gaps.
				keys = keys[:0]
				for at := rng.IntN(50); at < len(sortedUniverse) && len(keys) < 200; {
					run := 1 + rng.IntN(30)
					keys = append(keys, sortedUniverse[at:min(at+run, len(sortedUniverse))]...)
					at += run + []int{0, 1, 2, 9, 10, 40}[rng.IntN(6)]
				}
			}
			before := int64(rng.IntN(8))
			for _, step := range []string{"s", "t", "nope"} {
				want := model.get(step, keys, before)
				require.Equal(t, want, getEach(t, f, step, keys, before), "Get: round %d query %d step %s before %d", round, q, step, before)
				require.Equal(t, want, getMany(t, f, step, keys, before), "GetManyPacked: round %d query %d step %s before %d", round, q, step, before)
			}
		}
	}
}

func TestGetManyPackedStopsOnACancelledContext(t *testing.T) {
	f := newFile(t)
	base(t, f, 10)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := f.GetManyPacked(ctx, "s", []string{"k00001"}, 0)
	require.ErrorIs(t, err, context.Canceled)
	assert.Len(t, getMany(t, f, "s", []string{"k00001"}, 0), 1, "the connection is usable afterwards")
}

func TestMergePackedInterleavesByKey(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	_, err := f.Write(ctx, []rowbatch.Row{row("s", "b", 1, "B"), row("s", "d", 1, "D"), del("s", "f", 1)})
	require.NoError(t, err)
	page, err := f.GetManyPacked(ctx, "s", []string{"b", "d", "f"}, 0)
	require.NoError(t, err)
	empty, err := f.GetManyPacked(ctx, "s", []string{"nope"}, 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		page  []byte
		extra []PackedEntry
		want  []rowbatch.Row
	}{
		{"nothing to add", page, nil, []rowbatch.Row{
			{StepID: "s", Key: "b", Epoch: 1, Value: []byte("B")}, {StepID: "s", Key: "d", Epoch: 1, Value: []byte("D")},
			{StepID: "s", Key: "f", Epoch: 1, Deleted: true}}},
		{"into an empty page", empty, []PackedEntry{{Key: "a", Epoch: 2, Value: []byte("x")}, {Key: "z", Epoch: 3, Deleted: true}},
			[]rowbatch.Row{{StepID: "s", Key: "a", Epoch: 2, Value: []byte("x")}, {StepID: "s", Key: "z", Epoch: 3, Deleted: true}}},
		{"before, between and after", page, []PackedEntry{
			{Key: "a", Epoch: 2, Value: []byte("A")}, {Key: "c", Epoch: 2, Value: []byte{}}, {Key: "e", Epoch: 4, Deleted: true},
			{Key: "g", Epoch: 5, Value: []byte("G")}}, []rowbatch.Row{
			{StepID: "s", Key: "a", Epoch: 2, Value: []byte("A")}, {StepID: "s", Key: "b", Epoch: 1, Value: []byte("B")},
			{StepID: "s", Key: "c", Epoch: 2, Value: []byte{}}, {StepID: "s", Key: "d", Epoch: 1, Value: []byte("D")},
			{StepID: "s", Key: "e", Epoch: 4, Deleted: true}, {StepID: "s", Key: "f", Epoch: 1, Deleted: true},
			{StepID: "s", Key: "g", Epoch: 5, Value: []byte("G")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			merged, err := MergePacked(tc.page, tc.extra)
			require.NoError(t, err)
			assert.Equal(t, tc.want, unpackRows(t, "s", merged))
		})
	}
	for _, bad := range [][]byte{nil, {2, 1, 'a', 1, 0}, {1, 5, 'a'}, append(slices.Clone(page), 9)} {
		_, err := MergePacked(bad, []PackedEntry{{Key: "k", Epoch: 1}})
		assert.ErrorIs(t, err, errMalformedPage, "%v", bad)
	}
}

// FuzzGetManyPacked writes the rows its input describes into a local store
// file (keys of a 200-key universe, epochs 1-6, deletions, the recent
// table folded into snaps now and then) and asks for the keys it describes
// as runs of neighbours with gaps between them, of every length the walk
// treats differently (stepped over, sought, looked up one by one, probed):
// GetManyPacked, on both connections, and Get per key answer what a model
// of the rows does.
func FuzzGetManyPacked(f *testing.F) {
	f.Add([]byte{4, 3, 10, 1, 7, 11, 2, 9, 12, 131, 200, 3, 0, 1, 0xff, 0x3d, 0x08, 0x17})
	f.Add([]byte{12, 0, 0, 1, 0, 1, 1, 0, 2, 2, 1, 1, 3, 1, 2, 4, 2, 130, 5, 3, 1, 6, 3, 0, 7, 4, 1, 8, 4, 5, 9, 5, 6, 10, 5, 0xf8, 0xf8, 0x05, 0x07})
	f.Add(bytes.Repeat([]byte{60, 1, 2, 0x45}, 60))
	const universe = 200
	key := func(i int) string { return fmt.Sprintf("k%03d", i%universe) }
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		ops := min(int(data[0]), (len(data)-2)/3)
		before := int64(data[1] % 8)
		body, query := data[2:2+3*ops], data[2+3*ops:]
		file := newFile(t)
		model := rowModel{}
		ctx := context.Background()
		var batch []rowbatch.Row
		for i := 0; i+2 < len(body); i += 3 {
			k, e, v := key(int(body[i])), int64(body[i+1]%6)+1, body[i+2]
			switch {
			case body[i+1]&0x80 != 0:
				batch = append(batch, del("s", k, e))
			default:
				batch = append(batch, row("s", k, e, fmt.Sprintf("v%d", v)))
			}
			if body[i+1]&0x40 != 0 || i+5 >= len(body) {
				// one row per key and epoch in a batch, as snapshots write
				batch = slices.CompactFunc(batch, func(a, b rowbatch.Row) bool { return a.Key == b.Key && a.Epoch == b.Epoch })
				_, err := file.Write(ctx, batch)
				require.NoError(t, err)
				model.write(batch)
				batch = nil
				if body[i+1]&0x20 != 0 {
					_, err := file.FoldRecent(ctx)
					require.NoError(t, err)
				}
			}
		}
		gaps := []int{0, 0, 1, 2, 8, 9, 17, 60}
		var keys []string
		pos := 0
		for _, b := range query {
			run := int(b>>3) + 1
			for j := 0; j < run && pos+j < universe; j++ {
				keys = append(keys, key(pos+j))
			}
			pos += run + gaps[b&7]
			if pos >= universe {
				pos %= universe
			}
		}
		want := model.get("s", keys, before)
		require.Equal(t, want, getMany(t, file, "s", keys, before), "GetManyPacked of %d keys before %d", len(keys), before)
		require.Equal(t, want, getEach(t, file, "s", keys, before), "Get of %d keys before %d", len(keys), before)
	})
}

// A key damaged on disk out of its place in the b-tree must end a
// multi-get with ErrDamaged, not in a loop. testdata/keys-out-of-order is a
// word count's local store in which a flipped bit turned key "w110" into
// "w100" (bit-flip test of tests/test_never_wrong.py, seed 5): a seek to
// "w110" lands on that row, below the key sought, and the walk stepped
// over it and sought again, for good (a flow that hung in its first read
// after a fast resume, 2026-12-07).
func TestGetManyPackedStopsAtAKeyOutOfOrder(t *testing.T) {
	ctx := context.Background()
	gz, err := os.Open(filepath.Join("testdata", "keys-out-of-order.sqlite.gz"))
	require.NoError(t, err)
	defer gz.Close()
	zr, err := gzip.NewReader(gz)
	require.NoError(t, err)
	data, err := io.ReadAll(zr)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "store.sqlite")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	f, err := Open(ctx, path, Options{ReadOnly: true})
	require.NoError(t, err)
	defer f.Close()

	const step = "wc.count.stateful_batch"
	for _, keys := range [][]string{
		{"w110"},
		{"w101", "w110"},
		{"w035", "w050", "w101", "w110", "w125", "w266"},
	} {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := f.GetManyPacked(tctx, step, keys, 0)
		cancel()
		require.ErrorIs(t, err, ErrDamaged, "keys %q", keys)
		assert.Contains(t, err.Error(), "out of order")
	}
	// Keys elsewhere in the file still read.
	assert.Len(t, getMany(t, f, step, []string{"w035", "w266"}, 0), 2)
}
