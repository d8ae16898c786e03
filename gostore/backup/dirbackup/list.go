package dirbackup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"

	"github.com/millpond/millpond/gostore/backup"
)

// List returns the objects whose key starts with prefix, sorted by key. It
// walks only the directory holding the prefix's last complete segment, skips
// temporary files, and tolerates files deleted while it walks.
func (b *DirBackup) List(ctx context.Context, prefix string) ([]backup.ObjectInfo, error) {
	if err := backup.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("list %s: %w", b, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list %q in %s: %w", prefix, b, err)
	}
	start := b.root
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		start = filepath.Join(b.root, filepath.FromSlash(prefix[:i]))
	}
	var out []backup.ObjectInfo
	n := 0
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // missing start, or removed while walking
			}
			return err
		}
		if n++; n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if backup.IsTempName(d.Name()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(b.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if d.IsDir() {
			if p == start {
				return nil
			}
			dirKey := key + "/"
			if !strings.HasPrefix(dirKey, prefix) && !strings.HasPrefix(prefix, dirKey) {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasPrefix(key, prefix) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		out = append(out, backup.ObjectInfo{Key: key, Size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %q in %s: %w", prefix, b, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
