// Package localstore is a worker's retained local state store: one snapshot
// file per (flow id, worker) under the local state directory, locked so only
// one process writes it, checked so it is never mixed with another flow's
// state.
//
// It serves fast resume (read state locally instead of from the durable
// store) and reads of keys that are not live in memory.
//
// A store runs three kinds of background work, each in a file of its own:
// the writer (writer.go) writes queued batches in order; the checkpointer
// (checkpoint.go) folds small writes, builds the epoch index and
// checkpoints the write-ahead log; generations (generation.go) let a
// whole-state batch replace the store once its epoch commits. store.go
// holds opening, reads, rollback, GC and closing; lock.go the file lock.
package localstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// ErrForeign is wrapped when the store on disk belongs to another flow or
// key-group count.
var ErrForeign = errors.New("local store belongs to another flow")

// ErrReplaced is wrapped when a read of an older epoch finds that a
// whole-state generation of a later epoch has replaced the file that held
// it (ScanPageFlushed): that epoch's state is no longer in the store. Not
// damage: a compaction asking for it is retried at a later epoch.
var ErrReplaced = errors.New("a whole-state generation replaced that epoch's state")

// ErrLayoutChanged is wrapped when the store on disk cannot serve this
// open: it was written by a different worker layout (index or count), or
// it no longer holds the rows of the requested resume epoch. It must be
// rebuilt from the durable store.
var ErrLayoutChanged = errors.New("local store cannot serve this resume")

// Config names a worker's local store.
type Config struct {
	// Dir is the local state directory shared by all flows and workers.
	Dir           string
	FlowID        string
	WorkerIndex   int
	WorkerCount   int
	KeyGroupCount int
	// Execution is recorded in the store's metadata as the last execution
	// that opened it.
	Execution int64
	// GenerationMinRows: a whole batch of at least this many rows starts a
	// new generation of the store (StartsGeneration); 0 lets any whole
	// batch with rows start one.
	GenerationMinRows int
}

// Validate checks the config and returns an error that says what to change.
func (c Config) Validate() error {
	if c.Dir == "" {
		return errors.New("local state directory is empty")
	}
	if err := ValidateFlowID(c.FlowID); err != nil {
		return err
	}
	return keygroup.Validate(c.KeyGroupCount, c.WorkerIndex, c.WorkerCount)
}

// ValidateFlowID checks that a flow id can name recovery data.
func ValidateFlowID(id string) error {
	switch {
	case id == "":
		return errors.New("flow id is empty")
	case strings.ContainsAny(id, "./\\\x00"):
		return fmt.Errorf("flow id %q may not contain '.', '/', '\\' or NUL", id)
	}
	return nil
}

// EnsureDir makes the local state directory dir, with any missing parents,
// as Kafka Streams and Flink do with theirs. Directories it makes are the
// owner's only (0700): they hold state. A path that exists and is not a
// directory is an error that says so.
func EnsureDir(dir string) error {
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		return fmt.Errorf("local state directory %s exists and is not a directory; pass a directory (or a path that does not exist yet)", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("local state directory %s: %w", dir, err)
	}
	return nil
}

// WorkerDir is the directory holding one worker's store.
func WorkerDir(dir, flowID string, worker int) string {
	return filepath.Join(dir, flowID, fmt.Sprintf("worker-%04d", worker))
}

// FileName is the name of the snapshot file inside WorkerDir.
const FileName = "store.sqlite"

