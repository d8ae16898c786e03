package dirbackup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/backup/backuptest"
)

func newTestBackup(t *testing.T) *DirBackup {
	t.Helper()
	b, err := New(filepath.Join(t.TempDir(), "store"), nil)
	require.NoError(t, err)
	return b
}

func TestConformance(t *testing.T) {
	backuptest.RunConformance(t, func(t *testing.T) backup.Backup { return newTestBackup(t) })
}

func TestNewCreatesRootWhenParentExists(t *testing.T) {
	root := filepath.Join(t.TempDir(), "fresh")
	b, err := New(root, nil)
	require.NoError(t, err)
	assert.DirExists(t, root)
	assert.Equal(t, "dir "+root, b.String())
	require.NoError(t, b.Check(context.Background()))
}

func TestNewRejectsMissingParentAndFiles(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	tests := []struct {
		name, root, wantMsg string
	}{
		{"MissingParent", filepath.Join(tmp, "no", "such"), "does not exist, and neither does its parent " + filepath.Join(tmp, "no")},
		{"RootIsFile", file, "backup directory " + file + " exists and is not a directory; name a directory"},
		{"ParentIsFile", filepath.Join(file, "sub"), "backup directory " + filepath.Join(file, "sub") + " cannot be created: " + file + " is not a directory"},
		{"GrandparentIsFile", filepath.Join(file, "a", "b"), " cannot be created: " + file + " is not a directory"},
		{"Empty", "", "empty path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.root, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantMsg)
			assert.Contains(t, err.Error(), tt.root)
		})
	}
}

func TestCheckFailsWhenRootRemoved(t *testing.T) {
	b := newTestBackup(t)
	require.NoError(t, os.Remove(b.Root()))
	err := b.Check(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), b.Root())
}

func TestListSkipsTemporaryFiles(t *testing.T) {
	b := newTestBackup(t)
	backuptest.Put(t, b, "flow/a", []byte("a"))
	// Leftovers of an upload interrupted by a crash.
	require.NoError(t, os.WriteFile(filepath.Join(b.Root(), "flow", backup.TempPrefix+"a-123"), []byte("partial"), 0o600))
	require.NoError(t, os.MkdirAll(filepath.Join(b.Root(), backup.TempPrefix+"dir"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(b.Root(), backup.TempPrefix+"dir", "x"), nil, 0o600))
	assert.Equal(t, []string{"flow/a"}, backuptest.Keys(t, b, ""))
	assert.Equal(t, []string{"flow/a"}, backuptest.Keys(t, b, "flow/"))
}

func TestKeysWithTempPrefixRejected(t *testing.T) {
	b := newTestBackup(t)
	src, _ := backuptest.WriteRandomFile(t, t.TempDir(), 1)
	err := b.Upload(context.Background(), src, "flow/"+backup.TempPrefix+"x")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "reserved prefix")
}

func TestDeletePrunesEmptyDirectories(t *testing.T) {
	b := newTestBackup(t)
	ctx := context.Background()
	backuptest.Put(t, b, "f/e/1/seg", []byte("x"))
	backuptest.Put(t, b, "f/keep", []byte("y"))
	require.NoError(t, b.Delete(ctx, "f/e/1/seg"))
	assert.NoDirExists(t, filepath.Join(b.Root(), "f", "e"))
	assert.DirExists(t, filepath.Join(b.Root(), "f"))
	require.NoError(t, b.Delete(ctx, "f/keep"))
	assert.NoDirExists(t, filepath.Join(b.Root(), "f"))
	assert.DirExists(t, b.Root(), "the root itself is never pruned")
}

func TestUploadUnderAnObjectKeyFails(t *testing.T) {
	b := newTestBackup(t)
	backuptest.Put(t, b, "a", []byte("x"))
	src, _ := backuptest.WriteRandomFile(t, t.TempDir(), 1)
	err := b.Upload(context.Background(), src, "a/b")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "a/b")
}

