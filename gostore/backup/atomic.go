package backup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// TempPrefix starts the name of every temporary file the backends create
// while writing a file atomically. Listings skip such files, and a key with a
// segment that starts with it is rejected by the directory backend.
const TempPrefix = ".mp-tmp-"

// DirMode and FileMode are the permissions of the directories and files the
// backends create: owner-only, because they hold a flow's state. The umask
// may narrow them further; nothing widens them.
const (
	DirMode  os.FileMode = 0o700
	FileMode os.FileMode = 0o600
)

// IsTempName reports whether the base name of a file marks it as a temporary
// file of [WriteFileAtomic].
func IsTempName(name string) bool {
	return strings.HasPrefix(name, TempPrefix)
}

// WriteFileAtomic creates path with the content written by fill: fill writes
// to a temporary file in the same directory, which is then fsynced, closed,
// renamed over path, and the directory fsynced. On any error the temporary
// file is removed and path is left untouched.
//
// The file is owner-only (0600, as os.CreateTemp makes it, narrowed further
// by the umask): objects hold a flow's state, which may be private, and
// nothing here widens what the umask allows.
func WriteFileAtomic(path string, fill func(f *os.File) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, TempPrefix+base+"-*")
	if err != nil {
		return fmt.Errorf("create temporary file for %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if err := fill(f); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, path, err)
	}
	if err := SyncDir(dir); err != nil {
		return err
	}
	return nil
}

// SyncDir fsyncs a directory so that renames and removals in it are durable.
// Filesystems that cannot fsync a directory (EINVAL, ENOTSUP, as some network
// filesystems do) are tolerated.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s for fsync: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil &&
		!errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
