package localstore

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

func del(key string) rowbatch.Row {
	return rowbatch.Row{StepID: "wc.count", Key: key, Deleted: true}
}

// smallGenerations opens a fresh store in which a whole batch of 10 rows
// or more starts a generation; it is closed when the test ends.
func smallGenerations(t *testing.T) *Store {
	t.Helper()
	c := cfg(t.TempDir())
	c.GenerationMinRows = 10
	s, err := Open(context.Background(), c, 0)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// contents is key -> value of every key the store shows.
func contents(t *testing.T, s *Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	var cur snapfile.Cursor
	for {
		page, next, done, err := s.ScanPage(context.Background(), snapfile.ScanOptions{ChunkRows: 3}, cur)
		require.NoError(t, err)
		for _, r := range page {
			out[r.Key] = string(r.Value)
		}
		if done {
			return out
		}
		cur = next
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// stored opens a store with epochs 1-2 written: a=2 b=1 c=1.
func stored(t *testing.T, dir string) *Store {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	_, err = s.Write(ctx, rowbatch.NewBatch(1, []rowbatch.Row{put("a", "1"), put("b", "1"), put("c", "1")}, false))
	require.NoError(t, err)
	_, err = s.Write(ctx, rowbatch.NewBatch(2, []rowbatch.Row{put("a", "2")}, false))
	require.NoError(t, err)
	return s
}

// A whole-state write starts a new generation: reads show only its keys
// at once, and once its epoch commits it replaces the store's file, with
// no older version or deletion left in it.
func TestWholeWriteStartsAGenerationThatReplacesTheStoreOnCommit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	wdir := WorkerDir(dir, "wc", 0)
	s := stored(t, dir)
	defer s.Close()
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(3, []rowbatch.Row{put("a", "3"), put("d", "3"), del("b")}, true), nil))
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(4, []rowbatch.Row{put("d", "4")}, false), nil))
	require.NoError(t, s.Flush())
	want := map[string]string{"a": "3", "d": "4"}
	assert.Equal(t, want, contents(t, s), "c was not in the whole state: it has none")
	_, found, err := s.Get(ctx, "wc.count", "c")
	require.NoError(t, err)
	assert.False(t, found)
	assert.True(t, exists(filepath.Join(wdir, nextFileName)), "the generation waits for its epoch")
	n, err := s.GC(ctx, 2)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing to collect while a generation waits")

	s.NoteCommitted(2)
	require.NoError(t, s.Flush())
	assert.True(t, exists(filepath.Join(wdir, nextFileName)), "epoch 3 is not committed yet")
	s.NoteCommitted(3)
	require.NoError(t, s.Flush())
	assert.False(t, exists(filepath.Join(wdir, nextFileName)))
	assert.Equal(t, want, contents(t, s))
	m := s.Meta()
	assert.Equal(t, int64(4), m.LastEpoch)
	assert.Equal(t, int64(3), m.GCEpoch, "the generation held one row per key when it started")
	st, err := s.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(3), st.Rows, "a@3, d@3, d@4: the old file's rows are gone")
	assert.Zero(t, st.Deletions)

	// The store goes on as usual: GC collects what came after the
	// generation started, and a reopen at the next epoch resumes it.
	_, err = s.GC(ctx, 4)
	require.NoError(t, err)
	st, err = s.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), st.Rows)
	require.NoError(t, s.Close())
	s, err = Open(ctx, cfg(dir), 5)
	require.NoError(t, err)
	defer s.Close()
	assert.Equal(t, want, contents(t, s))
}

