package localstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// A whole-state write (WriteAsyncWhole) holds every key the worker has, so
// nothing already in the store is needed once its epoch commits. Rather
// than writing it over the store and then collecting every row it
// superseded, the store starts a new generation: the batch goes into an
// empty file beside the store (the cheapest write SQLite has: keys in
// order into an empty table, no index), later writes go there too, and
// once the batch's epoch commits the new file replaces the old one. Until
// then the old file stays as it was, so a crash before that commit rolls
// back to it as to any uncommitted epoch.

// nextFileName is the file of a generation waiting for its epoch to commit.
const nextFileName = "store.next.sqlite"

// startGeneration writes a whole-state batch at epoch into a new
// generation. With one already waiting, the batch is written into it like
// any other. s.mu is held.
func (s *Store) startGeneration(ctx context.Context, epoch int64, rows []rowbatch.Row) (int, error) {
	if s.next != nil {
		return s.writeLocked(ctx, epoch, rows)
	}
	if m := s.file.Meta(); epoch < 1 || epoch < m.LastEpoch {
		return 0, fmt.Errorf("write to %s at epoch %d: epochs start at 1 and never go back (last written: %d)", s.file.Path(), epoch, m.LastEpoch)
	}
	start := time.Now()
	path := filepath.Join(WorkerDir(s.cfg.Dir, s.cfg.FlowID, s.cfg.WorkerIndex), nextFileName)
	if err := removeFile(path); err != nil {
		return 0, fmt.Errorf("start a new generation of the local store: %w", err)
	}
	// LastEpoch stays 0 until the rows are in (the write moves it in the
	// same transaction): a file cut short by a crash is never taken for
	// a complete generation.
	meta := s.file.Meta()
	meta.FirstEpoch, meta.LastEpoch, meta.GCEpoch = epoch, 0, epoch
	f, err := snapfile.Create(ctx, path, meta, snapfile.Options{})
	if err != nil {
		return 0, fmt.Errorf("start a new generation of the local store: %w", err)
	}
	// A deletion in a whole state only says the key has none: in a file
	// that holds nothing older, it has nothing to hide.
	live := make([]rowbatch.Row, 0, len(rows))
	for i := range rows {
		if !rows[i].Deleted {
			live = append(live, rows[i])
			live[len(live)-1].Epoch = epoch
		}
	}
	n, err := f.Write(ctx, live)
	if err == nil {
		m := f.Meta()
		m.LastEpoch = epoch
		err = f.UpdateMeta(ctx, m)
	}
	if err != nil {
		f.Close()
		removeFile(path)
		return 0, fmt.Errorf("start a new generation of the local store: %w", err)
	}
	s.next = f
	s.writeNanos.Add(int64(time.Since(start)))
	s.maybeCheckpoint()
	return n, nil
}

// maybePromote makes a waiting generation the store once its epoch is
// committed. s.mu is held.
func (s *Store) maybePromote(ctx context.Context) error {
	if s.next == nil || s.file == nil || s.next.Meta().FirstEpoch > s.committed.Load() {
		return nil
	}
	wdir := WorkerDir(s.cfg.Dir, s.cfg.FlowID, s.cfg.WorkerIndex)
	s.passiveMu.Lock()
	defer s.passiveMu.Unlock()
	// Both files are closed first: a closed file has its write-ahead log
	// folded in, and a log must never outlive the file it belongs to.
	oldErr := s.file.Close()
	nextErr := s.next.Close()
	s.file, s.next = nil, nil
	if err := errors.Join(oldErr, nextErr); err != nil {
		return fmt.Errorf("replace the local store by its new generation: %w", err)
	}
	if err := promote(wdir); err != nil {
		return err
	}
	f, err := snapfile.Open(ctx, filepath.Join(wdir, FileName), snapfile.Options{})
	if err != nil {
		return fmt.Errorf("reopen the local store after its new generation: %w", err)
	}
	s.file = f
	return nil
}

// promote renames the waiting generation over the store's file. Neither
// file may be open.
func promote(wdir string) error {
	path := filepath.Join(wdir, FileName)
	for _, stale := range []string{path + "-wal", path + "-shm"} {
		if err := removeFile(stale); err != nil {
			return fmt.Errorf("replace the local store by its new generation: %w", err)
		}
	}
	if err := os.Rename(filepath.Join(wdir, nextFileName), path); err != nil {
		return fmt.Errorf("replace the local store by its new generation: %w", err)
	}
	return backup.SyncDir(wdir)
}

// settle decides what becomes of a generation a run left waiting when it
// stopped: it replaces the store if its epoch committed (before
// resumeEpoch; resumeEpoch 0 keeps every row, so the newest data wins) and
// its batch was written in full, and it is removed otherwise. The caller
// holds the store's lock.
func settle(ctx context.Context, wdir string, resumeEpoch int64) error {
	next := filepath.Join(wdir, nextFileName)
	if _, err := os.Stat(next); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	keep := false
	if f, err := snapfile.Open(ctx, next, snapfile.Options{}); err == nil {
		m := f.Meta()
		keep = m.Kind == snapfile.KindLocal && m.FirstEpoch > 0 && m.LastEpoch >= m.FirstEpoch &&
			(resumeEpoch == 0 || m.FirstEpoch < resumeEpoch)
		if err := f.Close(); err != nil {
			keep = false
		}
	}
	if keep {
		return promote(wdir)
	}
	for _, name := range []string{nextFileName, nextFileName + "-wal", nextFileName + "-shm"} {
		if err := removeFile(filepath.Join(wdir, name)); err != nil {
			return fmt.Errorf("drop the uncommitted generation of %s: %w", wdir, err)
		}
	}
	return nil
}

// Settle resolves a generation of worker's store left waiting by a run
// that stopped (see settle), taking the store's lock: the recovery layer
// calls it before it inspects the store to choose between fast and full
// resume.
func Settle(ctx context.Context, dir, flowID string, worker int, resumeEpoch int64) error {
	wdir := WorkerDir(dir, flowID, worker)
	if _, err := os.Stat(filepath.Join(wdir, nextFileName)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	lk, err := acquireLock(filepath.Join(wdir, "LOCK"))
	if err != nil {
		return fmt.Errorf("settle local store %s: %w", wdir, err)
	}
	defer lk.release()
	return settle(ctx, wdir, resumeEpoch)
}

func removeFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
