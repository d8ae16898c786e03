// Package backuptest holds the conformance suite every [backup.Backup]
// implementation must pass, and small helpers for backend tests.
package backuptest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup"
)

// RunConformance runs the behaviour every backend must have as subtests of t.
// newBackup returns an empty store; it is called once per subtest.
func RunConformance(t *testing.T, newBackup func(t *testing.T) backup.Backup) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b backup.Backup)
	}{
		{"RoundTripKeepsContent", testRoundTrip},
		{"ListEmptyStore", testListEmpty},
		{"ListByStringPrefixSortedWithSizes", testListPrefixes},
		{"UploadReplacesObject", testOverwrite},
		{"DownloadMissingKeyIsErrNotFound", testDownloadMissing},
		{"DownloadReplacesLocalFile", testDownloadReplacesLocal},
		{"DeleteRemovesAndMissingIsNoError", testDelete},
		{"InvalidKeysRejected", testInvalidKeys},
		{"UploadMissingLocalFileFails", testUploadMissingLocal},
		{"ConcurrentListNeverSeesPartialObject", testAtomicUpload},
		{"CanceledContextFails", testCanceled},
		{"StringDescribesStore", testString},
		{"SmallPutGetRoundTripAndReplace", small(testSmallRoundTrip)},
		{"SmallGetMissingKeyIsErrNotFound", small(testSmallGetMissing)},
		{"SmallCreateRefusesExistingKey", small(testCreateExisting)},
		{"SmallConcurrentCreatesExactlyOneWins", small(testCreateRace)},
		{"SmallInvalidKeysAndCanceledContext", small(testSmallInvalidAndCanceled)},
		{"SmallLeavesNoFilesInTempDir", small(testSmallNoTempFiles)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newBackup(t))
		})
	}
}

// WriteRandomFile writes size random bytes to a new file in dir and returns
// its path and content.
func WriteRandomFile(t testing.TB, dir string, size int) (string, []byte) {
	t.Helper()
	data := make([]byte, size)
	_, err := rand.Read(data)
	require.NoError(t, err)
	f, err := os.CreateTemp(dir, "src-*")
	require.NoError(t, err)
	_, err = f.Write(data)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return f.Name(), data
}

// Put uploads data under key through a temporary local file.
func Put(t testing.TB, b backup.Backup, key string, data []byte) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "put")
	require.NoError(t, os.WriteFile(src, data, 0o600))
	require.NoError(t, b.Upload(context.Background(), src, key))
}

// Get downloads key and returns its content.
func Get(t testing.TB, b backup.Backup, key string) []byte {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "get")
	require.NoError(t, b.Download(context.Background(), key, dst))
	data, err := os.ReadFile(dst)
	require.NoError(t, err)
	return data
}

// Keys lists prefix and returns the keys only.
func Keys(t testing.TB, b backup.Backup, prefix string) []string {
	t.Helper()
	infos, err := b.List(context.Background(), prefix)
	require.NoError(t, err)
	keys := make([]string, 0, len(infos))
	for _, o := range infos {
		keys = append(keys, o.Key)
	}
	return keys
}

func testRoundTrip(t *testing.T, b backup.Backup) {
	for _, size := range []int{0, 1, 1000, 1 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			src, data := WriteRandomFile(t, t.TempDir(), size)
			key := fmt.Sprintf("flow/seg-%d", size)
			require.NoError(t, b.Upload(context.Background(), src, key))
			assert.True(t, bytes.Equal(data, Get(t, b, key)), "content differs after round trip")
			infos, err := b.List(context.Background(), key)
			require.NoError(t, err)
			require.Len(t, infos, 1)
			assert.Equal(t, backup.ObjectInfo{Key: key, Size: int64(size)}, infos[0])
		})
	}
}

func testListEmpty(t *testing.T, b backup.Backup) {
	for _, prefix := range []string{"", "a", "a/", "a/b/c/"} {
		infos, err := b.List(context.Background(), prefix)
		require.NoError(t, err, "prefix %q", prefix)
		assert.Empty(t, infos, "prefix %q", prefix)
	}
}