// A run that stops while a generation waits leaves it on disk; the next
// open keeps it if its epoch committed (the resume epoch is past it) and
// drops it otherwise, rolling back to the old file.
func TestWaitingGenerationIsSettledByTheResumeEpoch(t *testing.T) {
	cases := []struct {
		name   string
		resume int64
		want   map[string]string
	}{
		{"its epoch committed", 4, map[string]string{"a": "3", "d": "3"}},
		{"no resume epoch keeps the newest rows", 0, map[string]string{"a": "3", "d": "3"}},
		{"its epoch did not commit", 3, map[string]string{"a": "2", "b": "1", "c": "1"}},
		{"nor the one before", 2, map[string]string{"a": "1", "b": "1", "c": "1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			s := stored(t, dir)
			require.NoError(t, s.WriteAsync(rowbatch.NewBatch(3, []rowbatch.Row{put("a", "3"), put("d", "3"), del("b")}, true), nil))
			require.NoError(t, s.Close())
			s, err := Open(ctx, cfg(dir), c.resume)
			require.NoError(t, err)
			defer s.Close()
			assert.Equal(t, c.want, contents(t, s))
			assert.False(t, exists(filepath.Join(WorkerDir(dir, "wc", 0), nextFileName)))
		})
	}
}

// A generation whose write never finished (its file has the metadata but
// not the rows), or a staged segment copy that was never marked local, is
// never taken for the store, whatever the resume epoch.
func TestUnfinishedGenerationIsDropped(t *testing.T) {
	cases := []struct {
		name string
		make func(t *testing.T, path string)
	}{
		{"rows never written", func(t *testing.T, path string) {
			meta := snapfile.Meta{FlowID: "wc", Kind: snapfile.KindLocal, WorkerCount: 1, KeyGroupCount: 16, FirstEpoch: 3, GCEpoch: 3}
			f, err := snapfile.Create(context.Background(), path, meta, snapfile.Options{})
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}},
		{"segment copy not adopted", func(t *testing.T, path string) {
			require.NoError(t, copyFile(segmentOf(t, 3, []rowbatch.Row{put("z", "3")}, 0), path))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			s := stored(t, dir)
			require.NoError(t, s.Close())
			c.make(t, filepath.Join(WorkerDir(dir, "wc", 0), nextFileName))
			require.NoError(t, Settle(ctx, dir, "wc", 0, 9))
			s, err := Open(ctx, cfg(dir), 9)
			require.NoError(t, err)
			defer s.Close()
			assert.Equal(t, map[string]string{"a": "2", "b": "1", "c": "1"}, contents(t, s))
		})
	}
}

// Rolling back to the generation's epoch or before drops it with
// everything it holds.
func TestDeleteFromDropsAWaitingGeneration(t *testing.T) {
	ctx := context.Background()
	s := stored(t, t.TempDir())
	defer s.Close()
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(3, []rowbatch.Row{put("a", "3")}, true), nil))
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(4, []rowbatch.Row{put("e", "4")}, false), nil))
	_, err := s.DeleteFrom(ctx, 3)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"a": "2", "b": "1", "c": "1"}, contents(t, s))
	assert.Equal(t, int64(2), s.Meta().LastEpoch)
	_, err = s.Write(ctx, rowbatch.NewBatch(3, []rowbatch.Row{put("b", "3")}, false))
	require.NoError(t, err)
	got := contents(t, s)
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	assert.Equal(t, []string{"a", "b", "c"}, keys)
	assert.Equal(t, "3", got["b"])
}

// segmentOf writes rows at epoch into a sealed segment of worker 0 of
// flow "wc", the way the segment cutter cuts one.
func segmentOf(t *testing.T, epoch int64, rows []rowbatch.Row, worker int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "seg.sqlite")
	meta := snapfile.Meta{FlowID: "wc", Kind: snapfile.KindSegment, WorkerIndex: worker, WorkerCount: 2, KeyGroupCount: 16,
		FirstEpoch: epoch, LastEpoch: epoch}
	if worker == 0 {
		meta.WorkerCount = 1
	}
	f, err := snapfile.Create(context.Background(), path, meta, snapfile.Options{Segment: true})
	require.NoError(t, err)
	for i := range rows {
		rows[i].Epoch = epoch
	}
	_, err = f.Write(context.Background(), rows)
	require.NoError(t, err)
	require.NoError(t, f.Seal())
	return path
}

