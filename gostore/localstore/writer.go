package localstore

import (
	"context"
	"fmt"
	"time"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// The writer: batches are written in order by one goroutine (WriteAsync),
// so a recovery run hands an epoch's rows over and goes on. A synchronous
// write, a scan and a single-key read wait for the queue (or, for the
// read, the batches holding its key) to drain first; a read of many keys
// takes the rows of keys still queued from the queue itself (fromQueue).

// asyncBatch is one entry of the writer's queue.
type asyncBatch struct {
	// seq is the batch's number in the store's queue list (0 for a
	// commit entry, which is not listed).
	seq   int64
	batch rowbatch.Batch
	// staged, for a batch that starts a generation, delivers its
	// segment's copy (StageGeneration), or is closed without one.
	staged <-chan Staged
	// commit marks no batch, only a commit to act on.
	commit bool
}

// Write writes b's rows in place, in one transaction, after every queued
// background write; a whole batch is written like any other (a new
// generation waits for its epoch's commit, which only a recovery run
// reports: see WriteAsync). Write takes over b and releases it.
func (s *Store) Write(ctx context.Context, b rowbatch.Batch) (int, error) {
	defer b.Release()
	s.filter.addRows(b.Rows, nil)
	if err := s.Flush(); err != nil {
		return 0, err
	}
	n, err := s.write(ctx, b.Epoch, b.Rows)
	return n, s.check(err)
}

// WriteAsync queues b to be written in the background, in order with every
// other write, and returns at once; it takes over b and releases it once
// written. A failed background write is returned by the next call.
// Recovery uses it to keep the local store's write off the flow's path:
// the durable segments do not depend on it, and a local store that lags
// the committed epoch after a crash is rebuilt, never trusted.
//
// A batch that StartsGeneration starts a new generation of the store
// instead of being written over the old one, which spares collecting every
// row it supersedes; the generation replaces the old file once b's epoch
// commits (NoteCommitted). For such a batch, staged may deliver a copy of
// the segment that holds exactly b (StageGeneration): the writer takes the
// copy as the generation instead of writing the rows again, and writes
// them after all if staged is closed without a copy. The writer waits for
// staged in order with the other writes, so the caller must make sure it
// gets a copy or is closed (reads and Flush wait for it too). Pass nil
// otherwise.
func (s *Store) WriteAsync(b rowbatch.Batch, staged <-chan Staged) error {
	// Before the batch is queued: a read that the filter lets through
	// then finds it in the queue list. Its own filter (for reads of the
	// queue) gets the keys from the same hashing.
	var keys *keyFilter
	if !b.Whole && len(b.Rows) > 0 {
		keys = newBatchFilter(s.filter.seed, len(b.Rows))
	}
	s.filter.addRows(b.Rows, keys)
	return s.enqueue(asyncBatch{batch: b, staged: staged}, keys)
}

// StartsGeneration reports whether WriteAsync takes b as a new generation:
// a whole batch of at least Config.GenerationMinRows rows (a smaller one
// costs less written in place than a new file).
func (s *Store) StartsGeneration(b rowbatch.Batch) bool {
	return b.Whole && len(b.Rows) > 0 && len(b.Rows) >= s.cfg.GenerationMinRows
}

// NoteCommitted tells the store that epoch is committed, so that a
// generation waiting for it can replace the old one, and so that the
// store's metadata records it (Meta.CommittedEpoch). It never waits: the
// replacement happens after the queued writes, or at the next Flush, and
// the metadata reaches disk with the next write (in its transaction), GC,
// background checkpoint or Close, whichever comes first.
func (s *Store) NoteCommitted(epoch int64) {
	for {
		old := s.committed.Load()
		if epoch <= old || s.committed.CompareAndSwap(old, epoch) {
			break
		}
	}
	s.asyncMu.Lock()
	defer s.asyncMu.Unlock()
	if s.async == nil {
		return // nothing written yet (or closed): nothing waits
	}
	select {
	case s.async <- asyncBatch{commit: true}:
		// The writer counts it done under asyncMu, held here. It holds
		// no keys: reads need not know of it.
		s.pending++
	default:
		// The writer is busy; it looks at the committed epoch after
		// each batch anyway.
	}
}

// enqueue hands b to the writer; keys is the filter of b's keys (nil for
// a whole or empty batch).
func (s *Store) enqueue(b asyncBatch, keys *keyFilter) error {
	s.asyncOnce.Do(func() {
		ch := make(chan asyncBatch, 4)
		s.asyncMu.Lock()
		s.async, s.asyncDone = ch, make(chan struct{})
		s.asyncMu.Unlock()
		go s.runAsync(ch, s.asyncDone)
	})
	q := queuedBatch{whole: b.batch.Whole, keys: keys}
	if keys != nil {
		q.epoch, q.rows = b.batch.Epoch, b.batch.Rows
	}
	s.asyncMu.Lock()
	if err := s.asyncErr; err != nil {
		s.asyncMu.Unlock()
		b.batch.Release()
		return err
	}
	ch := s.async
	s.enqueued++
	q.seq, b.seq = s.enqueued, s.enqueued
	s.queue = append(s.queue, q)
	s.pending++
	s.asyncMu.Unlock()
	ch <- b
	return nil
}

// queuedBatch is what reads know of a batch in the writer's queue.
type queuedBatch struct {
	seq int64
	// keys are the batch's keys (nil for a whole batch).
	keys *keyFilter
	// whole marks a whole batch, which changes what every key reads.
	whole bool
	// epoch and rows are the batch's (not for a whole batch): a read of a
	// key the batch holds takes its row from here. The writer may set
	// the rows' Epoch fields as it writes them, so reads use epoch.
	epoch int64
	rows  []rowbatch.Row
	// index finds a row by step and key; made by the first read that
	// needs it.
	index map[stepKey]int
}

// stepKey is a row's step and key.
type stepKey struct{ step, key string }

// row returns the batch's row of (step, key), if it holds one (the last,
// if it holds several, as the write keeps the last). asyncMu is held.
func (q *queuedBatch) row(step, key string) (*rowbatch.Row, bool) {
	if q.index == nil {
		q.index = make(map[stepKey]int, len(q.rows))
		for i := range q.rows {
			q.index[stepKey{q.rows[i].StepID, q.rows[i].Key}] = i
		}
	}
	i, ok := q.index[stepKey{step, key}]
	if !ok {
		return nil, false
	}
	return &q.rows[i], true
}

// fromQueue answers reads of step's keys (sorted, distinct) that batches
// not yet written hold, from the newest such batch, so those reads need
// not wait for the writer: it returns their entries (in key order) and
// the keys the file answers. If a whole batch is queued it waits until
// none is (such a batch changes what every key reads). asyncMu is held.
func (s *Store) fromQueue(step string, keys []string) ([]snapfile.PackedEntry, []string) {
	for s.wholeQueued() {
		s.idle.Wait()
	}
	if len(s.queue) == 0 {
		return nil, keys
	}
	var found []snapfile.PackedEntry
	rest := keys[:0:0]
	for _, k := range keys {
		hit := false
		// Every batch filter shares the store filter's seed: one hash
		// serves them all.
		a, b := s.filter.hash(step, k)
		for i := len(s.queue) - 1; i >= 0 && !hit; i-- {
			q := &s.queue[i]
			if q.keys == nil || !q.keys.has(a, b) {
				continue
			}
			r, ok := q.row(step, k)
			if !ok {
				continue // a false positive of the batch's filter
			}
			hit = true
			e := snapfile.PackedEntry{Key: k, Epoch: q.epoch, Deleted: r.Deleted}
			if !r.Deleted {
				// A copy: the batch's memory is freed once it is written.
				e.Value = append([]byte{}, r.Value...)
			}
			found = append(found, e)
		}
		if !hit {
			rest = append(rest, k)
		}
	}
	return found, rest
}

// wholeQueued reports whether a whole batch is queued; asyncMu is held.
func (s *Store) wholeQueued() bool {
	for _, q := range s.queue {
		if q.whole {
			return true
		}
	}
	return false
}

// dequeue drops the entry seq from the queue list; asyncMu is held.
func (s *Store) dequeue(seq int64) {
	for i := range s.queue {
		if s.queue[i].seq == seq {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return
		}
	}
}

// queuedMayHold reports whether a batch not written yet may hold a row of
// one of step's keys; asyncMu is held.
func (s *Store) queuedMayHold(step string, keys []string) bool {
	for _, q := range s.queue {
		if q.whole || (q.keys != nil && q.keys.anyMayHold(step, keys)) {
			return true
		}
	}
	return false
}

func (s *Store) runAsync(ch <-chan asyncBatch, done chan struct{}) {
	defer close(done)
	for b := range ch {
		var err error
		if s.asyncError() == nil {
			ctx := context.Background()
			// A generation whose epoch committed since the last batch is
			// promoted first, so a whole batch right behind it starts one
			// of its own.
			err = s.promoteCommitted(ctx)
			switch {
			case err != nil:
			case b.commit:
			case !s.StartsGeneration(b.batch):
				_, err = s.write(ctx, b.batch.Epoch, b.batch.Rows)
			case b.staged != nil:
				_, err = s.writeStaged(ctx, b.batch, b.staged)
			default:
				_, err = s.writeWhole(ctx, b.batch.Epoch, b.batch.Rows)
			}
		} else if b.staged != nil {
			// The writer failed before this batch: the staged copy is
			// nobody's now.
			if copied, ok := <-b.staged; ok && copied.Path != "" {
				removeFile(copied.Path)
			}
		}
		// Off the queue list first: reads take rows from the batches
		// listed there, so its memory may only be freed after. And freed
		// before it counts as done: Flush promises every batch released.
		s.asyncMu.Lock()
		s.dequeue(b.seq)
		s.asyncMu.Unlock()
		b.batch.Release()
		s.asyncMu.Lock()
		if err != nil && s.asyncErr == nil {
			s.asyncErr = s.check(fmt.Errorf("background write of epoch %d: %w", b.batch.Epoch, err))
		}
		s.pending--
		// Readers wait for the batches that hold their keys, not for
		// an empty queue.
		s.idle.Broadcast()
		s.asyncMu.Unlock()
	}
}

func (s *Store) asyncError() error {
	s.asyncMu.Lock()
	defer s.asyncMu.Unlock()
	return s.asyncErr
}

// Flush waits until every queued background write is done, and a
// generation whose epoch committed has replaced the old one, and returns
// the first error, if any.
func (s *Store) Flush() error {
	s.waitIdle()
	if err := s.asyncError(); err != nil {
		return err
	}
	return s.check(s.promoteCommitted(context.Background()))
}

func (s *Store) promoteCommitted(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maybePromote(ctx)
}

func (s *Store) writeStaged(ctx context.Context, b rowbatch.Batch, staged <-chan Staged) (int, error) {
	copied, ok := <-staged
	if !ok || copied.Path == "" {
		return s.writeWhole(ctx, b.Epoch, b.Rows)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		removeFile(copied.Path)
		return 0, errClosed
	}
	n, err := s.adoptStaged(ctx, b.Epoch, copied, b.Rows)
	if err != nil {
		// The copy was the shortcut; the rows are the batch itself.
		return s.startGeneration(ctx, b.Epoch, b.Rows)
	}
	return n, nil
}

func (s *Store) writeWhole(ctx context.Context, epoch int64, rows []rowbatch.Row) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return 0, errClosed
	}
	return s.startGeneration(ctx, epoch, rows)
}