func testListPrefixes(t *testing.T, b backup.Backup) {
	keys := []string{"b", "a/b/c", "a.b", "ab", "a/b2", "a/bc/d", "a/b/d/e", "z/y/x/w"}
	for i, k := range keys {
		Put(t, b, k, bytes.Repeat([]byte{'x'}, i+1))
	}
	tests := []struct {
		prefix string
		want   []string
	}{
		{"", []string{"a.b", "a/b/c", "a/b/d/e", "a/b2", "a/bc/d", "ab", "b", "z/y/x/w"}},
		{"a", []string{"a.b", "a/b/c", "a/b/d/e", "a/b2", "a/bc/d", "ab"}},
		{"a/", []string{"a/b/c", "a/b/d/e", "a/b2", "a/bc/d"}},
		{"a/b", []string{"a/b/c", "a/b/d/e", "a/b2", "a/bc/d"}},
		{"a/b/", []string{"a/b/c", "a/b/d/e"}},
		{"a/b/c", []string{"a/b/c"}},
		{"a/b/d/", []string{"a/b/d/e"}},
		{"z/y/", []string{"z/y/x/w"}},
		{"zz", []string{}},
		{"c/", []string{}},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, Keys(t, b, tt.prefix), "prefix %q", tt.prefix)
	}
	infos, err := b.List(context.Background(), "")
	require.NoError(t, err)
	sizes := map[string]int64{}
	for _, o := range infos {
		sizes[o.Key] = o.Size
	}
	for i, k := range keys {
		assert.Equal(t, int64(i+1), sizes[k], "size of %q", k)
	}
}

func testOverwrite(t *testing.T, b backup.Backup) {
	Put(t, b, "k/v", []byte("first version, longer"))
	Put(t, b, "k/v", []byte("second"))
	assert.Equal(t, "second", string(Get(t, b, "k/v")))
	infos, err := b.List(context.Background(), "k/")
	require.NoError(t, err)
	assert.Equal(t, []backup.ObjectInfo{{Key: "k/v", Size: 6}}, infos)
}

func testDownloadMissing(t *testing.T, b backup.Backup) {
	Put(t, b, "present/x", []byte("x"))
	for _, key := range []string{"missing", "present/y", "present"} {
		dst := filepath.Join(t.TempDir(), "dst")
		err := b.Download(context.Background(), key, dst)
		require.Error(t, err, "key %q", key)
		assert.True(t, errors.Is(err, backup.ErrNotFound), "key %q: %v", key, err)
		// The message names the object once: "dir /x: /x/flow/k" or a key
		// printed by two layers reads as two different objects.
		assert.Equal(t, 1, strings.Count(strings.ReplaceAll(err.Error(), dst, ""), key), "key %q: %v", key, err)
		assert.NoFileExists(t, dst)
		entries, err := os.ReadDir(filepath.Dir(dst))
		require.NoError(t, err)
		assert.Empty(t, entries, "download of a missing key left files behind")
	}
}

func testDownloadReplacesLocal(t *testing.T, b backup.Backup) {
	Put(t, b, "obj", []byte("remote"))
	dir := t.TempDir()
	dst := filepath.Join(dir, "local")
	require.NoError(t, os.WriteFile(dst, []byte("old local content"), 0o600))
	require.NoError(t, b.Download(context.Background(), "obj", dst))
	data, err := os.ReadFile(dst)
	require.NoError(t, err)
	assert.Equal(t, "remote", string(data))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "temporary files left behind")
}

func testDelete(t *testing.T, b backup.Backup) {
	ctx := context.Background()
	Put(t, b, "d/one", []byte("1"))
	Put(t, b, "d/two", []byte("2"))
	require.NoError(t, b.Delete(ctx, "d/one"))
	assert.Equal(t, []string{"d/two"}, Keys(t, b, ""))
	require.NoError(t, b.Delete(ctx, "d/one"), "deleting again")
	require.NoError(t, b.Delete(ctx, "never/existed"))
	err := b.Download(ctx, "d/one", filepath.Join(t.TempDir(), "x"))
	assert.True(t, errors.Is(err, backup.ErrNotFound), "%v", err)
	require.NoError(t, b.Delete(ctx, "d/two"))
	assert.Empty(t, Keys(t, b, ""))
	// The store is still usable after everything under a prefix is gone.
	Put(t, b, "d/three", []byte("3"))
	assert.Equal(t, []string{"d/three"}, Keys(t, b, "d/"))
}

func testInvalidKeys(t *testing.T, b backup.Backup) {
	ctx := context.Background()
	src, _ := WriteRandomFile(t, t.TempDir(), 10)
	dst := filepath.Join(t.TempDir(), "dst")
	for _, key := range []string{"", "/a", "a//b", "a/", "..", "a/../b", "./a", "a/."} {
		assert.Error(t, b.Upload(ctx, src, key), "upload %q", key)
		assert.Error(t, b.Download(ctx, key, dst), "download %q", key)
		assert.Error(t, b.Delete(ctx, key), "delete %q", key)
	}
	for _, prefix := range []string{"/a", "a//", "../x"} {
		_, err := b.List(ctx, prefix)
		assert.Error(t, err, "list %q", prefix)
	}
	assert.Empty(t, Keys(t, b, ""))
}

