package durable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/segment"
)

// SnapshotMode says when finished segments are cut.
type SnapshotMode int

// The snapshot modes.
const (
	// SnapshotBatch cuts one segment per worker per epoch, at the epoch's close.
	SnapshotBatch SnapshotMode = iota
	// SnapshotImmediate cuts a segment after every snapshot batch.
	SnapshotImmediate
)

func (m SnapshotMode) cutMode() segment.Mode {
	if m == SnapshotImmediate {
		return segment.PerBatch
	}
	return segment.PerEpoch
}

// String names the mode as ParseSnapshotMode reads it.
func (m SnapshotMode) String() string {
	switch m {
	case SnapshotBatch:
		return "batch"
	case SnapshotImmediate:
		return "immediate"
	}
	return fmt.Sprintf("SnapshotMode(%d)", int(m))
}

// SnapshotModes lists the modes, in order.
func SnapshotModes() []SnapshotMode { return []SnapshotMode{SnapshotBatch, SnapshotImmediate} }

// ParseSnapshotMode reads a mode by name: "batch" or "immediate".
func ParseSnapshotMode(name string) (SnapshotMode, error) {
	for _, m := range SnapshotModes() {
		if m.String() == name {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown snapshot mode %q; use \"batch\" or \"immediate\"", name)
}

// Config sets up a recovery run.
type Config struct {
	LocalDir      string
	FlowID        string
	WorkerCount   int
	KeyGroupCount int
	Backup        backup.Backup
	Mode          SnapshotMode
	// MaxEpochsInFlight bounds the epochs closed but not yet committed;
	// CloseEpoch waits beyond it. Default 4.
	MaxEpochsInFlight int
	// RetainEpochs keeps commit records (and the objects they name) of
	// this many recent epochs for point-in-time restore. Default 2.
	RetainEpochs int
	// RetainFor also keeps every commit record written within this long
	// (and the objects it names), however many epochs that spans. Zero
	// keeps by epochs only.
	RetainFor time.Duration
	// CompactRatio: compact when the bytes of segments since the last
	// compaction exceed this multiple of the compacted state. Default 0.5,
	// which keeps the durable footprint within about 3x the live state.
	CompactRatio float64
	// CompactMinBytes: never compact below this many segment bytes.
	// Default 256 KiB.
	CompactMinBytes int64
	// UploadWorkers uploads in parallel. Default 4.
	UploadWorkers int
	// UploadAttempts per segment before the run fails. Default 5.
	UploadAttempts int
	// GenerationMinRows: a whole-state batch of at least this many rows
	// starts a new generation of the local store; a smaller one is written
	// in place, which costs less than a new file for a small state.
	// Default 1024.
	GenerationMinRows int
	// CarryBytes bounds the memory a worker's carried state may take in
	// batch mode (carry.go), counting each row's key and value bytes and
	// about 70 bytes more; a state that outgrows it is no longer carried.
	// Default 64 MiB; negative carries nothing.
	CarryBytes int64
	// CheckpointHold bounds how long a local store's background checkpoint
	// waits for epochs closed but not committed (waitCommitsIdle).
	// Default 1s.
	CheckpointHold time.Duration
	// Key, when set, authenticates every commit and execution record
	// (seal.go): a record it did not seal is refused before anything it
	// names is read. Nil seals with a plain SHA-256 (integrity only).
	Key    Key
	Logger *slog.Logger

	// Cluster, when set, makes this run one process of a flow that runs as
	// several (cluster.go): it hosts workers FirstWorker..FirstWorker+
	// Workers-1 of WorkerCount, process 0 leads. Nil: this run is the
	// whole flow.
	Cluster Cluster
	// FirstWorker is the first worker this process hosts (a global
	// index); cluster mode only.
	FirstWorker int
	// Workers is how many workers this process hosts; 0 means
	// WorkerCount (one process).
	Workers int
	// StartTimeout bounds each wait for the other processes while a
	// cluster run starts: a follower's for the leader's agreement (Open)
	// and for the recorded execution (Start), the leader's for every
	// follower's restored workers (Start, so it must cover the slowest
	// process's restore beyond the leader's own). Default 60s.
	StartTimeout time.Duration
}

func (c *Config) defaults() error {
	if c.Backup == nil {
		return errors.New("recovery needs a backup")
	}
	if err := c.Key.Validate(); err != nil {
		return err
	}
	if err := localstore.ValidateFlowID(c.FlowID); err != nil {
		return err
	}
	if err := keygroup.Validate(c.KeyGroupCount, 0, c.WorkerCount); err != nil {
		return err
	}
	if c.Workers == 0 {
		c.Workers = c.WorkerCount
	}
	if c.Cluster == nil {
		if c.FirstWorker != 0 || c.Workers != c.WorkerCount {
			return fmt.Errorf("FirstWorker %d and Workers %d select one process's workers of a cluster; without a Cluster a run hosts all %d workers",
				c.FirstWorker, c.Workers, c.WorkerCount)
		}
	} else {
		if n, i := c.Cluster.Count(), c.Cluster.Index(); n < 1 || i < 0 || i >= n {
			return fmt.Errorf("cluster process %d of %d: the index must be in 0..count-1", i, n)
		}
		if c.FirstWorker < 0 || c.Workers < 1 || c.FirstWorker+c.Workers > c.WorkerCount {
			return fmt.Errorf("this process hosts workers %d..%d, not a range of the flow's %d workers; set FirstWorker and Workers (at least 1)",
				c.FirstWorker, c.FirstWorker+c.Workers-1, c.WorkerCount)
		}
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 60 * time.Second
	}
	if c.MaxEpochsInFlight <= 0 {
		c.MaxEpochsInFlight = 4
	}
	if c.RetainEpochs <= 0 {
		c.RetainEpochs = 2
	}
	if c.CompactRatio <= 0 {
		c.CompactRatio = 0.5
	}
	if c.CompactMinBytes <= 0 {
		c.CompactMinBytes = 256 << 10
	}
	if c.UploadWorkers <= 0 {
		c.UploadWorkers = 4
	}
	if c.UploadAttempts <= 0 {
		c.UploadAttempts = 5
	}
	if c.CheckpointHold <= 0 {
		c.CheckpointHold = time.Second
	}
	if c.GenerationMinRows <= 0 {
		c.GenerationMinRows = 1024
	}
	if c.CarryBytes == 0 {
		c.CarryBytes = 64 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Run is one execution of a flow with recovery: its workers' local stores,
// the segment pipeline to the backup, and the commit protocol.
type Run struct {
	cfg       Config
	state     State
	execution int64
	resume    int64

	stores   []*localstore.Store
	restores []RestoreInfo
	pipes    []*pipe
	uploads  chan uploadJob
	maint    chan int64

	mu        sync.Mutex
	cond      *sync.Cond
	epochs    map[int64]*epochState
	committed int64
	closedAll int64 // newest epoch every worker has closed
	err       error
	stopped   bool
	// verifying counts fast-resumed local stores still being checked;
	// nothing commits until it is zero (verify.go).
	verifying int
	// stopVerify cancels the checks still running (Finish, once nothing
	// is left to commit).
	stopVerify context.CancelFunc

	commitMu sync.Mutex // serializes writes of commit records
	healMu   sync.Mutex // one heal at a time (heal.go)
	// objectsMu keeps compaction and durable GC apart: a GC that read the
	// newest record before a compaction at that same epoch wrote its own
	// would take the new compacted object for an unreferenced one.
	objectsMu sync.Mutex
	record    CommitRecord

	// handoffs[w], under mu, are worker w's whole batches waiting for
	// their segments to be staged as the local store's next generation,
	// oldest first (the worker's pipe cuts segments in epoch order).
	handoffs [][]*handoff
	// held[w], under mu, is worker w's whole batch's held deletions.
	held []*heldDeletions
	// carry[w] is worker w's carried state (carry.go); nil outside batch
	// mode and before the worker is restored.
	carry []*carried

	progress  Progress
	metrics   Metrics
	commitLog []CommitEvent
	// uploadRetries counts the backup calls retry tried again (not under
	// mu: retries happen outside it).
	uploadRetries atomic.Int64

	// parent is the context Open was called with: the run outlives that
	// call, but cancelling it (an interrupt) stops the run's background
	// work and fails its waits.
	parent context.Context
	ctx    context.Context
	cancel context.CancelFunc
	// maintCtx stops compaction and GC at the end of a run.
	maintCtx    context.Context
	maintCancel context.CancelFunc
	// gcNext paces local GC (dutyFactor).
	gcNext time.Time
	// Under mu: what CloseEpoch needs to hold the flow back while
	// maintenance catches up (maintenanceBehindLocked).
	gcEpoch                      int64
	segmentBytes, compactedBytes int64
	maintFailing                 bool
	wg                           sync.WaitGroup
	// uploadWG tracks the upload goroutines apart: they send to maint,
	// so Finish closes maint only once they are gone.
	uploadWG sync.WaitGroup
	// clusterWG tracks the inbox reader and a follower's compactions.
	clusterWG sync.WaitGroup

	// failed is closed by the first fail, for waits on channels.
	failed chan struct{}
	// Cluster mode (cluster.go, agree.go, leader.go, follower.go).
	// peers (leader, under mu after Start) are the processes' workers.
	peers []peer
	// sent (follower, under mu) is the newest epoch reported uploaded.
	sent int64
	// kick wakes the leader's committer (an `uploaded` arrived).
	kick chan struct{}
	// stopCluster stops the inbox reader and the committer.
	stopCluster chan struct{}
	// round (leader, under mu) is the compaction waiting for the
	// followers' parts; rounds numbers them.
	round  *compactRound
	rounds int64
	// compactReqs (follower) queues the leader's compaction requests.
	// compactCtx stops the compaction in progress when the follower
	// finishes (stopCompactions); compactsDone is closed once
	// runCompactions has answered its last request; compactsStopped
	// (under mu) turns later requests away at once.
	compactReqs     chan clusterMsg
	compactCtx      context.Context
	compactCancel   context.CancelFunc
	compactsDone    chan struct{}
	compactsStopped bool
	// finishing (under mu): Finish was called. leaderDone (follower,
	// under mu): the leader finished and commits nothing more.
	finishing  bool
	leaderDone bool
	// finished: Finish ran to its end (Close then tells no one).
	finished bool
}

// Open reads the durable state and returns the run, numbered as the next
// execution. Call Restore for each worker, then Start, which records the
// execution before anything is processed.
//
// In cluster mode (Config.Cluster), the leader sends its decision to the
// other processes, and a follower waits for it (Config.StartTimeout) and
// takes over the leader's execution and resume epoch (agree.go).
func Open(ctx context.Context, cfg Config) (*Run, error) {
	r, err := open(ctx, cfg)
	if err != nil && cfg.Cluster != nil {
		tellFailed(cfg.Cluster, -1, err)
	}
	return r, err
}

func open(ctx context.Context, cfg Config) (*Run, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("open recovery for flow %q: %w", cfg.FlowID, err)
	}
	if err := localstore.EnsureDir(cfg.LocalDir); err != nil {
		return nil, fmt.Errorf("open recovery for flow %q: %w", cfg.FlowID, err)
	}
	if c, ok := cfg.Backup.(backup.Checker); ok {
		if err := c.Check(ctx); err != nil {
			return nil, backupFailed(fmt.Errorf("open recovery for flow %q: backup %s is not usable: %w", cfg.FlowID, cfg.Backup, err))
		}
	}
	st, err := ReadState(ctx, cfg.Backup, cfg.FlowID, cfg.Key)
	if err != nil {
		return nil, fmt.Errorf("open recovery for flow %q: %w", cfg.FlowID, err)
	}
	if err := checkLocalCommits(ctx, cfg, st); err != nil {
		return nil, fmt.Errorf("open recovery for flow %q: %w", cfg.FlowID, err)
	}
	if st.Commit.Epoch > 0 && st.Commit.KeyGroupCount != cfg.KeyGroupCount {
		return nil, fmt.Errorf("open recovery for flow %q: its durable state has %d key groups, not %d; the key-group count is fixed for the life of a flow",
			cfg.FlowID, st.Commit.KeyGroupCount, cfg.KeyGroupCount)
	}
	r := &Run{
		cfg: cfg, state: st, execution: st.NextExecution(), resume: st.ResumeEpoch(),
		stores: make([]*localstore.Store, cfg.WorkerCount), restores: make([]RestoreInfo, cfg.WorkerCount),
		handoffs: make([][]*handoff, cfg.WorkerCount),
		held:     make([]*heldDeletions, cfg.WorkerCount),
		carry:    make([]*carried, cfg.WorkerCount),
		epochs:   map[int64]*epochState{}, committed: st.Commit.Epoch, closedAll: st.Commit.Epoch,
		gcEpoch: st.Commit.Epoch,
		record:  st.Commit,
		parent:  ctx,
		failed:  make(chan struct{}),
		sent:    st.Commit.Epoch,
	}
	r.cond = sync.NewCond(&r.mu)
	r.segmentBytes, r.compactedBytes = objectBytes(st.Commit.Objects)
	if r.record.Epoch == 0 {
		r.record = CommitRecord{FlowID: cfg.FlowID}
	}
	if r.clustered() {
		if err := r.agreeOpen(); err != nil {
			return nil, fmt.Errorf("open recovery for flow %q: %w", cfg.FlowID, err)
		}
	}
	return r, nil
}

// Execution is this run's execution number (the cluster's: the leader's).
func (r *Run) Execution() int64 { return r.execution }

// ResumeEpoch is the first epoch this run processes (the cluster's).
func (r *Run) ResumeEpoch() int64 { return r.resume }

// State is the durable state the run started from.
func (r *Run) State() State { return r.state }

// Store returns worker w's local store (after Restore); nil for a worker
// this process does not host.
func (r *Run) Store(w int) *localstore.Store {
	if !r.hosts(w) {
		return nil
	}
	return r.stores[w]
}

// Worker is one worker's part of a run, for the owner of its state: the
// local store it reads from and Write for its snapshot batches.
type Worker struct {
	run   *Run
	index int
}

// Worker returns worker w's part of the run (after Restore). For a worker
// this process does not host, its Store is nil and Write refuses.
func (r *Run) Worker(w int) *Worker { return &Worker{run: r, index: w} }

// Store is the worker's local store.
func (w *Worker) Store() *localstore.Store { return w.run.Store(w.index) }

// Write is Run.Write for this worker.
func (w *Worker) Write(ctx context.Context, b rowbatch.Batch) (int, error) {
	return w.run.Write(ctx, w.index, b)
}

// WriteCarried is Run.WriteCarried for this worker.
func (w *Worker) WriteCarried(ctx context.Context, b rowbatch.Batch) (int, int, error) {
	return w.run.WriteCarried(ctx, w.index, b)
}

// Carries is Run.Carries for this worker.
func (w *Worker) Carries() bool { return w.run.Carries(w.index) }

// StopCarrying is Run.StopCarrying for this worker.
func (w *Worker) StopCarrying() { w.run.StopCarrying(w.index) }

// Start launches the background pipeline. Call it after every worker was
// restored.
//
// In cluster mode a follower tells the leader its workers are restored and
// returns once the leader recorded the execution; the leader waits for
// every follower first (agree.go). Each process then runs the pipelines of
// its own workers.
func (r *Run) Start() error {
	if err := r.start(); err != nil {
		if r.clustered() {
			tellFailed(r.cfg.Cluster, r.execution, err)
		}
		return err
	}
	return nil
}

func (r *Run) start() error {
	if r.pipes != nil {
		return errors.New("start recovery run: already started")
	}
	for w, s := range r.hosted() {
		if s == nil {
			return fmt.Errorf("start recovery run: worker %d was not restored", w)
		}
	}
	if r.clustered() {
		if err := r.agreeStart(); err != nil {
			return fmt.Errorf("start recovery for flow %q: %w", r.cfg.FlowID, err)
		}
	}
	if r.leads() {
		// The execution is recorded only now, with every worker's local
		// store locked: a second start that fails on a lock must leave no
		// record, or it would fence off the run it collided with
		// (listFlow, superseded).
		rec := ExecutionRecord{
			FlowID: r.cfg.FlowID, Execution: r.execution, ResumeEpoch: r.resume,
			WorkerCount: r.cfg.WorkerCount, KeyGroupCount: r.cfg.KeyGroupCount, StartedUnix: time.Now().Unix(),
		}
		if err := RecordExecution(r.parent, r.cfg.Backup, rec, r.cfg.Key); err != nil {
			return fmt.Errorf("start recovery for flow %q: record execution %d: %w", r.cfg.FlowID, r.execution, err)
		}
		r.cfg.Logger.Debug("execution recorded", "flow", r.cfg.FlowID, "execution", r.execution, "resume_epoch", r.resume)
		if r.clustered() {
			if err := r.toFollowers(clusterMsg{Type: msgStarted}); err != nil {
				return fmt.Errorf("start recovery for flow %q: %w", r.cfg.FlowID, err)
			}
		}
	}
	// Local GC's debt is what the restored stores carry, not the committed
	// epoch: a store resumed fast may not have been collected for a while.
	r.mu.Lock()
	for _, s := range r.hosted() {
		r.gcEpoch = min(r.gcEpoch, s.Meta().GCEpoch)
	}
	r.mu.Unlock()
	for _, s := range r.hosted() {
		s.SetCheckpointGate(r.waitCommitsIdle)
	}
	r.ctx, r.cancel = context.WithCancel(r.parent)
	r.maintCtx, r.maintCancel = context.WithCancel(r.ctx)
	context.AfterFunc(r.ctx, func() {
		if err := r.parent.Err(); err != nil {
			r.fail(fmt.Errorf("recovery run of flow %q interrupted: %w", r.cfg.FlowID, err))
		}
	})
	r.uploads = make(chan uploadJob, 64)
	r.maint = make(chan int64, 1)
	pipes := make([]*pipe, r.cfg.WorkerCount)
	cuts := make(map[int]*segment.Cutter, r.cfg.Workers)
	for w := range r.hosted() {
		cut, err := r.newCutter(w)
		if err != nil {
			for _, c := range cuts {
				c.Close()
			}
			r.cancel()
			return err
		}
		cuts[w] = cut
		pipes[w] = &pipe{events: make(chan pipeEvent, 16), done: make(chan struct{})}
	}
	r.pipes = pipes
	for w, cut := range cuts {
		r.wg.Add(1)
		go r.runPipe(w, r.pipes[w], cut)
	}
	for i := 0; i < r.cfg.UploadWorkers; i++ {
		r.uploadWG.Add(1)
		go r.runUploads()
	}
	r.wg.Add(1)
	go r.runMaintenance()
	if r.clustered() {
		r.startCluster()
	}
	r.startVerification()
	return nil
}

func (r *Run) fail(err error) {
	r.mu.Lock()
	first := r.err == nil
	if first {
		r.err = err
		close(r.failed)
		r.cfg.Logger.Error("recovery pipeline failed; nothing is committed past this point", "err", err)
	}
	// A failed pipe cuts no more segments: a local store waiting for one
	// would hold up every read of it until the run finishes.
	r.dropHandoffsLocked()
	r.cond.Broadcast()
	r.mu.Unlock()
	if first && r.clustered() {
		// The other processes cannot commit without this one: they stop
		// too, rather than wait for it.
		tellFailed(r.cfg.Cluster, r.execution, err)
	}
}

// Err returns the error that stopped the pipeline, if any.
func (r *Run) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Finish waits until every epoch that all workers closed is committed (or
// the pipeline failed), then stops the background work. With aborted set
// an epoch that not every worker closed is dropped, as a crash would.
//
// In cluster mode the leader first waits (unless aborted) until every
// follower said it closes nothing more, so that the epochs all workers of
// all processes closed are known, and at the end tells the followers it
// commits nothing more. A follower reports its last uploads and (unless
// aborted) waits until the leader committed the last epoch its workers
// closed (follower.go).
func (r *Run) Finish(aborted bool) error {
	if r.pipes == nil {
		return nil
	}
	r.mu.Lock()
	r.finishing = true
	r.mu.Unlock()
	for _, p := range r.pipes {
		if p != nil {
			close(p.events)
		}
	}
	for _, p := range r.pipes {
		if p != nil {
			<-p.done
		}
	}
	r.dropHandoffs()
	r.releaseAllHeld()
	// (a whole batch a carried state kept holds the flow's memory)
	for _, c := range r.carry {
		if c != nil {
			c.stop()
		}
	}
	var err error
	if r.leads() {
		err = r.finishCommits(aborted)
		if err == nil && !aborted && r.clustered() {
			// Before the inbox reader stops: the followers' `stopped`
			// comes through it.
			r.awaitFollowersStopped()
		}
	} else {
		err = r.finishFollower(aborted)
	}
	// Nothing is left to commit: a check still running guards nothing.
	if r.stopVerify != nil {
		r.stopVerify()
	}
	close(r.uploads)
	if r.stopCluster != nil {
		close(r.stopCluster)
	}
	r.uploadWG.Wait() // an upload's tryCommit may still send to maint
	// A maintenance round still running is stopped (it is safe to stop at
	// any point, and local GC and compaction check for it as they go):
	// waiting for it would hold the end of the run for work the next run
	// does anyway.
	r.maintCancel()
	r.clusterWG.Wait() // a follower's applied commit may send to maint
	close(r.maint)
	r.wg.Wait()
	r.cancel()
	r.pipes = nil
	for _, s := range r.hosted() {
		// The next run's fast resume needs the local store complete.
		if ferr := s.Flush(); ferr != nil && err == nil {
			err = ferr
		}
	}
	r.finished = true
	if err == nil && !aborted {
		r.finalLocalGC()
	}
	if err == nil && r.leads() {
		r.finalMaintenance(context.Background())
	}
	return err
}

// finishCommits is Finish's wait for the commits of the run (the leader's,
// or a run of its own): every epoch that every worker closed.
func (r *Run) finishCommits(aborted bool) error {
	r.mu.Lock()
	for r.err == nil && !aborted && !r.followersFinishedLocked() {
		r.cond.Wait()
	}
	target := r.committed
	for e := r.committed + 1; ; e++ {
		es := r.epochs[e]
		if es == nil || es.closed < r.cfg.WorkerCount {
			break
		}
		target = e
	}
	for r.err == nil && r.committed < target {
		r.cond.Wait()
	}
	err := r.err
	committed := r.committed
	r.stopped = true
	r.cond.Broadcast()
	r.mu.Unlock()
	if r.clustered() && err == nil {
		if serr := r.toFollowers(clusterMsg{Type: msgFinished, Epoch: committed}); serr != nil {
			// What is committed stands; the followers find the cluster
			// gone instead.
			r.cfg.Logger.Warn("could not tell every process the run finished", "err", serr)
		}
	}
	return err
}

// Close stops the run (without waiting for commits) and closes the stores.
// In cluster mode, closing a run that did not finish stops the other
// processes' runs too.
func (r *Run) Close() error {
	if r.pipes == nil && r.clustered() && !r.finished {
		r.finished = true
		tellFailed(r.cfg.Cluster, r.execution, fmt.Errorf("process %d closed its run before it started", r.cfg.Cluster.Index()))
	}
	if r.pipes != nil {
		r.fail(errStopped)
		// Without waiting for commits nothing in flight matters any more:
		// cancel uploads (and their retries) so a hanging backend cannot
		// hang Close.
		r.cancel()
		r.Finish(true)
	}
	var first error
	for _, s := range r.hosted() {
		if s != nil {
			if err := s.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}
