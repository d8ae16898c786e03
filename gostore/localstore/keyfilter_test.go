package localstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
)

// waitFilter waits until the store's key filter covers its file.
func waitFilter(t *testing.T, s *Store) {
	t.Helper()
	require.Eventually(t, func() bool { _, ready := s.FilterStats(); return ready }, 10*time.Second, time.Millisecond)
}

// view is what Get and GetManyPacked return for key k: "" when not found,
// "-" for a deletion, the value otherwise.
func viewOf(t *testing.T, s *Store, k string) (string, string) {
	t.Helper()
	ctx := context.Background()
	r, found, err := s.Get(ctx, "wc.count", k)
	require.NoError(t, err)
	one := ""
	if found {
		one = "-"
		if !r.Deleted {
			one = string(r.Value)
		}
	}
	packed, err := s.GetManyPacked(ctx, "wc.count", []string{k})
	require.NoError(t, err)
	many := ""
	if len(packed) > 1 {
		many = "(found)"
	}
	return one, many
}

// A key the store holds (a value or a deletion, written in place, queued,
// or in the file it opened) is never hidden by the filter: every read
// agrees with a model of the newest row per key, before, during and after
// the filter's fill.
func TestKeyFilterNeverHidesAKeyTheStoreHolds(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 11))
	model := map[string]string{}
	check := func(s *Store, round int) {
		for i := 0; i < 400; i++ {
			k := fmt.Sprintf("k%04d", rng.IntN(3000)) // most never written
			one, many := viewOf(t, s, k)
			want, ok := model[k]
			switch {
			case !ok:
				assert.Equal(t, "", one, "round %d key %s", round, k)
				assert.Equal(t, "", many, "round %d key %s", round, k)
			case want == "-":
				assert.Equal(t, "-", one, "round %d key %s", round, k)
			default:
				assert.Equal(t, want, one, "round %d key %s", round, k)
				assert.Equal(t, "(found)", many, "round %d key %s", round, k)
			}
		}
	}
	for round := 0; round < 4; round++ {
		s, err := Open(ctx, cfg(dir), 0)
		require.NoError(t, err)
		check(s, round) // the fill may still run: reads go to the store
		waitFilter(t, s)
		check(s, round)
		for e := 1; e <= 5; e++ {
			epoch := int64(round*10 + e)
			var rows []rowbatch.Row
			for i := 0; i < 50; i++ {
				k := fmt.Sprintf("k%04d", rng.IntN(1000))
				if rng.IntN(5) == 0 {
					rows = append(rows, rowbatch.Row{StepID: "wc.count", Key: k, Deleted: true})
					model[k] = "-"
				} else {
					v := fmt.Sprintf("v%d.%d", epoch, i)
					rows = append(rows, put(k, v))
					model[k] = v
				}
			}
			rows = dedupeLast(rows)
			b := rowbatch.NewBatch(epoch, rows, false)
			if e%2 == 0 {
				_, err = s.Write(ctx, b)
				require.NoError(t, err)
			} else {
				require.NoError(t, s.WriteAsync(b, nil)) // read at once, while queued
			}
			check(s, round)
		}
		require.NoError(t, s.Close())
	}
}

// dedupeLast keeps the last row of each key (a batch holds a key once).
func dedupeLast(rows []rowbatch.Row) []rowbatch.Row {
	last := map[string]int{}
	for i, r := range rows {
		last[r.Key] = i
	}
	var out []rowbatch.Row
	for i, r := range rows {
		if last[r.Key] == i {
			out = append(out, r)
		}
	}
	return out
}

// Once the filter covers the store, reads of keys it never held are
// answered without it, at a false-positive rate of about 1% however many
// keys it grew to hold.
func TestKeyFilterAnswersReadsOfNewKeysAlone(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		keys int
	}{
		{"first part only", 1000},
		{"grown past several parts", 300_000},
	}
	for _, c := range cases {
		if raceDetector && c.keys > 10_000 {
			c.keys = 140_000 // still three parts; the race detector makes each write slow
		}
		t.Run(c.name, func(t *testing.T) {
			s, err := Open(ctx, cfg(t.TempDir()), 0)
			require.NoError(t, err)
			defer s.Close()
			rows := make([]rowbatch.Row, c.keys)
			for i := range rows {
				rows[i] = put(fmt.Sprintf("held-%07d", i), "v")
			}
			_, err = s.Write(ctx, rowbatch.NewBatch(1, rows, false))
			require.NoError(t, err)
			waitFilter(t, s)
			before, _ := s.FilterStats()
			asked := make([]string, 10_000)
			for i := range asked {
				asked[i] = fmt.Sprintf("new-%07d", i)
			}
			packed, err := s.GetManyPacked(ctx, "wc.count", asked)
			require.NoError(t, err)
			assert.Equal(t, []byte{0}, packed)
			after, _ := s.FilterStats()
			assert.Greater(t, after-before, int64(len(asked)*97/100), "false positives over 3%")
			// Every held key still reads.
			packed, err = s.GetManyPacked(ctx, "wc.count", []string{"held-0000000", fmt.Sprintf("held-%07d", c.keys-1)})
			require.NoError(t, err)
			assert.Greater(t, len(packed), 1)
		})
	}
}