// Store is an open local store. Its methods are safe for concurrent use.
type Store struct {
	mu   sync.Mutex
	cfg  Config
	file *snapfile.File
	// next is a generation started by a whole-state write whose epoch has
	// not committed yet (generation.go); while it exists, it is what
	// writes and reads go to.
	next *snapfile.File
	// committed is the newest epoch the recovery run committed
	// (NoteCommitted).
	committed atomic.Int64
	// staged numbers the staged segment copies (StageGeneration).
	staged atomic.Int64
	lock   *lock

	// Asynchronous writes (WriteAsync) go through one goroutine in order;
	// reads and synchronous writes see them (writer.go).
	asyncOnce sync.Once
	async     chan asyncBatch
	asyncDone chan struct{}
	// pending counts queued batches. A WaitGroup does not fit: Add may run
	// while another goroutine waits at zero.
	asyncMu  sync.Mutex
	idle     *sync.Cond
	pending  int
	asyncErr error

	// A background goroutine checkpoints the WAL when it grows past the
	// file, so neither writes nor GC pay for it inline.
	kick     chan struct{}
	quit     chan struct{}
	ckptDone chan struct{}
	// ckptGate, when set, is called before a background checkpoint
	// (SetCheckpointGate).
	ckptGate atomic.Pointer[func()]
	// passiveMu is held while a passive checkpoint has its own connection
	// to a file open: a generation replaces the store's file only when no
	// such connection is left on either file. Taken after mu, never
	// before it. fileGen counts the closings of a file behind target(),
	// under passiveMu, so the checkpointer never opens a file that is gone
	// (opening a missing path would create an empty one).
	passiveMu sync.Mutex
	fileGen   atomic.Int64
	// verifyMu serializes Verify; verifyCancel interrupts the running
	// one (stopVerify) before its files are closed or replaced, and
	// verifying tells the checkpoints to put off what would wait for its
	// reads.
	verifyMu     sync.Mutex
	verifyCancel atomic.Pointer[context.CancelFunc]
	verifying    atomic.Bool

	// Reads of many keys (GetManyPacked) go to the target file's reader
	// connection without s.mu, so a batch being written, GC or a
	// checkpoint does not hold them up: shared is the file they may read
	// (nil while none may: closed, or being replaced, when they take s.mu
	// instead), and each holds swapMu for reading while it reads, so a
	// replacement (retireFiles) waits until none uses the old file.
	swapMu sync.RWMutex
	shared atomic.Pointer[snapfile.File]

	// writeNanos is the time spent in writes, for metrics.
	writeNanos atomic.Int64

	// filter knows which keys the store may hold (keyfilter.go);
	// filterDone closes when its background fill has stopped. queue
	// lists the batches handed to the writer and not written yet, with
	// their keys (under asyncMu); enqueued numbers them.
	filter     *keyFilter
	queue      []queuedBatch
	enqueued   int64
	filterDone chan struct{}
}

// Open opens (or creates) the worker's store, taking its lock. With
// resumeEpoch > 0, rows at or after it are rolled back: they belong to an
// epoch that never committed and the run will write that epoch anew.
func Open(ctx context.Context, cfg Config, resumeEpoch int64) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open local store: %w", err)
	}
	if err := EnsureDir(cfg.Dir); err != nil {
		return nil, fmt.Errorf("open local store: %w", err)
	}
	wdir := WorkerDir(cfg.Dir, cfg.FlowID, cfg.WorkerIndex)
	if err := os.MkdirAll(wdir, 0o700); err != nil {
		return nil, fmt.Errorf("open local store %s: %w", wdir, err)
	}
	lk, err := acquireLock(filepath.Join(wdir, "LOCK"))
	if err != nil {
		return nil, fmt.Errorf("open local store %s: %w", wdir, err)
	}
	if reason, bad := readMarker(wdir); bad {
		// Whatever the file looks like now, it was found damaged: only a
		// rebuild (Remove, then Open) makes it trusted again.
		lk.release()
		return nil, markedError(wdir, reason)
	}
	if err := settle(ctx, wdir, resumeEpoch); err != nil {
		lk.release()
		return nil, damaged(wdir, filepath.Join(wdir, FileName), fmt.Errorf("open local store: %w", err))
	}
	s, err := openLocked(ctx, cfg, wdir, resumeEpoch)
	if err != nil {
		lk.release()
		return nil, err
	}
	s.lock = lk
	return s, nil
}

// target is the file writes and reads go to: the waiting generation if
// there is one. s.mu is held.
func (s *Store) target() *snapfile.File {
	if s.next != nil {
		return s.next
	}
	return s.file
}

