package durable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Durable GC: commit records past the retention window go, and then every
// object that no remaining record names.

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
		e, ok := recordNumber(o.Key, commitsDir)
		if !ok || e == newest.Epoch {
			continue
		}
		var rec CommitRecord
		var err error
		if e <= cutoff && r.cfg.RetainFor > 0 {
			// Past the epochs kept: still kept if young enough, which
			// only the record itself can tell.
			if rec, err = readCommit(ctx, b, flow, e, r.cfg.Key); err != nil && !errors.Is(err, ErrCorrupt) {
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
		rec, err = readCommit(ctx, b, flow, e, r.cfg.Key)
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
