package durable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/millpond/millpond/gostore/localstore"
)

// The leader of a cluster run: it counts a follower's `uploaded` epoch as
// closed by every worker of that follower, with the segments it names,
// and commits as a run of its own would (commit.go); it sends every
// record it writes to the followers, and compacts with them.

// startCluster starts the goroutines of cluster mode: the reader of the
// inbox, and the leader's committer or a follower's compactions.
func (r *Run) startCluster() {
	r.stopCluster = make(chan struct{})
	r.clusterWG.Add(1)
	go r.runInbox()
	if r.leads() {
		r.kick = make(chan struct{}, 1)
		// In uploadWG: like an upload, it commits and wakes maintenance.
		r.uploadWG.Add(1)
		go r.runCommitter()
		return
	}
	r.compactReqs = make(chan clusterMsg, 4)
	r.compactCtx, r.compactCancel = context.WithCancel(r.maintCtx)
	r.compactsDone = make(chan struct{})
	r.clusterWG.Add(1)
	go r.runCompactions()
}

// runInbox reads the other processes' messages for the life of the run.
// A cluster that stops, or a message this run cannot use, fails the run;
// after that, messages are read and dropped.
func (r *Run) runInbox() {
	defer r.clusterWG.Done()
	inbox := r.cfg.Cluster.Inbox()
	for {
		select {
		case cm, ok := <-inbox:
			if !ok {
				// Closed in good order once the leader said it commits
				// nothing more, or once Finish is past its waits: nothing
				// more was needed from the others.
				r.mu.Lock()
				done := r.stopped || (!r.leads() && r.leaderDone)
				r.mu.Unlock()
				if !done {
					r.fail(clusterDown(r.cfg.Cluster))
				}
				return
			}
			if r.Err() != nil {
				continue
			}
			if err := r.receive(cm); err != nil {
				r.fail(err)
			}
		case <-r.stopCluster:
			return
		}
	}
}

// receive handles one message of another process.
func (r *Run) receive(cm ClusterMessage) error {
	m, err := decodeMsg(cm.From, cm.Payload)
	if err != nil {
		return err
	}
	if m.Type == msgFailed {
		return peerFailed(cm.From, m)
	}
	if m.Execution != r.execution {
		return fenced(cm.From, m, r.execution)
	}
	r.mu.Lock()
	r.metrics.ClusterReceived++
	r.mu.Unlock()
	unexpected := func() error {
		return fmt.Errorf("%w: process %d sent a %q message, which process %d does not take while it runs",
			ErrCluster, cm.From, m.Type, r.cfg.Cluster.Index())
	}
	if r.leads() {
		if cm.From <= 0 || cm.From >= len(r.peers) {
			return unexpected()
		}
		switch m.Type {
		case msgUploaded:
			return r.onUploaded(cm.From, m)
		case msgCompacted, msgCompactFailed:
			return r.onCompactReply(cm.From, m)
		case msgFinish:
			return r.onFinish(cm.From, m)
		case msgStopped:
			r.mu.Lock()
			r.peers[cm.From].stopped = true
			r.cond.Broadcast()
			r.mu.Unlock()
			return nil
		}
		return unexpected()
	}
	if cm.From != 0 {
		return unexpected()
	}
	switch m.Type {
	case msgCommitted:
		return r.applyRecord(*m.Record)
	case msgCompact:
		return r.queueCompaction(m)
	case msgFinished:
		return r.onFinished(m)
	}
	return unexpected()
}

// onUploaded counts follower p's workers as closed at the message's epoch,
// with the segments it names, and wakes the committer.
func (r *Run) onUploaded(p int, m clusterMsg) error {
	r.mu.Lock()
	pe := &r.peers[p]
	if m.Epoch != pe.reported+1 {
		r.mu.Unlock()
		return fmt.Errorf("%w: process %d reported epoch %d uploaded after epoch %d; epochs are reported in order, once each",
			ErrCluster, p, m.Epoch, pe.reported)
	}
	if err := r.checkRemote(p, *pe, m, KindSegment); err != nil {
		r.mu.Unlock()
		return err
	}
	es := r.epochLocked(m.Epoch)
	es.closed += pe.workers
	es.objects = append(es.objects, m.Objects...)
	for _, w := range m.Whole {
		es.markWhole(w)
	}
	for _, w := range m.Bare {
		es.markBare(w)
	}
	pe.reported = m.Epoch
	r.metrics.RemoteUploads++
	r.metrics.RemoteSegments += int64(len(m.Objects))
	r.cond.Broadcast()
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default: // a commit try is due already
	}
	return nil
}

