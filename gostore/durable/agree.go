package durable

import (
	"fmt"
	"sort"
	"strings"
)

// The agreement at the start of a cluster run, before any worker processes
// anything. Open: the leader reads the durable state, numbers the
// execution and sends `agree` to every follower; a follower reads the
// state too (and checks its own local stores against it), waits for
// `agree` and refuses when it read another committed epoch. Start: a
// follower whose workers are restored sends `ready`; the leader waits for
// every follower's, records the execution and sends `started`, which a
// follower waits for. So nothing is processed, and no segment uploaded,
// before the execution record exists.

// peer is what the leader knows of a follower.
type peer struct {
	first, workers int
	// reported is the newest epoch the follower reported uploaded.
	reported int64
	// finished: the follower sent `finish` (it closes nothing more).
	finished bool
	// stopped: the follower sent `stopped` (it compacts nothing more).
	stopped bool
}

// agreeOpen is the cluster's part of Open: the leader sends its decision,
// a follower waits for it and takes it over.
func (r *Run) agreeOpen() error {
	c := r.cfg.Cluster
	if r.leads() {
		return r.toFollowers(clusterMsg{
			Type: msgAgree, FlowID: r.cfg.FlowID, ResumeEpoch: r.resume, CommittedEpoch: r.state.Commit.Epoch,
			WorkerCount: r.cfg.WorkerCount, KeyGroupCount: r.cfg.KeyGroupCount, Processes: c.Count(),
		})
	}
	from, m, err := await(r.parent, c, r.cfg.StartTimeout, -1, "process 0's agreement on the resume point")
	if err != nil {
		return err
	}
	if from != 0 || m.Type != msgAgree {
		return fmt.Errorf("%w: expected process 0's %q message, got %q from process %d", ErrCluster, msgAgree, m.Type, from)
	}
	var diffs []string
	if m.FlowID != r.cfg.FlowID {
		diffs = append(diffs, fmt.Sprintf("flow %q, not %q", m.FlowID, r.cfg.FlowID))
	}
	if m.WorkerCount != r.cfg.WorkerCount {
		diffs = append(diffs, fmt.Sprintf("%d workers, not %d", m.WorkerCount, r.cfg.WorkerCount))
	}
	if m.KeyGroupCount != r.cfg.KeyGroupCount {
		diffs = append(diffs, fmt.Sprintf("%d key groups, not %d", m.KeyGroupCount, r.cfg.KeyGroupCount))
	}
	if m.Processes != c.Count() {
		diffs = append(diffs, fmt.Sprintf("%d processes, not %d", m.Processes, c.Count()))
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%w: process 0 runs %s: every process must run the same flow with the same settings", ErrCluster, strings.Join(diffs, ", "))
	}
	if m.CommittedEpoch != r.state.Commit.Epoch {
		return fmt.Errorf("%w: process 0 resumes from committed epoch %d but this process reads epoch %d from backup %s: every process must use the same backup",
			ErrCluster, m.CommittedEpoch, r.state.Commit.Epoch, r.cfg.Backup)
	}
	r.execution, r.resume = m.Execution, m.ResumeEpoch
	return nil
}

// agreeStart is the cluster's part of Start before the execution is
// recorded (leader) or known to be (follower).
func (r *Run) agreeStart() error {
	c := r.cfg.Cluster
	if !r.leads() {
		if err := r.send(0, clusterMsg{Type: msgReady, FirstWorker: r.cfg.FirstWorker, Workers: r.cfg.Workers}); err != nil {
			return err
		}
		from, m, err := await(r.parent, c, r.cfg.StartTimeout, r.execution, "process 0 to record the execution")
		if err != nil {
			return err
		}
		if from != 0 || m.Type != msgStarted {
			return fmt.Errorf("%w: expected process 0's %q message, got %q from process %d", ErrCluster, msgStarted, m.Type, from)
		}
		return nil
	}
	r.peers = make([]peer, c.Count())
	r.peers[0] = peer{first: r.cfg.FirstWorker, workers: r.cfg.Workers, reported: r.state.Commit.Epoch}
	seen := 0
	for seen < r.followers() {
		from, m, err := await(r.parent, c, r.cfg.StartTimeout, r.execution,
			fmt.Sprintf("every process to restore its workers (%d of %d ready)", seen, r.followers()))
		if err != nil {
			return err
		}
		if m.Type != msgReady || from <= 0 || from >= c.Count() || r.peers[from].workers > 0 {
			return fmt.Errorf("%w: expected one %q message from each process, got %q from process %d", ErrCluster, msgReady, m.Type, from)
		}
		r.peers[from] = peer{first: m.FirstWorker, workers: m.Workers, reported: r.state.Commit.Epoch}
		seen++
	}
	return r.checkLayout()
}

// checkLayout checks that the processes' workers are every worker of the
// flow, once each.
func (r *Run) checkLayout() error {
	order := make([]int, len(r.peers))
	for p := range order {
		order[p] = p
	}
	sort.Slice(order, func(i, j int) bool { return r.peers[order[i]].first < r.peers[order[j]].first })
	next := 0
	ok := true
	var hosts []string
	for _, p := range order {
		pe := r.peers[p]
		if pe.first != next {
			ok = false
		}
		next = pe.first + pe.workers
		hosts = append(hosts, fmt.Sprintf("process %d hosts %d..%d", p, pe.first, pe.first+pe.workers-1))
	}
	if ok && next == r.cfg.WorkerCount {
		return nil
	}
	return fmt.Errorf("%w: the processes' workers are not workers 0..%d once each: %s; give each process its own range of the %d workers (FirstWorker, Workers)",
		ErrCluster, r.cfg.WorkerCount-1, strings.Join(hosts, ", "), r.cfg.WorkerCount)
}
