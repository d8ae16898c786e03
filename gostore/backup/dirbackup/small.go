package dirbackup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/millpond/millpond/gostore/backup"
)

var _ backup.Small = (*DirBackup)(nil)

// Get returns the content of the object at key. A missing key (or a key
// naming a directory) gives an error wrapping [backup.ErrNotFound].
func (b *DirBackup) Get(ctx context.Context, key string) ([]byte, error) {
	p, err := b.path(key)
	if err != nil {
		return nil, fmt.Errorf("get from %s: %w", b, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("get %s from %s: %w", key, b, err)
	}
	in, err := b.open(p)
	if err != nil {
		return nil, fmt.Errorf("get %s from %s: %w", key, b, err)
	}
	defer in.Close()
	data, err := io.ReadAll(in)
	if err != nil {
		return nil, fmt.Errorf("get %s from %s: %w", key, b, b.quiet(err))
	}
	return data, nil
}

// Put stores data under key atomically, as Upload does, with the temporary
// file in the target directory of the store (never in the system's
// temporary directory, where a killed process would leave it).
func (b *DirBackup) Put(ctx context.Context, key string, data []byte) error {
	dst, err := b.path(key)
	if err != nil {
		return fmt.Errorf("put to %s: %w", b, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("put %s in %s: %w", key, b, err)
	}
	if err := b.writeObject(bytes.NewReader(data), dst); err != nil {
		return fmt.Errorf("put %s in %s: %w", key, b, b.quiet(err))
	}
	b.logger.Debug("put", "store", b.String(), "key", key)
	return nil
}

// Create stores data under key unless an object has that key. It writes and
// fsyncs a temporary file in the target directory, then hard-links it to
// the key's name: link(2) fails with EEXIST if the name exists, atomically,
// also between processes and on the network filesystems that support
// links, so of concurrent Creates exactly one links its file. The temporary
// name is then removed and the directory fsynced. An existing object gives
// an error wrapping [backup.ErrExists].
func (b *DirBackup) Create(ctx context.Context, key string, data []byte) error {
	dst, err := b.path(key)
	if err != nil {
		return fmt.Errorf("create in %s: %w", b, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("create %s in %s: %w", key, b, err)
	}
	if err := b.create(dst, data); err != nil {
		return fmt.Errorf("create %s in %s: %w", key, b, b.quiet(err))
	}
	b.logger.Debug("created", "store", b.String(), "key", key)
	return nil
}

func (b *DirBackup) create(dst string, data []byte) error {
	dir := filepath.Dir(dst)
	var f *os.File
	err := retryPruned(func() (err error) {
		if err := os.MkdirAll(dir, backup.DirMode); err != nil {
			return err
		}
		// CreateTemp makes the file 0600: owner-only, as objects are.
		f, err = os.CreateTemp(dir, backup.TempPrefix+filepath.Base(dst)+"-*")
		return err
	})
	if err != nil {
		return err
	}
	tmp := f.Name()
	// The temporary name goes on every path: on success the object has its
	// own name, and on failure nothing may be left.
	defer os.Remove(tmp)
	if err := writeSynced(f, data); err != nil {
		return err
	}
	if err := os.Link(tmp, dst); err != nil {
		if errors.Is(err, fs.ErrExist) {
			if fi, serr := os.Lstat(dst); serr == nil && fi.IsDir() {
				// Not an object: keys under it exist ("a" when "a/b" does).
				return fmt.Errorf("%w: a key under it exists, so it cannot be an object in a directory store", fs.ErrInvalid)
			}
			return backup.ErrExists
		}
		return err
	}
	if err := os.Remove(tmp); err != nil {
		return err
	}
	return backup.SyncDir(dir)
}

// writeSynced writes data to f, fsyncs and closes it.
func writeSynced(f *os.File, data []byte) error {
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
