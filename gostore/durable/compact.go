package durable

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// Compaction: when the segments written since the last compaction outgrow
// the compacted state, each worker's whole state as of a committed epoch is
// written into one compacted object that takes their place in the next
// commit record.

// compactionDue reports whether the segments since the last compaction
// exceed CompactRatio times the compacted state (and CompactMinBytes).
func (r *Run) compactionDue() bool {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	seg, comp := objectBytes(r.record.Objects)
	return seg >= r.cfg.CompactMinBytes && float64(seg) > r.cfg.CompactRatio*float64(comp)
}

// compactedThrough is the newest epoch a compacted object among objs
// stands for (0 if none).
func compactedThrough(objs []ObjectRef) int64 {
	var e int64
	for _, o := range objs {
		if o.Kind == KindCompacted {
			e = max(e, o.LastEpoch)
		}
	}
	return e
}

// objectBytes sums the sizes of segments and of compacted objects.
func objectBytes(objs []ObjectRef) (seg, comp int64) {
	for _, o := range objs {
		if o.Kind == KindCompacted {
			comp += o.Size
		} else {
			seg += o.Size
		}
	}
	return seg, comp
}

// compact writes each worker's whole state as of epoch c (newest row per
// key, deletions dropped: nothing older remains to resurface) into one
// compacted object per worker, uploads them, and writes a commit record
// that names them in place of every object up to c. Until that record is
// written the old record stands, so a crash at any point leaves correct,
// readable state.
func (r *Run) compact(ctx context.Context, c int64) error {
	return r.compactAt(ctx, c, false)
}

// compactAt is compact; with heal set it compacts even when compacted
// state at c exists already (the backup lost some of it: heal.go), under
// keys of its own.
func (r *Run) compactAt(ctx context.Context, c int64, heal bool) error {
	r.objectsMu.Lock()
	defer r.objectsMu.Unlock()
	// Object keys are named by epoch and execution: a second compaction
	// at the same epoch would replace the objects the first one's record
	// names, and a crash before its own record would leave that record
	// naming objects whose checksums no longer match. A heal names its
	// objects apart for the same reason.
	r.commitMu.Lock()
	through := compactedThrough(r.record.Objects)
	r.commitMu.Unlock()
	if c <= through && !heal {
		return nil
	}
	variant := 0
	if heal {
		r.mu.Lock()
		variant = int(r.metrics.Heals) + 1
		r.mu.Unlock()
	}
	// In a cluster the followers compact their workers meanwhile.
	round := r.requestCompaction(c, heal, variant)
	defer r.endCompaction(round)
	objs, err := r.compactHosted(ctx, c, variant)
	if err != nil {
		return err
	}
	if round != nil {
		remote, err := r.awaitCompaction(ctx, round)
		if err != nil {
			return err
		}
		objs = append(objs, remote...)
	}
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	rec := r.record
	if compactedThrough(rec.Objects) >= c && !heal {
		// A whole-state epoch committed meanwhile already stands for
		// this state; the objects just written are left to GC.
		return nil
	}
	keep := append([]ObjectRef{}, objs...)
	for _, o := range rec.Objects {
		if o.LastEpoch > c {
			keep = append(keep, o)
		}
	}
	sortObjects(keep)
	rec.Objects = keep
	rec.Execution = r.execution
	l, err := r.listFlow(ctx)
	if err != nil {
		return err
	}
	if err := r.superseded(l); err != nil {
		return err
	}
	if lost := l.missing(rec.Objects); len(lost) > 0 {
		// Not this record: the next commit finds them missing and
		// rebuilds them (heal.go).
		return fmt.Errorf("%w: %s; not writing the compacted commit record", ErrObjectsLost, describeObjects(lost))
	}
	if r.clustered() {
		// Not after the cluster failed (see commitOnce).
		if err := r.cfg.Cluster.Err(); err != nil {
			return fmt.Errorf("%w: %w; not writing the compacted commit record", ErrCluster, err)
		}
		if err := r.Err(); err != nil {
			return err
		}
	}
	if err := writeCommit(ctx, r.cfg.Backup, rec, r.cfg.Key); err != nil {
		return fmt.Errorf("write compacted commit record of epoch %d: %w", rec.Epoch, err)
	}
	r.record = rec
	if r.clustered() {
		// Under commitMu, in order with the commits: the followers'
		// record stays the leader's.
		r.broadcastRecord(rec)
	}
	r.mu.Lock()
	r.metrics.Compactions++
	r.segmentBytes, r.compactedBytes = objectBytes(rec.Objects)
	r.mu.Unlock()
	r.cfg.Logger.Info("durable state compacted", "flow", r.cfg.FlowID, "epoch", c, "objects", len(keep))
	return nil
}

