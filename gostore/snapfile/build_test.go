package snapfile

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
)

var largeSegment = Options{Segment: true, LargePages: true}

// fileDump is what a snapshot file holds, read through SQLite: every row
// of snaps in key order, the metadata, and what PRAGMA integrity_check
// says.
type fileDump struct {
	Rows      []string
	Meta      map[string]string
	Integrity string
}

func dumpFile(t *testing.T, path string) fileDump {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+uriPath(path)+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	var d fileDump
	rows, err := db.Query(`SELECT step_id, state_key, epoch, key_group, value IS NULL, hex(value), crc FROM snaps ORDER BY step_id, state_key, epoch`)
	require.NoError(t, err)
	for rows.Next() {
		var step, key, value string
		var epoch, group, crc int64
		var null bool
		require.NoError(t, rows.Scan(&step, &key, &epoch, &group, &null, &value, &crc))
		if null {
			value = "NULL"
		}
		d.Rows = append(d.Rows, fmt.Sprintf("%q %q %d %d %s %d", step, key, epoch, group, value, crc))
	}
	require.NoError(t, rows.Err())
	d.Meta = map[string]string{}
	mrows, err := db.Query(`SELECT name, value FROM meta`)
	require.NoError(t, err)
	for mrows.Next() {
		var k, v string
		require.NoError(t, mrows.Scan(&k, &v))
		d.Meta[k] = v
	}
	require.NoError(t, mrows.Err())
	var lines []string
	irows, err := db.Query(`PRAGMA integrity_check`)
	require.NoError(t, err)
	for irows.Next() {
		var s string
		require.NoError(t, irows.Scan(&s))
		lines = append(lines, s)
	}
	d.Integrity = strings.Join(lines, "\n")
	return d
}

// buildAndWrite makes two files of rows: one built, one created and
// written through SQLite, both sealed; it returns their paths.
func buildAndWrite(t *testing.T, meta Meta, rows []rowbatch.Row) (built, written string) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	built, written = filepath.Join(dir, "built.sqlite"), filepath.Join(dir, "written.sqlite")
	f, err := Build(ctx, built, meta, largeSegment, rows)
	require.NoError(t, err)
	require.NoError(t, f.Seal())
	g, err := Create(ctx, written, meta, largeSegment)
	require.NoError(t, err)
	if len(rows) > 0 {
		_, err = g.Write(ctx, rows)
		require.NoError(t, err)
	}
	require.NoError(t, g.Seal())
	return built, written
}

func sized(n int, b byte) string { return string(bytes.Repeat([]byte{b}, n)) }