// checkRemote checks the objects follower p names in m: of this flow and
// execution, of kind, of p's workers and of m's epoch.
func (r *Run) checkRemote(p int, pe peer, m clusterMsg, kind string) error {
	for _, w := range append(append([]int(nil), m.Whole...), m.Bare...) {
		if w < pe.first || w >= pe.first+pe.workers {
			return fmt.Errorf("%w: process %d (workers %d..%d) marked worker %d's batch of epoch %d whole",
				ErrCluster, p, pe.first, pe.first+pe.workers-1, w, m.Epoch)
		}
	}
	for _, o := range m.Objects {
		bad := ""
		switch {
		case o.Kind != kind:
			bad = "is a " + o.Kind
		case o.Execution != r.execution:
			bad = fmt.Sprintf("is of execution %d", o.Execution)
		case o.Worker < pe.first || o.Worker >= pe.first+pe.workers || o.WorkerCount != r.cfg.WorkerCount:
			bad = fmt.Sprintf("is worker %d of %d's", o.Worker, o.WorkerCount)
		case o.LastEpoch != m.Epoch || o.FirstEpoch > o.LastEpoch:
			bad = fmt.Sprintf("holds epochs %d..%d", o.FirstEpoch, o.LastEpoch)
		case !strings.HasPrefix(o.Key, flowPrefix(r.cfg.FlowID)):
			bad = "is not an object of this flow"
		}
		if bad != "" {
			return fmt.Errorf("%w: process %d (workers %d..%d) named %s for epoch %d, which %s",
				ErrCluster, p, pe.first, pe.first+pe.workers-1, o.Key, m.Epoch, bad)
		}
	}
	return nil
}

// runCommitter tries a commit whenever a follower reported an epoch. (Not
// in the inbox reader: a commit may heal lost objects, which waits for
// the followers' compactions, which that reader delivers.)
func (r *Run) runCommitter() {
	defer r.uploadWG.Done()
	for {
		select {
		case <-r.kick:
			r.tryCommit()
		case <-r.stopCluster:
			return
		}
	}
}

// broadcastRecord sends a record just written to every follower. The
// caller holds commitMu, so followers get the records in order.
func (r *Run) broadcastRecord(rec CommitRecord) {
	if err := r.toFollowers(clusterMsg{Type: msgCommitted, Record: &rec}); err != nil {
		r.fail(err)
	}
}

// onFinish notes that follower p closes nothing more.
func (r *Run) onFinish(p int, m clusterMsg) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	pe := &r.peers[p]
	if m.Epoch != pe.reported {
		return fmt.Errorf("%w: process %d finished at epoch %d, but reported epochs up to %d", ErrCluster, p, m.Epoch, pe.reported)
	}
	pe.finished = true
	r.cond.Broadcast()
	return nil
}

// stoppedWait bounds the leader's wait for its followers' `stopped`: a
// follower stops a compaction in progress within moments, and one that
// does not answer leaves at worst objects the next run's GC collects.
const stoppedWait = 10 * time.Second

