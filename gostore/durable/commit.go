package durable

import (
	"errors"
	"fmt"
	"time"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/segment"
)

type epochState struct {
	// closing counts the workers that called CloseEpoch; closed, those
	// whose close their pipe applied.
	closing  int
	closed   int
	pending  int
	objects  []ObjectRef
	closeAt  time.Time
	closeSet bool
	// sentAt (a follower's) is when the epoch was reported uploaded.
	sentAt time.Time
	// whole holds the workers whose rows of the epoch are their whole
	// state (markWhole).
	whole map[int]bool
	// bare holds the whole workers that cut no segment of the epoch: no
	// key left, and their deletions were dropped (or there were none).
	bare map[int]bool
	// dropped: some worker's deletions were dropped on the promise that
	// the epoch is committed as compacted state (closeEpoch).
	dropped bool
}

func (r *Run) epochLocked(e int64) *epochState {
	es := r.epochs[e]
	if es == nil {
		es = &epochState{}
		r.epochs[e] = es
	}
	return es
}

// CloseEpoch marks that worker w finished epoch (its snapshot is written).
// When every worker closed it and its segments are uploaded, it commits.
// The last worker to close an epoch waits while more than
// MaxEpochsInFlight epochs are closed but not committed, or while
// compaction or local GC is too far behind (back-pressure). CloseEpoch
// returns the pipeline's error if it failed.
func (r *Run) CloseEpoch(w int, epoch int64) error {
	return r.closeEpoch(w, epoch, false)
}

// CloseLastEpoch is CloseEpoch for the last epoch of the run (its input
// ended; Finish comes next). It does not wait for maintenance to catch up:
// those waits bound the growth of a run that goes on, and Finish waits for
// the commit itself.
func (r *Run) CloseLastEpoch(w int, epoch int64) error {
	return r.closeEpoch(w, epoch, true)
}

func (r *Run) closeEpoch(w int, epoch int64, last bool) error {
	if err := r.checkHosted(w); err != nil {
		return err
	}
	if r.pipes == nil {
		return errNotRunning
	}
	r.mu.Lock()
	es := r.epochLocked(epoch)
	if !es.closeSet {
		es.closeSet, es.closeAt = true, time.Now()
	}
	es.closing++
	// Only the last worker to close the epoch waits: until every worker
	// closed it, a whole-state batch's local write may wait for a segment
	// that a later close cuts, and compaction and local GC wait for the
	// local writes, so an earlier close that waited for them would wait
	// forever (the engine closes an epoch worker by worker). In cluster
	// mode, the last of this process's workers.
	mayWait := !last && es.closing >= r.cfg.Workers
	err := r.err
	r.mu.Unlock()
	if err != nil {
		return err
	}
	// A worker that wrote nothing in this epoch still holds every row of
	// it: say so, or its next resume rebuilds a store that was current.
	// (A no-op when rows of the epoch were written.) Queued behind the
	// epoch's rows, so the close never waits for the local writer.
	if err := r.stores[w].WriteAsync(rowbatch.Batch{Epoch: epoch}, nil); err != nil {
		return err
	}
	if h := r.releaseHeld(w, epoch); h != nil {
		r.sendHeld(w, h)
	}
	r.pipes[w].events <- pipeEvent{Event: segment.Event{Epoch: epoch, Close: true}}
	start := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for mayWait && r.err == nil && !r.stopped && (epoch-r.committed > int64(r.cfg.MaxEpochsInFlight) || r.maintenanceBehindLocked()) {
		// Maintenance runs after commits; when the debt is older than the
		// last one (inherited from a previous run), wake it ourselves, or
		// the wait would need a commit that this very wait holds back.
		// (Finish sets stopped under mu before it closes maint.)
		select {
		case r.maint <- r.committed:
		default:
		}
		r.cond.Wait()
	}
	if waited := time.Since(start); waited > time.Millisecond {
		r.metrics.BackpressureSeconds += waited.Seconds()
	}
	return r.err
}

// tryCommit writes the commit record for the newest epoch whose every
// worker closed it and whose segments (and every older epoch's) are
// uploaded. Objects of committed epochs that the backup lost are rebuilt
// first (heal.go). On a follower of a cluster it reports the epochs its
// workers closed and uploaded to the leader instead (follower.go).
func (r *Run) tryCommit() {
	if !r.leads() {
		r.reportUploads()
		return
	}
	lost := r.commitOnce()
	if len(lost) == 0 {
		return
	}
	if err := r.heal(r.ctx, lost); err != nil {
		r.fail(err)
		return
	}
	if lost := r.commitOnce(); len(lost) > 0 {
		r.fail(fmt.Errorf("%w: %s are still missing after they were rebuilt; not committing", ErrObjectsLost, describeObjects(lost)))
	}
}

