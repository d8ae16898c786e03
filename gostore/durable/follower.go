package durable

import (
	"errors"
	"fmt"
	"time"

	"github.com/millpond/millpond/gostore/localstore"
)

// A follower of a cluster run: it uploads its own workers' segments,
// reports each epoch to the leader once its workers closed it and its
// segments are uploaded (`uploaded`), and applies every record the leader
// writes as a commit of its own (`committed`): its local stores learn the
// committed epoch, local GC and back-pressure follow it. It compacts its
// workers when the leader asks (`compact`). It never writes a record,
// compacts on its own or deletes a durable object.

// reportUploads sends the leader, in order, every epoch that all of this
// process's workers closed and whose segments are uploaded (once the
// fast-resumed local stores passed their check, verify.go).
func (r *Run) reportUploads() {
	// commitMu keeps the reports in order.
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	for {
		r.mu.Lock()
		e := r.sent + 1
		es := r.epochs[e]
		if r.err != nil || !r.verifiedLocked() || es == nil || es.closed < r.cfg.Workers || es.pending > 0 {
			r.mu.Unlock()
			return
		}
		m := clusterMsg{
			Type: msgUploaded, Epoch: e, Objects: append([]ObjectRef(nil), es.objects...),
			Whole: marked(es.whole, r.cfg.FirstWorker, r.cfg.Workers), Bare: marked(es.bare, r.cfg.FirstWorker, r.cfg.Workers),
		}
		// Counted as reported before it is sent: the leader's record of
		// e can arrive (and be applied) before the send returns. A send
		// that fails fails the run, which then commits nothing more.
		r.sent = e
		es.sentAt = time.Now()
		r.cond.Broadcast()
		r.mu.Unlock()
		if err := r.send(0, m); err != nil {
			r.fail(err)
			return
		}
	}
}

// applyRecord takes a record the leader wrote: a commit of new epochs (as
// commitOnce does for the leader), or a compaction's record of the
// committed epoch.
func (r *Run) applyRecord(rec CommitRecord) error {
	if rec.FlowID != r.cfg.FlowID {
		return fmt.Errorf("%w: process 0 sent a commit record of flow %q, not %q", ErrCluster, rec.FlowID, r.cfg.FlowID)
	}
	r.mu.Lock()
	committed, sent := r.committed, r.sent
	r.mu.Unlock()
	if rec.Epoch > sent {
		return fmt.Errorf("%w: process 0 committed epoch %d, which this process has not reported uploaded (it reported up to %d)",
			ErrCluster, rec.Epoch, sent)
	}
	r.commitMu.Lock()
	r.record = rec
	r.commitMu.Unlock()
	if rec.Epoch > committed {
		// Before Committed reports it, as on the leader.
		for _, s := range r.hosted() {
			s.NoteCommitted(rec.Epoch)
		}
	}
	r.mu.Lock()
	r.segmentBytes, r.compactedBytes = objectBytes(rec.Objects)
	if rec.Epoch <= r.committed {
		r.mu.Unlock()
		return nil
	}
	ev := CommitEvent{Epoch: rec.Epoch}
	for _, o := range rec.Objects {
		if o.Kind == KindSegment && o.FirstEpoch > r.committed {
			ev.Objects++
			ev.Rows += o.Rows
			ev.Bytes += o.Size
		}
	}
	var closeAt, sentAt time.Time
	for e := r.committed + 1; e <= rec.Epoch; e++ {
		if es := r.epochs[e]; es != nil {
			if es.closeSet {
				closeAt = es.closeAt
			}
			sentAt = es.sentAt
		}
		delete(r.epochs, e)
	}
	r.committed = rec.Epoch
	r.metrics.Commits++
	r.metrics.CommittedEpoch = rec.Epoch
	if !closeAt.IsZero() {
		ev.LatencySeconds = time.Since(closeAt).Seconds()
		r.metrics.observeCommit(time.Since(closeAt))
	}
	if !sentAt.IsZero() {
		r.metrics.CommitWaitSeconds += time.Since(sentAt).Seconds()
	}
	if len(r.commitLog) < 1024 {
		r.commitLog = append(r.commitLog, ev)
	}
	r.cond.Broadcast()
	r.mu.Unlock()
	r.cfg.Logger.Debug("epoch committed by process 0", "flow", r.cfg.FlowID, "epoch", rec.Epoch, "objects", len(rec.Objects))
	select {
	case r.maint <- rec.Epoch: // local GC
	default:
	}
	return nil
}

// onFinished notes that the leader commits nothing more. Before this
// process's Finish, that stops its run: what it closes from now on can
// never commit.
func (r *Run) onFinished(m clusterMsg) error {
	r.mu.Lock()
	r.leaderDone = true
	finishing := r.finishing
	r.cond.Broadcast()
	r.mu.Unlock()
	if finishing {
		return nil
	}
	return peerError{from: 0, err: fmt.Errorf("%w: process 0 finished its run at committed epoch %d; this process can commit nothing more", ErrCluster, m.Epoch)}
}

// runCompactions compacts this process's workers when the leader asks, one
// request at a time, beside the commits (the inbox reader goes on
// applying them), until the follower finishes (stopCompactions) or the
// run stops.
func (r *Run) runCompactions() {
	defer r.clusterWG.Done()
	defer close(r.compactsDone)
	for {
		select {
		case m := <-r.compactReqs:
			r.compactFor(m)
		case <-r.compactCtx.Done():
			return
		case <-r.stopCluster:
			return
		}
	}
}

