package snapfile

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
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

// contents reads every key's newest row of f.
func contents(ctx context.Context, f *File) (map[string]string, error) {
	got := map[string]string{}
	err := f.Scan(ctx, ScanOptions{}, func(rows []rowbatch.Row) error {
		for _, r := range rows {
			got[r.StepID+"/"+r.Key] = string(r.Value)
		}
		return nil
	})
	return got, err
}

// FuzzCheckWAL patches the write-ahead log of a crash image whose second
// round of frames a checkpoint has copied into the file. With the log's
// index (-shm) in the image, anywhere in the log; without it, anywhere but
// in the last frame of the current round (a write the kill cut short
// cannot be told from damage there without the index, see checkWAL).
// Whenever checkWAL lets the log through, the file SQLite then shows must
// pass the full check and hold what the file held after one of its
// transactions: a log that would make SQLite mix pages of different
// transactions is refused before any connection opens it. (Such a mix
// mostly passes SQLite's own check: rows silently missing or old.)
func FuzzCheckWAL(f *testing.F) {
	ctx := context.Background()
	src, err := Create(ctx, filepath.Join(f.TempDir(), "s.sqlite"), testMeta(), Options{})
	if err != nil {
		f.Fatal(err)
	}
	defer src.Close()
	// Six epochs of new keys, copied into the file by a checkpoint; then
	// six epochs each rewriting the keys of one earlier epoch, in a log
	// started over. Pages a later epoch changes are then not in the
	// log's frames of an earlier one: if SQLite dropped the later frames,
	// it would read those pages as the checkpoint copied them, beside
	// older versions of the others.
	states := []map[string]string{{}}
	epoch := func(e int64, keysOf int64, v string) {
		var rows []rowbatch.Row
		for k := 0; k < 150; k++ {
			rows = append(rows, row("s", fmt.Sprintf("key-%02d-%03d", keysOf, k), e, strings.Repeat(v, 60)))
		}
		if _, err := src.Write(ctx, rows); err != nil {
			f.Fatal(err)
		}
		if _, err := src.FoldRecent(ctx); err != nil {
			f.Fatal(err)
		}
		state, err := contents(ctx, src)
		if err != nil {
			f.Fatal(err)
		}
		states = append(states, state)
	}
	for e := int64(1); e <= 6; e++ {
		epoch(e, e, "n")
	}
	if err := src.CheckpointPassive(ctx); err != nil {
		f.Fatal(err)
	}
	for e := int64(7); e <= 12; e++ {
		epoch(e, e-6, "u")
	}
	if err := src.CheckpointPassive(ctx); err != nil {
		f.Fatal(err)
	}
	db, err := os.ReadFile(src.Path())
	if err != nil {
		f.Fatal(err)
	}
	wal, err := os.ReadFile(src.Path() + "-wal")
	if err != nil {
		f.Fatal(err)
	}
	shm, err := os.ReadFile(src.Path() + "-shm")
	if err != nil {
		f.Fatal(err)
	}
	_, pageSize, ok := walHeader(wal[:walHeaderSize])
	if !ok {
		f.Fatal("the log's header is not valid")
	}
	// The last frame of the log's current round (frames of the round
	// before may follow it).
	frameSize := walFrameHeaderSize + pageSize
	lastFrame := walHeaderSize
	for off := walHeaderSize; off+frameSize <= len(wal) && string(wal[off+8:off+16]) == string(wal[16:24]); off += frameSize {
		lastFrame = off
	}
	f.Add(uint32(0), []byte{0x01}, false)
	f.Add(uint32(walHeaderSize+9), []byte{0xff}, false)
	f.Add(uint32(walHeaderSize+walFrameHeaderSize+100), []byte("xyz"), false)
	f.Add(uint32(lastFrame/2), []byte{0, 0, 0, 0}, false)
	f.Add(uint32(lastFrame/3), []byte{0x55}, false)
	f.Add(uint32(lastFrame+walFrameHeaderSize+7), []byte{0x55}, true)
	f.Fuzz(func(t *testing.T, at uint32, patch []byte, withIndex bool) {
		end := lastFrame
		if withIndex {
			end = len(wal)
		}
		off := int(at) % end
		if len(patch) == 0 || off+len(patch) > end {
			return
		}
		dir := t.TempDir()
		path := filepath.Join(dir, "image.sqlite")
		patched := append([]byte{}, wal...)
		copy(patched[off:], patch)
		if err := os.WriteFile(path, db, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path+"-wal", patched, 0o600); err != nil {
			t.Fatal(err)
		}
		if withIndex {
			if err := os.WriteFile(path+"-shm", shm, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := checkWAL(path, false); err != nil {
			if !errors.Is(err, ErrDamaged) {
				t.Fatalf("checkWAL: %v, want damage", err)
			}
			return
		}
		file, err := Open(ctx, path, Options{})
		if err != nil {
			t.Fatalf("checkWAL passed, open failed: %v", err)
		}
		defer file.Close()
		if err := file.Verify(ctx); err != nil {
			t.Fatalf("checkWAL passed, the file is damaged: %v", err)
		}
		got, err := contents(ctx, file)
		if err != nil {
			t.Fatalf("checkWAL passed, the file cannot be read: %v", err)
		}
		for _, state := range states {
			if maps.Equal(got, state) {
				return
			}
		}
		t.Fatalf("checkWAL passed, the file holds %d keys, not the contents after any of its transactions", len(got))
	})
}
