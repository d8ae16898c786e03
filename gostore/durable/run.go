package durable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
	"unsafe"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/compactor"
	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
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

func (m SnapshotMode) compactorMode() compactor.Mode {
	if m == SnapshotImmediate {
		return compactor.Immediate
	}
	return compactor.Batch
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
	// this many recent epochs for point-in-time restore. Default 10.
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
	// Default 1 MiB.
	CompactMinBytes int64
	// UploadWorkers uploads in parallel. Default 4.
	UploadWorkers int
	// UploadAttempts per segment before the run fails. Default 5.
	UploadAttempts int
	// GenerationMinRows: a whole-state batch (WriteWhole) of at least this
	// many rows starts a new generation of the local store; a smaller one
	// is written in place, which costs less than a new file for a small
	// state. Default 1024.
	GenerationMinRows int
	Logger            *slog.Logger
}

func (c *Config) defaults() error {
	if c.Backup == nil {
		return errors.New("recovery needs a backup")
	}
	if err := localstore.ValidateFlowID(c.FlowID); err != nil {
		return err
	}
	if err := keygroup.Validate(c.KeyGroupCount, 0, c.WorkerCount); err != nil {
		return err
	}
	if c.MaxEpochsInFlight <= 0 {
		c.MaxEpochsInFlight = 4
	}
	if c.RetainEpochs <= 0 {
		c.RetainEpochs = 10
	}
	if c.CompactRatio <= 0 {
		c.CompactRatio = 0.5
	}
	if c.CompactMinBytes <= 0 {
		c.CompactMinBytes = 1 << 20
	}
	if c.UploadWorkers <= 0 {
		c.UploadWorkers = 4
	}
	if c.UploadAttempts <= 0 {
		c.UploadAttempts = 5
	}
	if c.GenerationMinRows <= 0 {
		c.GenerationMinRows = 1024
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(discard{}, nil))
	}
	return nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

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

	commitMu sync.Mutex // serializes writes of commit records
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

	progress  Progress
	metrics   Metrics
	commitLog []CommitEvent

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
}

type epochState struct {
	closed   int
	pending  int
	objects  []ObjectRef
	closeAt  time.Time
	closeSet bool
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

// heldDeletions are the deletions of a worker's whole batch in batch mode,
// held back from its segment until the worker closes the epoch: if by then
// every worker's batch is whole, the epoch's segments are committed as
// compacted state, which holds nothing older for a deletion to hide, and
// they are dropped. A flow whose keys all end at once (a final count at
// EOF) then commits its last epoch without a segment of deletions.
type heldDeletions struct {
	epoch int64
	rows  []rowbatch.Row
	// live counts the batch's other rows (those sent to the segment).
	live int
}

// handoff carries the staged copy of a whole epoch's segment to the local
// store's writer (localstore.Store.WriteAsyncStaged).
type handoff struct {
	epoch  int64
	staged chan string
}

type uploadJob struct {
	seg   compactor.Segment
	ref   ObjectRef
	epoch int64
}

// pipe feeds one worker's compactor from a goroutine, so segments are
// written while the worker goes on with the next epoch.
type pipe struct {
	events chan compactor.Event
	done   chan struct{}
}

// Open reads the durable state and returns the run, numbered as the next
// execution. Call Restore for each worker, then Start, which records the
// execution before anything is processed.
func Open(ctx context.Context, cfg Config) (*Run, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("open recovery for flow %q: %w", cfg.FlowID, err)
	}
	if err := localstore.EnsureDir(cfg.LocalDir); err != nil {
		return nil, fmt.Errorf("open recovery for flow %q: %w", cfg.FlowID, err)
	}
	if c, ok := cfg.Backup.(backup.Checker); ok {
		if err := c.Check(ctx); err != nil {
			return nil, fmt.Errorf("open recovery for flow %q: %w: backup %s is not usable: %w", cfg.FlowID, ErrBackup, cfg.Backup, err)
		}
	}
	st, err := ReadState(ctx, cfg.Backup, cfg.FlowID)
	if err != nil {
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
		epochs:   map[int64]*epochState{}, committed: st.Commit.Epoch, closedAll: st.Commit.Epoch,
		gcEpoch: st.Commit.Epoch,
		record:  st.Commit,
	}
	r.cond = sync.NewCond(&r.mu)
	r.segmentBytes, r.compactedBytes = objectBytes(st.Commit.Objects)
	if r.record.Epoch == 0 {
		r.record = CommitRecord{FlowID: cfg.FlowID}
	}
	return r, nil
}

