package durable

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"

	"github.com/millpond/millpond/gostore/backup"
)

// CompactAt runs a compaction at epoch c now, for tests.
func CompactAt(ctx context.Context, r *Run, c int64) error { return r.compact(ctx, c) }

// StoredSize is the size of the file at path as the durable store keeps
// a compacted object: compressed, for tests.
func StoredSize(path string) (int64, error) {
	e, err := encodeFileAt(path, compactedLevel)
	if err != nil {
		return 0, err
	}
	os.Remove(e.Path)
	return e.Size, nil
}

// Uncompress rewrites flow's durable data in the format written before
// objects were compressed, for tests: every object a commit record names
// is stored as its SQLite file under its key, and every record names its
// objects with that file's size and sha256 and no encoding, sealed with k.
// It returns the number of objects rewritten.
func Uncompress(ctx context.Context, b backup.Backup, flow string, k Key) (int, error) {
	list, err := b.List(ctx, flowPrefix(flow)+commitsDir)
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "mp-uncompress-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	done := map[string]ObjectRef{}
	for _, l := range list {
		e, ok := recordNumber(l.Key, commitsDir)
		if !ok {
			continue
		}
		rec, err := readCommit(ctx, b, flow, e, k)
		if err != nil {
			return 0, err
		}
		for i, o := range rec.Objects {
			if old, ok := done[o.Key]; ok {
				rec.Objects[i] = old
				continue
			}
			if o.Encoding == "" {
				return 0, fmt.Errorf("%s is not encoded", o.Key)
			}
			path := filepath.Join(dir, fmt.Sprintf("%d.sqlite", len(done)))
			if err := fetchObject(ctx, b, o, path); err != nil {
				return 0, err
			}
			sum, size, err := fileSHA256(path)
			if err != nil {
				return 0, err
			}
			if err := b.Upload(ctx, path, o.Key); err != nil {
				return 0, err
			}
			o.Size, o.SHA256, o.Encoding = size, sum, ""
			rec.Objects[i], done[o.Key] = o, o
		}
		if err := writeCommit(ctx, b, rec, k); err != nil {
			return 0, err
		}
	}
	return len(done), nil
}

// CompactionRunning reports whether the leader r is in a compaction round
// (from its request to the followers to its record), for tests.
func CompactionRunning(r *Run) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.round != nil
}

// CompactionRound returns the id and epoch of the leader r's compaction
// round in progress (0, 0 without one), for tests.
func CompactionRound(r *Run) (id, epoch int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.round == nil {
		return 0, 0
	}
	return r.round.id, r.round.epoch
}

// Packed returns rows as a batch that owns the buffer they alias, as the
// bindings hand one over: the buffer is overwritten when the batch's last
// holder releases it, so a row read after that is garbage and shows up in
// the state; freed counts the releases.
func Packed(t testing.TB, epoch int64, rows []rowbatch.Row, whole bool, freed *atomic.Int64) rowbatch.Batch {
	t.Helper()
	buf := rowbatch.Encode(rows)
	decoded, err := rowbatch.Decode(buf, epoch)
	require.NoError(t, err)
	b := rowbatch.NewBatch(epoch, decoded, whole)
	b.Mem = rowbatch.NewMemory(func() {
		for i := range buf {
			buf[i] = 0xEE
		}
		freed.Add(1)
	})
	return b
}
