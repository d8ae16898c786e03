package localstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/millpond/millpond/gostore/snapfile"
)

// verifyRestarts bounds how often Verify starts over because a generation
// replaced the store's file under it.
const verifyRestarts = 8

// Verify checks the store's files in full (snapfile.File.Verify: SQLite's
// quick_check, then every row against its checksum and in order): the
// store's file and, when one waits for its epoch to commit, the next
// generation. A problem is an error wrapping ErrDamaged, and the store is
// marked damaged (Damaged).
//
// It runs on connections of its own, opened read-only, while the store is
// written: the write-ahead log lets it read a snapshot beside the writer,
// and it holds the store's mutex only to look up which files to check, so
// reads and writes do not wait for it. While it reads, checkpoints that
// would wait for its reads to end (TRUNCATE) are put off; the WAL grows
// meanwhile and is checkpointed after. If a generation replaces the file
// (or a rollback drops it) during the check, the check is interrupted and
// starts over on the files the store then has, so what it reports is
// always about files the store still uses; it gives up after a few such
// restarts. Closing the store interrupts it too (it then returns an error
// saying the store is closed).
func (s *Store) Verify(ctx context.Context) error {
	s.verifyMu.Lock() // one check at a time: it has one cancel slot
	defer s.verifyMu.Unlock()
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("verify local store %s: %w", s.Path(), err)
		}
		if attempt == verifyRestarts {
			return fmt.Errorf("verify local store %s: the store's file was replaced %d times during the check; try again", s.Path(), attempt)
		}
		s.mu.Lock()
		closed := s.file == nil
		var paths []string
		if !closed {
			paths = append(paths, s.file.Path())
			if s.next != nil {
				paths = append(paths, s.next.Path())
			}
		}
		gen := s.fileGen.Load()
		s.mu.Unlock()
		if closed {
			return errClosed
		}
		replaced, err := s.verifyGen(ctx, gen, paths)
		if replaced {
			continue
		}
		if err != nil {
			return s.check(err)
		}
		return nil
	}
}

// verifyGen verifies paths, which were the store's files at generation
// gen; replaced reports that they stopped being so before or during the
// check (whose result then says nothing).
func (s *Store) verifyGen(ctx context.Context, gen int64, paths []string) (replaced bool, err error) {
	vctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Registered before passiveMu is taken: whoever retires the files
	// bumps fileGen, then cancels, then takes passiveMu, so either the
	// check below sees the new generation or the cancel reaches it.
	s.verifyCancel.Store(&cancel)
	defer s.verifyCancel.Store(nil)
	s.passiveMu.Lock()
	defer s.passiveMu.Unlock()
	if s.fileGen.Load() != gen {
		return true, nil
	}
	s.verifying.Store(true)
	defer s.verifying.Store(false)
	for _, path := range paths {
		err = verifyFile(vctx, path)
		if s.fileGen.Load() != gen {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
	return false, nil
}

// verifyFile opens path read-only beside the store's own connections and
// verifies it. The store's own open checked the file's log.
func verifyFile(ctx context.Context, path string) error {
	f, err := snapfile.Open(ctx, path, snapfile.Options{ReadOnly: true, LogChecked: true})
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	err = f.Verify(ctx)
	return errors.Join(err, f.Close())
}

// stopVerify interrupts a running Verify, whose files are about to be
// closed or replaced; the caller has bumped fileGen first and takes
// passiveMu next, which waits for the check to let go of the files.
func (s *Store) stopVerify() {
	if c := s.verifyCancel.Load(); c != nil {
		(*c)()
	}
}