// A read of keys that no queued batch holds does not wait for the queue;
// a read of a key a queued batch holds waits for it and sees it.
func TestReadsWaitOnlyForQueuedBatchesThatHoldTheirKeys(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Write(ctx, rowbatch.NewBatch(1, []rowbatch.Row{put("old", "1")}, false))
	require.NoError(t, err)
	waitFilter(t, s)
	// A queue the writer needs a while for.
	size := 100_000
	if raceDetector {
		size = 20_000
	}
	for e := int64(2); e <= 6; e++ {
		rows := make([]rowbatch.Row, size)
		for i := range rows {
			rows[i] = put(fmt.Sprintf("big-%07d", i), fmt.Sprintf("v%d", e))
		}
		require.NoError(t, s.WriteAsync(rowbatch.NewBatch(e, rows, false), nil))
	}
	packed, err := s.GetManyPacked(ctx, "wc.count", []string{"old"})
	require.NoError(t, err)
	assert.Greater(t, len(packed), 1)
	s.asyncMu.Lock()
	queued := s.pending
	s.asyncMu.Unlock()
	assert.Positive(t, queued, "the read of a key no queued batch holds waited for the queue")
	r, found, err := s.Get(ctx, "wc.count", "big-0000007")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, "v6", string(r.Value))
	s.asyncMu.Lock()
	queued = s.pending
	s.asyncMu.Unlock()
	assert.Zero(t, queued)
}

// A read of a key whose batch is written does not wait for the batches
// queued after it, even while the queue never empties.
func TestReadsDoNotWaitForBatchesQueuedAfterTheirKeys(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	waitFilter(t, s)
	size := 100_000
	if raceDetector {
		size = 20_000
	}
	// Made first and queued back to back, a large batch before the small
	// one: the queue does not empty from the first batch to the last.
	var batches []rowbatch.Batch
	for e := int64(1); e <= 6; e++ {
		rows := make([]rowbatch.Row, size)
		for i := range rows {
			rows[i] = put(fmt.Sprintf("big-%07d", i), fmt.Sprintf("v%d", e))
		}
		batches = append(batches, rowbatch.NewBatch(e, rows, false))
		if e == 1 {
			batches = append(batches, rowbatch.NewBatch(e, []rowbatch.Row{put("early", "1")}, false))
		}
	}
	for _, b := range batches {
		require.NoError(t, s.WriteAsync(b, nil))
	}
	// The small batch is written once it has left the queue list.
	require.Eventually(t, func() bool {
		s.asyncMu.Lock()
		defer s.asyncMu.Unlock()
		return len(s.queue) == 0 || s.queue[0].seq > 2
	}, 10*time.Second, 100*time.Microsecond)
	packed, err := s.GetManyPacked(ctx, "wc.count", []string{"early"})
	require.NoError(t, err)
	assert.Greater(t, len(packed), 1, "the written key is found")
	s.asyncMu.Lock()
	queued := s.pending
	s.asyncMu.Unlock()
	assert.Positive(t, queued, "the read waited for batches queued after its key's")
	packed, err = s.GetManyPacked(ctx, "wc.count", []string{"big-0000009"})
	require.NoError(t, err)
	assert.Contains(t, string(packed), "v6", "a key of queued batches is read after the last of them")
}

// Reads of many keys go to the file's reader connection: a write, GC or
// checkpoint holding the store's lock does not hold them up.
func TestReadsOfManyKeysDoNotWaitForTheStoreLock(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Write(ctx, rowbatch.NewBatch(1, []rowbatch.Row{put("a", "1"), put("b", "2")}, false))
	require.NoError(t, err)
	s.mu.Lock()
	got := make(chan []byte, 1)
	go func() {
		packed, err := s.GetManyPacked(ctx, "wc.count", []string{"a", "b", "never"})
		assert.NoError(t, err)
		got <- packed
	}()
	select {
	case packed := <-got:
		assert.Contains(t, string(packed), "1")
		assert.Contains(t, string(packed), "2")
	case <-time.After(10 * time.Second):
		t.Error("the read waited for the store's lock")
	}
	s.mu.Unlock()
}