func TestBuildHoldsWhatWriteStores(t *testing.T) {
	b := newBuilder(nil, LargePageSize)
	many := func(n int, key func(int) string, value func(int) string) []rowbatch.Row {
		rows := make([]rowbatch.Row, n)
		for i := range rows {
			rows[i] = row("flow.step", key(i), 7, value(i))
		}
		return rows
	}
	cases := []struct {
		name string
		rows []rowbatch.Row
	}{
		{"no rows", nil},
		{"one row", []rowbatch.Row{row("s", "k", 1, "v")}},
		{"empty key and value", []rowbatch.Row{row("s", "", 1, ""), row("s", "a", 1, "")}},
		{"deletions", []rowbatch.Row{del("s", "a", 2), row("s", "b", 2, "x"), del("s", "c", 2)}},
		{"the last of equal keys wins", []rowbatch.Row{row("s", "a", 3, "first"), row("s", "b", 3, "b"), row("s", "a", 3, "second"), del("s", "b", 3)}},
		{"several steps and epochs, unsorted", []rowbatch.Row{
			row("z.step", "k2", 4, "1"), row("a.step", "k1", 9, "2"), row("a.step", "k1", 3, "3"), row("m", "é", 1<<40, "4"), row("m", "e", 128, "5"),
		}},
		{"integers of every width", []rowbatch.Row{
			row("s", "a", 1, "x"), row("s", "b", 127, "x"), row("s", "c", 128, "x"), row("s", "d", 40000, "x"),
			row("s", "e", 9000000, "x"), row("s", "f", 1<<33, "x"), row("s", "g", 1<<50, "x"), row("s", "h", 1<<62, "x"),
		}},
		{"a leaf level", many(200, func(i int) string { return fmt.Sprintf("k%05d", i) }, func(i int) string { return "v" })},
		{"two levels of small rows", many(5000, func(i int) string { return fmt.Sprintf("key-%010d", i) }, func(i int) string { return fmt.Sprintf("%d", i) })},
		{"three levels", many(3000, func(i int) string { return fmt.Sprintf("%06d", i) + sized(300, 'k') }, func(i int) string { return fmt.Sprintf("%d", i) })},
		{"four levels of long keys", many(4000, func(i int) string { return fmt.Sprintf("%06d", i) + sized(1900, 'k') }, func(i int) string { return "v" })},
		{"values around the local payload bounds", func() []rowbatch.Row {
			var rows []rowbatch.Row
			for i, n := range []int{b.minLocal - 40, b.minLocal, b.maxLocal - 60, b.maxLocal - 40, b.maxLocal - 39, b.maxLocal - 30, b.maxLocal, b.maxLocal + 1, b.size - 100, b.size, 3 * b.size, 3*b.size + 500} {
				rows = append(rows, row("s", fmt.Sprintf("k%02d", i), 1, sized(n, byte('a'+i))))
			}
			return rows
		}()},
		{"large values among small ones", many(300, func(i int) string { return fmt.Sprintf("k%04d", i) }, func(i int) string {
			if i%7 == 0 {
				return sized(20000+i*97, byte('a'+i%26))
			}
			return fmt.Sprintf("small-%d", i)
		})},
		{"a key that overflows", []rowbatch.Row{row("s", sized(50000, 'q'), 1, "v"), row("s", "a", 1, "w"), row("s", "z", 1, sized(10, 'z'))}},
	}
	meta := testMeta()
	meta.Kind = KindSegment
	meta.FirstEpoch = 1
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			built, written := buildAndWrite(t, meta, c.rows)
			got, want := dumpFile(t, built), dumpFile(t, written)
			assert.Equal(t, "ok", got.Integrity)
			assert.Equal(t, want.Rows, got.Rows)
			assert.Equal(t, want.Meta, got.Meta)
			// and the package reads it as it reads any segment
			f, err := Open(context.Background(), built, Options{Segment: true, ReadOnly: true})
			require.NoError(t, err)
			defer f.Close()
			g, err := Open(context.Background(), written, Options{Segment: true, ReadOnly: true})
			require.NoError(t, err)
			defer g.Close()
			assert.Equal(t, scanAll(t, g, ScanOptions{}), scanAll(t, f, ScanOptions{}))
			assert.Equal(t, g.Meta(), f.Meta())
			err = f.Verify(context.Background())
			assert.NoError(t, err)
		})
	}
}

// A built file takes SQLite's own writes afterwards (a local store that
// adopts a whole epoch's segment writes, collects and vacuums it): its
// pages, pointer maps included, must be what SQLite expects.
func TestBuiltFileTakesLaterWritesDeletesAndVacuum(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "b.sqlite")
	rng := rand.New(rand.NewPCG(1, 2))
	var rows []rowbatch.Row
	for i := 0; i < 30000; i++ {
		v := fmt.Sprintf("v%d", i)
		if rng.IntN(50) == 0 {
			v = sized(5000+rng.IntN(40000), 'x')
		}
		rows = append(rows, row("s", fmt.Sprintf("k%06d", rng.IntN(1_000_000)), 1, v))
	}
	f, err := Build(ctx, path, testMeta(), largeSegment, rows)
	require.NoError(t, err)
	more := make([]rowbatch.Row, 0, 5000)
	for i := 0; i < 5000; i++ {
		more = append(more, row("s", fmt.Sprintf("k%06d", rng.IntN(1_000_000)), 2, sized(rng.IntN(3000), 'y')))
	}
	_, err = f.Write(ctx, more)
	require.NoError(t, err)
	require.NoError(t, f.Seal())
	db, err := sql.Open("sqlite", "file:"+uriPath(path))
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`DELETE FROM snaps WHERE epoch = 1 AND state_key < 'k500000'`)
	require.NoError(t, err)
	var before, after int64
	require.NoError(t, db.QueryRow(`PRAGMA page_count`).Scan(&before))
	_, err = db.Exec(`PRAGMA incremental_vacuum`)
	require.NoError(t, err)
	require.NoError(t, db.QueryRow(`PRAGMA page_count`).Scan(&after))
	assert.Less(t, after, before, "incremental vacuum gave pages back")
	var check string
	require.NoError(t, db.QueryRow(`PRAGMA integrity_check`).Scan(&check))
	assert.Equal(t, "ok", check)
}