// Execution is this run's execution number.
func (r *Run) Execution() int64 { return r.execution }

// ResumeEpoch is the first epoch this run processes.
func (r *Run) ResumeEpoch() int64 { return r.resume }

// State is the durable state the run started from.
func (r *Run) State() State { return r.state }

// Store returns worker w's local store (after Restore).
func (r *Run) Store(w int) *localstore.Store { return r.stores[w] }

// Start launches the background pipeline. Call it after every worker was
// restored.
func (r *Run) Start() error {
	for w, s := range r.stores {
		if s == nil {
			return fmt.Errorf("start recovery run: worker %d was not restored", w)
		}
	}
	// The execution is recorded only now, with every worker's local store
	// locked: a second start that fails on a lock must leave no record, or
	// it would fence off the run it collided with (checkNotSuperseded).
	rec := ExecutionRecord{
		FlowID: r.cfg.FlowID, Execution: r.execution, ResumeEpoch: r.resume,
		WorkerCount: r.cfg.WorkerCount, KeyGroupCount: r.cfg.KeyGroupCount, StartedUnix: time.Now().Unix(),
	}
	if err := RecordExecution(context.Background(), r.cfg.Backup, rec); err != nil {
		return fmt.Errorf("start recovery for flow %q: record execution %d: %w", r.cfg.FlowID, r.execution, err)
	}
	r.cfg.Logger.Info("execution recorded", "flow", r.cfg.FlowID, "execution", r.execution, "resume_epoch", r.resume)
	// Local GC's debt is what the restored stores carry, not the committed
	// epoch: a store resumed fast may not have been collected for a while.
	r.mu.Lock()
	for _, s := range r.stores {
		r.gcEpoch = min(r.gcEpoch, s.Meta().GCEpoch)
	}
	r.mu.Unlock()
	for _, s := range r.stores {
		s.SetCheckpointGate(r.waitCommitsIdle)
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.maintCtx, r.maintCancel = context.WithCancel(r.ctx)
	r.uploads = make(chan uploadJob, 64)
	r.maint = make(chan int64, 1)
	for w := range r.stores {
		p := &pipe{events: make(chan compactor.Event, 16), done: make(chan struct{})}
		r.pipes = append(r.pipes, p)
		comp, err := r.newCompactor(w)
		if err != nil {
			return err
		}
		r.wg.Add(1)
		go r.runPipe(w, p, comp)
	}
	for i := 0; i < r.cfg.UploadWorkers; i++ {
		r.uploadWG.Add(1)
		go r.runUploads()
	}
	r.wg.Add(1)
	go r.runMaintenance()
	return nil
}

func (r *Run) segmentDir(w int) string {
	return filepath.Join(r.cfg.LocalDir, r.cfg.FlowID, fmt.Sprintf("worker-%04d", w), "outbox")
}

func (r *Run) newCompactor(w int) (*compactor.Compactor, error) {
	dir := r.segmentDir(w)
	// Segments left by a crashed run were never committed: start clean.
	os.RemoveAll(dir)
	rng := keygroup.OwnedBy(w, r.cfg.WorkerCount, r.cfg.KeyGroupCount)
	return compactor.New(compactor.Config{
		Mode: r.cfg.Mode.compactorMode(),
		Dir:  dir,
		Meta: snapfile.Meta{
			FlowID: r.cfg.FlowID, WorkerIndex: w, WorkerCount: r.cfg.WorkerCount,
			KeyGroupCount: r.cfg.KeyGroupCount, Execution: r.execution,
		},
		Emit: func(seg compactor.Segment) error {
			r.stage(w, seg)
			sum, size, err := fileSHA256(seg.Path)
			if err != nil {
				return fmt.Errorf("checksum segment %s: %w", seg.Path, err)
			}
			m := seg.Meta
			ref := ObjectRef{
				Key:  segmentKey(r.cfg.FlowID, r.execution, w, m.FirstEpoch, seg.Seq),
				Kind: KindSegment, Execution: r.execution, Worker: w, WorkerCount: r.cfg.WorkerCount,
				GroupLo: rng.Lo, GroupHi: rng.Hi, FirstEpoch: m.FirstEpoch, LastEpoch: m.LastEpoch,
				Seq: seg.Seq, Rows: seg.Rows, Size: size, SHA256: sum,
			}
			r.mu.Lock()
			r.epochLocked(m.LastEpoch).pending++
			r.mu.Unlock()
			select {
			case r.uploads <- uploadJob{seg: seg, ref: ref, epoch: m.LastEpoch}:
				return nil
			case <-r.ctx.Done():
				return errStopped
			}
		},
	})
}

// stage hands a copy of seg to worker w's local store when seg is the
// segment of the whole batch the store waits for. The copy is made before
// the segment is uploaded (an upload may move or delete it).
func (r *Run) stage(w int, seg compactor.Segment) {
	r.mu.Lock()
	queue := r.handoffs[w]
	for len(queue) > 0 && queue[0].epoch < seg.Meta.FirstEpoch {
		close(queue[0].staged) // its epoch cut no segment of its own
		queue = queue[1:]
	}
	var h *handoff
	if len(queue) > 0 && queue[0].epoch == seg.Meta.FirstEpoch && seg.Meta.LastEpoch == seg.Meta.FirstEpoch {
		h, queue = queue[0], queue[1:]
	}
	r.handoffs[w] = queue
	r.mu.Unlock()
	if h == nil {
		return
	}
	defer close(h.staged)
	if path, err := r.stores[w].StageGeneration(seg.Path); err == nil {
		h.staged <- path
	} else {
		// The store writes the batch's rows instead.
		r.cfg.Logger.Warn("staging a whole epoch's segment for the local store failed", "worker", w, "epoch", h.epoch, "err", err)
	}
}

// dropHandoffs closes the handoffs no segment will fulfil (the pipes are
// done), so the local stores write those batches' rows themselves.
func (r *Run) dropHandoffs() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropHandoffsLocked()
}