// A read of keys that queued batches hold takes their rows from the
// newest such batch, without waiting for the writer; the keys it does not
// hold come from the file, and the page is in key order.
func TestReadsTakeKeysOfQueuedBatchesFromTheQueue(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Write(ctx, rowbatch.NewBatch(1, []rowbatch.Row{put("a", "file"), put("c", "file"), put("e", "file")}, false))
	require.NoError(t, err)
	s.mu.Lock() // the writer cannot write: every batch stays queued
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(2, []rowbatch.Row{put("b", "q2"), put("c", "q2")}, false), nil))
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(3, []rowbatch.Row{put("c", "q3"), del("e")}, false), nil))
	got := make(chan []byte, 1)
	go func() {
		packed, err := s.GetManyPacked(ctx, "wc.count", []string{"e", "c", "a", "b", "c", "zz"})
		assert.NoError(t, err)
		got <- packed
	}()
	var packed []byte
	select {
	case packed = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the read waited for the writer")
	}
	s.mu.Unlock()
	want := []byte{4}
	for _, e := range []struct {
		key   string
		epoch int
		val   string
	}{{"a", 1, "file"}, {"b", 2, "q2"}, {"c", 3, "q3"}, {"e", 3, ""}} {
		want = append(want, byte(len(e.key)))
		want = append(want, e.key...)
		want = append(want, byte(e.epoch))
		if e.val == "" {
			want = append(want, 0) // a deletion
			continue
		}
		want = append(want, byte(len(e.val)+1))
		want = append(want, e.val...)
	}
	assert.Equal(t, want, packed)
	require.NoError(t, s.Flush())
	after, err := s.GetManyPacked(ctx, "wc.count", []string{"e", "c", "a", "b", "zz"})
	require.NoError(t, err)
	assert.Equal(t, want, after, "the file, once written, reads the same")
}

// The filter fills on connections of its own while the store is written
// and generations replace its file (a whole-state batch, then its commit);
// once ready, it holds every key the store holds, from the old file, the
// generation and the writes alike.
func TestKeyFilterFillsWhileGenerationsReplaceTheFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const n = 30000 // several of the fill's pages
	key := func(i int) string { return fmt.Sprintf("k%06d", i) }
	s, err := Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	rows := make([]rowbatch.Row, n)
	for i := range rows {
		rows[i] = put(key(i), "v1")
	}
	_, err = s.Write(ctx, rowbatch.NewBatch(1, rows, false))
	require.NoError(t, err)
	s.NoteCommitted(1)
	require.NoError(t, s.Close())

	for round := 0; round < 3; round++ {
		s, err = Open(ctx, cfg(dir), 0)
		require.NoError(t, err)
		// While the fill walks the file: a whole state with keys of its
		// own replaces it, and more keys are written after it.
		epoch := int64(2 + 2*round)
		whole := make([]rowbatch.Row, 0, n+100)
		for i := 0; i < n+100*(round+1); i++ {
			whole = append(whole, put(key(i), fmt.Sprintf("v%d", epoch)))
		}
		require.NoError(t, s.WriteAsync(rowbatch.NewBatch(epoch, whole, true), nil))
		require.NoError(t, s.WriteAsync(rowbatch.NewBatch(epoch+1, []rowbatch.Row{put(fmt.Sprintf("late%d", round), "x")}, false), nil))
		require.NoError(t, s.Flush())
		s.NoteCommitted(epoch)
		require.NoError(t, s.Flush())
		waitFilter(t, s)
		var all []string
		for i := 0; i < n+100*(round+1); i++ {
			all = append(all, key(i))
		}
		all = append(all, fmt.Sprintf("late%d", round)) // older ones: not in the whole state
		assert.Equal(t, all, s.filter.filterKeys("wc.count", all), "round %d: every key the store holds is a maybe", round)
		require.NoError(t, s.Close())
	}
}

// BenchmarkFilterKeys1M asks a filter of 1M keys about batches of 1000 of
// them (keys it holds, as a resumed flow's prefetch does); ns/key.
func BenchmarkFilterKeys1M(b *testing.B) {
	f := newKeyFilter(maphash.MakeSeed())
	const n = 1_000_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%09d", i)
		f.addLocked(f.hash("flow.step", keys[i]))
	}
	f.ready.Store(true)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := (i * 1000) % n
		if got := f.filterKeys("flow.step", keys[start:start+1000]); len(got) != 1000 {
			b.Fatal(len(got))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/key")
}

// Writing the same keys epoch after epoch does not grow the filter: it
// counts keys, not rows written, so a read's probes stay as few as the
// keys make them.
func TestKeyFilterCountsKeysNotWrites(t *testing.T) {
	f := newKeyFilter(maphash.MakeSeed())
	rows := make([]rowbatch.Row, 3*filterFirstKeys/4)
	for i := range rows {
		rows[i] = rowbatch.Row{StepID: "flow.step", Key: fmt.Sprintf("k%09d", i)}
	}
	for epoch := 0; epoch < 10; epoch++ {
		f.addRows(rows, nil)
	}
	require.Len(t, f.parts, 1, "ten writes of %d keys fit the first part", len(rows))
	f.addRows([]rowbatch.Row{{StepID: "flow.step", Key: "one more"}}, nil)
	f.ready.Store(true)
	for i := range rows {
		require.True(t, f.mayHold("flow.step", rows[i].Key))
	}
	assert.True(t, f.mayHold("flow.step", "one more"))
}