// Pointer-map pages recur every size/5+1 pages: a file past the first
// one's reach gets a second, and pages are numbered around it.
func TestBuildPastTheFirstPointerMapPage(t *testing.T) {
	if raceDetector {
		t.Skip("120 MB of files: 18 s under the race detector; the plain lane runs it")
	}
	var rows []rowbatch.Row
	for i := 0; i < 60; i++ {
		rows = append(rows, row("s", fmt.Sprintf("k%03d", i), 1, sized(1<<20, byte('a'+i%26))))
	}
	built, written := buildAndWrite(t, testMeta(), rows)
	got, want := dumpFile(t, built), dumpFile(t, written)
	assert.Equal(t, "ok", got.Integrity)
	assert.Equal(t, want.Rows, got.Rows)
	st, err := os.Stat(built)
	require.NoError(t, err)
	assert.Greater(t, st.Size(), int64(LargePageSize)*int64(LargePageSize/5+2), "the file reaches the second pointer-map page")
}

func TestBuildRefusesWhatWouldReachTheLockBytePage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.sqlite")
	o := largeSegment
	o.BuildPageLimit = 40 // as if the lock-byte page came after 40 pages
	bl, err := NewBuilder(path, testMeta(), o)
	require.NoError(t, err)
	err = bl.Add(context.Background(), benchRows(20000, 1))
	require.ErrorIs(t, err, ErrTooLarge)
	bl.Abort()
	assert.NoFileExists(t, path)
}

// The pages Finish adds (the last leaf, the levels above) count too: a
// build that only they take past the bound fails there, leaving no file.
func TestBuilderFinishRefusesPagesPastTheBound(t *testing.T) {
	ctx := context.Background()
	rows := benchRows(20000, 1)
	probe, err := NewBuilder(filepath.Join(t.TempDir(), "probe.sqlite"), testMeta(), largeSegment)
	require.NoError(t, err)
	require.NoError(t, probe.Add(ctx, rows))
	afterAdd := probe.b.next
	probe.Abort()

	o := largeSegment
	o.BuildPageLimit = int(afterAdd)
	path := filepath.Join(t.TempDir(), "b.sqlite")
	bl, err := NewBuilder(path, testMeta(), o)
	require.NoError(t, err)
	require.NoError(t, bl.Add(ctx, rows))
	_, err = bl.Finish(ctx)
	require.ErrorIs(t, err, ErrTooLarge)
	assert.NoFileExists(t, path)
}

// A compaction feeds a Builder page by page, in key order: the file is
// the one Build makes of all the rows at once, and a row out of order
// (or a key given twice) fails the build instead of making a B-tree that
// SQLite would search wrongly.
func TestBuilderTakesRowsInKeyOrderAcrossCalls(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rows := benchRows(20000, 4)
	rows = append(rows, row("z.step", "a", 1, "x"), row("z.step", "a", 2, "y"), del("z.step", "b", 3))
	bl, err := NewBuilder(filepath.Join(dir, "paged.sqlite"), testMeta(), largeSegment)
	require.NoError(t, err)
	for start := 0; start < len(rows); start += 8192 {
		require.NoError(t, bl.Add(ctx, rows[start:min(len(rows), start+8192)]))
	}
	f, err := bl.Finish(ctx)
	require.NoError(t, err)
	require.NoError(t, f.Seal())
	g, err := Build(ctx, filepath.Join(dir, "whole.sqlite"), testMeta(), largeSegment, rows)
	require.NoError(t, err)
	require.NoError(t, g.Seal())
	got, want := dumpFile(t, filepath.Join(dir, "paged.sqlite")), dumpFile(t, filepath.Join(dir, "whole.sqlite"))
	assert.Equal(t, "ok", got.Integrity)
	assert.Equal(t, want, got)

	for name, bad := range map[string][2][]rowbatch.Row{
		"a key again":         {{row("s", "a", 1, "x")}, {row("s", "a", 1, "y")}},
		"an older epoch":      {{row("s", "a", 2, "x")}, {row("s", "a", 1, "y")}},
		"a key before":        {{row("s", "b", 1, "x"), row("s", "a", 1, "y")}, nil},
		"a step before":       {{row("t", "a", 1, "x")}, {row("s", "z", 1, "y")}},
		"a longer key before": {{row("s", "ab", 1, "x")}, {row("s", "a", 1, "y")}},
	} {
		path := filepath.Join(dir, "bad.sqlite")
		bl, err := NewBuilder(path, testMeta(), largeSegment)
		require.NoError(t, err)
		err = bl.Add(ctx, bad[0])
		if err == nil {
			err = bl.Add(ctx, bad[1])
		}
		assert.ErrorContains(t, err, "rows must be in key order", name)
		bl.Abort()
		assert.NoFileExists(t, path, name)
	}
}

