package snapfile

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/rowbatch"
)

func testMeta() Meta {
	return Meta{FlowID: "flow", Kind: KindLocal, WorkerIndex: 0, WorkerCount: 1, KeyGroupCount: 16}
}

func newFile(t *testing.T) *File {
	t.Helper()
	f, err := Create(context.Background(), filepath.Join(t.TempDir(), "s.sqlite"), testMeta(), Options{})
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

func row(step, key string, epoch int64, v string) rowbatch.Row {
	return rowbatch.Row{StepID: step, Key: key, Epoch: epoch, Value: []byte(v)}
}

func del(step, key string, epoch int64) rowbatch.Row {
	return rowbatch.Row{StepID: step, Key: key, Epoch: epoch, Deleted: true}
}

func scanAll(t *testing.T, f *File, o ScanOptions) map[string]string {
	t.Helper()
	got := map[string]string{}
	require.NoError(t, f.Scan(context.Background(), o, func(rows []rowbatch.Row) error {
		for _, r := range rows {
			k := r.StepID + "/" + r.Key
			if r.Deleted {
				got[k] = "<deleted>"
			} else {
				got[k] = string(r.Value)
			}
		}
		return nil
	}))
	return got
}

func TestCreateThenOpenKeepsMetaAndRows(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.sqlite")
	f, err := Create(ctx, path, testMeta(), Options{})
	require.NoError(t, err)
	_, err = f.Write(ctx, []rowbatch.Row{row("s", "a", 1, "x"), row("s", "b", 1, "")})
	require.NoError(t, err)
	require.NoError(t, f.Close())

	g, err := Open(ctx, path, Options{})
	require.NoError(t, err)
	defer g.Close()
	want := testMeta()
	want.LastEpoch = 1 // advanced by the write
	assert.Equal(t, want, g.Meta())
	r, found, err := g.Get(ctx, "s", "b", 0)
	require.NoError(t, err)
	require.True(t, found)
	assert.False(t, r.Deleted, "an empty value is a value, not a deletion")
	assert.Equal(t, 0, len(r.Value))
}

func TestCreateRefusesExistingFile(t *testing.T) {
	f := newFile(t)
	_, err := Create(context.Background(), f.Path(), testMeta(), Options{})
	require.ErrorContains(t, err, "already exists")
}

func TestGetReturnsNewestBeforeEpoch(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	_, err := f.Write(ctx, []rowbatch.Row{row("s", "k", 1, "one"), row("s", "k", 3, "three"), del("s", "k", 5)})
	require.NoError(t, err)
	cases := []struct {
		before  int64
		found   bool
		deleted bool
		value   string
	}{
		{1, false, false, ""},
		{2, true, false, "one"},
		{4, true, false, "three"},
		{6, true, true, ""},
		{0, true, true, ""},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.before), func(t *testing.T) {
			r, found, err := f.Get(ctx, "s", "k", c.before)
			require.NoError(t, err)
			require.Equal(t, c.found, found)
			if found {
				assert.Equal(t, c.deleted, r.Deleted)
				assert.Equal(t, c.value, string(r.Value))
			}
		})
	}
}

func TestWriteLastDuplicateWins(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	_, err := f.Write(ctx, []rowbatch.Row{row("s", "k", 2, "first"), row("s", "k", 2, "second")})
	require.NoError(t, err)
	_, err = f.Write(ctx, []rowbatch.Row{row("s", "k", 2, "third")})
	require.NoError(t, err)
	r, _, err := f.Get(ctx, "s", "k", 0)
	require.NoError(t, err)
	assert.Equal(t, "third", string(r.Value))
}

func TestScanNewestPerKeyAcrossStepsAndChunks(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	var rows []rowbatch.Row
	for i := 0; i < 100; i++ {
		k := fmt.Sprintf("k%03d", i)
		rows = append(rows, row("a", k, 1, "old"), row("a", k, 2, "new"+k))
		if i%10 == 0 {
			rows = append(rows, del("a", k, 3))
		}
		rows = append(rows, row("b", k, 1, "b"))
	}
	_, err := f.Write(ctx, rows)
	require.NoError(t, err)

	got := scanAll(t, f, ScanOptions{StepID: "a", ChunkRows: 7})
	assert.Len(t, got, 90, "deleted keys are skipped")
	assert.Equal(t, "newk001", got["a/k001"])

	got = scanAll(t, f, ScanOptions{StepID: "a", IncludeDeleted: true})
	assert.Equal(t, "<deleted>", got["a/k010"])

	got = scanAll(t, f, ScanOptions{StepID: "a", Before: 3})
	assert.Len(t, got, 100)
	assert.Equal(t, "newk010", got["a/k010"])

	got = scanAll(t, f, ScanOptions{})
	assert.Len(t, got, 190)

	steps, err := f.Steps(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, steps)
}

