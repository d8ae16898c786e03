package localstore

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/snapfile"
)

// ErrDamaged is wrapped when the store's file is damaged: a row or the
// metadata failed its checksum, rows came out of order, or SQLite found
// the file malformed. It is snapfile.ErrDamaged, so errors.Is works with
// either. The store is then marked (Damaged) and must be rebuilt from the
// durable store.
var ErrDamaged = snapfile.ErrDamaged

// DamagedFileName is the marker a store leaves in its worker directory
// once it found itself damaged; its first line is the reason.
const DamagedFileName = "DAMAGED"

// rebuildAdvice ends every damage message: what happens next.
const rebuildAdvice = "the next run rebuilds it from the backup"

// damageError is a damaged store as reported to the store's callers.
type damageError struct {
	path   string
	detail string
	err    error // wraps ErrDamaged
}

func (e *damageError) Error() string {
	return fmt.Sprintf("local store damaged: %s: %s; %s", e.path, e.detail, rebuildAdvice)
}

func (e *damageError) Unwrap() error { return e.err }

// DamageReason is how err, which wraps ErrDamaged, reads as the reason of
// a full resume: "local store damaged: PATH: DETAIL", without the advice
// that ends the error, since the run that gives the reason is the one
// rebuilding the store.
func DamageReason(err error) string {
	var de *damageError
	if errors.As(err, &de) {
		return fmt.Sprintf("local store damaged: %s: %s", de.path, de.detail)
	}
	return "local store damaged: " + err.Error()
}

// Damaged reports whether worker's store was found damaged (by this run or
// an earlier one) and why: the marker stays until Remove.
func Damaged(dir, flowID string, worker int) (reason string, ok bool) {
	return readMarker(WorkerDir(dir, flowID, worker))
}

func readMarker(wdir string) (string, bool) {
	fh, err := os.Open(filepath.Join(wdir, DamagedFileName))
	if err != nil {
		return "", false
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	if sc.Scan() {
		return sc.Text(), true
	}
	return "damaged (no reason recorded)", true
}

// damaged turns err, when it wraps ErrDamaged (or, for the store's own
// file, ErrNotSnapshotFile: nothing but a snapshot file is ever written
// there, so anything else found there is damage), into the store's damage
// error, and records the damage in the worker directory first. Other
// errors are returned as they are.
func damaged(wdir, path string, err error) error {
	if err == nil {
		return nil
	}
	var de *damageError
	if errors.As(err, &de) {
		return err
	}
	if !errors.Is(err, ErrDamaged) && !errors.Is(err, snapfile.ErrNotSnapshotFile) {
		return err
	}
	detail := err.Error()
	var se *snapfile.DamageError
	if errors.As(err, &se) {
		path, detail = se.Path, se.Detail
	}
	if !errors.Is(err, ErrDamaged) {
		err = errors.Join(ErrDamaged, err)
	}
	out := &damageError{path: path, detail: detail, err: err}
	if merr := markDamaged(wdir, path+": "+detail); merr != nil {
		// The error still says damaged; a run that fails to record it
		// finds the damage again, at the latest when it verifies.
		return fmt.Errorf("%w (and recording it failed: %v)", out, merr)
	}
	return out
}

// markDamaged writes the marker with reason as its first line, durably
// (file and directory fsynced), unless one is there already: the first
// reason found is kept.
func markDamaged(wdir, reason string) error {
	path := filepath.Join(wdir, DamagedFileName)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	reason = strings.ReplaceAll(reason, "\n", " ")
	tmp := path + ".tmp"
	fh, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("mark %s damaged: %w", wdir, err)
	}
	_, err = fh.WriteString(reason + "\n")
	if err == nil {
		err = fh.Sync()
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// Renamed into place, so a marker is never seen half written.
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = backup.SyncDir(wdir)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mark %s damaged: %w", wdir, err)
	}
	return nil
}

// markedError is the error Open and Inspect give for a store marked
// damaged by an earlier call.
func markedError(wdir, reason string) error {
	return &damageError{path: filepath.Join(wdir, FileName), detail: "marked damaged earlier (" + reason + ")", err: ErrDamaged}
}

// check is damaged for the store's own worker directory and file.
func (s *Store) check(err error) error {
	if err == nil {
		return nil
	}
	return damaged(s.wdir(), s.Path(), err)
}

func (s *Store) wdir() string {
	return WorkerDir(s.cfg.Dir, s.cfg.FlowID, s.cfg.WorkerIndex)
}
