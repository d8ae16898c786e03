package durable

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/snapfile"
)

// compaction is compacted state waiting to replace the segments it covers
// in the next commit record.
type compaction struct {
	epoch   int64
	objects []ObjectRef
}

// runMaintenance collects garbage and compacts after commits, off the path
// of the flow and of the commits themselves.
func (r *Run) runMaintenance() {
	defer r.wg.Done()
	// A local GC held back by pacing runs when its turn comes, even if no
	// commit wakes maintenance by then (a flow gone idle would otherwise
	// keep its last epochs' superseded rows until the next commit).
	paced := time.NewTimer(time.Hour)
	paced.Stop()
	defer paced.Stop()
	for {
		select {
		case _, ok := <-r.maint:
			if !ok {
				return
			}
		case <-paced.C:
		}
		if r.maintCtx.Err() != nil {
			continue // the run is finishing: drain the wake-ups
		}
		// The newest commit, not the one that woke us: a wake-up dropped
		// while a round ran must not leave maintenance an epoch behind.
		committed := r.Committed()
		r.maintain(r.maintCtx, committed)
		r.mu.Lock()
		behind, failing := r.gcEpoch < committed, r.maintFailing
		r.mu.Unlock()
		if behind {
			wait := max(time.Until(r.gcNext), time.Millisecond)
			if failing {
				wait = max(wait, retryMaintenance)
			}
			paced.Reset(wait)
		}
	}
}

// retryMaintenance spaces the retries of a failing local GC that no
// commit wakes.
const retryMaintenance = time.Second

// dutyFactor spaces local GC rounds (they rewrite pages all over a store)
// so they use at most about a quarter of a core: after a round that took
// d, the next waits 3d. Rounds shorter than paceFrom run after every
// commit. The local store's growth stays bounded by the writes of the
// paced interval.
const (
	dutyFactor = 3
	paceFrom   = 100 * time.Millisecond
)

func nextRound(started time.Time) time.Time {
	d := time.Since(started)
	if d < paceFrom {
		return time.Time{}
	}
	return time.Now().Add(dutyFactor * d)
}

// maintain runs the background work due after epoch committed: local GC,
// durable compaction when segments outgrew the compacted state, and
// durable GC of objects no retained commit names. A failure here never
// touches committed state; it is logged and retried after a later commit.
func (r *Run) maintain(ctx context.Context, committed int64) {
	failed := false
	r.mu.Lock()
	lagging := committed-r.gcEpoch >= maxGCLag/2
	r.mu.Unlock()
	if now := time.Now(); lagging || !now.Before(r.gcNext) {
		defer r.addSeconds(&r.metrics.LocalGCSeconds, now)
		ok := true
		for w, s := range r.stores {
			if _, err := s.GC(ctx, committed); err != nil {
				ok = false
				if ctx.Err() == nil {
					r.cfg.Logger.Warn("local gc failed", "worker", w, "err", err)
					failed = true
				}
			}
		}
		r.gcNext = nextRound(now)
		if ok {
			r.mu.Lock()
			r.gcEpoch = max(r.gcEpoch, committed)
			r.mu.Unlock()
		}
	}
	// Compaction is not paced: it is what keeps the durable footprint
	// within its bound, so it runs whenever it is due.
	if ctx.Err() == nil && r.compactionDue() {
		start := time.Now()
		// The newest commit: the round started a while ago, and
		// compacting at an epoch already compacted would write over an
		// object that a commit record names (compact refuses that).
		committed = r.Committed()
		err := r.compact(ctx, committed)
		r.addSeconds(&r.metrics.CompactionSeconds, start)
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("durable compaction failed; will retry", "epoch", committed, "err", err)
			failed = true
		}
	}
	if err := r.collectGarbage(ctx); err != nil && ctx.Err() == nil {
		r.cfg.Logger.Warn("durable gc failed; will retry", "err", err)
	}
	r.mu.Lock()
	r.maintFailing = failed
	r.cond.Broadcast() // CloseEpoch may wait for maintenance to catch up
	r.mu.Unlock()
}

// addSeconds adds the time since start to a metric.
func (r *Run) addSeconds(metric *float64, start time.Time) {
	d := time.Since(start).Seconds()
	r.mu.Lock()
	*metric += d
	r.mu.Unlock()
}