func (r *Run) dropHandoffsLocked() {
	for w, queue := range r.handoffs {
		for _, h := range queue {
			close(h.staged)
		}
		r.handoffs[w] = nil
	}
}

func (r *Run) epochLocked(e int64) *epochState {
	es := r.epochs[e]
	if es == nil {
		es = &epochState{}
		r.epochs[e] = es
	}
	return es
}

func (r *Run) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
		r.cfg.Logger.Error("recovery pipeline failed; nothing is committed past this point", "err", err)
	}
	// A failed pipe cuts no more segments: a local store waiting for one
	// would hold up every read of it until the run finishes.
	r.dropHandoffsLocked()
	r.cond.Broadcast()
	r.mu.Unlock()
}

// Err returns the error that stopped the pipeline, if any.
func (r *Run) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *Run) runPipe(w int, p *pipe, comp *compactor.Compactor) {
	defer r.wg.Done()
	defer close(p.done)
	defer comp.Close()
	for ev := range p.events {
		if r.Err() != nil {
			continue // drain; the run has failed
		}
		if err := comp.Apply(r.ctx, ev); err != nil {
			r.fail(fmt.Errorf("worker %d epoch %d: %w", w, ev.Epoch, err))
			continue
		}
		if ev.Close {
			r.mu.Lock()
			r.epochLocked(ev.Epoch).closed++
			r.cond.Broadcast()
			r.mu.Unlock()
			r.tryCommit()
		}
	}
}