// waitFor waits until no queued write can hold a row of step's keys (a
// queued whole batch holds every key): reads of those keys then see every
// write made before them.
func (s *Store) waitFor(step string, keys []string) {
	s.asyncMu.Lock()
	for s.queuedMayHold(step, keys) {
		s.idle.Wait()
	}
	s.asyncMu.Unlock()
}

func (s *Store) waitIdle() {
	s.asyncMu.Lock()
	for s.pending > 0 {
		s.idle.Wait()
	}
	s.asyncMu.Unlock()
}

func (s *Store) write(ctx context.Context, epoch int64, rows []rowbatch.Row) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil {
		return 0, errClosed
	}
	return s.writeLocked(ctx, epoch, rows)
}

func (s *Store) writeLocked(ctx context.Context, epoch int64, rows []rowbatch.Row) (int, error) {
	// The epochs committed so far go to disk with this write, in its
	// transaction.
	s.syncCommitted()
	f := s.target()
	if m := f.Meta(); epoch < 1 || epoch < m.LastEpoch {
		return 0, fmt.Errorf("write to %s at epoch %d: epochs start at 1 and never go back (last written: %d)", f.Path(), epoch, m.LastEpoch)
	}
	for i := range rows {
		// Only assign when needed: batches shared with other readers
		// already carry their epoch, and a write would race with them.
		if rows[i].Epoch != epoch {
			rows[i].Epoch = epoch
		}
	}
	if len(rows) == 0 {
		m := f.Meta()
		if epoch <= m.LastEpoch {
			return 0, nil
		}
		m.LastEpoch = epoch
		return 0, f.UpdateMeta(ctx, m)
	}
	start := time.Now()
	n, err := f.Write(ctx, rows)
	s.writeNanos.Add(int64(time.Since(start)))
	if err == nil {
		s.maybeCheckpoint()
	}
	return n, err
}

// WriteSeconds is the time spent writing batches since the store opened.
func (s *Store) WriteSeconds() float64 {
	return time.Duration(s.writeNanos.Load()).Seconds()
}