func TestScanByKeyGroupPartitionsKeys(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	var rows []rowbatch.Row
	for i := 0; i < 200; i++ {
		rows = append(rows, row("s", fmt.Sprint(i), 1, "v"))
	}
	_, err := f.Write(ctx, rows)
	require.NoError(t, err)
	total := 0
	for w := 0; w < 3; w++ {
		r := keygroup.OwnedBy(w, 3, 16)
		got := scanAll(t, f, ScanOptions{Groups: &r})
		for k := range got {
			require.Equal(t, w, keygroup.Owner(keygroup.Of(k[2:], 16), 16, 3))
		}
		total += len(got)
	}
	assert.Equal(t, 200, total)
}

func TestDeleteFromRollsBackUncommittedEpochs(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	_, err := f.Write(ctx, []rowbatch.Row{row("s", "k", 1, "one"), row("s", "k", 2, "two"), row("s", "j", 3, "three")})
	require.NoError(t, err)
	n, err := f.DeleteFrom(ctx, 2)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	assert.Equal(t, map[string]string{"s/k": "one"}, scanAll(t, f, ScanOptions{}))
}

func TestGCKeepsNewestCommittedAndAllUncommitted(t *testing.T) {
	ctx := context.Background()
	f := newFile(t)
	_, err := f.Write(ctx, []rowbatch.Row{
		row("s", "a", 1, "a1"), row("s", "a", 2, "a2"), row("s", "a", 4, "a4"),
		row("s", "b", 1, "b1"), del("s", "b", 2),
		row("s", "c", 1, "c1"), del("s", "c", 4),
		row("s", "d", 3, "d3"),
	})
	require.NoError(t, err)
	removed, err := f.GC(ctx, 0, 3)
	require.NoError(t, err)
	// a1 (superseded by a2), b1 and the b deletion at 2.
	assert.Equal(t, int64(3), removed)
	st, err := f.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(5), st.Rows)
	// Rolling back the uncommitted epoch 4 must leave committed state.
	_, err = f.DeleteFrom(ctx, 4)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"s/a": "a2", "s/c": "c1", "s/d": "d3"}, scanAll(t, f, ScanOptions{}))
	// A second GC only looks at newer rows and finds nothing.
	removed, err = f.GC(ctx, 3, 3)
	require.NoError(t, err)
	assert.Zero(t, removed)
}

func TestOpenRefusesForeignFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	notSQLite := filepath.Join(dir, "text")
	require.NoError(t, os.WriteFile(notSQLite, []byte("hello, this is not a database at all"), 0o644))
	_, err := Open(ctx, notSQLite, Options{})
	require.ErrorIs(t, err, ErrNotSnapshotFile)
	assert.Contains(t, err.Error(), notSQLite)

	_, err = Open(ctx, filepath.Join(dir, "missing"), Options{})
	require.ErrorIs(t, err, os.ErrNotExist)

	// A SQLite file with other tables.
	other := filepath.Join(dir, "other.sqlite")
	db, err := openDB(other, Options{})
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE t (x)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	_, err = Open(ctx, other, Options{})
	require.ErrorIs(t, err, ErrNotSnapshotFile)
}

func TestSegmentSealIsReadable(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "seg.sqlite")
	m := testMeta()
	m.Kind = KindSegment
	f, err := Create(ctx, path, m, Options{Segment: true})
	require.NoError(t, err)
	_, err = f.Write(ctx, []rowbatch.Row{row("s", "a", 1, "x")})
	require.NoError(t, err)
	require.NoError(t, f.Seal())
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "a sealed segment is a single file")
	g, err := Open(ctx, path, Options{Segment: true})
	require.NoError(t, err)
	defer g.Close()
	assert.Equal(t, KindSegment, g.Meta().Kind)
}

func TestSortedOrderLargeBatchKeepsLastDuplicateLast(t *testing.T) {
	// Above the parallel threshold: the merge must keep (step, key, epoch)
	// order and arrival order among duplicates.
	n := parallelSortRows + 1000
	rows := make([]rowbatch.Row, n)
	for i := range rows {
		rows[i] = rowbatch.Row{StepID: "s", Key: fmt.Sprintf("k%05d", (i*7919)%5000), Epoch: 1}
	}
	order := sortedOrder(rows)
	require.Len(t, order, n)
	for i := 1; i < n; i++ {
		a, b := rows[order[i-1]], rows[order[i]]
		require.LessOrEqual(t, a.Key, b.Key)
		if a.Key == b.Key {
			require.Less(t, order[i-1], order[i], "duplicates stay in arrival order")
		}
	}
}