func (r *Run) runUploads() {
	defer r.uploadWG.Done()
	for job := range r.uploads {
		if r.Err() != nil {
			os.Remove(job.seg.Path)
			continue
		}
		start := time.Now()
		err := r.uploadWithRetry(job.seg.Path, job.ref.Key)
		os.Remove(job.seg.Path)
		if err != nil {
			r.fail(fmt.Errorf("upload segment %s of worker %d epoch %d: %w", job.ref.Key, job.ref.Worker, job.epoch, err))
			continue
		}
		r.mu.Lock()
		es := r.epochLocked(job.epoch)
		es.pending--
		es.objects = append(es.objects, job.ref)
		r.metrics.SegmentsUploaded++
		r.metrics.BytesUploaded += job.ref.Size
		r.metrics.UploadSeconds += time.Since(start).Seconds()
		r.mu.Unlock()
		r.tryCommit()
	}
}

func (r *Run) uploadWithRetry(path, key string) error {
	return r.retry("segment upload", key, func() error { return store(r.ctx, r.cfg.Backup, path, key) })
}

// store ships a sealed local file: adopted where the backend can take it
// over without a copy, uploaded otherwise.
func store(ctx context.Context, b backup.Backup, path, key string) error {
	if a, ok := b.(backup.Adopter); ok {
		return a.Adopt(ctx, path, key)
	}
	return b.Upload(ctx, path, key)
}

// retry runs op up to UploadAttempts times with backoff, until it
// succeeds or the run stops.
func (r *Run) retry(what, key string, op func() error) error {
	var err error
	delay := 50 * time.Millisecond
	for attempt := 1; attempt <= r.cfg.UploadAttempts; attempt++ {
		if err = op(); err == nil {
			return nil
		}
		if r.ctx.Err() != nil || attempt == r.cfg.UploadAttempts {
			break
		}
		r.cfg.Logger.Warn(what+" failed; retrying", "key", key, "attempt", attempt, "err", err)
		select {
		case <-time.After(delay):
		case <-r.ctx.Done():
			return err
		}
		delay = min(delay*2, 2*time.Second)
	}
	if r.ctx.Err() != nil {
		return err
	}
	return fmt.Errorf("%w: gave up after %d attempts: %w", ErrBackup, r.cfg.UploadAttempts, err)
}

// errNotRunning is returned by Write and CloseEpoch before Start or after
// Finish (the pipes they feed do not exist then).
var errNotRunning = errors.New("recovery run is not started or already finished")

// Write stores a snapshot batch of worker w at epoch in its local store and
// queues it for the worker's segment.
func (r *Run) Write(ctx context.Context, w int, epoch int64, rows []rowbatch.Row) (int, error) {
	return r.writeCopy(ctx, w, epoch, rows, false)
}

// WriteWhole is Write for a batch that is worker w's whole state at epoch:
// every key it holds is written (or deleted) in it, and it is the worker's
// only batch of the epoch. The local store starts a new generation with it
// rather than collecting everything it supersedes, and when every worker's
// epoch is whole in batch mode, the epoch's segments are committed as
// compacted state (markWhole).
func (r *Run) WriteWhole(ctx context.Context, w int, epoch int64, rows []rowbatch.Row) (int, error) {
	return r.writeCopy(ctx, w, epoch, rows, true)
}

func (r *Run) writeCopy(ctx context.Context, w int, epoch int64, rows []rowbatch.Row, whole bool) (int, error) {
	if err := r.Err(); err != nil {
		return 0, err
	}
	if r.pipes == nil {
		return 0, errNotRunning
	}
	// The rows alias the caller's buffer; the local writer and the pipe
	// outlive it, and share one copy (neither changes it).
	return r.writeOwned(ctx, w, epoch, copyRows(rows), whole)
}

