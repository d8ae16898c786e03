package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/millpond/millpond/gostore/localstore"
)

// A flow can run as several processes, each hosting a contiguous range of
// the flow's workers (Config.FirstWorker, Config.Workers) with its own
// local stores, all against the same backup. Process 0 leads: it alone
// decides the execution and the resume epoch, records the execution,
// writes commit records, decides compactions and collects durable
// garbage. The others (followers) upload their own workers' segments and
// tell the leader; the leader tells them what it committed. The messages
// are small JSON documents (clusterMsg) that travel over the Cluster the
// caller provides. See doc.go for the protocol.

// Cluster is how one process's run reaches the other processes of its flow.
type Cluster interface {
	// Index is this process; 0 leads.
	Index() int
	// Count is the number of processes.
	Count() int
	// Send queues a control message for process `to`. It never blocks
	// long, keeps messages to one process in order, and returns an error
	// once the cluster failed.
	Send(to int, payload []byte) error
	// Inbox delivers the messages for this run from the other processes,
	// in order per sender. It is closed when the cluster stops; Err then
	// says why.
	Inbox() <-chan ClusterMessage
	// Err is why the cluster stopped, nil while it runs.
	Err() error
}

// ClusterMessage is a control message from another process.
type ClusterMessage struct {
	From    int
	Payload []byte
}

// ErrCluster is wrapped when the cluster, or another process of the flow,
// stopped this run: the transport failed, a process failed or left, or a
// process sent a message this run cannot use.
var ErrCluster = errors.New("cluster failed")

// clusterVersion is the version of the messages; a process refuses a
// message of another version.
const clusterVersion = 2

// Message types.
const (
	msgAgree         = "agree"          // leader -> follower, in Open: the execution and resume point
	msgReady         = "ready"          // follower -> leader, in Start: its workers are restored
	msgStarted       = "started"        // leader -> follower, in Start: the execution is recorded
	msgUploaded      = "uploaded"       // follower -> leader: its workers closed an epoch and uploaded its segments
	msgCommitted     = "committed"      // leader -> follower: a commit record was written
	msgCompact       = "compact"        // leader -> follower: compact your workers at a committed epoch
	msgCompacted     = "compacted"      // follower -> leader: the compacted objects
	msgCompactFailed = "compact_failed" // follower -> leader: the compaction failed (retried later)
	msgFinish        = "finish"         // follower -> leader, in Finish: nothing more will be closed
	msgFinished      = "finished"       // leader -> follower, in Finish: nothing more will be committed
	msgStopped       = "stopped"        // follower -> leader, in Finish: it compacts nothing more
	msgFailed        = "failed"         // either way: the sender's run failed or stopped
)

// clusterMsg is every message; each type uses some of the fields.
type clusterMsg struct {
	Version   int    `json:"v"`
	Type      string `json:"type"`
	Execution int64  `json:"execution"`
	// agree
	FlowID         string `json:"flow_id,omitempty"`
	ResumeEpoch    int64  `json:"resume_epoch,omitempty"`
	CommittedEpoch int64  `json:"committed_epoch,omitempty"`
	WorkerCount    int    `json:"worker_count,omitempty"`
	KeyGroupCount  int    `json:"key_group_count,omitempty"`
	Processes      int    `json:"processes,omitempty"`
	// ready
	FirstWorker int `json:"first_worker,omitempty"`
	Workers     int `json:"workers,omitempty"`
	// uploaded, compact, compacted, compact_failed, finish, finished
	Epoch   int64       `json:"epoch,omitempty"`
	Objects []ObjectRef `json:"objects,omitempty"`
	// uploaded: the sender's workers whose batch of the epoch was their
	// whole state (whole.go), and those of them that cut no segment.
	Whole []int `json:"whole,omitempty"`
	Bare  []int `json:"bare,omitempty"`
	// committed
	Record *CommitRecord `json:"record,omitempty"`
	// compact, compacted, compact_failed
	Round   int64 `json:"round,omitempty"`
	Heal    bool  `json:"heal,omitempty"`
	Variant int   `json:"variant,omitempty"`
	// failed, compact_failed
	Error string `json:"error,omitempty"`
	// compact_failed: the follower finished its run (or was stopping)
	// and compacts nothing more; the end of a run, not a fault.
	Finished bool `json:"finished,omitempty"`
	// compact_failed: a whole-state generation of a later epoch had
	// replaced the epoch's state in a local store (localstore.ErrReplaced):
	// retried at a later epoch, not a fault.
	Replaced bool `json:"replaced,omitempty"`
}

