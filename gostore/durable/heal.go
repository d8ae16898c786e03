package durable

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Objects the backup lost. A commit record carries forward the objects of
// the record before it; if the backup lost one of them meanwhile (a bucket
// lifecycle rule, an operator's mistake, a server that dropped data), the
// new record would name state that no longer exists, and the loss would
// surface only at the next full resume. So before a record is written, the
// flow's objects are listed and every object it names must be there with
// its size. Objects of committed epochs that are gone are rebuilt from the
// local stores, which hold the same rows: a compaction at the committed
// epoch writes the whole state anew and takes the place of every object up
// to it. Objects of the epochs being committed that are gone (uploaded a
// moment ago) stop the run instead: the next run processes those epochs
// again.

// ErrObjectsLost is wrapped when objects a commit record would name are
// missing from the backup and could not be rebuilt.
var ErrObjectsLost = errors.New("backup lost objects of committed state")

// listing is what one listing of a flow's objects says before a commit.
type listing struct {
	sizes map[string]int64
	// newer is an execution record newer than this run's, if any.
	newer int64
}

// listFlow lists the flow's objects once: the sizes of its objects and the
// newest execution record.
func (r *Run) listFlow(ctx context.Context) (listing, error) {
	objs, err := r.cfg.Backup.List(ctx, flowPrefix(r.cfg.FlowID))
	if err != nil {
		return listing{}, backupFailed(fmt.Errorf("list objects of flow %q in %s: %w", r.cfg.FlowID, r.cfg.Backup, err))
	}
	l := listing{sizes: make(map[string]int64, len(objs)), newer: -1}
	for _, o := range objs {
		l.sizes[o.Key] = o.Size
		if x, ok := recordNumber(o.Key, executionsDir); ok && x > r.execution && x > l.newer {
			l.newer = x
		}
	}
	return l, nil
}

// superseded is the fencing error when a newer execution started.
func (r *Run) superseded(l listing) error {
	if l.newer < 0 {
		return nil
	}
	return fmt.Errorf("%w: flow %q execution %d started on %s after this execution %d; this run stops committing (at epoch %d) so the two cannot mix; stop one of them",
		ErrSuperseded, r.cfg.FlowID, l.newer, r.cfg.Backup, r.execution, r.Committed())
}

// missing returns the objects of objs that the listing lacks or holds
// with another size. (A size of -1, from a backup written in Python that
// does not report sizes, counts as present.)
func (l listing) missing(objs []ObjectRef) []ObjectRef {
	var out []ObjectRef
	for _, o := range objs {
		size, ok := l.sizes[o.Key]
		if !ok || (size >= 0 && size != o.Size) {
			out = append(out, o)
		}
	}
	return out
}

// describeObjects names up to a few objects for an error message.
func describeObjects(objs []ObjectRef) string {
	var names []string
	for i, o := range objs {
		if i == 3 {
			names = append(names, fmt.Sprintf("and %d more", len(objs)-3))
			break
		}
		names = append(names, o.Key)
	}
	return strings.Join(names, ", ")
}

// heal rebuilds lost objects of committed epochs: a compaction at the
// committed epoch, whatever its schedule, replaces every object up to it.
// Older commit records that name lost objects can no longer be restored
// from; they are deleted, so that what remains verifies.
func (r *Run) heal(ctx context.Context, lost []ObjectRef) error {
	r.healMu.Lock()
	defer r.healMu.Unlock()
	if !r.recordNames(lost) {
		return nil // another upload's commit healed them meanwhile
	}
	committed := r.Committed()
	r.cfg.Logger.Warn("the backup lost objects of committed state; rebuilding them from the local stores",
		"flow", r.cfg.FlowID, "epoch", committed, "objects", describeObjects(lost))
	if err := r.compactAt(ctx, committed, true); err != nil {
		return fmt.Errorf("%w: %s; rebuilding them from the local stores failed: %w", ErrObjectsLost, describeObjects(lost), err)
	}
	r.mu.Lock()
	r.metrics.Heals++
	r.mu.Unlock()
	return r.dropBrokenRecords(ctx, lost)
}

// recordNames reports whether the newest record names any of objs.
func (r *Run) recordNames(objs []ObjectRef) bool {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	named := map[string]bool{}
	for _, o := range r.record.Objects {
		named[o.Key] = true
	}
	for _, o := range objs {
		if named[o.Key] {
			return true
		}
	}
	return false
}

// dropBrokenRecords deletes the retained commit records older than the
// newest that name any of the lost objects.
func (r *Run) dropBrokenRecords(ctx context.Context, lost []ObjectRef) error {
	gone := map[string]bool{}
	for _, o := range lost {
		gone[o.Key] = true
	}
	r.commitMu.Lock()
	newest := r.record.Epoch
	r.commitMu.Unlock()
	b, flow := r.cfg.Backup, r.cfg.FlowID
	commits, err := b.List(ctx, flowPrefix(flow)+commitsDir)
	if err != nil {
		return backupFailed(fmt.Errorf("list commit records of flow %q in %s: %w", flow, b, err))
	}
	for _, c := range commits {
		e, ok := recordNumber(c.Key, commitsDir)
		if !ok || e >= newest {
			continue
		}
		rec, err := readCommit(ctx, b, flow, e, r.cfg.Key)
		if err != nil {
			continue // damaged records are durable GC's to judge
		}
		for _, o := range rec.Objects {
			if gone[o.Key] {
				r.cfg.Logger.Warn("commit record names lost objects; deleting it (its epoch can no longer be restored)",
					"flow", flow, "record", c.Key)
				if err := b.Delete(ctx, c.Key); err != nil {
					return backupFailed(fmt.Errorf("delete %s from %s: %w", c.Key, b, err))
				}
				break
			}
		}
	}
	return nil
}