// WriteOwnedWhole is WriteWhole for rows the caller hands over (see
// WriteOwned).
func (r *Run) WriteOwnedWhole(ctx context.Context, w int, epoch int64, batch []rowbatch.Row) (int, error) {
	return r.writeOwned(ctx, w, epoch, batch, true)
}

// WriteOwned is Write for rows the caller hands over: they are not copied,
// and must not be changed or reused afterwards (the local writer and the
// segment pipe read them in the background).
func (r *Run) WriteOwned(ctx context.Context, w int, epoch int64, batch []rowbatch.Row) (int, error) {
	return r.writeOwned(ctx, w, epoch, batch, false)
}

func (r *Run) writeOwned(ctx context.Context, w int, epoch int64, batch []rowbatch.Row, whole bool) (int, error) {
	if err := r.Err(); err != nil {
		return 0, err
	}
	if r.pipes == nil {
		return 0, errNotRunning
	}
	deleted := 0
	for i := range batch {
		batch[i].Epoch = epoch
		if batch[i].Deleted {
			deleted++
		}
	}
	write := r.stores[w].WriteAsync
	segment := batch
	if whole {
		r.markWhole(w, epoch)
		if r.cfg.Mode == SnapshotBatch {
			var held []rowbatch.Row
			segment, held = splitDeletions(batch, deleted)
			r.mu.Lock()
			earlier := r.held[w]
			r.held[w] = &heldDeletions{epoch: epoch, rows: held, live: len(segment)}
			r.mu.Unlock()
			if earlier != nil && len(earlier.rows) > 0 {
				// A second batch before the close (not what the engine
				// does): the first one's deletions go first, in order.
				r.pipes[w].events <- compactor.Event{Epoch: earlier.epoch, Rows: earlier.rows}
			}
		}
	}
	if whole && len(batch) >= r.cfg.GenerationMinRows {
		write = r.stores[w].WriteAsyncWhole
		if r.cfg.Mode == SnapshotBatch && len(segment) > 0 {
			// In batch mode the epoch's segment holds exactly this
			// batch: the local store takes a copy of it (stage) rather
			// than writing the rows a second time. (A batch of only
			// deletions starts an empty generation: nothing to copy.)
			h := &handoff{epoch: epoch, staged: make(chan string, 1)}
			r.mu.Lock()
			if err := r.err; err != nil {
				// fail dropped the handoffs already; this one would wait
				// for a segment no pipe will cut.
				r.mu.Unlock()
				return 0, err
			}
			r.handoffs[w] = append(r.handoffs[w], h)
			r.mu.Unlock()
			write = func(epoch int64, rows []rowbatch.Row) error {
				return r.stores[w].WriteAsyncStaged(epoch, rows, h.staged)
			}
		}
	}
	if err := write(epoch, batch); err != nil {
		return 0, err
	}
	if len(segment) > 0 {
		r.pipes[w].events <- compactor.Event{Epoch: epoch, Rows: segment}
	}
	return len(batch), nil
}

// splitDeletions returns batch's rows that are not deletions and those
// that are, as two views of one new array (batch itself is left as it is:
// the local store reads it). deleted is how many deletions batch holds.
func splitDeletions(batch []rowbatch.Row, deleted int) (live, dels []rowbatch.Row) {
	if deleted == 0 {
		return batch, nil
	}
	out := make([]rowbatch.Row, len(batch))
	n, d := 0, len(batch)-deleted
	for i := range batch {
		if batch[i].Deleted {
			out[d] = batch[i]
			d++
		} else {
			out[n] = batch[i]
			n++
		}
	}
	return out[:n:n], out[n:]
}