func TestBuildRefusesOtherKindsAndExistingFiles(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "b.sqlite")
	for _, o := range []Options{{}, {Segment: true}, {Segment: true, LargePages: true, ReadOnly: true}} {
		_, err := Build(ctx, path, testMeta(), o, nil)
		assert.ErrorContains(t, err, "only large segments are built")
	}
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	_, err := Build(ctx, path, testMeta(), largeSegment, nil)
	assert.ErrorContains(t, err, "already exists")
	_, err = Build(ctx, filepath.Join(t.TempDir(), "c.sqlite"), Meta{FlowID: "f", WorkerCount: 1}, largeSegment, nil)
	assert.Error(t, err, "no key groups")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	p := filepath.Join(t.TempDir(), "d.sqlite")
	_, err = Build(cancelled, p, testMeta(), largeSegment, benchRows(10, 1))
	assert.ErrorIs(t, err, context.Canceled)
	assert.NoFileExists(t, p)
}

func TestRecordVarintsMatchSQLitesLengths(t *testing.T) {
	for _, v := range []uint64{0, 1, 0x7f, 0x80, 0x3fff, 0x4000, 1<<21 - 1, 1 << 21, 1<<56 - 1, 1 << 56, 1<<64 - 1} {
		got := appendVarint(nil, v)
		assert.Len(t, got, varintLen(v), "%#x", v)
		// decode as SQLite does
		var x uint64
		for i, c := range got {
			if i == 8 {
				x = x<<8 | uint64(c)
				break
			}
			x = x<<7 | uint64(c&0x7f)
			if c&0x80 == 0 {
				break
			}
		}
		assert.Equal(t, v, x, "%#x", v)
	}
}

// FuzzBuild: any batch of rows builds to a file SQLite finds sound and
// that holds what writing the rows through SQLite stores.
func FuzzBuild(f *testing.F) {
	f.Add([]byte{3, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(bytes.Repeat([]byte{0x81, 0x02, 0xf3}, 40))
	f.Add(bytes.Repeat([]byte{0x10, 0xff, 0x07, 0x00}, 90))
	f.Fuzz(func(t *testing.T, data []byte) {
		var rows []rowbatch.Row
		for i := 0; i+2 < len(data); i += 3 {
			key := fmt.Sprintf("k%d", data[i]%64)
			if data[i]&0x40 != 0 {
				key += sized(int(data[i+2])*37, 'k')
			}
			epoch := int64(data[i+1]%5) + 1
			if data[i+1]&0x80 != 0 {
				rows = append(rows, del(fmt.Sprintf("s%d", data[i+1]%3), key, epoch))
				continue
			}
			rows = append(rows, row(fmt.Sprintf("s%d", data[i+1]%3), key, epoch, sized(int(data[i+2])*int(data[i+2]), byte('a'+data[i]%26))))
		}
		built, written := buildAndWrite(t, testMeta(), rows)
		got, want := dumpFile(t, built), dumpFile(t, written)
		require.Equal(t, "ok", got.Integrity)
		require.Equal(t, want.Rows, got.Rows)
		require.Equal(t, want.Meta, got.Meta)
	})
}