// sortedOrder's prefix words must order rows exactly as comparing whole
// (step, key, epoch, arrival) does, whatever the keys: shared prefixes
// longer than 16 bytes, keys that differ only in length or in trailing
// NUL bytes, several steps; with and without a prefix every key of the
// batch shares (the words are taken after it), including keys that are
// that prefix and nothing more.
func TestSortedOrderMatchesAFullComparison(t *testing.T) {
	alphabet := []string{"", "\x00", "a", "ab", "user-0000000", "user-00000000000000000", "\xff", "é"}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		n      int
		shared string
	}{
		{1, ""}, {17, ""}, {500, ""}, {parallelSortRows + 321, ""},
		{17, "tenant-0042/user-000000"}, {500, "\x00\x00"}, {parallelSortRows + 321, "sensor/eu-west-1/"},
	} {
		n := c.n
		rows := make([]rowbatch.Row, n)
		for i := range rows {
			key := c.shared + alphabet[rng.IntN(len(alphabet))] + alphabet[rng.IntN(len(alphabet))]
			if rng.IntN(3) == 0 {
				key += fmt.Sprint(rng.IntN(50))
			}
			rows[i] = rowbatch.Row{StepID: []string{"b", "a", "a.x"}[rng.IntN(3)], Key: key, Epoch: int64(rng.IntN(3))}
		}
		want := make([]int32, n)
		for i := range want {
			want[i] = int32(i)
		}
		slices.SortStableFunc(want, func(a, b int32) int {
			ra, rb := rows[a], rows[b]
			return cmp.Or(strings.Compare(ra.StepID, rb.StepID), strings.Compare(ra.Key, rb.Key), cmp.Compare(ra.Epoch, rb.Epoch))
		})
		require.Equal(t, want, sortedOrder(rows), "n=%d shared=%q", n, c.shared)
	}
}

func TestSharedPrefix(t *testing.T) {
	keys := func(ks ...string) []rowbatch.Row {
		rows := make([]rowbatch.Row, len(ks))
		for i, k := range ks {
			rows[i] = rowbatch.Row{StepID: "s", Key: k}
		}
		return rows
	}
	cases := []struct {
		rows []rowbatch.Row
		want int
	}{
		{nil, 0},
		{keys("abc"), 3},
		{keys("user-1", "user-2", "user-10"), 5},
		{keys("user-1", "user-1"), 6},
		{keys("user-1", ""), 0},
		{keys("ab", "abc", "abd"), 2},
		{keys("xa", "ya"), 0},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, sharedPrefix(c.rows), "%v", c.rows)
	}
}

func TestEachKindOfFileGetsItsPageCache(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantKiB int
	}{
		{"local store", Options{}, storeCacheMiB << 10},
		{"segment", Options{Segment: true}, segmentCacheMiB << 10},
		{"large segment", Options{Segment: true, LargePages: true}, segmentCacheMiB << 10},
		{"explicit size", Options{Segment: true, CacheMiB: 2}, 2 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "s.sqlite")
			f, err := Create(ctx, path, testMeta(), tt.opts)
			require.NoError(t, err)
			defer f.Close()
			var got int
			require.NoError(t, f.db.QueryRowContext(ctx, "PRAGMA cache_size").Scan(&got))
			// A negative cache_size is a size in KiB rather than pages.
			assert.Equal(t, -tt.wantKiB, got)
		})
	}
}

// A path is handed to SQLite inside a URI on some connections and as a
// plain name on others: characters a URI gives a meaning to ('?' starts
// its query, '#' its fragment, '%' an escape) must reach every connection
// as part of the name, or the connections open different files.
func TestAPathWithURICharactersIsThatFileOnEveryConnection(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"a#b", "a?b", "a%41b", "a%2", "sp ace", "q?x=1&mode=ro#f"} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, name)
			require.NoError(t, os.MkdirAll(dir, 0o700))
			path := filepath.Join(dir, "s.sqlite")
			f, err := Create(ctx, path, testMeta(), Options{})
			require.NoError(t, err)
			_, err = f.Write(ctx, []rowbatch.Row{row("s", "k", 1, "v1"), row("s", "j", 1, "v2")})
			require.NoError(t, err)
			require.NoError(t, f.Close())
			// nothing was made beside it
			entries, err := os.ReadDir(root)
			require.NoError(t, err)
			require.Len(t, entries, 1, "only %q under %s", name, root)
			require.Equal(t, name, entries[0].Name())
			for _, o := range []Options{{}, {ReadOnly: true}} {
				f, err := Open(ctx, path, o)
				require.NoError(t, err, "open %+v", o)
				assert.Equal(t, testMeta().FlowID, f.Meta().FlowID)
				assert.Equal(t, map[string]string{"s/j": "v2", "s/k": "v1"}, scanAll(t, f, ScanOptions{}))
				assert.Equal(t, []rowbatch.Row{row("s", "j", 1, "v2"), row("s", "k", 1, "v1")},
					getMany(t, f, "s", []string{"k", "j"}, 0))
				require.NoError(t, f.Close())
			}
		})
	}
}