func openLocked(ctx context.Context, cfg Config, wdir string, resumeEpoch int64) (*Store, error) {
	path := filepath.Join(wdir, FileName)
	want := snapfile.Meta{
		FlowID: cfg.FlowID, Kind: snapfile.KindLocal,
		WorkerIndex: cfg.WorkerIndex, WorkerCount: cfg.WorkerCount,
		KeyGroupCount: cfg.KeyGroupCount, Execution: cfg.Execution,
	}
	var f *snapfile.File
	var err error
	if err := removeStoreFiles(wdir, creatingFileName); err != nil {
		return nil, fmt.Errorf("open local store: remove the store a killed run left half made: %w", err)
	}
	if _, statErr := os.Stat(path); errors.Is(statErr, os.ErrNotExist) {
		f, err = create(ctx, wdir, want)
	} else {
		f, err = snapfile.Open(ctx, path, snapfile.Options{})
	}
	if err != nil {
		return nil, damaged(wdir, path, fmt.Errorf("open local store: %w", err))
	}
	got := f.Meta()
	if err := checkMeta(path, got, want); err != nil {
		f.Close()
		return nil, err
	}
	if !f.RowChecksums() {
		f.Close()
		return nil, errNoChecksums(path)
	}
	if resumeEpoch > 0 && resumeEpoch <= got.GCEpoch {
		f.Close()
		return nil, fmt.Errorf("%w: cannot resume %s at epoch %d: superseded rows up to committed epoch %d were garbage-collected; rebuild it from the durable store",
			ErrLayoutChanged, path, resumeEpoch, got.GCEpoch)
	}
	if resumeEpoch > 0 && got.LastEpoch >= resumeEpoch {
		// Only when there is something to roll back: DeleteFrom builds
		// the epoch index first, which a store of whole-state
		// generations never needs otherwise.
		if _, err := f.DeleteFrom(ctx, resumeEpoch); err != nil {
			f.Close()
			return nil, damaged(wdir, path, fmt.Errorf("open local store: %w", err))
		}
		got.LastEpoch = min(got.LastEpoch, resumeEpoch-1)
		got.GCEpoch = min(got.GCEpoch, resumeEpoch-1)
	}
	got.Execution = cfg.Execution
	if err := f.UpdateMeta(ctx, got); err != nil {
		f.Close()
		return nil, damaged(wdir, path, fmt.Errorf("open local store: %w", err))
	}
	st := &Store{cfg: cfg, file: f, kick: make(chan struct{}, 1), quit: make(chan struct{}), ckptDone: make(chan struct{}),
		filterDone: make(chan struct{})}
	seed := maphash.MakeSeed()
	st.filter = newKeyFilter(seed)
	st.idle = sync.NewCond(&st.asyncMu)
	st.publish()
	go st.runCheckpoints()
	go st.fillFilter(context.Background())
	return st, nil
}

// errNoChecksums refuses a store written before rows carried checksums:
// nothing could tell its damaged rows from good ones.
func errNoChecksums(path string) error {
	return fmt.Errorf("%w: %s was written by an older version without row checksums and will be rebuilt from the durable store",
		ErrLayoutChanged, path)
}

func checkMeta(path string, got, want snapfile.Meta) error {
	switch {
	case got.Kind != snapfile.KindLocal:
		return fmt.Errorf("%w: %s is a %s file, not a local store; remove it or use another local state directory", ErrForeign, path, got.Kind)
	case got.FlowID != want.FlowID:
		return fmt.Errorf("%w: %s holds state of flow %q, not %q; use another local state directory", ErrForeign, path, got.FlowID, want.FlowID)
	case got.KeyGroupCount != want.KeyGroupCount:
		return fmt.Errorf("%w: %s was written with %d key groups, not %d; the key-group count is fixed for the life of a flow's state",
			ErrForeign, path, got.KeyGroupCount, want.KeyGroupCount)
	case got.WorkerIndex != want.WorkerIndex || got.WorkerCount != want.WorkerCount:
		return fmt.Errorf("%w: %s belongs to worker %d of %d, not %d of %d", ErrLayoutChanged, path,
			got.WorkerIndex, got.WorkerCount, want.WorkerIndex, want.WorkerCount)
	}
	return nil
}

// Inspect reads the metadata of the worker's store without locking it or
// changing it. It returns os.ErrNotExist (wrapped) when there is none, an
// error wrapping ErrDamaged when the store is marked damaged or its file
// is, and one wrapping ErrLayoutChanged when it was written without row
// checksums.
func Inspect(ctx context.Context, dir, flowID string, worker int) (snapfile.Meta, error) {
	return inspect(ctx, dir, flowID, worker, true)
}

// InspectOther is Inspect for a store another process may own and be
// removing or re-making right now (a local state directory shared by the
// processes of a cluster): a store it cannot read is an error, but it
// records no damage, which is the owner's to find.
func InspectOther(ctx context.Context, dir, flowID string, worker int) (snapfile.Meta, error) {
	return inspect(ctx, dir, flowID, worker, false)
}