func testUploadMissingLocal(t *testing.T, b backup.Backup) {
	missing := filepath.Join(t.TempDir(), "nope")
	err := b.Upload(context.Background(), missing, "k")
	require.Error(t, err)
	assert.Contains(t, err.Error(), missing)
	assert.Empty(t, Keys(t, b, ""))
}

// testAtomicUpload uploads several objects concurrently while another
// goroutine lists: every listed object must already have its full size, and
// no temporary object may ever appear.
func testAtomicUpload(t *testing.T, b backup.Backup) {
	ctx := context.Background()
	const n, size = 6, 1 << 20
	src, data := WriteRandomFile(t, t.TempDir(), size)
	done := make(chan struct{})
	var wg sync.WaitGroup
	var listErr error
	var bad []backup.ObjectInfo
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			infos, err := b.List(ctx, "atomic/")
			if err != nil {
				listErr = err
				return
			}
			for _, o := range infos {
				if o.Size != size || len(o.Key) != len("atomic/0") {
					bad = append(bad, o)
				}
			}
			select {
			case <-done:
				return
			default:
			}
		}
	}()
	var uwg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		uwg.Add(1)
		go func() {
			defer uwg.Done()
			errs[i] = b.Upload(ctx, src, fmt.Sprintf("atomic/%d", i))
		}()
	}
	uwg.Wait()
	close(done)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, listErr)
	assert.Empty(t, bad, "listing showed partial or temporary objects")
	assert.Len(t, Keys(t, b, "atomic/"), n)
	assert.True(t, bytes.Equal(data, Get(t, b, "atomic/3")))
}

func testCanceled(t *testing.T, b backup.Backup) {
	Put(t, b, "c", []byte("c"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	src, _ := WriteRandomFile(t, t.TempDir(), 10)
	err := b.Upload(ctx, src, "c2")
	assert.ErrorIs(t, err, context.Canceled)
	_, err = b.List(ctx, "")
	assert.ErrorIs(t, err, context.Canceled)
	err = b.Download(ctx, "c", filepath.Join(t.TempDir(), "x"))
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, []string{"c"}, Keys(t, b, ""))
}

func testString(t *testing.T, b backup.Backup) {
	assert.NotEmpty(t, b.String())
}

// small adapts a test of [backup.Small] to the suite; a backend that does
// not implement it skips the test.
func small(fn func(t *testing.T, b backup.Backup, sb backup.Small)) func(t *testing.T, b backup.Backup) {
	return func(t *testing.T, b backup.Backup) {
		sb, ok := b.(backup.Small)
		if !ok {
			t.Skipf("%s does not implement backup.Small", b)
		}
		fn(t, b, sb)
	}
}

func testSmallRoundTrip(t *testing.T, b backup.Backup, sb backup.Small) {
	ctx := context.Background()
	tests := []struct {
		name string
		key  string
		data []byte
	}{
		{"empty", "rec/empty", []byte{}},
		{"short", "rec/short", []byte("commit 1")},
		{"binary", "rec/deep/er/bin", []byte{0, 1, 2, 255, '\n', 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, sb.Put(ctx, tt.key, tt.data))
			got, err := sb.Get(ctx, tt.key)
			require.NoError(t, err)
			assert.Equal(t, len(tt.data), len(got))
			assert.True(t, bytes.Equal(tt.data, got), "content differs after Put and Get")
			// Small objects are ordinary objects: listed, downloadable.
			assert.True(t, bytes.Equal(tt.data, Get(t, b, tt.key)))
			infos, err := b.List(ctx, tt.key)
			require.NoError(t, err)
			assert.Equal(t, []backup.ObjectInfo{{Key: tt.key, Size: int64(len(tt.data))}}, infos)
		})
	}
	require.NoError(t, sb.Put(ctx, "rec/short", []byte("v2")))
	got, err := sb.Get(ctx, "rec/short")
	require.NoError(t, err)
	assert.Equal(t, "v2", string(got), "Put replaces")
	Put(t, b, "rec/uploaded", []byte("by upload"))
	got, err = sb.Get(ctx, "rec/uploaded")
	require.NoError(t, err)
	assert.Equal(t, "by upload", string(got))
}

