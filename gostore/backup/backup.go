// Package backup defines the durable store behind millpond's recovery: a
// flat namespace of immutable objects addressed by "/"-separated keys.
//
// Each backend lives in its own sub-package (dirbackup, s3backup) and
// implements [Backup]; backupuri opens one from a URI, faultbackup wraps one
// to inject failures in tests, and backuptest holds the conformance suite
// every backend must pass.
package backup

import (
	"context"
	"errors"
)

// ErrNotFound is returned (wrapped) by [Backup.Download] when the key does
// not exist. Test for it with errors.Is.
var ErrNotFound = errors.New("object not found")

// ErrExists is returned (wrapped) by [Small.Create] when an object already
// has the key. Test for it with errors.Is.
var ErrExists = errors.New("object already exists")

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	// Key is the full key of the object, as passed to Upload.
	Key string
	// Size is the object's size in bytes.
	Size int64
}

// Backup is a durable object store. Implementations are safe for concurrent
// use by multiple goroutines.
//
// Keys are validated with [ValidateKey]; an invalid key is an error for every
// method.
type Backup interface {
	// List returns every object whose key starts with prefix (a plain string
	// prefix, not a directory: "a/b" matches "a/b/c" and "a/bc"), sorted by
	// key. An empty prefix lists everything. Objects being uploaded are never
	// listed before they are complete.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)

	// Upload stores the content of the local file localPath under key,
	// replacing any previous object. It is atomic: a concurrent List or
	// Download sees either the previous object or the complete new one,
	// never a partial object.
	Upload(ctx context.Context, localPath, key string) error

	// Download writes the object at key to localPath, atomically (a
	// temporary file in the same directory, then a rename). The parent
	// directory of localPath must exist. If the key does not exist the error
	// wraps [ErrNotFound] and localPath is left untouched.
	Download(ctx context.Context, key, localPath string) error

	// Delete removes the object at key. Deleting a missing key is not an
	// error.
	Delete(ctx context.Context, key string) error

	// String describes the store for humans and error messages, e.g.
	// "s3://bucket/prefix" or "dir /var/lib/millpond".
	String() string
}

// Checker is implemented by backends that can validate their configuration
// (the directory exists, the bucket is reachable and listable) before first
// use. Callers that want an early, clear error call Check once.
type Checker interface {
	// Check returns an error naming the store if it cannot be used.
	Check(ctx context.Context) error
}

// Adopter is implemented by backends that can take over a finished local
// file instead of copying it. The caller promises the file is complete,
// fsynced, and never changed again (it may still delete its own name for
// it). A directory backup on the same filesystem links the file into
// place, so a segment reaches the store without its bytes being copied and
// written a second time.
type Adopter interface {
	// Adopt stores localPath under key as Upload does; where it cannot
	// link (another filesystem) it copies.
	Adopt(ctx context.Context, localPath, key string) error
}

// Small is implemented by backends that move small objects (records) in
// memory, without temporary files: a caller writing a commit record need not
// create, and on a crash leave behind, a local file for it. Temporary files a
// backend needs (the directory backend's) live in its own directory, where
// listings skip them.
type Small interface {
	// Get returns the object's content; a missing key wraps [ErrNotFound].
	Get(ctx context.Context, key string) ([]byte, error)
	// Put stores data under key atomically, replacing any previous object.
	Put(ctx context.Context, key string, data []byte) error
	// Create stores data under key only if no object has that key;
	// otherwise it returns an error wrapping [ErrExists] and changes
	// nothing. Of concurrent Creates of one key (from any number of
	// processes and machines), exactly one succeeds.
	Create(ctx context.Context, key string, data []byte) error
}