func inspect(ctx context.Context, dir, flowID string, worker int, mark bool) (snapfile.Meta, error) {
	wdir := WorkerDir(dir, flowID, worker)
	path := filepath.Join(wdir, FileName)
	if _, err := os.Stat(path); err != nil {
		return snapfile.Meta{}, fmt.Errorf("inspect local store: %w", err)
	}
	if reason, bad := readMarker(wdir); bad {
		return snapfile.Meta{}, markedError(wdir, reason)
	}
	// Read-only, and without the lock: other processes sharing the
	// local state directory inspect every worker's store at start while
	// its owner may be removing and re-making it. A writable connection
	// to a path removed after the Stat above would create an empty
	// database there, which the owner's next open must refuse as damage.
	f, err := snapfile.Open(ctx, path, snapfile.Options{ReadOnly: true})
	if err != nil {
		if _, statErr := os.Stat(path); errors.Is(statErr, os.ErrNotExist) {
			return snapfile.Meta{}, fmt.Errorf("inspect local store: %w", statErr)
		}
		err = fmt.Errorf("inspect local store: %w", err)
		if !mark {
			return snapfile.Meta{}, err
		}
		return snapfile.Meta{}, damaged(wdir, path, err)
	}
	defer f.Close()
	if !f.RowChecksums() {
		return snapfile.Meta{}, errNoChecksums(path)
	}
	return f.Meta(), nil
}

// Remove deletes the worker's store (to rebuild it), and its damage marker
// with it. It takes the store's
// lock first, so a store another run has open is never pulled from under
// it: that is an ErrLocked error instead.
func Remove(dir, flowID string, worker int) error {
	wdir := WorkerDir(dir, flowID, worker)
	if _, err := os.Stat(wdir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	lk, err := acquireLock(filepath.Join(wdir, "LOCK"))
	if err != nil {
		return fmt.Errorf("remove local store %s: %w", wdir, err)
	}
	defer lk.release()
	if err := removeStaged(wdir); err != nil {
		return fmt.Errorf("remove local store %s: %w", wdir, err)
	}
	// The marker goes last: a removal cut short leaves it, and the store
	// is still not trusted.
	for _, name := range []string{FileName, nextFileName, creatingFileName} {
		if err := removeStoreFiles(wdir, name); err != nil {
			return fmt.Errorf("remove local store %s: %w", wdir, err)
		}
	}
	for _, name := range []string{DamagedFileName + ".tmp", DamagedFileName} {
		if err := removeFile(filepath.Join(wdir, name)); err != nil {
			return fmt.Errorf("remove local store %s: %w", wdir, err)
		}
	}
	return nil
}

// retireFiles is how a file behind target() is closed or replaced: a new
// file generation, so the checkpointer and Verify let go of the old files,
// then Verify interrupted, then passiveMu taken (the caller unlocks it),
// which waits until neither has a connection to them open. s.mu is held.
func (s *Store) retireFiles() {
	s.swapMu.Lock()
	s.shared.Store(nil)
	s.swapMu.Unlock()
	s.fileGen.Add(1)
	s.stopVerify()
	s.passiveMu.Lock()
}

// publish lets reads without s.mu go to the target file, after a change
// of s.file or s.next. s.mu is held.
func (s *Store) publish() {
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	if s.file == nil {
		s.shared.Store(nil)
		return
	}
	s.shared.Store(s.target())
}

// Config returns the store's config.
func (s *Store) Config() Config { return s.cfg }

// Meta returns the store's current metadata. CommittedEpoch includes what
// NoteCommitted reported and is not on disk yet (see NoteCommitted).
func (s *Store) Meta() snapfile.Meta {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return snapfile.Meta{}
	}
	m := s.target().Meta()
	m.CommittedEpoch = max(m.CommittedEpoch, s.committed.Load())
	return m
}

// syncCommitted hands the epoch NoteCommitted last reported to the open
// files' metadata, in memory: the next write carries it to disk in its
// own transaction, GC and Close write it otherwise. s.mu is held.
func (s *Store) syncCommitted() {
	c := s.committed.Load()
	for _, f := range []*snapfile.File{s.file, s.next} {
		if f != nil {
			f.NoteCommitted(c)
		}
	}
}

// Path returns the path of the store's snapshot file.
func (s *Store) Path() string {
	return filepath.Join(WorkerDir(s.cfg.Dir, s.cfg.FlowID, s.cfg.WorkerIndex), FileName)
}