// A whole batch whose segment is staged becomes the next generation by
// way of the segment's copy; when no copy comes, or the copy is not this
// store's, the rows are written instead. Either way the store then shows
// the whole state, and takes later writes and its commit as usual.
func TestStagedWholeBatch(t *testing.T) {
	withDeletion := func() []rowbatch.Row { return []rowbatch.Row{put("a", "3"), put("d", "3"), del("b")} }
	live := func() []rowbatch.Row { return []rowbatch.Row{put("a", "3"), put("d", "3")} }
	cases := []struct {
		name    string
		whole   func() []rowbatch.Row
		segment func(t *testing.T) string // "" sends nothing
		adopted bool
	}{
		{"staged copy", withDeletion, func(t *testing.T) string { return segmentOf(t, 3, withDeletion(), 0) }, true},
		{"staged copy without deletions", live, func(t *testing.T) string { return segmentOf(t, 3, live(), 0) }, true},
		{"no copy", withDeletion, func(t *testing.T) string { return "" }, false},
		{"another worker's segment", withDeletion, func(t *testing.T) string { return segmentOf(t, 3, withDeletion(), 1) }, false},
		{"another epoch's segment", withDeletion, func(t *testing.T) string { return segmentOf(t, 4, withDeletion(), 0) }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			s := stored(t, dir)
			defer s.Close()
			staged := make(chan Staged, 1)
			rows := c.whole()
			require.NoError(t, s.WriteAsync(rowbatch.NewBatch(3, rows, true), staged))
			if seg := c.segment(t); seg != "" {
				deletions := int64(0)
				for _, r := range rows {
					if r.Deleted {
						deletions++
					}
				}
				copied, err := s.StageGeneration(seg, deletions)
				require.NoError(t, err)
				staged <- copied
			}
			close(staged)
			require.NoError(t, s.WriteAsync(rowbatch.NewBatch(4, []rowbatch.Row{put("e", "4")}, false), nil))
			require.NoError(t, s.Flush())
			want := map[string]string{"a": "3", "d": "3", "e": "4"}
			assert.Equal(t, want, contents(t, s))
			st, err := s.Stats(ctx)
			require.NoError(t, err)
			assert.Zero(t, st.Deletions)
			left, err := filepath.Glob(filepath.Join(WorkerDir(dir, "wc", 0), stagedPattern))
			require.NoError(t, err)
			assert.Empty(t, left, "staged copies are taken or removed")
			// The segment has 1 KiB pages, a store written afresh
			// snapfile.LocalPageSize.
			wantPage := snapfile.LocalPageSize
			if c.adopted {
				wantPage = 1024
			}
			assert.Equal(t, wantPage, pageSize(t, filepath.Join(WorkerDir(dir, "wc", 0), nextFileName)))
			s.NoteCommitted(3)
			require.NoError(t, s.Flush())
			assert.Equal(t, want, contents(t, s))
			assert.Equal(t, int64(3), s.Meta().GCEpoch)
		})
	}
}

func pageSize(t *testing.T, path string) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	var page int
	require.NoError(t, db.QueryRow(`PRAGMA page_size`).Scan(&page))
	return page
}

// The pipe may stage the next whole epoch's segment before the writer took
// the previous one: each staged copy stays its own.
func TestTwoStagedEpochsInFlight(t *testing.T) {
	dir := t.TempDir()
	s := stored(t, dir)
	defer s.Close()
	third := []rowbatch.Row{put("a", "3"), put("d", "3")}
	fourth := []rowbatch.Row{put("a", "4"), put("d", "4"), put("f", "4")}
	ch3, ch4 := make(chan Staged, 1), make(chan Staged, 1)
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(3, third, true), ch3))
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(4, fourth, true), ch4))
	p3, err := s.StageGeneration(segmentOf(t, 3, third, 0), 0)
	require.NoError(t, err)
	p4, err := s.StageGeneration(segmentOf(t, 4, fourth, 0), 0)
	require.NoError(t, err)
	ch3 <- p3
	close(ch3)
	ch4 <- p4
	close(ch4)
	require.NoError(t, s.Flush())
	assert.Equal(t, map[string]string{"a": "4", "d": "4", "f": "4"}, contents(t, s))
	assert.Equal(t, 1024, pageSize(t, filepath.Join(WorkerDir(dir, "wc", 0), nextFileName)), "epoch 3's copy was taken")
}