// releaseHeld settles worker w's held deletions of epoch as it closes it:
// dropped when every worker's batch of the epoch is whole (the epoch will
// be committed as compacted state, see wholeLocked), sent to the segment
// otherwise. Workers close an epoch after all of them wrote it (the engine
// snapshots every worker first), so the marks are complete by then; a
// mark still missing only costs the deletions being written.
func (r *Run) releaseHeld(w int, epoch int64) []rowbatch.Row {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.held[w]
	if h == nil || h.epoch != epoch {
		return nil
	}
	r.held[w] = nil
	es := r.epochLocked(epoch)
	if len(es.whole) != r.cfg.WorkerCount {
		return h.rows
	}
	if len(h.rows) > 0 {
		es.dropped = true
	}
	if h.live == 0 {
		if es.bare == nil {
			es.bare = map[int]bool{}
		}
		es.bare[w] = true
	}
	return nil
}

// copyRows copies rows into one arena of their own. The strings view the
// arena in place (it is never written again), and a step id shared with
// the previous row is shared in the copy too: one allocation for the
// batch, not two per row.
func copyRows(rows []rowbatch.Row) []rowbatch.Row {
	size := 0
	for i := range rows {
		size += len(rows[i].Key) + len(rows[i].Value)
		if i == 0 || rows[i].StepID != rows[i-1].StepID {
			size += len(rows[i].StepID)
		}
	}
	arena := make([]byte, 0, size)
	view := func(from int) string {
		if len(arena) == from {
			return ""
		}
		return unsafe.String(&arena[from], len(arena)-from)
	}
	out := make([]rowbatch.Row, len(rows))
	for i, r := range rows {
		if i > 0 && r.StepID == rows[i-1].StepID {
			out[i].StepID = out[i-1].StepID
		} else {
			start := len(arena)
			arena = append(arena, r.StepID...)
			out[i].StepID = view(start)
		}
		start := len(arena)
		arena = append(arena, r.Key...)
		out[i].Key = view(start)
		out[i].Epoch, out[i].Deleted = r.Epoch, r.Deleted
		if !r.Deleted {
			start = len(arena)
			arena = append(arena, r.Value...)
			out[i].Value = arena[start:len(arena):len(arena)]
		}
	}
	return out
}

// markWhole records that the rows worker w wrote at epoch are its whole
// state (WriteWhole). When every worker marks an epoch so, in batch mode,
// its segments are committed as compacted state that replaces every older
// object: a flow that rewrites all its keys each epoch then never needs a
// compaction pass that would write the same state a second time.
func (r *Run) markWhole(w int, epoch int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	es := r.epochLocked(epoch)
	if es.whole == nil {
		es.whole = map[int]bool{}
	}
	es.whole[w] = true
}

// wholeLocked reports whether es's segments are the whole state of every
// worker: each marked it whole and cut exactly one segment (batch mode; an
// immediate-mode epoch spans several). r.mu is held.
func (r *Run) wholeLocked(es *epochState) bool {
	if r.cfg.Mode != SnapshotBatch || len(es.whole) != r.cfg.WorkerCount || len(es.objects)+len(es.bare) != r.cfg.WorkerCount {
		return false
	}
	seen := map[int]bool{}
	for _, o := range es.objects {
		if seen[o.Worker] || !es.whole[o.Worker] || es.bare[o.Worker] {
			return false
		}
		seen[o.Worker] = true
	}
	return true
}

