package localstore

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

func cfg(dir string) Config {
	return Config{Dir: dir, FlowID: "wc", WorkerIndex: 0, WorkerCount: 1, KeyGroupCount: 16}
}

func put(key, v string) rowbatch.Row {
	return rowbatch.Row{StepID: "wc.count", Key: key, Value: []byte(v)}
}

func TestOpenWriteReopenResumes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	_, err = s.Write(ctx, rowbatch.NewBatch(1, []rowbatch.Row{put("a", "1"), put("b", "1")}, false))
	require.NoError(t, err)
	_, err = s.Write(ctx, rowbatch.NewBatch(2, []rowbatch.Row{put("a", "2")}, false))
	require.NoError(t, err)
	require.NoError(t, s.Close())

	// Resuming at epoch 2 rolls back what epoch 2 wrote.
	s, err = Open(ctx, cfg(dir), 2)
	require.NoError(t, err)
	defer s.Close()
	r, found, err := s.Get(ctx, "wc.count", "a")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, "1", string(r.Value))
	assert.Equal(t, int64(1), s.Meta().LastEpoch)
}

func TestEmptyWriteAdvancesLastEpoch(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Write(ctx, rowbatch.NewBatch(5, nil, false))
	require.NoError(t, err)
	assert.Equal(t, int64(5), s.Meta().LastEpoch)
}

func TestSecondOpenIsLockedAndNamesThePid(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	_, err = Open(ctx, cfg(dir), 0)
	require.ErrorIs(t, err, ErrLocked)
	assert.Contains(t, err.Error(), fmt.Sprintf("process %d", os.Getpid()))
	require.NoError(t, s.Close())
	s, err = Open(ctx, cfg(dir), 0)
	require.NoError(t, err, "the lock is released on close")
	require.NoError(t, s.Close())
}

// Removing a store another open holds is refused: a second run must not
// delete the files the first one is writing.
func TestRemoveRefusesAStoreInUse(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	_, err = s.Write(ctx, rowbatch.NewBatch(1, []rowbatch.Row{put("a", "1")}, false))
	require.NoError(t, err)
	require.ErrorIs(t, Remove(dir, "wc", 0), ErrLocked)
	_, err = s.Write(ctx, rowbatch.NewBatch(2, []rowbatch.Row{put("a", "2")}, false))
	require.NoError(t, err, "the store is still there for its owner")
	require.NoError(t, s.Close())
	require.NoError(t, Remove(dir, "wc", 0))
	assert.NoFileExists(t, filepath.Join(WorkerDir(dir, "wc", 0), FileName))
	require.NoError(t, Remove(filepath.Join(dir, "nothing-here"), "wc", 0), "removing what is not there is not an error")
}

// Small writes wait in the file's recent table; once enough wait, the
// background goroutine folds them into the main table.
func TestBackgroundFoldsBufferedWrites(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	big := make([]rowbatch.Row, 20000)
	for i := range big {
		big[i] = rowbatch.Row{StepID: "wc.count", Key: fmt.Sprintf("k%06d", i), Value: make([]byte, 100)}
	}
	_, err = s.Write(ctx, rowbatch.NewBatch(1, big, false))
	require.NoError(t, err)
	for e := int64(2); e < 6; e++ {
		small := make([]rowbatch.Row, foldRows/3)
		for i := range small {
			small[i] = put(fmt.Sprintf("k%06d", i*7), fmt.Sprint(e))
		}
		_, err = s.Write(ctx, rowbatch.NewBatch(e, small, false))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.file.RecentRows() < foldRows
	}, 10*time.Second, 10*time.Millisecond)
	r, found, err := s.Get(ctx, "wc.count", "k000007")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, "5", string(r.Value))
}

func TestOpenRefusesMismatchedStores(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		mutate func(*Config)
		want   error
		msg    string
	}{
		{"key groups", func(c *Config) { c.KeyGroupCount = 32 }, ErrForeign, "16 key groups, not 32"},
		{"worker count", func(c *Config) { c.WorkerCount = 2 }, ErrLayoutChanged, "worker 0 of 1, not 0 of 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := Open(ctx, cfg(dir), 0)
			require.NoError(t, err)
			require.NoError(t, s.Close())
			other := cfg(dir)
			c.mutate(&other)
			_, err = Open(ctx, other, 0)
			require.ErrorIs(t, err, c.want)
			assert.Contains(t, err.Error(), c.msg)
		})
	}
}

func TestOpenRefusesStoreCopiedFromAnotherFlow(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	other := cfg(dir)
	other.FlowID = "other"
	require.NoError(t, os.MkdirAll(filepath.Dir(WorkerDir(dir, "other", 0)), 0o755))
	require.NoError(t, os.Rename(WorkerDir(dir, "wc", 0), WorkerDir(dir, "other", 0)))
	_, err = Open(ctx, other, 0)
	require.ErrorIs(t, err, ErrForeign)
	assert.Contains(t, err.Error(), `holds state of flow "wc", not "other"`)
}