// Reads of many keys run on the file's reader connection while the
// writer writes other keys, new generations replace the file and GC runs:
// every read sees one epoch for all its keys, and never one older than a
// write of them that was queued before the read began.
func TestReadsOfManyKeysStayCorrectWhileGenerationsReplaceTheFile(t *testing.T) {
	ctx := context.Background()
	s := smallGenerations(t)
	mine := make([]string, 50)
	for i := range mine {
		mine[i] = fmt.Sprintf("m%02d", i)
	}
	epochs := int64(120)
	if raceDetector {
		epochs = 40
	}
	var floor atomic.Int64 // the newest epoch that wrote mine, queued
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				low := floor.Load()
				packed, err := s.GetManyPacked(ctx, "wc.count", mine)
				if !assert.NoError(t, err) {
					return
				}
				got := unpackKeys(t, packed)
				if low == 0 {
					continue
				}
				if !assert.Len(t, got, len(mine)) {
					return
				}
				for _, v := range got {
					e, err := strconv.ParseInt(v, 10, 64)
					assert.NoError(t, err)
					assert.GreaterOrEqual(t, e, low, "a read older than a write queued before it")
					assert.Equal(t, got[mine[0]], v, "one read, one epoch")
				}
			}
		}()
	}
	for e := int64(1); e <= epochs; e++ {
		v := strconv.FormatInt(e, 10)
		var rows []rowbatch.Row
		whole := e%7 == 0
		if whole || e%5 == 0 || e == 1 {
			for _, k := range mine {
				rows = append(rows, put(k, v))
			}
		}
		if !whole {
			for i := range 2000 {
				rows = append(rows, put(fmt.Sprintf("o%05d", i), v))
			}
		}
		require.NoError(t, s.WriteAsync(rowbatch.NewBatch(e, rows, whole), nil))
		if whole || e%5 == 0 || e == 1 {
			floor.Store(e)
		}
		s.NoteCommitted(e - 1)
		if e%11 == 0 {
			_, err := s.GC(ctx, e-1)
			require.NoError(t, err)
		}
	}
	close(stop)
	wg.Wait()
	require.NoError(t, s.Flush())
}

// unpackKeys decodes a packed page of GetManyPacked into key -> value.
func unpackKeys(t *testing.T, packed []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	n, w := binary.Uvarint(packed)
	b := packed[w:]
	for range n {
		kl, w := binary.Uvarint(b)
		key := string(b[w : w+int(kl)])
		b = b[w+int(kl):]
		_, w = binary.Uvarint(b) // epoch
		b = b[w:]
		tag, w := binary.Uvarint(b)
		b = b[w:]
		if tag > 0 {
			out[key] = string(b[:tag-1])
			b = b[tag-1:]
		}
	}
	require.Empty(t, b)
	return out
}

// A scan of an older epoch (compaction's) that spans the start of a
// whole-state generation of a later epoch keeps reading the old file,
// which holds that epoch: it sees every key. Once the generation replaced
// the old file, such a scan fails rather than return a part of the state.
func TestAScanOfAnOlderEpochIsNotCutShortByANewGeneration(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	const n = 20000
	write := func(e int64, whole bool) {
		rows := make([]rowbatch.Row, n)
		for i := range rows {
			rows[i] = put(fmt.Sprintf("k%06d", i), fmt.Sprintf("v%d", e))
		}
		require.NoError(t, s.WriteAsync(rowbatch.NewBatch(e, rows, whole), nil))
		require.NoError(t, s.Flush())
	}
	write(1, false)
	write(2, false)
	s.NoteCommitted(2)
	scan := func(started func()) (int, error) {
		var cur snapfile.Cursor
		got := 0
		for first := true; ; first = false {
			page, next, done, err := s.ScanPageFlushed(ctx, snapfile.ScanOptions{Before: 3, ChunkRows: 4096}, cur)
			if err != nil {
				return got, err
			}
			for _, r := range page {
				assert.Equal(t, "v2", string(r.Value))
			}
			got += len(page)
			if first {
				started()
			}
			if done {
				return got, nil
			}
			cur = next
		}
	}
	got, err := scan(func() { write(5, true) }) // the generation starts mid-scan
	require.NoError(t, err)
	assert.Equal(t, n, got, "every key of epoch 2")
	_, err = scan(func() {
		s.NoteCommitted(5)
		require.NoError(t, s.Flush())
		_, err := s.GC(ctx, 5) // promotes the generation
		require.NoError(t, err)
	})
	require.ErrorIs(t, err, ErrReplaced)
}