// decodeMsg reads a message from process `from` and checks what every
// message of its type must hold.
func decodeMsg(from int, payload []byte) (clusterMsg, error) {
	var m clusterMsg
	if err := json.Unmarshal(payload, &m); err != nil {
		return m, fmt.Errorf("%w: malformed message from process %d: %v", ErrCluster, from, err)
	}
	if m.Version != clusterVersion {
		return m, fmt.Errorf("%w: process %d sent a %q message of version %d; this process speaks version %d (run the same millpond version on every process)",
			ErrCluster, from, m.Type, m.Version, clusterVersion)
	}
	bad := ""
	switch m.Type {
	case msgAgree:
		if m.FlowID == "" || m.ResumeEpoch != m.CommittedEpoch+1 || m.WorkerCount <= 0 || m.KeyGroupCount <= 0 || m.Processes <= 0 || m.Execution < 0 {
			bad = "incomplete"
		}
	case msgReady:
		if m.Workers <= 0 || m.FirstWorker < 0 {
			bad = "without workers"
		}
	case msgUploaded, msgCompact, msgCompacted:
		if m.Epoch <= 0 {
			bad = "without an epoch"
		}
	case msgCommitted:
		if m.Record == nil || m.Record.Epoch <= 0 {
			bad = "without a record"
		}
	case msgStarted, msgCompactFailed, msgFinish, msgFinished, msgStopped, msgFailed:
	default:
		return m, fmt.Errorf("%w: process %d sent a message of unknown type %q", ErrCluster, from, m.Type)
	}
	if bad != "" {
		return m, fmt.Errorf("%w: process %d sent a %q message %s: %s", ErrCluster, from, m.Type, bad, payload)
	}
	return m, nil
}

// encodeMsg stamps m with the version and encodes it.
func encodeMsg(m clusterMsg) []byte {
	m.Version = clusterVersion
	data, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("encode cluster message: %v", err)) // plain data: cannot fail
	}
	return data
}

// clustered reports whether the run is one process of several (a Cluster
// is configured, even of one process).
func (r *Run) clustered() bool { return r.cfg.Cluster != nil }

// leads reports whether this process writes commit records: a run of its
// own, or process 0 of a cluster.
func (r *Run) leads() bool { return r.cfg.Cluster == nil || r.cfg.Cluster.Index() == 0 }

// followers is the number of processes besides the leader (0 without a
// cluster).
func (r *Run) followers() int {
	if r.cfg.Cluster == nil {
		return 0
	}
	return r.cfg.Cluster.Count() - 1
}

// hosts reports whether worker w (global index) runs in this process.
func (r *Run) hosts(w int) bool { return w >= r.cfg.FirstWorker && w < r.cfg.FirstWorker+r.cfg.Workers }

// checkHosted is the error for a worker that is not hosted here.
func (r *Run) checkHosted(w int) error {
	if r.hosts(w) {
		return nil
	}
	if r.clustered() {
		return fmt.Errorf("worker %d is not hosted by process %d of flow %q, which hosts workers %d..%d of %d",
			w, r.cfg.Cluster.Index(), r.cfg.FlowID, r.cfg.FirstWorker, r.cfg.FirstWorker+r.cfg.Workers-1, r.cfg.WorkerCount)
	}
	return fmt.Errorf("worker %d is not a worker of flow %q, which has %d", w, r.cfg.FlowID, r.cfg.WorkerCount)
}

// hosted yields the workers of this process with their local stores (nil
// before Restore).
func (r *Run) hosted() iter.Seq2[int, *localstore.Store] {
	return func(yield func(int, *localstore.Store) bool) {
		for w := r.cfg.FirstWorker; w < r.cfg.FirstWorker+r.cfg.Workers; w++ {
			if !yield(w, r.stores[w]) {
				return
			}
		}
	}
}

// Hosts reports whether worker w (global index) runs in this process.
func (r *Run) Hosts(w int) bool { return r.hosts(w) }