func TestConfigValidation(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Config)
		msg    string
	}{
		{"dot in flow id", func(c *Config) { c.FlowID = "a.b" }, "may not contain"},
		{"empty flow id", func(c *Config) { c.FlowID = "" }, "flow id is empty"},
		{"no dir", func(c *Config) { c.Dir = "" }, "directory is empty"},
		{"worker index", func(c *Config) { c.WorkerIndex = 3 }, "out of range"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := cfg(t.TempDir())
			c.mutate(&x)
			_, err := Open(context.Background(), x, 0)
			require.ErrorContains(t, err, c.msg)
		})
	}
}

func TestOpenMakesTheLocalStateDirAndRefusesAFile(t *testing.T) {
	ctx := context.Background()
	missing := filepath.Join(t.TempDir(), "not", "yet")
	s, err := Open(ctx, cfg(missing), 0)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	assert.DirExists(t, WorkerDir(missing, "wc", 0))

	file := filepath.Join(t.TempDir(), "afile")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))
	_, err = Open(ctx, cfg(file), 0)
	require.ErrorContains(t, err, file+" exists and is not a directory")
}

func TestGCRemovesSupersededRowsIncrementally(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	for e := int64(1); e <= 5; e++ {
		_, err := s.Write(ctx, rowbatch.NewBatch(e, []rowbatch.Row{put("a", strconv.FormatInt(e, 10))}, false))
		require.NoError(t, err)
	}
	n, err := s.GC(ctx, 3)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	assert.Equal(t, int64(3), s.Meta().GCEpoch)
	st, err := s.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(3), st.Rows)
}

func TestFinalGCCollectsOnlyASmallBacklog(t *testing.T) {
	ctx := context.Background()
	// Epochs 1-5 each write a and b (10 rows); a GC at epoch 1 builds the
	// epoch index and leaves a backlog of 8 rows written after it.
	tests := []struct {
		name      string
		committed int64
		maxRows   int64
		collected bool
		rowsLeft  int64
	}{
		{"small backlog", 4, 100, true, 4}, // a and b at epochs 4 and 5 (5 is uncommitted)
		{"backlog over the bound", 4, 7, false, 10},
		{"backlog at the bound", 4, 8, true, 4},
		{"nothing committed past the last gc", 1, 100, false, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Open(ctx, cfg(t.TempDir()), 0)
			require.NoError(t, err)
			defer s.Close()
			for e := int64(1); e <= 5; e++ {
				v := strconv.FormatInt(e, 10)
				_, err := s.Write(ctx, rowbatch.NewBatch(e, []rowbatch.Row{put("a", v), put("b", v)}, false))
				require.NoError(t, err)
			}
			_, err = s.GC(ctx, 1)
			require.NoError(t, err)
			collected, err := s.FinalGC(ctx, tt.committed, tt.maxRows)
			require.NoError(t, err)
			assert.Equal(t, tt.collected, collected)
			st, err := s.Stats(ctx)
			require.NoError(t, err)
			assert.Equal(t, tt.rowsLeft, st.Rows)
			want := int64(1)
			if tt.collected {
				want = tt.committed
			}
			assert.Equal(t, want, s.Meta().GCEpoch)
			r, found, err := s.Get(ctx, "wc.count", "a")
			require.NoError(t, err)
			require.True(t, found)
			assert.Equal(t, "5", string(r.Value))
		})
	}
}