// maxGCLag is how many committed epochs local GC may fall behind before
// CloseEpoch waits for it, which bounds the local store's growth whatever
// the epoch interval.
const maxGCLag = 4

// maintenanceBehindLocked reports whether the flow must wait for
// maintenance to keep the stores within their bounds: local GC too many
// epochs behind, or segments since the last compaction past 1.5 times
// what makes compaction due. (A looser margin let compaction overlap the
// next epoch of a flow that rewrites its whole state every epoch, but did
// not make that flow faster, and took the durable footprint past 3x the
// state at the end of some runs: the retention window can hold the
// previous compaction too.) A failing maintenance is not waited for (its
// errors are logged; waiting would stop the flow for good). r.mu is held.
func (r *Run) maintenanceBehindLocked() bool {
	if r.maintFailing || r.stopped {
		return false
	}
	if r.committed-r.gcEpoch > maxGCLag {
		return true
	}
	floor := max(r.compactedBytes, r.cfg.CompactMinBytes)
	return float64(r.segmentBytes) > 1.5*r.cfg.CompactRatio*float64(floor)+float64(r.cfg.CompactMinBytes)
}

// finalMaintenance collects durable garbage at the end of a run. It does
// not compact: the segments left are within the bound the run kept while
// it was going (CloseEpoch held the flow back for that), and compacting
// them only to exit made every run end with a full rewrite of its state.
// The next run compacts after its first commit, when it is due.
func (r *Run) finalMaintenance(ctx context.Context) {
	if err := r.collectGarbage(ctx); err != nil {
		r.cfg.Logger.Warn("durable gc failed; the next run retries", "err", err)
	}
}

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
	r.objectsMu.Lock()
	defer r.objectsMu.Unlock()
	// Object keys are named by epoch and execution: a second compaction
	// at the same epoch would replace the objects the first one's record
	// names, and a crash before its own record would leave that record
	// naming objects whose checksums no longer match.
	r.commitMu.Lock()
	through := compactedThrough(r.record.Objects)
	r.commitMu.Unlock()
	if c <= through {
		return nil
	}
	var objs []ObjectRef
	for w, s := range r.stores {
		dir := filepath.Join(r.cfg.LocalDir, r.cfg.FlowID, fmt.Sprintf("worker-%04d", w), "compact")
		os.RemoveAll(dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		ref, err := r.compactWorker(ctx, w, s, dir, c)
		os.RemoveAll(dir)
		if err != nil {
			return err
		}
		objs = append(objs, ref)
	}
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	rec := r.record
	if compactedThrough(rec.Objects) >= c {
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
	if err := r.checkNotSuperseded(ctx); err != nil {
		return err
	}
	if err := writeCommit(ctx, r.cfg.Backup, rec); err != nil {
		return fmt.Errorf("write compacted commit record of epoch %d: %w", rec.Epoch, err)
	}
	r.record = rec
	r.mu.Lock()
	r.metrics.Compactions++
	r.segmentBytes, r.compactedBytes = objectBytes(rec.Objects)
	r.mu.Unlock()
	r.cfg.Logger.Info("durable state compacted", "flow", r.cfg.FlowID, "epoch", c, "objects", len(keep))
	return nil
}

func (r *Run) compactWorker(ctx context.Context, w int, s *localstore.Store, dir string, c int64) (ObjectRef, error) {
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
	// A compacted object holds the whole state: never small.
	f, err := snapfile.Create(ctx, path, meta, snapfile.Options{Segment: true, LargePages: true})
	if err != nil {
		return ObjectRef{}, err
	}
	var rows int64
	var cur snapfile.Cursor
	for {
		if err := ctx.Err(); err != nil {
			f.Close()
			return ObjectRef{}, err
		}
		page, next, done, err := s.ScanPageFlushed(ctx, snapfile.ScanOptions{Before: c + 1, ChunkRows: 8192}, cur)
		if err != nil {
			f.Close()
			return ObjectRef{}, err
		}
		if len(page) > 0 {
			n, err := f.Write(ctx, page)
			if err != nil {
				f.Close()
				return ObjectRef{}, err
			}
			rows += int64(n)
		}
		if done {
			break
		}
		cur = next
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
	sum, size, err := fileSHA256(path)
	if err != nil {
		return ObjectRef{}, err
	}
	rng := keygroup.OwnedBy(w, r.cfg.WorkerCount, r.cfg.KeyGroupCount)
	ref := ObjectRef{
		Key: compactedKey(r.cfg.FlowID, c, r.execution, w, r.cfg.WorkerCount), Kind: KindCompacted,
		Execution: r.execution, Worker: w, WorkerCount: r.cfg.WorkerCount, GroupLo: rng.Lo, GroupHi: rng.Hi,
		LastEpoch: c, Rows: rows, Size: size, SHA256: sum,
	}
	if err := store(ctx, r.cfg.Backup, path, ref.Key); err != nil {
		return ObjectRef{}, fmt.Errorf("upload compacted %s: %w", ref.Key, err)
	}
	return ref, nil
}

// collectGarbage deletes commit records older than the retention window
// (always keeping the newest) and then every segment or compacted object
// that no remaining record names and whose epochs are all committed. It
// deletes records before objects, so a crash in between leaves only
// unreferenced objects for the next round.
func (r *Run) collectGarbage(ctx context.Context) error {
	r.objectsMu.Lock()
	defer r.objectsMu.Unlock()
	b := r.cfg.Backup
	flow := r.cfg.FlowID
	r.commitMu.Lock()
	newest := r.record
	r.commitMu.Unlock()
	if newest.Epoch == 0 {
		return nil
	}
	list, err := b.List(ctx, flowPrefix(flow)+commitsDir)
	if err != nil {
		return err
	}
	referenced := map[string]bool{}
	for _, o := range newest.Objects {
		referenced[o.Key] = true
	}
	cutoff := newest.Epoch - int64(r.cfg.RetainEpochs)
	for _, o := range list {
		e, ok := numberAfter(o.Key, commitsDir)
		if !ok || e == newest.Epoch {
			continue
		}
		var rec CommitRecord
		var err error
		if e <= cutoff && r.cfg.RetainFor > 0 {
			// Past the epochs kept: still kept if young enough, which
			// only the record itself can tell.
			if rec, err = readCommit(ctx, b, flow, e); err != nil && !errors.Is(err, ErrCorrupt) {
				return fmt.Errorf("read commit record %s: %w", o.Key, err)
			}
			if err == nil && time.Since(time.Unix(rec.CommittedUnix, 0)) < r.cfg.RetainFor {
				for _, ref := range rec.Objects {
					referenced[ref.Key] = true
				}
				continue
			}
		}
		if e <= cutoff {
			if err := b.Delete(ctx, o.Key); err != nil {
				return err
			}
			r.countDeleted()
			continue
		}
		rec, err = readCommit(ctx, b, flow, e)
		if err != nil && !errors.Is(err, ErrCorrupt) {
			// Not knowing what a retained record names, nothing may go:
			// a failed download is no reason to break its restore.
			return fmt.Errorf("read retained commit record %s: %w", o.Key, err)
		}
		if err != nil {
			// A damaged old record cannot be restored from; it protects
			// nothing.
			r.cfg.Logger.Warn("damaged commit record kept out of gc", "key", o.Key, "err", err)
			continue
		}
		for _, ref := range rec.Objects {
			referenced[ref.Key] = true
		}
	}
	for _, dir := range []string{segmentsDir, compactedDir} {
		objs, err := b.List(ctx, flowPrefix(flow)+dir)
		if err != nil {
			return err
		}
		for _, o := range objs {
			if referenced[o.Key] {
				continue
			}
			if e, ok := objectEpoch(o.Key); !ok || e > newest.Epoch {
				continue // not ours to judge, or still in flight
			}
			if err := b.Delete(ctx, o.Key); err != nil {
				return err
			}
			r.countDeleted()
		}
	}
	return nil
}

func (r *Run) countDeleted() {
	r.mu.Lock()
	r.metrics.ObjectsDeleted++
	r.mu.Unlock()
}

// objectEpoch reads the newest epoch from a segment or compacted key.
func objectEpoch(key string) (int64, bool) {
	if i := strings.LastIndex(key, "-e"); i >= 0 && strings.Contains(key, "/"+segmentsDir) {
		var e int64
		if _, err := fmt.Sscanf(key[i+2:], "%010d", &e); err == nil {
			return e, true
		}
		return 0, false
	}
	return numberAfter(key, compactedDir)
}
