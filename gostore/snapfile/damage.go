package snapfile

import (
	"errors"
	"fmt"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// ErrDamaged is wrapped by every error that means a snapshot file's bytes
// are not what was written: a row whose checksum does not match, rows out
// of primary-key order, metadata whose checksum does not match, or SQLite
// reporting a malformed file. Such a file is never read as data; a local
// store is rebuilt from the durable store, a segment fetched again.
var ErrDamaged = errors.New("snapshot file damaged")

// DamageError is the error a damaged snapshot file is reported with. It
// wraps ErrDamaged (errors.Is) and, when SQLite found the damage, SQLite's
// error (errors.Unwrap).
type DamageError struct {
	// Path is the damaged file.
	Path string
	// Detail says what was found, and where: the step, key and epoch of a
	// bad row, or SQLite's message.
	Detail string
	// Err is the underlying error (SQLite's), if any.
	Err error
}

// Error implements error.
func (e *DamageError) Error() string {
	return fmt.Sprintf("%s: %s: %s", ErrDamaged.Error(), e.Path, e.Detail)
}

// Is makes errors.Is(err, ErrDamaged) hold.
func (e *DamageError) Is(target error) bool { return target == ErrDamaged }

// Unwrap returns the underlying error.
func (e *DamageError) Unwrap() error { return e.Err }

// damageCode reports whether a SQLite result code (primary or extended)
// means the file's bytes are damaged rather than that a call failed.
// SQLITE_FORMAT is unused by current SQLite but means the same.
func damageCode(rc int) bool {
	switch rc & 0xff {
	case sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_FORMAT:
		return true
	}
	return false
}

// damagedf reports damage found by the checks of this package.
func damagedf(path, format string, args ...any) error {
	return &DamageError{Path: path, Detail: fmt.Sprintf(format, args...)}
}

// classify returns err, turned into a DamageError when it is SQLite
// reporting a damaged file (the driver's *sqlite.Error, or the bulk
// connection's sqliteError), so that callers see ErrDamaged wherever the
// damage surfaces. what says what was being done, for the message.
func classify(path, what string, err error) error {
	if err == nil || errors.Is(err, ErrDamaged) {
		return err
	}
	var se *sqlite.Error
	if errors.As(err, &se) && damageCode(se.Code()) {
		return &DamageError{Path: path, Detail: what + ": " + se.Error(), Err: err}
	}
	var be *sqliteError
	if errors.As(err, &be) && damageCode(int(be.rc)) {
		return &DamageError{Path: path, Detail: what + ": " + be.Error(), Err: err}
	}
	return err
}

// sqliteError is a failed call on the bulk connection, keeping SQLite's
// result code so damage can be told from other failures.
type sqliteError struct {
	rc  int32
	msg string
}

func (e *sqliteError) Error() string { return e.msg }