// TestCrashMidWriteKeepsEveryFinishedBatch runs a child that writes batches
// and reports each finished one, kills it with SIGKILL in the middle of the
// stream, and checks the store: readable, every reported batch intact, no
// partial batch visible.
func TestCrashMidWriteKeepsEveryFinishedBatch(t *testing.T) {
	if os.Getenv("MILLPOND_CRASH_CHILD") != "" {
		t.Skip("child mode")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.v")
	cmd.Env = append(os.Environ(), "MILLPOND_CRASH_CHILD="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	done := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "batch ") {
			done, _ = strconv.Atoi(strings.TrimPrefix(sc.Text(), "batch "))
			if done >= 7 {
				break
			}
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
	require.GreaterOrEqual(t, done, 7)

	ctx := context.Background()
	s, err := Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	defer s.Close()
	// Each batch e writes 2000 keys with value "e"; a batch is visible
	// either entirely or not at all.
	counts := map[string]int{}
	require.NoError(t, func() error {
		var cur snapfile.Cursor
		for {
			rows, next, end, err := s.ScanPage(ctx, snapfile.ScanOptions{StepID: "wc.count"}, cur)
			if err != nil {
				return err
			}
			for _, r := range rows {
				counts[string(r.Value)]++
			}
			if end {
				return nil
			}
			cur = next
		}
	}())
	last := s.Meta().LastEpoch
	require.GreaterOrEqual(t, last, int64(done), "every reported batch is durable")
	assert.Equal(t, map[string]int{strconv.FormatInt(last, 10): 2000}, counts)
}

// TestCrashChild is the child of the crash test: it writes until killed.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv("MILLPOND_CRASH_CHILD")
	if dir == "" {
		t.Skip("only runs as the crash test's child")
	}
	ctx := context.Background()
	s, err := Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	for e := int64(1); ; e++ {
		rows := make([]rowbatch.Row, 2000)
		for i := range rows {
			rows[i] = put(fmt.Sprintf("k%05d", i), strconv.FormatInt(e, 10))
		}
		_, err := s.Write(ctx, rowbatch.NewBatch(e, rows, false))
		require.NoError(t, err)
		fmt.Printf("batch %d\n", e)
		os.Stdout.Sync()
	}
}

// TestWriteAsyncKeepsOrderAndReadsSeeIt writes batches in the background
// while another goroutine reads and collects garbage: reads must see every
// batch queued before them, and the last write must win.
func TestWriteAsyncKeepsOrderAndReadsSeeIt(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _, _ = s.Get(ctx, "wc.count", "k")
			_, _ = s.GC(ctx, 1)
		}
	}()
	for e := int64(1); e <= 50; e++ {
		require.NoError(t, s.WriteAsync(rowbatch.NewBatch(e, []rowbatch.Row{put("k", strconv.FormatInt(e, 10))}, false), nil))
		r, found, err := s.Get(ctx, "wc.count", "k")
		require.NoError(t, err)
		require.True(t, found)
		assert.Equal(t, strconv.FormatInt(e, 10), string(r.Value), "a read waits for queued writes")
	}
	close(stop)
	<-readerDone
	require.NoError(t, s.Close())
}

func TestWriteAsyncErrorSurfacesOnNextCall(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(5, []rowbatch.Row{put("a", "1")}, false), nil))
	require.NoError(t, s.WriteAsync(rowbatch.NewBatch(3, []rowbatch.Row{put("a", "2")}, false), nil)) // goes back in time: fails in the background
	err = s.Flush()
	require.ErrorContains(t, err, "never go back")
	require.Error(t, s.WriteAsync(rowbatch.NewBatch(6, nil, false), nil))
}

// A background checkpoint waits for the gate the owner set (the recovery
// run holds checkpoints while an epoch's segments are being made durable).
func TestCheckpointWaitsForItsGate(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	release := make(chan struct{})
	var calls atomic.Int32
	s.SetCheckpointGate(func() {
		calls.Add(1)
		<-release
	})
	walBytes := func() int64 {
		st, err := os.Stat(s.Path() + "-wal")
		if err != nil {
			return 0
		}
		return st.Size()
	}
	rows := make([]rowbatch.Row, 4000)
	for i := range rows {
		rows[i] = rowbatch.Row{StepID: "s", Key: fmt.Sprintf("k%06d", i), Value: make([]byte, 300)}
	}
	_, err = s.Write(ctx, rowbatch.NewBatch(1, rows, false))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return calls.Load() > 0 }, 10*time.Second, time.Millisecond, "a checkpoint is due and asks the gate")
	time.Sleep(50 * time.Millisecond)
	assert.Positive(t, walBytes(), "no checkpoint while the gate holds it")
	close(release)
	require.Eventually(t, func() bool { return walBytes() == 0 }, 10*time.Second, time.Millisecond, "the checkpoint runs once the gate opens")
}

// Every batch handed to the store is released exactly once, whether it was
// written synchronously, in the background, as a new generation, or after
// the writer failed.
func TestWritesReleaseTheirBatchOnce(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	var freed atomic.Int64
	owned := func(epoch int64, whole bool, keys ...string) rowbatch.Batch {
		rows := make([]rowbatch.Row, len(keys))
		for i, k := range keys {
			rows[i] = put(k, k)
		}
		b := rowbatch.NewBatch(epoch, rows, whole)
		b.Mem = rowbatch.NewMemory(func() { freed.Add(1) })
		return b
	}
	_, err = s.Write(ctx, owned(1, false, "a"))
	require.NoError(t, err)
	require.NoError(t, s.WriteAsync(owned(2, false, "b"), nil))
	require.NoError(t, s.WriteAsync(owned(3, true, "a", "b"), nil))
	require.NoError(t, s.WriteAsync(owned(1, false, "c"), nil)) // goes back in time: fails in the background
	require.Error(t, s.Flush())
	require.Error(t, s.WriteAsync(owned(4, false, "d"), nil), "the failure is returned by the next call")
	assert.Equal(t, int64(5), freed.Load())
}
