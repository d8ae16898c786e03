// Package dirbackup implements [backup.Backup] on a directory of a local or
// network filesystem.
//
// A key maps to a file under the root directory, one sub-directory per key
// segment ("flow/seg/1" is ROOT/flow/seg/1). Uploads write a temporary file
// in the target directory, fsync it, rename it into place and fsync the
// directory, so a listing never shows a partial object and a completed upload
// survives a crash. Listings skip temporary files.
//
// Because keys become paths, a key cannot be both an object and a prefix of
// another object's key ("a" and "a/b"); such an upload fails.
package dirbackup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/millpond/millpond/gostore/backup"
)

// DirBackup is a [backup.Backup] on a directory. It is safe for concurrent
// use, including by several processes sharing the directory.
type DirBackup struct {
	root   string
	logger *slog.Logger
}

var (
	_ backup.Backup  = (*DirBackup)(nil)
	_ backup.Checker = (*DirBackup)(nil)
)

// New returns a DirBackup rooted at root, which is made absolute.
//
// If root does not exist but its parent directory does, root is created
// (mode 0700, owner-only: it holds flow state) and the creation logged: pointing a flow at a fresh
// sub-directory just works. If the parent is missing too, New fails with an
// error naming both, since that is usually a typo or an unmounted volume.
// A root that exists but is not a directory is an error. A nil logger
// discards log output.
func New(root string, logger *slog.Logger) (*DirBackup, error) {
	if root == "" {
		return nil, errors.New("backup directory: empty path")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("backup directory %s: %w", root, err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	fi, err := os.Stat(abs)
	switch {
	case err == nil && !fi.IsDir():
		return nil, fmt.Errorf("backup directory %s exists and is not a directory; name a directory, or a path "+
			"that does not exist yet in an existing directory (it is created)", abs)
	case err == nil:
	case errors.Is(err, fs.ErrNotExist):
		parent := filepath.Dir(abs)
		if pfi, perr := os.Stat(parent); perr != nil || !pfi.IsDir() {
			if perr == nil {
				return nil, fmt.Errorf("backup directory %s cannot be created: %s is not a directory", abs, parent)
			}
			return nil, fmt.Errorf("backup directory %s does not exist, and neither does its parent %s; "+
				"only the last part is created, so check the path (a typo, an unmounted volume?)", abs, parent)
		}
		if err := os.Mkdir(abs, backup.DirMode); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("create backup directory %s: %w", abs, err)
		}
		logger.Info("created backup directory", "dir", abs)
	case errors.Is(err, syscall.ENOTDIR):
		return nil, fmt.Errorf("backup directory %s cannot be created: %s is not a directory", abs, fileAncestor(abs))
	default:
		return nil, fmt.Errorf("backup directory %s: %w", abs, err)
	}
	return &DirBackup{root: abs, logger: logger}, nil
}

// fileAncestor returns the nearest ancestor of path that exists and is not
// a directory (what makes a stat of path fail with ENOTDIR).
func fileAncestor(path string) string {
	for p := filepath.Dir(path); p != filepath.Dir(p); p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	return filepath.Dir(path)
}

// Root returns the absolute path of the backup directory.
func (b *DirBackup) Root() string { return b.root }

// String returns "dir ROOT".
func (b *DirBackup) String() string { return "dir " + b.root }

// Check verifies that the root is still a directory and that a file can be
// created in it.
func (b *DirBackup) Check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("check %s: %w", b, err)
	}
	fi, err := os.Stat(b.root)
	if err != nil {
		return fmt.Errorf("check %s: %w", b, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("check %s: not a directory", b)
	}
	f, err := os.CreateTemp(b.root, backup.TempPrefix+"check-*")
	if err != nil {
		return fmt.Errorf("check %s: not writable: %w", b, err)
	}
	name := f.Name()
	_ = f.Close()
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("check %s: %w", b, err)
	}
	return nil
}

// path validates key and returns the file that holds it.
func (b *DirBackup) path(key string) (string, error) {
	if err := backup.ValidateKey(key); err != nil {
		return "", err
	}
	for _, seg := range strings.Split(key, "/") {
		if backup.IsTempName(seg) {
			return "", fmt.Errorf("invalid key %q: segment %q starts with the reserved prefix %q", key, seg, backup.TempPrefix)
		}
	}
	return filepath.Join(b.root, filepath.FromSlash(key)), nil
}