var errClosed = errors.New("local store is closed")

// Restore writes rows that keep their own epochs (a rebuild from durable
// segments) and then marks the store as holding every epoch up to
// through.
func (s *Store) Restore(ctx context.Context, rows []rowbatch.Row) (int, error) {
	s.filter.addRows(rows, nil)
	s.waitIdle()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return 0, errClosed
	}
	n, err := s.target().Write(ctx, rows)
	return n, s.check(err)
}

// MarkRebuilt records that the store holds every row up to epoch and no
// superseded version of any of them: a store filled with one row per key
// (a full resume merges the durable objects so) needs no GC up to epoch.
// The rebuild is of a committed epoch, so epoch is recorded as the
// store's CommittedEpoch too.
func (s *Store) MarkRebuilt(ctx context.Context, epoch int64) error {
	s.waitIdle()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return errClosed
	}
	f := s.target()
	m := f.Meta()
	m.LastEpoch = max(m.LastEpoch, epoch)
	m.GCEpoch = max(m.GCEpoch, epoch)
	m.CommittedEpoch = max(m.CommittedEpoch, epoch, s.committed.Load())
	return s.check(f.UpdateMeta(ctx, m))
}

// Get returns the newest row of (step, key); see snapfile.File.Get.
func (s *Store) Get(ctx context.Context, step, key string) (rowbatch.Row, bool, error) {
	if !s.filter.mayHold(step, key) {
		return rowbatch.Row{}, false, nil
	}
	s.waitFor(step, []string{key})
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return rowbatch.Row{}, false, errClosed
	}
	r, ok, err := s.target().Get(ctx, step, key, 0)
	return r, ok, s.check(err)
}

// GetManyPacked returns the newest rows of many keys of a step, packed;
// see snapfile.File.GetManyPacked.
func (s *Store) GetManyPacked(ctx context.Context, step string, keys []string) ([]byte, error) {
	if keys = s.filter.filterKeys(step, keys); len(keys) == 0 {
		return []byte{0}, nil // a packed page of no entries
	}
	keys = slices.Compact(slices.Sorted(slices.Values(keys)))
	s.asyncMu.Lock()
	queued, keys := s.fromQueue(step, keys)
	s.asyncMu.Unlock()
	packed := []byte{0}
	if len(keys) > 0 {
		var err error
		if packed, err = s.readMany(ctx, step, keys); err != nil {
			return nil, err
		}
	}
	if len(queued) == 0 {
		return packed, nil
	}
	return snapfile.MergePacked(packed, queued)
}

// readMany reads keys of step that no queued batch holds: the file as
// committed has their newest rows. Its reader connection reads them while
// the writer writes other keys.
func (s *Store) readMany(ctx context.Context, step string, keys []string) ([]byte, error) {
	s.swapMu.RLock()
	if f := s.shared.Load(); f != nil {
		packed, err := f.GetManyPackedConcurrent(ctx, step, keys, 0)
		s.swapMu.RUnlock()
		return packed, s.check(err)
	}
	s.swapMu.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return nil, errClosed
	}
	packed, err := s.target().GetManyPacked(ctx, step, keys, 0)
	return packed, s.check(err)
}

// ScanPage returns one page of the newest rows; see snapfile.File.ScanPage.
// Pages are read under the store's lock one at a time, so a long scan does
// not block other calls.
func (s *Store) ScanPage(ctx context.Context, o snapfile.ScanOptions, cur snapfile.Cursor) ([]rowbatch.Row, snapfile.Cursor, bool, error) {
	s.waitIdle()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return nil, cur, true, errClosed
	}
	rows, next, done, err := s.target().ScanPage(ctx, o, cur)
	return rows, next, done, s.check(err)
}

// ScanPageFlushed is ScanPage without waiting for queued background
// writes: for a caller that called Flush once and only reads epochs written
// before it (compaction of a committed epoch), so a long scan is not held
// up page after page by the writes of newer epochs.
//
// A scan of an older epoch (o.Before) reads the file that holds it: while
// a whole-state generation of a later epoch waits for its commit, the old
// file, not the generation, which holds that epoch's state only. Once the
// generation replaced the old file, the older epoch is gone from the store
// and the scan fails (the generation's epoch committed, and stands for
// everything before it).
func (s *Store) ScanPageFlushed(ctx context.Context, o snapfile.ScanOptions, cur snapfile.Cursor) ([]rowbatch.Row, snapfile.Cursor, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return nil, cur, true, errClosed
	}
	f := s.target()
	if s.next != nil && o.Before > 0 && o.Before <= s.next.Meta().FirstEpoch {
		f = s.file
	}
	if first := f.Meta().FirstEpoch; o.Before > 0 && o.Before <= first {
		return nil, cur, false, fmt.Errorf("scan %s before epoch %d: %w: the store holds the state of epoch %d on",
			f.Path(), o.Before, ErrReplaced, first)
	}
	rows, next, done, err := f.ScanPage(ctx, o, cur)
	return rows, next, done, s.check(err)
}

