package localstore

import (
	"context"

	"github.com/millpond/millpond/gostore/snapfile"
)

// The checkpointer: one goroutine per store folds small writes into the
// main table, builds the epoch index and checkpoints the write-ahead log
// when it grows past the file, so neither writes nor GC pay for it inline.

func (s *Store) runCheckpoints() {
	defer close(s.ckptDone)
	for {
		select {
		case <-s.quit:
			return
		case <-s.kick:
			ctx := context.Background()
			// Small writes wait in the file's recent table; folding them
			// into the main table here keeps its page writes off the
			// writer's path. A failed fold is retried at the next kick
			// (and GC folds first anyway).
			s.mu.Lock()
			f, gen := s.target(), s.fileGen.Load()
			if f != nil && f.RecentRows() >= foldRows {
				f.FoldRecent(ctx)
			}
			if f != nil && s.indexDue(f) {
				// Off the writer's path; GC and rollback would build it
				// anyway.
				f.EnsureIndex(ctx)
			}
			if f != nil {
				// A committed epoch no write carried yet reaches disk
				// here, off the flow's path.
				s.syncCommitted()
				f.FlushMeta(ctx)
			}
			due := f != nil && f.NeedsCheckpoint()
			s.mu.Unlock()
			if !due {
				continue
			}
			if gate := s.ckptGate.Load(); gate != nil {
				(*gate)()
			}
			// The long copy runs beside writers; only the short truncation
			// at the end takes the store's lock. A failed checkpoint only
			// leaves the WAL longer, and one of a file a generation
			// replaced meanwhile finds it gone.
			s.passiveMu.Lock()
			if s.fileGen.Load() == gen {
				f.CheckpointPassive(ctx)
			}
			s.passiveMu.Unlock()
			s.mu.Lock()
			if f := s.target(); f != nil && !s.verifying.Load() {
				// Truncating waits for readers on older snapshots: not
				// while Verify reads; the next kick does it.
				f.Checkpoint(ctx)
			}
			s.mu.Unlock()
		}
	}
}

// SetCheckpointGate makes the background checkpointer call wait before
// it checkpoints (a checkpoint fsyncs the WAL and the file). The recovery
// run uses it to hold checkpoints back while an epoch's segments are being
// made durable, so the two do not queue behind each other on the disk.
// wait should return within a bounded time; a writer whose WAL grows past
// twice the checkpoint threshold meanwhile checkpoints inline, gate or not.
func (s *Store) SetCheckpointGate(wait func()) {
	if wait == nil {
		s.ckptGate.Store(nil)
		return
	}
	s.ckptGate.Store(&wait)
}

// foldRows is how many rows may wait in a store's recent table before the
// background goroutine folds them into the main table.
const foldRows = 4096

// maybeCheckpoint asks the background goroutine to fold the recent table,
// build the epoch index or checkpoint the WAL, whichever is due. The caller
// holds s.mu.
func (s *Store) maybeCheckpoint() {
	f := s.target()
	if f.RecentRows() >= foldRows || s.indexDue(f) {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	if !f.NeedsCheckpoint() {
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
		// A checkpoint is already pending and the WAL kept growing: when
		// it is twice due, the writer checkpoints itself, which bounds the
		// WAL however fast writes come.
		// Not while Verify reads: truncating would wait for its reads,
		// holding the store's mutex.
		if f.CheckpointOverdue() && !s.verifying.Load() {
			f.Checkpoint(context.Background())
		}
	}
}

// indexDue reports whether the checkpointer should build the epoch index
// of f, the store's file (s.mu is held): it is missing, no generation
// waits (if the next write is whole too, it is never needed), and it pays:
// not for a whole-state generation that holds only its own epoch.
// It has one row per key, so GC finds nothing in it, and its epoch was
// committed before it replaced the old file, so no rollback removes it. A
// flow whose every epoch is whole would otherwise index each generation
// just before the next one replaced it (about 5% of a word count's CPU
// with recovery). Once a write of another epoch lands in it, the index
// is built (by that write or by the next round here), as GC would.
func (s *Store) indexDue(f *snapfile.File) bool {
	if s.next != nil || !f.IndexPending() {
		return false
	}
	m := f.Meta()
	return m.FirstEpoch == 0 || m.LastEpoch > m.FirstEpoch
}