// queueCompaction hands the leader's request m to runCompactions, or
// answers at once when the queue is full or this process has finished.
func (r *Run) queueCompaction(m clusterMsg) error {
	// Queued under mu, so that stopCompactions, which sets the flag under
	// mu, finds every request queued before it in the queue.
	r.mu.Lock()
	stopped, queued := r.compactsStopped, false
	if !stopped {
		select {
		case r.compactReqs <- m:
			queued = true
		default:
		}
	}
	r.mu.Unlock()
	switch {
	case queued:
		return nil
	case stopped:
		return r.send(0, r.finishedCompacting(m))
	}
	return r.send(0, clusterMsg{Type: msgCompactFailed, Epoch: m.Epoch, Round: m.Round, Error: "too many compactions queued"})
}

// finishedCompacting is the answer to request m of a follower that
// compacts nothing more.
func (r *Run) finishedCompacting(m clusterMsg) clusterMsg {
	return clusterMsg{Type: msgCompactFailed, Epoch: m.Epoch, Round: m.Round, Finished: true,
		Error: fmt.Sprintf("process %d has finished its run", r.cfg.Cluster.Index())}
}

// stopCompactions ends this follower's part in compactions once the
// leader commits nothing more for it: the compaction in progress is
// stopped and answered, queued and later requests are turned away. Then
// the follower sends `stopped`, which the leader waits for before its
// last GC (awaitFollowersStopped); the transport keeps each pair's
// messages in order, so no follower uploads a compacted object after
// that GC looked (it would stay until the next run's GC).
func (r *Run) stopCompactions() {
	r.mu.Lock()
	r.compactsStopped = true
	r.mu.Unlock()
	r.compactCancel()
	<-r.compactsDone
	for {
		select {
		case m := <-r.compactReqs:
			if err := r.send(0, r.finishedCompacting(m)); err != nil {
				r.fail(err)
			}
		default:
			return
		}
	}
}

// compactFor compacts the hosted workers at the leader's epoch and sends
// the objects, or why it could not.
func (r *Run) compactFor(m clusterMsg) {
	r.mu.Lock()
	committed, verified := r.committed, r.verifiedLocked()
	r.mu.Unlock()
	var objs []ObjectRef
	var err error
	switch {
	case m.Epoch > committed:
		err = fmt.Errorf("process %d has not learned of the commit of epoch %d (it has %d)", r.cfg.Cluster.Index(), m.Epoch, committed)
	case !verified:
		err = fmt.Errorf("the local stores of process %d are still being checked after a fast resume", r.cfg.Cluster.Index())
	default:
		start := time.Now()
		// Local GC may have collected past m.Epoch meanwhile (this
		// process learned of newer commits): a key rewritten since then
		// may be missing from the compacted object, but the leader's
		// record keeps every segment after m.Epoch, which holds it.
		objs, err = r.compactHosted(r.compactCtx, m.Epoch, m.Variant)
		r.addSeconds(&r.metrics.CompactionSeconds, start)
	}
	if err != nil {
		if errors.Is(err, localstore.ErrDamaged) {
			r.fail(fmt.Errorf("compaction at epoch %d: %w", m.Epoch, err))
			return
		}
		stopped := r.compactCtx.Err() != nil
		if stopped {
			err = errStopped
		}
		reply := clusterMsg{Type: msgCompactFailed, Epoch: m.Epoch, Round: m.Round, Finished: stopped,
			Replaced: errors.Is(err, localstore.ErrReplaced), Error: err.Error()}
		if serr := r.send(0, reply); serr != nil {
			r.fail(serr)
		}
		return
	}
	if err := r.send(0, clusterMsg{Type: msgCompacted, Epoch: m.Epoch, Round: m.Round, Objects: objs}); err != nil {
		r.fail(err)
		return
	}
	r.mu.Lock()
	r.metrics.Compactions++
	r.mu.Unlock()
}

// finishFollower is a follower's Finish after its pipes are flushed: it
// reports every epoch its workers closed, tells the leader it closes
// nothing more, and (unless aborted) waits until the leader committed
// the last of them, or said it commits nothing more, or the cluster
// failed.
func (r *Run) finishFollower(aborted bool) error {
	r.mu.Lock()
	target := r.sent
	for e := r.sent + 1; ; e++ {
		es := r.epochs[e]
		if es == nil || es.closed < r.cfg.Workers {
			break
		}
		target = e
	}
	for r.err == nil && r.sent < target {
		r.cond.Wait()
	}
	err := r.err
	r.mu.Unlock()
	if err == nil {
		// After the report of target is out: reportUploads counts an
		// epoch reported before its send returns, and holds commitMu
		// until it does.
		r.commitMu.Lock()
		err = r.send(0, clusterMsg{Type: msgFinish, Epoch: target})
		r.commitMu.Unlock()
		if err != nil {
			r.fail(err)
		}
	}
	r.mu.Lock()
	for !aborted && r.err == nil && r.committed < target && !r.leaderDone {
		r.cond.Wait()
	}
	err = r.err
	if err == nil && !aborted && r.committed < target {
		err = fmt.Errorf("%w: process 0 finished at committed epoch %d, before epoch %d that this process's workers closed was committed",
			ErrCluster, r.committed, target)
	}
	r.stopped = true
	r.cond.Broadcast()
	r.mu.Unlock()
	// Only now: until the leader committed this process's last epoch, a
	// commit may need its compaction (a heal, heal.go).
	r.stopCompactions()
	if err == nil {
		if serr := r.send(0, clusterMsg{Type: msgStopped}); serr != nil {
			r.cfg.Logger.Debug("could not tell process 0 this process stopped compacting", "err", serr)
		}
	}
	return err
}