// ScanPagePacked is ScanPage returning the page packed; see
// snapfile.File.ScanPagePacked.
func (s *Store) ScanPagePacked(ctx context.Context, o snapfile.ScanOptions, cur snapfile.Cursor) ([]byte, snapfile.Cursor, bool, error) {
	s.waitIdle()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return nil, cur, true, errClosed
	}
	packed, next, done, err := s.target().ScanPagePacked(ctx, o, cur)
	return packed, next, done, s.check(err)
}

// Steps lists the step ids with rows.
func (s *Store) Steps(ctx context.Context) ([]string, error) {
	s.waitIdle()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return nil, errClosed
	}
	steps, err := s.target().Steps(ctx)
	return steps, s.check(err)
}

// Stats counts the store's rows.
func (s *Store) Stats(ctx context.Context) (snapfile.Stats, error) {
	s.waitIdle()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return snapfile.Stats{}, errClosed
	}
	st, err := s.target().Stats(ctx)
	return st, s.check(err)
}

// DeleteFrom rolls back rows at or after epoch.
func (s *Store) DeleteFrom(ctx context.Context, epoch int64) (int64, error) {
	s.waitIdle()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return 0, errClosed
	}
	n, err := s.deleteFrom(ctx, epoch)
	return n, s.check(err)
}

func (s *Store) deleteFrom(ctx context.Context, epoch int64) (int64, error) {
	if s.next != nil && s.next.Meta().FirstEpoch >= epoch {
		// The whole generation is rolled back: drop it, and what the old
		// file holds from epoch on with it.
		s.retireFiles()
		path := s.next.Path()
		err := s.next.Close()
		s.next = nil
		s.passiveMu.Unlock()
		s.publish()
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			err = errors.Join(err, removeFile(p))
		}
		if err != nil {
			return 0, fmt.Errorf("roll back %s to before epoch %d: %w", path, epoch, err)
		}
	}
	f := s.target()
	n, err := f.DeleteFrom(ctx, epoch)
	if err != nil {
		return 0, err
	}
	m := f.Meta()
	if m.LastEpoch >= epoch || m.GCEpoch >= epoch {
		m.LastEpoch = min(m.LastEpoch, epoch-1)
		m.GCEpoch = min(m.GCEpoch, epoch-1)
		if err := f.UpdateMeta(ctx, m); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// GC removes rows superseded at or before the committed epoch and records
// how far it got, so the next GC only looks at newer rows. It writes the
// committed epoch NoteCommitted reported to the metadata too.
func (s *Store) GC(ctx context.Context, committed int64) (int64, error) {
	s.waitIdle()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return 0, errClosed
	}
	n, err := s.gc(ctx, committed)
	return n, s.check(err)
}

// FinalGC is GC for a run that is ending: it collects only when at most
// maxRows rows were written since the last collection, so the store is
// left without superseded rows (a stopped flow's disk holds its state, not
// its last epochs' versions of it) while a large collection, which would
// hold up the end of the run, is left to the next run's background GC.
// It reports whether it collected.
func (s *Store) FinalGC(ctx context.Context, committed, maxRows int64) (bool, error) {
	s.waitIdle()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return false, errClosed
	}
	since := s.file.Meta().GCEpoch
	if s.next != nil || committed <= since {
		return false, nil
	}
	n, err := s.file.RowsAfter(ctx, since, maxRows+1)
	if err != nil {
		return false, s.check(err)
	}
	if n > maxRows {
		return false, nil
	}
	_, err = s.gc(ctx, committed)
	return err == nil, s.check(err)
}