func testSmallGetMissing(t *testing.T, b backup.Backup, sb backup.Small) {
	require.NoError(t, sb.Put(context.Background(), "present/x", []byte("x")))
	for _, key := range []string{"missing", "present/y", "present", "present/x/under"} {
		data, err := sb.Get(context.Background(), key)
		require.Error(t, err, "key %q", key)
		assert.Nil(t, data)
		assert.ErrorIs(t, err, backup.ErrNotFound, "key %q", key)
		assert.Equal(t, 1, strings.Count(err.Error(), key), "the key once in %q", err)
	}
}

func testCreateExisting(t *testing.T, b backup.Backup, sb backup.Small) {
	ctx := context.Background()
	require.NoError(t, sb.Create(ctx, "c/one", []byte("first")))
	err := sb.Create(ctx, "c/one", []byte("second"))
	require.Error(t, err)
	assert.ErrorIs(t, err, backup.ErrExists)
	assert.Contains(t, err.Error(), "c/one")
	got, err := sb.Get(ctx, "c/one")
	require.NoError(t, err)
	assert.Equal(t, "first", string(got), "a refused Create changes nothing")

	Put(t, b, "c/uploaded", []byte("by upload"))
	assert.ErrorIs(t, sb.Create(ctx, "c/uploaded", []byte("x")), backup.ErrExists)
	assert.Equal(t, "by upload", string(Get(t, b, "c/uploaded")))

	// Once deleted, the key can be created again.
	require.NoError(t, b.Delete(ctx, "c/one"))
	require.NoError(t, sb.Create(ctx, "c/one", []byte("again")))
	got, err = sb.Get(ctx, "c/one")
	require.NoError(t, err)
	assert.Equal(t, "again", string(got))
	assert.Equal(t, []string{"c/one", "c/uploaded"}, Keys(t, b, "c/"), "no temporary objects listed")
}

// testCreateRace starts many Creates of one key at once, each with its own
// content: exactly one succeeds, every other one reports ErrExists, and
// the object holds the winner's content.
func testCreateRace(t *testing.T, b backup.Backup, sb backup.Small) {
	const n = 24
	ctx := context.Background()
	for round := range 3 {
		key := fmt.Sprintf("race/%d/commit", round)
		start := make(chan struct{})
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = sb.Create(ctx, key, []byte(fmt.Sprintf("writer %d", i)))
			}()
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				assert.Equal(t, -1, winner, "two Creates of %s succeeded: %d and %d", key, winner, i)
				winner = i
				continue
			}
			assert.ErrorIs(t, err, backup.ErrExists, "writer %d", i)
		}
		require.NotEqual(t, -1, winner, "no Create of %s succeeded", key)
		got, err := sb.Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("writer %d", winner), string(got))
		assert.Equal(t, []string{key}, Keys(t, b, fmt.Sprintf("race/%d/", round)))
	}
}

func testSmallInvalidAndCanceled(t *testing.T, b backup.Backup, sb backup.Small) {
	ctx := context.Background()
	for _, key := range []string{"", "/a", "a//b", "a/", "..", "a/../b"} {
		_, err := sb.Get(ctx, key)
		assert.Error(t, err, "get %q", key)
		assert.Error(t, sb.Put(ctx, key, []byte("x")), "put %q", key)
		assert.Error(t, sb.Create(ctx, key, []byte("x")), "create %q", key)
	}
	assert.Empty(t, Keys(t, b, ""))

	require.NoError(t, sb.Put(ctx, "k", []byte("k")))
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err := sb.Get(canceled, "k")
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, sb.Put(canceled, "k2", []byte("x")), context.Canceled)
	assert.ErrorIs(t, sb.Create(canceled, "k3", []byte("x")), context.Canceled)
	assert.Equal(t, []string{"k"}, Keys(t, b, ""))
}

// testSmallNoTempFiles points the process's temporary directory at an
// empty directory and checks that Put, Create and Get leave nothing in it:
// a process killed mid-call must not litter the system's /tmp.
func testSmallNoTempFiles(t *testing.T, b backup.Backup, sb backup.Small) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx := context.Background()
	require.NoError(t, sb.Put(ctx, "t/put", []byte("p")))
	require.NoError(t, sb.Create(ctx, "t/create", []byte("c")))
	_, err := sb.Get(ctx, "t/put")
	require.NoError(t, err)
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, entries)
}
