package snapfile

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/millpond/millpond/gostore/rowbatch"
)

// FuzzOpenSnapshotFile corrupts a valid snapshot file at a fuzzed offset and
// length: opening and reading it may fail, but never panic.
func FuzzOpenSnapshotFile(f *testing.F) {
	ctx := context.Background()
	dir := f.TempDir()
	seed := filepath.Join(dir, "seed.sqlite")
	m := testMeta()
	m.Kind = KindSegment
	sf, err := Create(ctx, seed, m, Options{Segment: true})
	if err != nil {
		f.Fatal(err)
	}
	var rows []rowbatch.Row
	for i := 0; i < 300; i++ {
		rows = append(rows, row("s", string(rune('a'+i%26))+string(rune('a'+i/26)), int64(1+i%3), "value"))
	}
	if _, err := sf.Write(ctx, rows); err != nil {
		f.Fatal(err)
	}
	if err := sf.Seal(); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(seed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint32(0), []byte{})
	f.Add(uint32(100), []byte{0xff, 0xff, 0xff, 0xff})
	f.Add(uint32(4096), []byte("garbage in the second page"))
	f.Add(uint32(len(good)-10), []byte{0})
	f.Fuzz(func(t *testing.T, at uint32, patch []byte) {
		buf := append([]byte{}, good...)
		off := int(at) % (len(buf) + 1)
		buf = append(buf[:off], append(patch, buf[min(len(buf), off+len(patch)):]...)...)
		if len(patch) == 1 && patch[0] == 0 {
			buf = buf[:off] // truncation
		}
		path := filepath.Join(t.TempDir(), "f.sqlite")
		if err := os.WriteFile(path, buf, 0o644); err != nil {
			t.Fatal(err)
		}
		file, err := Open(ctx, path, Options{Segment: true})
		if err != nil {
			return
		}
		defer file.Close()
		_ = file.Scan(ctx, ScanOptions{IncludeDeleted: true}, func([]rowbatch.Row) error { return nil })
		_, _, _ = file.Get(ctx, "s", "aa", 0)
		_, _ = file.Steps(ctx)
	})
}