// TestObjectsAndDirectoriesAreOwnerOnly pins the permissions of what the
// store creates: files 0600 and directories 0700 (they hold flow state),
// narrowed by the umask and never widened beyond it.
func TestObjectsAndDirectoriesAreOwnerOnly(t *testing.T) {
	shm := "/dev/shm"
	for _, umask := range []int{0o022, 0o077, 0o027} {
		t.Run(fmt.Sprintf("umask=%03o", umask), func(t *testing.T) {
			old := syscall.Umask(umask)
			t.Cleanup(func() { syscall.Umask(old) })
			wantFile := backup.FileMode &^ os.FileMode(umask)
			wantDir := backup.DirMode &^ os.FileMode(umask)
			ctx := context.Background()

			b := newTestBackup(t)
			backuptest.Put(t, b, "up/load/x", []byte("upload"))
			require.NoError(t, b.Put(ctx, "put/x", []byte("put")))
			require.NoError(t, b.Create(ctx, "create/x", []byte("create")))
			paths := map[string]os.FileMode{
				b.Root():                                   wantDir,
				filepath.Join(b.Root(), "up"):              wantDir,
				filepath.Join(b.Root(), "up", "load"):      wantDir,
				filepath.Join(b.Root(), "up", "load", "x"): wantFile,
				filepath.Join(b.Root(), "put", "x"):        wantFile,
				filepath.Join(b.Root(), "create"):          wantDir,
				filepath.Join(b.Root(), "create", "x"):     wantFile,
			}
			// Adopt copies when it cannot link: a source on another
			// filesystem (tmpfs) takes that path.
			if fi, err := os.Stat(shm); err == nil && fi.IsDir() && !sameDevice(t, shm, b.Root()) {
				src, err := os.CreateTemp(shm, "mp-adopt-test-*")
				require.NoError(t, err)
				t.Cleanup(func() { os.Remove(src.Name()) })
				require.NoError(t, src.Close())
				require.NoError(t, os.Chmod(src.Name(), 0o644))
				require.NoError(t, b.Adopt(ctx, src.Name(), "adopted/x"))
				paths[filepath.Join(b.Root(), "adopted", "x")] = wantFile
			}
			local := filepath.Join(t.TempDir(), "downloaded")
			require.NoError(t, b.Download(ctx, "put/x", local))
			paths[local] = wantFile

			for p, want := range paths {
				fi, err := os.Stat(p)
				require.NoError(t, err)
				assert.Equal(t, want, fi.Mode().Perm(), "%s", p)
			}
		})
	}
}

func sameDevice(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	require.NoError(t, syscall.Stat(a, &sa))
	require.NoError(t, syscall.Stat(b, &sb))
	return sa.Dev == sb.Dev
}

func TestErrorsNameTheObjectOnce(t *testing.T) {
	b := newTestBackup(t)
	ctx := context.Background()
	backuptest.Put(t, b, "flow/seg", []byte("x"))
	// A key running past an object is a missing object, said once, not
	// "open ROOT/flow/seg/more: not a directory".
	err := b.Download(ctx, "flow/seg/more", filepath.Join(t.TempDir(), "x"))
	require.ErrorIs(t, err, backup.ErrNotFound)
	assert.Equal(t, "download flow/seg/more from dir "+b.Root()+": object not found", err.Error())
	_, err = b.Get(ctx, "flow/nope")
	assert.Equal(t, "get flow/nope from dir "+b.Root()+": object not found", err.Error())
	require.NoError(t, b.Delete(ctx, "flow/seg/more"), "no object there, so nothing to delete")
	err = b.Put(ctx, "flow/seg/more", []byte("x"))
	require.Error(t, err)
	assert.Equal(t, 1, strings.Count(err.Error(), b.Root()), "%v", err)
	err = b.Create(ctx, "flow", []byte("x"))
	require.Error(t, err)
	assert.NotErrorIs(t, err, backup.ErrExists, "a directory of keys is not an object")
	assert.Equal(t, 1, strings.Count(err.Error(), b.Root()), "%v", err)
}

// TestConcurrentUploadAndDeleteInSameDirectory races uploads against deletes
// that prune the directory the uploads write into.
func TestConcurrentUploadAndDeleteInSameDirectory(t *testing.T) {
	b := newTestBackup(t)
	src, _ := backuptest.WriteRandomFile(t, t.TempDir(), 100)
	ctx := context.Background()
	errs := make(chan error, 8)
	for w := range 4 {
		go func() {
			var err error
			for i := 0; i < 50 && err == nil; i++ {
				key := filepath.ToSlash(filepath.Join("d", "e", string(rune('a'+w))))
				if err = b.Upload(ctx, src, key); err == nil {
					err = b.Delete(ctx, key)
				}
			}
			errs <- err
		}()
	}
	var failures []error
	for range 4 {
		if err := <-errs; err != nil {
			failures = append(failures, err)
		}
	}
	require.Empty(t, failures)
	assert.Empty(t, backuptest.Keys(t, b, ""))
}

func TestAdoptLinksTheFileAndSurvivesRemovalOfTheOriginal(t *testing.T) {
	ctx := context.Background()
	b := newTestBackup(t)
	src := filepath.Join(t.TempDir(), "seg.sqlite")
	require.NoError(t, os.WriteFile(src, []byte("sealed segment"), 0o644))
	require.NoError(t, b.Adopt(ctx, src, "flow/segments/000001/w0000.sqlite"))
	require.NoError(t, os.Remove(src), "the caller drops its own name")
	dst := filepath.Join(t.TempDir(), "back")
	require.NoError(t, b.Download(ctx, "flow/segments/000001/w0000.sqlite", dst))
	got, err := os.ReadFile(dst)
	require.NoError(t, err)
	assert.Equal(t, "sealed segment", string(got))
	keys, err := b.List(ctx, "flow/")
	require.NoError(t, err)
	require.Len(t, keys, 1, "no temporary link is left listed")
	var _ backup.Adopter = b
}

func TestAdoptMissingFileFails(t *testing.T) {
	b := newTestBackup(t)
	err := b.Adopt(context.Background(), filepath.Join(t.TempDir(), "missing"), "k")
	require.Error(t, err)
}
