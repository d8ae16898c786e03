package localstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// A whole-state batch (rowbatch.Batch.Whole) holds every key the worker has, so
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

// stagedPattern names the copies of whole epochs' segments
// (StageGeneration) waiting for the writer to take them as the next
// generation, one per epoch: the pipe may stage the next epoch's before
// the writer took this one's.
const stagedPattern = "store.staged-*.sqlite"

func stagedName(n int64) string {
	return strings.Replace(stagedPattern, "*", strconv.FormatInt(n, 10), 1)
}

// removeStaged removes every staged copy in wdir.
func removeStaged(wdir string) error {
	stale, err := filepath.Glob(filepath.Join(wdir, stagedPattern))
	if err != nil {
		return err
	}
	for _, p := range stale {
		if err := removeFile(p); err != nil {
			return err
		}
	}
	return nil
}

// Staged is a copy of a whole epoch's segment made for the store's writer
// (StageGeneration).
type Staged struct {
	// Path is the copy, which belongs to the store.
	Path string
	// Deletions is how many deletion records the segment holds (its
	// cutter counted them; more than there are is harmless). The store
	// drops them before the copy becomes a generation, and skips the scan
	// that finds them when there are none: a whole epoch of a flow that
	// deletes nothing would otherwise read every row of the file for
	// nothing (8% of a word count's background CPU).
	Deletions int64
}

// StageGeneration copies a sealed segment that holds exactly a whole-state
// batch (WriteAsync with staged), of which deletions are deletion records,
// into the store's directory, to be handed to the batch's writer. The
// segment is written anyway, for the durable store; copying it, rather
// than writing the same rows into a new file a second time, makes a whole
// epoch's local write cost a file copy. The copy belongs to the store from
// then on.
func (s *Store) StageGeneration(segment string, deletions int64) (Staged, error) {
	dst := filepath.Join(WorkerDir(s.cfg.Dir, s.cfg.FlowID, s.cfg.WorkerIndex), stagedName(s.staged.Add(1)))
	if err := copyFile(segment, dst); err != nil {
		removeFile(dst)
		return Staged{}, fmt.Errorf("stage %s as the next generation of the local store: %w", segment, err)
	}
	return Staged{Path: dst, Deletions: deletions}, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	// Owner-only, as every file holding state.
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// adoptStaged makes a staged copy of a whole epoch's segment the waiting
// generation; rows are the same batch, written the slow way when a
// generation already waits. s.mu is held.
func (s *Store) adoptStaged(ctx context.Context, epoch int64, staged Staged, rows []rowbatch.Row) (int, error) {
	if s.next != nil {
		removeFile(staged.Path)
		return s.writeLocked(ctx, epoch, rows)
	}
	if m := s.file.Meta(); epoch < 1 || epoch < m.LastEpoch {
		removeFile(staged.Path)
		return 0, fmt.Errorf("write to %s at epoch %d: epochs start at 1 and never go back (last written: %d)", s.file.Path(), epoch, m.LastEpoch)
	}
	start := time.Now()
	wdir := WorkerDir(s.cfg.Dir, s.cfg.FlowID, s.cfg.WorkerIndex)
	path := filepath.Join(wdir, nextFileName)
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := removeFile(p); err != nil {
			return 0, fmt.Errorf("adopt the next generation of the local store: %w", err)
		}
	}
	if err := os.Rename(staged.Path, path); err != nil {
		return 0, fmt.Errorf("adopt the next generation of the local store: %w", err)
	}
	f, err := snapfile.Open(ctx, path, snapfile.Options{})
	if err != nil {
		removeFile(path)
		return 0, fmt.Errorf("adopt the next generation of the local store: %w", err)
	}
	fail := func(err error) (int, error) {
		f.Close()
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			removeFile(p)
		}
		return 0, fmt.Errorf("adopt the next generation of the local store: %w", err)
	}
	got, want := f.Meta(), s.file.Meta()
	if got.FlowID != want.FlowID || got.KeyGroupCount != want.KeyGroupCount ||
		got.WorkerIndex != want.WorkerIndex || got.WorkerCount != want.WorkerCount || got.LastEpoch != epoch {
		return fail(fmt.Errorf("staged segment holds worker %d of %d of flow %q through epoch %d, not worker %d of %d of %q at %d",
			got.WorkerIndex, got.WorkerCount, got.FlowID, got.LastEpoch, want.WorkerIndex, want.WorkerCount, want.FlowID, epoch))
	}
	// The file only counts as a generation once it is marked local, after
	// its deletions are gone (settle drops it until then).
	if staged.Deletions > 0 {
		if _, err := f.DropDeletions(ctx); err != nil {
			return fail(err)
		}
	}
	s.syncCommitted()
	want = s.file.Meta()
	want.FirstEpoch, want.LastEpoch, want.GCEpoch = epoch, epoch, epoch
	if err := f.UpdateMeta(ctx, want); err != nil {
		return fail(err)
	}
	s.next = f
	s.publish()
	s.writeNanos.Add(int64(time.Since(start)))
	return len(rows), nil
}

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
	s.syncCommitted()
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
	s.publish()
	s.writeNanos.Add(int64(time.Since(start)))
	s.maybeCheckpoint()
	return n, nil
}

// maybePromote makes a waiting generation the store once its epoch is
// committed. s.mu is held. Once it has begun it finishes whatever happens
// to ctx: it closes both files first, and a replacement cut short by a
// canceled context (local GC runs under the run's, which a killed run
// cancels) would leave the store with no file open.
func (s *Store) maybePromote(ctx context.Context) error {
	if s.next == nil || s.file == nil || s.next.Meta().FirstEpoch > s.committed.Load() {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	wdir := WorkerDir(s.cfg.Dir, s.cfg.FlowID, s.cfg.WorkerIndex)
	s.retireFiles()
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
	s.publish()
	return nil
}

// promote renames the waiting generation over the store's file. Neither
// file may be open.
func promote(wdir string) error {
	path := filepath.Join(wdir, FileName)
	if err := removeJournals(wdir, FileName); err != nil {
		return fmt.Errorf("replace the local store by its new generation: %w", err)
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
	// A staged copy is only ever taken by the writer that staged it.
	if err := removeStaged(wdir); err != nil {
		return fmt.Errorf("drop the staged generation of %s: %w", wdir, err)
	}
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
	if err := removeStoreFiles(wdir, nextFileName); err != nil {
		return fmt.Errorf("drop the uncommitted generation of %s: %w", wdir, err)
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