// awaitFollowersStopped waits, before the leader's last GC, until every
// follower said it compacts nothing more (follower.go, stopCompactions),
// or the run failed, or stoppedWait passed.
func (r *Run) awaitFollowersStopped() {
	over := false // under mu
	timer := time.AfterFunc(stoppedWait, func() {
		r.mu.Lock()
		over = true
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer timer.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	stopped := func(pe peer) bool { return pe.stopped }
	for r.err == nil && !over && !r.everyFollowerLocked(stopped) {
		r.cond.Wait()
	}
	if r.err == nil && !r.everyFollowerLocked(stopped) {
		r.cfg.Logger.Warn("a process did not say it stopped compacting; the next run's GC collects what it leaves",
			"waited", stoppedWait)
	}
}

// followersFinishedLocked reports whether every follower sent `finish`
// (true without followers). r.mu is held.
func (r *Run) followersFinishedLocked() bool {
	return r.everyFollowerLocked(func(pe peer) bool { return pe.finished })
}

// everyFollowerLocked reports whether ok holds for every follower (true
// without followers). r.mu is held.
func (r *Run) everyFollowerLocked(ok func(peer) bool) bool {
	for p := 1; p < len(r.peers); p++ {
		if !ok(r.peers[p]) {
			return false
		}
	}
	return true
}

// errFollowerFinished ends a compaction round that a follower can no
// longer take part in: it finished its run (the end of the run, not a
// fault; the next run compacts).
var errFollowerFinished = errors.New("a process finished its run before its part of the compaction")

// compactRound is a compaction the leader waits for the followers' parts
// of.
type compactRound struct {
	id      int64
	epoch   int64
	replies chan compactReply
}

type compactReply struct {
	from int
	m    clusterMsg
}

// requestCompaction asks every follower to compact its workers at c, and
// returns the round to wait for (nil without followers).
func (r *Run) requestCompaction(c int64, heal bool, variant int) *compactRound {
	if r.followers() == 0 {
		return nil
	}
	r.mu.Lock()
	r.rounds++
	round := &compactRound{id: r.rounds, epoch: c, replies: make(chan compactReply, r.followers())}
	r.round = round
	r.mu.Unlock()
	// Under commitMu: a commit of c that is being written sends its record
	// first, so every follower has committed c when it reads this.
	r.commitMu.Lock()
	err := r.toFollowers(clusterMsg{Type: msgCompact, Epoch: c, Heal: heal, Variant: variant, Round: round.id})
	r.commitMu.Unlock()
	if err != nil {
		r.fail(err)
	}
	return round
}

// endCompaction gives up waiting for round (nil-safe): later answers to it
// are dropped.
func (r *Run) endCompaction(round *compactRound) {
	if round == nil {
		return
	}
	r.mu.Lock()
	if r.round == round {
		r.round = nil
	}
	r.mu.Unlock()
}

// onCompactReply hands a follower's answer to the compaction waiting for
// it; an answer to a round given up is dropped.
func (r *Run) onCompactReply(p int, m clusterMsg) error {
	r.mu.Lock()
	round := r.round
	r.mu.Unlock()
	if round == nil || round.id != m.Round {
		r.cfg.Logger.Debug("late answer to a compaction dropped", "process", p, "round", m.Round, "epoch", m.Epoch)
		return nil
	}
	select {
	case round.replies <- compactReply{from: p, m: m}:
		return nil
	default:
		return fmt.Errorf("%w: process %d answered compaction round %d more than once", ErrCluster, p, m.Round)
	}
}

// awaitCompaction waits for every follower's compacted objects of round,
// and checks that each follower compacted each of its workers once.
func (r *Run) awaitCompaction(ctx context.Context, round *compactRound) ([]ObjectRef, error) {
	var objs []ObjectRef
	got := map[int]bool{}
	for len(got) < r.followers() {
		select {
		case rep := <-round.replies:
			if got[rep.from] {
				return nil, fmt.Errorf("%w: process %d answered compaction round %d twice", ErrCluster, rep.from, round.id)
			}
			got[rep.from] = true
			if rep.m.Type == msgCompactFailed {
				if rep.m.Finished {
					return nil, fmt.Errorf("%w: process %d at epoch %d", errFollowerFinished, rep.from, round.epoch)
				}
				if rep.m.Replaced {
					return nil, fmt.Errorf("process %d at epoch %d: %w", rep.from, round.epoch, localstore.ErrReplaced)
				}
				return nil, fmt.Errorf("process %d could not compact its workers at epoch %d: %s", rep.from, round.epoch, rep.m.Error)
			}
			r.mu.Lock()
			pe := r.peers[rep.from]
			r.mu.Unlock()
			if rep.m.Epoch != round.epoch {
				return nil, fmt.Errorf("%w: process %d compacted at epoch %d, not %d", ErrCluster, rep.from, rep.m.Epoch, round.epoch)
			}
			if err := r.checkRemote(rep.from, pe, rep.m, KindCompacted); err != nil {
				return nil, err
			}
			workers := map[int]bool{}
			for _, o := range rep.m.Objects {
				workers[o.Worker] = true
			}
			if len(workers) != pe.workers || len(rep.m.Objects) != pe.workers {
				return nil, fmt.Errorf("%w: process %d compacted %d objects of %d workers, not one of each of its %d", ErrCluster, rep.from, len(rep.m.Objects), len(workers), pe.workers)
			}
			objs = append(objs, rep.m.Objects...)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-r.failed:
			return nil, r.Err()
		case <-r.stopCluster:
			return nil, errStopped
		}
	}
	return objs, nil
}