// compactHosted compacts every worker of this process at epoch c, one
// compacted object each.
func (r *Run) compactHosted(ctx context.Context, c int64, variant int) ([]ObjectRef, error) {
	var objs []ObjectRef
	for w, s := range r.hosted() {
		dir := filepath.Join(r.cfg.LocalDir, r.cfg.FlowID, fmt.Sprintf("worker-%04d", w), "compact")
		os.RemoveAll(dir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		ref, err := r.compactWorker(ctx, w, s, dir, c, variant)
		os.RemoveAll(dir)
		if err != nil {
			return nil, err
		}
		objs = append(objs, ref)
	}
	return objs, nil
}

// writeCompacted writes the newest row of every key of s up to epoch c
// into a new compacted object at path and returns it open, with the rows
// it holds. The rows come in key order, a page at a time, and are laid
// into the file's pages directly (snapfile.Builder: a fraction of the CPU
// of INSERTs); a state past what a built file may hold (1 GiB) is written
// again through SQLite. A compacted object holds the whole state: never
// small, so it gets a segment's large pages (opts); it is appended to
// page by page, so a segment's small page cache is all it needs.
func writeCompacted(ctx context.Context, s *localstore.Store, path string, meta snapfile.Meta, c int64, opts snapfile.Options) (*snapfile.File, int64, error) {
	bl, err := snapfile.NewBuilder(path, meta, opts)
	if err != nil {
		return nil, 0, err
	}
	rows, err := scanCompacted(ctx, s, c, func(page []rowbatch.Row) error { return bl.Add(ctx, page) })
	if err == nil {
		var f *snapfile.File
		if f, err = bl.Finish(ctx); err == nil {
			return f, rows, nil
		}
	} else {
		bl.Abort()
	}
	if !errors.Is(err, snapfile.ErrTooLarge) {
		return nil, 0, err
	}
	f, err := snapfile.Create(ctx, path, meta, opts)
	if err != nil {
		return nil, 0, err
	}
	rows, err = scanCompacted(ctx, s, c, func(page []rowbatch.Row) error {
		_, err := f.Write(ctx, page)
		return err
	})
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, rows, nil
}

// scanCompacted hands write the newest row of every key of s up to epoch
// c, a page at a time in key order, and returns how many rows it handed.
func scanCompacted(ctx context.Context, s *localstore.Store, c int64, write func([]rowbatch.Row) error) (int64, error) {
	var rows int64
	var cur snapfile.Cursor
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		page, next, done, err := s.ScanPageFlushed(ctx, snapfile.ScanOptions{Before: c + 1, ChunkRows: 8192}, cur)
		if err != nil {
			return 0, err
		}
		if len(page) > 0 {
			if err := write(page); err != nil {
				return 0, err
			}
			rows += int64(len(page))
		}
		if done {
			return rows, nil
		}
		cur = next
	}
}

func (r *Run) compactWorker(ctx context.Context, w int, s *localstore.Store, dir string, c int64, variant int) (ObjectRef, error) {
	// Every row up to the committed epoch c was queued before c committed;
	// one flush makes them readable, and the scan below then does not wait
	// on the writes of the epochs that keep arriving.
	if err := s.Flush(); err != nil {
		return ObjectRef{}, err
	}
	path := filepath.Join(dir, "compacted.sqlite")
	meta := snapfile.Meta{
		FlowID: r.cfg.FlowID, Kind: snapfile.KindCompacted, WorkerIndex: w, WorkerCount: r.cfg.WorkerCount,
		KeyGroupCount: r.cfg.KeyGroupCount, Execution: r.execution, LastEpoch: c,
	}
	f, rows, err := writeCompacted(ctx, s, path, meta, c, snapfile.Options{Segment: true, LargePages: true})
	if err != nil {
		return ObjectRef{}, err
	}
	// Write advanced LastEpoch to the newest row; the object stands for c.
	m := f.Meta()
	m.LastEpoch = c
	if err := f.UpdateMeta(ctx, m); err != nil {
		f.Close()
		return ObjectRef{}, err
	}
	if err := f.Seal(); err != nil {
		return ObjectRef{}, err
	}
	e, err := encodeFileAt(path, compactedLevel)
	if err != nil {
		return ObjectRef{}, fmt.Errorf("compacted object of worker %d at epoch %d: %w", w, c, err)
	}
	rng := keygroup.OwnedBy(w, r.cfg.WorkerCount, r.cfg.KeyGroupCount)
	ref := ObjectRef{
		Key: compactedKey(r.cfg.FlowID, c, r.execution, w, r.cfg.WorkerCount, variant), Kind: KindCompacted,
		Execution: r.execution, Worker: w, WorkerCount: r.cfg.WorkerCount, GroupLo: rng.Lo, GroupHi: rng.Hi,
		LastEpoch: c, Rows: rows, Size: e.Size, SHA256: e.SHA256, Encoding: EncodingZstd,
	}
	if err := store(ctx, r.cfg.Backup, e.Path, ref.Key); err != nil {
		return ObjectRef{}, fmt.Errorf("upload compacted %s: %w", ref.Key, err)
	}
	r.mu.Lock()
	r.metrics.CompactedUploaded++
	r.metrics.BytesUploaded += e.Size
	r.metrics.CompactedBytes += e.Size
	r.metrics.CompactedRawBytes += e.Raw
	r.mu.Unlock()
	return ref, nil
}