// Leads reports whether this process writes the commit records: a run of
// its own, or process 0 of a cluster.
func (r *Run) Leads() bool { return r.leads() }

// HostedWorkers returns the first worker this process hosts and how many.
func (r *Run) HostedWorkers() (first, count int) { return r.cfg.FirstWorker, r.cfg.Workers }

// peerError is a failure another process reported (or the cluster's
// own): fail does not echo it back to where it came from. (A message this
// run cannot use is a plain error: its sender is told.)
type peerError struct {
	from int // -1: the cluster itself
	err  error
}

func (e peerError) Error() string { return e.err.Error() }
func (e peerError) Unwrap() error { return e.err }

// send sends m to process `to`, stamped with this run's execution.
func (r *Run) send(to int, m clusterMsg) error {
	m.Execution = r.execution
	if err := r.cfg.Cluster.Send(to, encodeMsg(m)); err != nil {
		return peerError{from: -1, err: fmt.Errorf("%w: send %q to process %d: %w", ErrCluster, m.Type, to, err)}
	}
	r.mu.Lock()
	r.metrics.ClusterSent++
	r.mu.Unlock()
	return nil
}

// toFollowers sends m to every follower.
func (r *Run) toFollowers(m clusterMsg) error {
	for p := 1; p <= r.followers(); p++ {
		if err := r.send(p, m); err != nil {
			return err
		}
	}
	return nil
}

// tellFailed tells the other processes, as well as it can, that this run
// failed with err: the leader tells every follower but the one err came
// from, a follower tells the leader (unless err came from it). Nothing is
// sent for an error of the cluster itself.
func tellFailed(c Cluster, execution int64, err error) {
	if c == nil {
		return
	}
	from := -2
	var pe peerError
	if errors.As(err, &pe) {
		if pe.from == -1 {
			return
		}
		from = pe.from
	}
	data := encodeMsg(clusterMsg{Type: msgFailed, Execution: execution, Error: err.Error()})
	if c.Index() != 0 {
		if from != 0 {
			c.Send(0, data) // best effort: the cluster may be down already
		}
		return
	}
	for p := 1; p < c.Count(); p++ {
		if p != from {
			c.Send(p, data)
		}
	}
}

// peerFailed is the error for a `failed` message.
func peerFailed(from int, m clusterMsg) error {
	return peerError{from: from, err: fmt.Errorf("%w: process %d failed: %s", ErrCluster, from, m.Error)}
}

// fenced is the error for a message of another execution.
func fenced(from int, m clusterMsg, execution int64) error {
	return fmt.Errorf("%w: fenced out: process %d sent a %q message of execution %d, but this run is execution %d; every process of a cluster must belong to the same execution (stop the processes of the other one)",
		ErrCluster, from, m.Type, m.Execution, execution)
}

// clusterDown is the error when the cluster stopped (its inbox closed).
func clusterDown(c Cluster) error {
	cause := c.Err()
	if cause == nil {
		cause = errors.New("its inbox closed")
	}
	return peerError{from: -1, err: fmt.Errorf("%w: %w", ErrCluster, cause)}
}

// await reads the next message of the cluster, bounded by ctx and timeout
// (what says what was waited for, in errors). A `failed` message is
// returned as the error it reports; a message of another execution (when
// execution >= 0) as a fencing error.
func await(ctx context.Context, c Cluster, timeout time.Duration, execution int64, what string) (int, clusterMsg, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case cm, ok := <-c.Inbox():
		if !ok {
			return 0, clusterMsg{}, clusterDown(c)
		}
		m, err := decodeMsg(cm.From, cm.Payload)
		if err != nil {
			return cm.From, m, err
		}
		if m.Type == msgFailed {
			return cm.From, m, peerFailed(cm.From, m)
		}
		if execution >= 0 && m.Execution != execution {
			return cm.From, m, fenced(cm.From, m, execution)
		}
		return cm.From, m, nil
	case <-timer.C:
		return 0, clusterMsg{}, fmt.Errorf("%w: no message from the other processes within %s while waiting for %s (StartTimeout); is every process of the flow started, with the same cluster addresses?",
			ErrCluster, timeout, what)
	case <-ctx.Done():
		return 0, clusterMsg{}, fmt.Errorf("waiting for %s: %w", what, ctx.Err())
	}
}