// commitOnce is one try of tryCommit. It returns the objects of committed
// epochs that the new record would name but the backup lost, without
// writing the record.
func (r *Run) commitOnce() []ObjectRef {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	r.mu.Lock()
	if !r.verifiedLocked() {
		// The local stores this run resumed from are still being
		// checked; the check's end calls tryCommit again.
		r.mu.Unlock()
		return nil
	}
	target := r.committed
	var fresh, whole []ObjectRef
	var wholeAt int64
	var broken error
	var closeAt time.Time
	for e := r.committed + 1; ; e++ {
		es := r.epochs[e]
		if es == nil || es.closed < r.cfg.WorkerCount || es.pending > 0 {
			break
		}
		target = e
		fresh = append(fresh, es.objects...)
		if es.closeSet {
			closeAt = es.closeAt
		}
		if r.wholeLocked(es) {
			whole, wholeAt = es.objects, e
		} else if es.dropped && broken == nil {
			// Its segments lack the deletions that only compacted state
			// can do without: committed as plain segments they would
			// bring deleted keys back.
			broken = fmt.Errorf("epoch %d: deletions of a whole-state batch were dropped, but the epoch is not whole on every worker (%d of %d marked, %d segments); not committing it",
				e, len(es.whole), r.cfg.WorkerCount, len(es.objects))
		}
	}
	failed := r.err != nil
	r.mu.Unlock()
	if broken != nil {
		r.fail(broken)
		return nil
	}
	if target == r.committed || failed {
		return nil
	}
	rec := CommitRecord{
		FlowID: r.cfg.FlowID, Epoch: target, Execution: r.execution,
		WorkerCount: r.cfg.WorkerCount, KeyGroupCount: r.cfg.KeyGroupCount,
		Objects:       append(append([]ObjectRef{}, r.record.Objects...), fresh...),
		CommittedUnix: time.Now().Unix(),
	}
	if wholeAt > 0 {
		rec.Objects = promoteWhole(rec.Objects, whole, wholeAt)
	}
	sortObjects(rec.Objects)
	// One listing fences this run off when a newer execution started and
	// finds what the backup lost; a record never names a missing object.
	var l listing
	if err := r.retry("listing before a commit", flowPrefix(r.cfg.FlowID), func() error {
		var err error
		l, err = r.listFlow(r.ctx)
		return err
	}); err != nil {
		r.fail(fmt.Errorf("commit epoch %d: %w", target, err))
		return nil
	}
	if err := r.superseded(l); err != nil {
		r.fail(err)
		return nil
	}
	if lost := l.missing(rec.Objects); len(lost) > 0 {
		if gone := l.missing(fresh); len(gone) > 0 {
			r.fail(fmt.Errorf("%w: %s, uploaded for epoch %d, vanished before its commit; not committing it (the next run processes it again)",
				ErrObjectsLost, describeObjects(gone), target))
			return nil
		}
		return lost
	}
	// Not after the cluster failed: a follower may have stopped before
	// it learned of this commit, and nothing more may be committed.
	if r.clustered() {
		if err := r.cfg.Cluster.Err(); err != nil {
			r.fail(peerError{from: -1, err: fmt.Errorf("%w: %w", ErrCluster, err)})
			return nil
		}
		if r.Err() != nil {
			return nil
		}
	}
	// A commit record is retried like a segment: one failed request must
	// not stop the flow.
	if err := r.retry("commit record upload", commitKey(r.cfg.FlowID, target), func() error {
		return writeCommit(r.ctx, r.cfg.Backup, rec, r.cfg.Key)
	}); err != nil {
		r.fail(fmt.Errorf("write commit record of epoch %d: %w", target, err))
		return nil
	}
	r.record = rec
	for _, s := range r.hosted() {
		// A local store generation started at a whole epoch up to target
		// may now replace the old one. (Before Committed reports target:
		// whoever sees the commit finds the stores told.)
		s.NoteCommitted(target)
	}
	if r.clustered() {
		// Under commitMu, so the followers get the records in order; and
		// before Committed reports target, so that whatever the leader
		// sends once it sees the commit (`finished`, `compact`) reaches
		// a follower after the commit.
		r.broadcastRecord(rec)
	}
	r.mu.Lock()
	for e := r.committed + 1; e <= target; e++ {
		delete(r.epochs, e)
	}
	r.committed = target
	r.segmentBytes, r.compactedBytes = objectBytes(rec.Objects)
	r.metrics.Commits++
	r.metrics.CommittedEpoch = target
	if wholeAt > 0 {
		r.metrics.WholeEpochs++
	}
	ev := CommitEvent{Epoch: target, Objects: len(fresh)}
	for _, o := range fresh {
		ev.Rows += o.Rows
		ev.Bytes += o.Size
	}
	if !closeAt.IsZero() {
		ev.LatencySeconds = time.Since(closeAt).Seconds()
		r.metrics.observeCommit(time.Since(closeAt))
	}
	if len(r.commitLog) < 1024 {
		r.commitLog = append(r.commitLog, ev)
	}
	r.cond.Broadcast()
	r.mu.Unlock()
	r.cfg.Logger.Debug("epoch committed", "flow", r.cfg.FlowID, "epoch", target, "objects", len(rec.Objects))
	select {
	case r.maint <- target:
	default:
		// Maintenance is busy; it picks up the newest commit next round.
	}
	return nil
}

// ErrSuperseded is wrapped when a newer execution of the same flow has
// started against the same backup: this run stops committing, so the two
// never interleave their commit records.
var ErrSuperseded = errors.New("a newer execution of this flow is running")

// Committed returns the newest committed epoch.
func (r *Run) Committed() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.committed
}

// waitCommitsIdle returns once no closed epoch is waiting for its commit,
// or after Config.CheckpointHold. Local stores call it before a background
// checkpoint: the checkpoint's fsyncs, running while a segment was sealed
// and linked into a DirBackup, made the segment's own fsyncs wait behind
// them.
func (r *Run) waitCommitsIdle() {
	deadline := time.Now().Add(r.cfg.CheckpointHold)
	for {
		r.mu.Lock()
		busy := r.err == nil && !r.stopped && r.commitPendingLocked()
		r.mu.Unlock()
		if !busy || time.Now().After(deadline) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// commitPendingLocked reports whether some worker closed an epoch that is
// not committed yet. r.mu is held.
func (r *Run) commitPendingLocked() bool {
	for _, es := range r.epochs {
		if es.closeSet {
			return true
		}
	}
	return false
}