func (s *Store) gc(ctx context.Context, committed int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("gc %s: %w", s.file.Path(), err)
	}
	if err := s.maybePromote(ctx); err != nil {
		return 0, err
	}
	s.syncCommitted()
	if s.next != nil {
		// The waiting generation replaces this file, superseded rows
		// and all, once its epoch commits; it holds none itself.
		return 0, s.next.FlushMeta(ctx)
	}
	m := s.file.Meta()
	n, err := s.file.GC(ctx, m.GCEpoch, committed)
	if err != nil {
		return 0, err
	}
	if _, err := s.file.Reclaim(ctx, false); err != nil {
		return n, err
	}
	s.maybeCheckpoint()
	m = s.file.Meta() // with the committed epoch noted above
	if committed > m.GCEpoch {
		m.GCEpoch = committed
		if err := s.file.UpdateMeta(ctx, m); err != nil {
			return n, err
		}
	}
	return n, s.file.FlushMeta(ctx)
}

// Close waits for background writes, closes the store and releases its
// lock. Closing twice is a no-op.
func (s *Store) Close() error {
	s.waitIdle()
	s.asyncMu.Lock()
	ch, done := s.async, s.asyncDone
	s.async = nil
	s.asyncMu.Unlock()
	if ch != nil {
		close(ch)
		<-done
	}
	if s.quit != nil {
		close(s.quit)
		<-s.ckptDone
		<-s.filterDone
		s.quit = nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		// Closed before, or a replacement by a new generation failed
		// and left no file open: either way the lock goes, or no run
		// could open or rebuild the store until this process ends.
		return s.lock.release()
	}
	// A Verify on its own connection must not keep the files' closing
	// checkpoints waiting for its reads.
	s.retireFiles()
	s.passiveMu.Unlock()
	// The committed epoch reaches disk as the files close.
	s.syncCommitted()
	// A generation whose epoch committed replaces the old file now; one
	// that is still waiting stays on disk for the next open to settle.
	perr := s.maybePromote(context.Background())
	if s.file == nil {
		if s.next != nil {
			s.next.Close()
			s.next = nil
		}
		s.lock.release()
		return s.check(perr)
	}
	// Best effort: a store that keeps free pages is still correct.
	s.target().Reclaim(context.Background(), true)
	err := s.file.Close()
	if s.next != nil {
		err = errors.Join(err, s.next.Close())
		s.next = nil
	}
	s.file = nil
	if err == nil {
		err = perr
	}
	err = s.check(err)
	if lerr := s.lock.release(); err == nil {
		err = lerr
	}
	if aerr := s.asyncError(); err == nil {
		err = aerr
	}
	return err
}

// creatingFileName is the name a new store is made under, until its
// schema has committed.
const creatingFileName = "store.creating.sqlite"

// create makes the worker's store file under creatingFileName and renames
// it into place once its schema and metadata have committed. So a run
// killed while creating its store leaves no store file that holds nothing
// (which the next run would have to refuse as damaged, since an empty or
// schemaless store.sqlite can also be what a failing disk leaves), only the
// temporary file, which the next open removes.
func create(ctx context.Context, wdir string, meta snapfile.Meta) (*snapfile.File, error) {
	tmp := filepath.Join(wdir, creatingFileName)
	path := filepath.Join(wdir, FileName)
	f, err := snapfile.Create(ctx, tmp, meta, snapfile.Options{})
	if err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		removeStoreFiles(wdir, creatingFileName)
		return nil, fmt.Errorf("create local store %s: %w", path, err)
	}
	// SQLite would apply journals left beside a store removed by hand to
	// the new file.
	if err := removeJournals(wdir, FileName); err != nil {
		return nil, fmt.Errorf("create local store %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("create local store %s: %w", path, err)
	}
	if err := backup.SyncDir(wdir); err != nil {
		return nil, fmt.Errorf("create local store %s: %w", path, err)
	}
	return snapfile.Open(ctx, path, snapfile.Options{})
}

// removeStoreFiles removes the SQLite file name in wdir and the journals
// SQLite keeps beside it.
func removeStoreFiles(wdir, name string) error {
	if err := removeFile(filepath.Join(wdir, name)); err != nil {
		return err
	}
	return removeJournals(wdir, name)
}

// removeJournals removes the journals SQLite keeps beside the file name
// in wdir.
func removeJournals(wdir, name string) error {
	for _, suffix := range []string{"-wal", "-shm", "-journal"} {
		if err := removeFile(filepath.Join(wdir, name+suffix)); err != nil {
			return err
		}
	}
	return nil
}
