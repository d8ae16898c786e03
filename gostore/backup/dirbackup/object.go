package dirbackup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

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
	if err := b.writeObject(src, dst); err != nil {
		return fmt.Errorf("upload %s to %s in %s: %w", localPath, key, b, b.quiet(err))
	}
	b.logger.Debug("uploaded", "store", b.String(), "key", key)
	return nil
}

// writeObject writes the content of src to dst atomically, creating its
// directory (owner-only) first.
func (b *DirBackup) writeObject(src io.ReadSeeker, dst string) error {
	return retryPruned(func() error {
		if _, err := src.Seek(0, io.SeekStart); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(dst), backup.DirMode); err != nil {
			return err
		}
		return backup.WriteFileAtomic(dst, func(f *os.File) error {
			_, err := io.Copy(f, src)
			return err
		})
	})
}

// retryPruned runs write again while it fails because a concurrent Delete
// pruned a directory it had just created (ENOENT), or pruned one MkdirAll
// saw appear (EEXIST, then gone).
func retryPruned(write func() error) error {
	var err error
	for attempt := 1; attempt <= mkdirAttempts; attempt++ {
		err = write()
		if err == nil || !(errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrExist)) {
			return err
		}
	}
	return err
}

// quiet drops the path from an error of the os package about a file of the
// store: the callers' messages already name the key and the store, and
// "dir /x: open /x/flow/k: ..." would name them twice. errors.Is still
// sees the cause.
func (b *DirBackup) quiet(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.HasPrefix(pe.Path, b.root+string(filepath.Separator)) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	var le *os.LinkError
	if errors.As(err, &le) && strings.HasPrefix(le.New, b.root+string(filepath.Separator)) {
		return fmt.Errorf("%s: %w", le.Op, le.Err)
	}
	return err
}

// isMissing reports whether err from opening a store file means there is no
// object: the file does not exist, or an ancestor of it is a file (the key
// runs past an object's key, "a/b" when "a" is an object).
func isMissing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
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
	in, err := b.open(src)
	if err != nil {
		return fmt.Errorf("download %s from %s: %w", key, b, err)
	}
	defer in.Close()
	err = backup.WriteFileAtomic(localPath, func(f *os.File) error {
		_, err := io.Copy(f, in)
		return err
	})
	if err != nil {
		return fmt.Errorf("download %s from %s to %s: %w", key, b, localPath, b.quiet(err))
	}
	return nil
}

// open opens the object file p for reading. No file, or a directory,
// gives [backup.ErrNotFound]; other errors are quieted (see quiet).
func (b *DirBackup) open(p string) (*os.File, error) {
	in, err := os.Open(p)
	if isMissing(err) {
		return nil, backup.ErrNotFound
	}
	if err != nil {
		return nil, b.quiet(err)
	}
	if fi, err := in.Stat(); err != nil {
		in.Close()
		return nil, b.quiet(err)
	} else if !fi.Mode().IsRegular() {
		in.Close()
		return nil, backup.ErrNotFound
	}
	return in, nil
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
	if err != nil && errors.Is(err, syscall.ENOTDIR) {
		return nil // an ancestor is an object: no object has this key
	}
	if err != nil {
		return fmt.Errorf("delete %s from %s: %w", key, b, b.quiet(err))
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s from %s: %w", key, b, b.quiet(err))
	}
	dir := filepath.Dir(p)
	if err := backup.SyncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s from %s: %w", key, b, b.quiet(err))
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
	if err := os.MkdirAll(dir, backup.DirMode); err != nil {
		return b.Upload(ctx, localPath, key)
	}
	tmp := filepath.Join(dir, backup.TempPrefix+filepath.Base(dst)+"-link")
	os.Remove(tmp)
	if err := os.Link(localPath, tmp); err != nil {
		return b.Upload(ctx, localPath, key) // another filesystem, or no links
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("adopt %s as %s in %s: %w", localPath, key, b, b.quiet(err))
	}
	if err := backup.SyncDir(dir); err != nil {
		return fmt.Errorf("adopt %s as %s in %s: %w", localPath, key, b, err)
	}
	b.logger.Debug("adopted", "store", b.String(), "key", key)
	return nil
}
