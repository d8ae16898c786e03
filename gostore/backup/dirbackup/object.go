package dirbackup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/millpond/millpond/gostore/backup"
)

// mkdirAttempts bounds the retries of an upload whose target directory was
// removed by a concurrent Delete (which prunes empty directories) between
// creating it and writing into it. Each retry is cheap.
const mkdirAttempts = 100

// Upload copies localPath into the store under key, atomically: a temporary
// file in the target directory, fsync, rename, fsync of the directory.
func (b *DirBackup) Upload(ctx context.Context, localPath, key string) error {
	dst, err := b.path(key)
	if err != nil {
		return fmt.Errorf("upload %s to %s: %w", localPath, b, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("upload %s to %s in %s: %w", localPath, key, b, err)
	}
	src, err := os.Open(localPath)
	if err != nil {
		return fmt.Errorf("upload %s to %s in %s: %w", localPath, key, b, err)
	}
	defer src.Close()
	for attempt := 1; ; attempt++ {
		err = b.writeObject(src, dst)
		if err == nil || attempt == mkdirAttempts ||
			!(errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrExist)) {
			break
		}
		// A concurrent Delete pruned a directory we just created (ENOENT),
		// or pruned one MkdirAll saw appear (EEXIST, then gone).
		if _, serr := src.Seek(0, io.SeekStart); serr != nil {
			err = serr
			break
		}
	}
	if err != nil {
		return fmt.Errorf("upload %s to %s in %s: %w", localPath, key, b, err)
	}
	b.logger.Debug("uploaded", "store", b.String(), "key", key)
	return nil
}

func (b *DirBackup) writeObject(src *os.File, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return backup.WriteFileAtomic(dst, func(f *os.File) error {
		_, err := io.Copy(f, src)
		return err
	})
}

// Download copies the object at key to localPath, atomically. A missing key
// (or a key naming a directory) gives an error wrapping [backup.ErrNotFound].
func (b *DirBackup) Download(ctx context.Context, key, localPath string) error {
	src, err := b.path(key)
	if err != nil {
		return fmt.Errorf("download from %s: %w", b, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("download %s from %s: %w", key, b, err)
	}
	in, err := os.Open(src)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("download %s from %s: %w", key, b, backup.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("download %s from %s: %w", key, b, err)
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil {
		return fmt.Errorf("download %s from %s: %w", key, b, err)
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("download %s from %s: %w", key, b, backup.ErrNotFound)
	}
	err = backup.WriteFileAtomic(localPath, func(f *os.File) error {
		_, err := io.Copy(f, in)
		return err
	})
	if err != nil {
		return fmt.Errorf("download %s from %s to %s: %w", key, b, localPath, err)
	}
	return nil
}

// Delete removes the object at key, then any directories the removal left
// empty (up to, not including, the root). A missing key is not an error.
func (b *DirBackup) Delete(ctx context.Context, key string) error {
	p, err := b.path(key)
	if err != nil {
		return fmt.Errorf("delete from %s: %w", b, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete %s from %s: %w", key, b, err)
	}
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && fi.IsDir()) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete %s from %s: %w", key, b, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s from %s: %w", key, b, err)
	}
	dir := filepath.Dir(p)
	if err := backup.SyncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s from %s: %w", key, b, err)
	}
	b.pruneEmptyDirs(dir)
	return nil
}

// pruneEmptyDirs removes dir and its ancestors below the root while they are
// empty. Failing to remove one (not empty, raced with an upload) just stops.
func (b *DirBackup) pruneEmptyDirs(dir string) {
	for dir != b.root && len(dir) > len(b.root) {
		if err := os.Remove(dir); err != nil {
			return
		}
		dir = filepath.Dir(dir)
	}
}

// Adopt stores a finished, fsynced local file under key by linking it into
// the store (a temporary name in the target directory, rename, fsync of
// the directory); across filesystems it falls back to Upload's copy.
func (b *DirBackup) Adopt(ctx context.Context, localPath, key string) error {
	dst, err := b.path(key)
	if err != nil {
		return fmt.Errorf("adopt %s as %s: %w", localPath, b, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("adopt %s as %s in %s: %w", localPath, key, b, err)
	}
	dir := filepath.Dir(dst)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return b.Upload(ctx, localPath, key)
	}
	tmp := filepath.Join(dir, backup.TempPrefix+filepath.Base(dst)+"-link")
	os.Remove(tmp)
	if err := os.Link(localPath, tmp); err != nil {
		return b.Upload(ctx, localPath, key) // another filesystem, or no links
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("adopt %s as %s in %s: %w", localPath, key, b, err)
	}
	if err := backup.SyncDir(dir); err != nil {
		return fmt.Errorf("adopt %s as %s in %s: %w", localPath, key, b, err)
	}
	b.logger.Debug("adopted", "store", b.String(), "key", key)
	return nil
}