// A whole-state generation that holds only its own epoch gets no epoch
// index in the background (it has nothing for GC to find, and a flow
// whose every epoch is whole would index each generation just before the
// next replaced it); once another epoch's rows land in it, the index is
// built, and GC collects as usual.
func TestAGenerationOfOneEpochIsNotIndexed(t *testing.T) {
	ctx := context.Background()
	s := smallGenerations(t)
	whole := func(e int64) []rowbatch.Row {
		rows := make([]rowbatch.Row, 0, 50)
		for k := range 50 {
			rows = append(rows, put(fmt.Sprintf("k%02d", k), strconv.FormatInt(e, 10)))
		}
		return rows
	}
	indexPending := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.target().IndexPending()
	}
	settle := func() { // a checkpointer round that has seen the latest file
		s.kick <- struct{}{}
		s.kick <- struct{}{} // taken once the previous round is over
	}
	for e := int64(1); e <= 3; e++ {
		require.NoError(t, s.WriteAsync(rowbatch.NewBatch(e, whole(e), true), nil))
		s.NoteCommitted(e)
		require.NoError(t, s.Flush())
		settle()
		assert.True(t, indexPending(), "generation of epoch %d indexed", e)
	}
	assert.Equal(t, int64(3), s.Meta().FirstEpoch, "the store is the generation of epoch 3")

	// Rows of another epoch: the index is built, and GC collects the
	// versions they superseded once their epoch commits.
	var rows []rowbatch.Row
	for k := range 50 {
		rows = append(rows, put(fmt.Sprintf("k%02d", k), "4"))
	}
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(4, rows, false), nil))
	require.NoError(t, s.Flush())
	settle()
	require.Eventually(t, func() bool { return !indexPending() }, 5*time.Second, 5*time.Millisecond)
	s.NoteCommitted(4)
	require.NoError(t, s.Flush())
	n, err := s.GC(ctx, 4)
	require.NoError(t, err)
	assert.Equal(t, int64(50), n, "every key's epoch-3 row")
	got := contents(t, s)
	assert.Len(t, got, 50)
	assert.Equal(t, "4", got["k07"])
}

// A run that is killed while a generation replaces the store cancels the
// context of that replacement (local GC runs under the run's context). The
// replacement finishes anyway, and the store still closes and lets go of
// its lock: the next run must be able to open it, or rebuild it.
func TestAPromotionUnderACanceledContextLeavesTheStoreClosable(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := stored(t, dir)
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(3, []rowbatch.Row{put("a", "3"), put("d", "3")}, true), nil))
	require.NoError(t, s.Flush())
	require.True(t, exists(filepath.Join(WorkerDir(dir, "wc", 0), nextFileName)))
	s.committed.Store(3) // as NoteCommitted, without the writer promoting it first
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	s.mu.Lock()
	err := s.maybePromote(canceled)
	s.mu.Unlock()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"a": "3", "d": "3"}, contents(t, s))
	require.NoError(t, s.Close())
	s, err = Open(ctx, cfg(dir), 4)
	require.NoError(t, err, "the lock was released")
	defer s.Close()
	assert.Equal(t, map[string]string{"a": "3", "d": "3"}, contents(t, s))
}

// A replacement that failed for another reason (a disk error on reopen)
// also leaves no file open: closing the store still releases its lock.
func TestAStoreLeftWithoutAFileStillReleasesItsLock(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := stored(t, dir)
	s.mu.Lock()
	require.NoError(t, s.file.Close())
	s.file = nil // what a failed maybePromote leaves
	s.mu.Unlock()
	require.NoError(t, s.Close())
	s, err := Open(ctx, cfg(dir), 0)
	require.NoError(t, err, "the lock was released")
	require.NoError(t, s.Close())
}