// CloseEpoch marks that worker w finished epoch (its snapshot is written).
// When every worker closed it and its segments are uploaded, it commits.
// CloseEpoch waits while more than MaxEpochsInFlight epochs are closed but
// not committed, or while compaction or local GC is too far behind, and
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
	if r.pipes == nil {
		return errNotRunning
	}
	r.mu.Lock()
	es := r.epochLocked(epoch)
	if !es.closeSet {
		es.closeSet, es.closeAt = true, time.Now()
	}
	err := r.err
	r.mu.Unlock()
	if err != nil {
		return err
	}
	// A worker that wrote nothing in this epoch still holds every row of
	// it: say so, or its next resume rebuilds a store that was current.
	// (A no-op when rows of the epoch were written.) Queued behind the
	// epoch's rows, so the close never waits for the local writer.
	if err := r.stores[w].WriteAsync(epoch, nil); err != nil {
		return err
	}
	if dels := r.releaseHeld(w, epoch); len(dels) > 0 {
		r.pipes[w].events <- compactor.Event{Epoch: epoch, Rows: dels}
	}
	r.pipes[w].events <- compactor.Event{Epoch: epoch, Close: true}
	start := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for !last && r.err == nil && !r.stopped && (epoch-r.committed > int64(r.cfg.MaxEpochsInFlight) || r.maintenanceBehindLocked()) {
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
// uploaded.
func (r *Run) tryCommit() {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	r.mu.Lock()
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
		return
	}
	if target == r.committed || failed {
		return
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
	if err := r.checkNotSuperseded(r.ctx); err != nil {
		r.fail(err)
		return
	}
	// A commit record is retried like a segment: one failed request must
	// not stop the flow.
	if err := r.retry("commit record upload", commitKey(r.cfg.FlowID, target), func() error {
		return writeCommit(r.ctx, r.cfg.Backup, rec)
	}); err != nil {
		r.fail(fmt.Errorf("write commit record of epoch %d: %w", target, err))
		return
	}
	r.record = rec
	for _, s := range r.stores {
		// A local store generation started at a whole epoch up to target
		// may now replace the old one. (Before Committed reports target:
		// whoever sees the commit finds the stores told.)
		s.NoteCommitted(target)
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
}

// promoteWhole returns objs with the segments of whole-state epoch at (at
// most one per worker: a worker left without keys cuts none) taking the
// place of every object up to that epoch, as a compaction at that epoch
// would: they are named compacted state, so a restore reads nothing older
// and compaction counts from them. With no segment at all the state is
// empty at at, and so is the list up to it.
func promoteWhole(objs, whole []ObjectRef, at int64) []ObjectRef {
	keep := make([]ObjectRef, 0, len(objs))
	for _, o := range whole {
		o.Kind = KindCompacted
		keep = append(keep, o)
	}
	for _, o := range objs {
		if o.LastEpoch > at {
			keep = append(keep, o)
		}
	}
	sortObjects(keep)
	return keep
}

// ErrSuperseded is wrapped when a newer execution of the same flow has
// started against the same backup: this run stops committing, so the two
// never interleave their commit records.
var ErrSuperseded = errors.New("a newer execution of this flow is running")

// checkNotSuperseded fences this run off when a newer execution record
// exists (the same flow started again, say on another machine with its own
// local state directory). The newest execution wins; the older one fails
// before its next commit instead of mixing states with it.
func (r *Run) checkNotSuperseded(ctx context.Context) error {
	objs, err := r.cfg.Backup.List(ctx, flowPrefix(r.cfg.FlowID)+executionsDir)
	if err != nil {
		return nil // a listing hiccup is not evidence; the commit goes on
	}
	for _, o := range objs {
		if x, ok := numberAfter(o.Key, executionsDir); ok && x > r.execution {
			return fmt.Errorf("%w: flow %q execution %d started on %s after this execution %d; this run stops committing (at epoch %d) so the two cannot mix; stop one of them",
				ErrSuperseded, r.cfg.FlowID, x, r.cfg.Backup, r.execution, r.committed)
		}
	}
	return nil
}

// Committed returns the newest committed epoch.
func (r *Run) Committed() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.committed
}

// Finish waits until every epoch that all workers closed is committed (or
// the pipeline failed), then stops the background work. With aborted set
// an epoch that not every worker closed is dropped, as a crash would.
func (r *Run) Finish(aborted bool) error {
	if r.pipes == nil {
		return nil
	}
	for _, p := range r.pipes {
		close(p.events)
	}
	for _, p := range r.pipes {
		<-p.done
	}
	r.dropHandoffs()
	r.mu.Lock()
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
	r.stopped = true
	r.cond.Broadcast()
	r.mu.Unlock()
	close(r.uploads)
	r.uploadWG.Wait() // an upload's tryCommit may still send to maint
	// A maintenance round still running is stopped (it is safe to stop at
	// any point, and local GC and compaction check for it as they go):
	// waiting for it would hold the end of the run for work the next run
	// does anyway.
	r.maintCancel()
	close(r.maint)
	r.wg.Wait()
	r.cancel()
	r.pipes = nil
	for _, s := range r.stores {
		// The next run's fast resume needs the local store complete.
		if ferr := s.Flush(); ferr != nil && err == nil {
			err = ferr
		}
	}
	if err == nil {
		// The local store's GC is left to the next run's fast resume,
		// which does it before it reads.
		r.finalMaintenance(context.Background())
	}
	return err
}

// Close stops the run (without waiting for commits) and closes the stores.
func (r *Run) Close() error {
	if r.pipes != nil {
		r.fail(errStopped)
		// Without waiting for commits nothing in flight matters any more:
		// cancel uploads (and their retries) so a hanging backend cannot
		// hang Close.
		r.cancel()
		r.Finish(true)
	}
	var first error
	for _, s := range r.stores {
		if s != nil {
			if err := s.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// CommitEvent describes one commit, for logs.
type CommitEvent struct {
	Epoch          int64   `json:"epoch"`
	Objects        int     `json:"objects"`
	Rows           int64   `json:"rows"`
	Bytes          int64   `json:"bytes"`
	LatencySeconds float64 `json:"latency_seconds"`
}

// DrainCommits returns the commits since the last call (at most 1024 are
// kept between calls).
func (r *Run) DrainCommits() []CommitEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.commitLog
	r.commitLog = nil
	return out
}

// Metrics reports what the pipeline did, for users and benchmarks.
type Metrics struct {
	CommittedEpoch      int64
	Commits             int64
	SegmentsUploaded    int64
	BytesUploaded       int64
	UploadSeconds       float64
	BackpressureSeconds float64
	Compactions         int64
	// WholeEpochs counts commits whose newest whole-state epoch (markWhole)
	// took the place of a compaction.
	WholeEpochs    int64
	ObjectsDeleted int64
	// LocalGCSeconds and CompactionSeconds are the background time spent
	// collecting the local stores and compacting the durable store.
	LocalGCSeconds    float64
	CompactionSeconds float64
	// LocalWriteSeconds is the time the local stores spent writing
	// snapshot batches (in the background, beside the flow).
	LocalWriteSeconds float64
	// CommitLatencies are seconds from the first close of an epoch to its
	// commit, newest last (at most 4096 kept).
	CommitLatencies []float64
}

func (m *Metrics) observeCommit(d time.Duration) {
	m.CommitLatencies = append(m.CommitLatencies, d.Seconds())
	if len(m.CommitLatencies) > 4096 {
		m.CommitLatencies = m.CommitLatencies[len(m.CommitLatencies)-4096:]
	}
}

// Metrics returns a copy of the run's metrics.
func (r *Run) Metrics() Metrics {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.metrics
	m.CommitLatencies = append([]float64(nil), r.metrics.CommitLatencies...)
	m.CommittedEpoch = r.committed
	for _, s := range r.stores {
		if s != nil {
			m.LocalWriteSeconds += s.WriteSeconds()
		}
	}
	return m
}

// Percentile returns the p-th percentile (0-100) of xs, 0 if empty.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

// maxCheckpointHold bounds how long waitCommitsIdle holds a local store's
// checkpoint back.
const maxCheckpointHold = time.Second

// waitCommitsIdle returns once no closed epoch is waiting for its commit,
// or after maxCheckpointHold. Local stores call it before a background
// checkpoint: the checkpoint's fsyncs, running while a segment was sealed
// and linked into a DirBackup, made the segment's own fsyncs wait behind
// them.
func (r *Run) waitCommitsIdle() {
	deadline := time.Now().Add(maxCheckpointHold)
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
