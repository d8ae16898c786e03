package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"errors"
	"strings"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// errorKind classifies an error for the Python side, which raises the
// exception class registered for the kind's name (set_error_types; see
// millpond/_corebridge.py). The names are read at import as
// _core.ERROR_KINDS, so the list exists only here.
type errorKind int

// The error kinds; kindNames names them.
const (
	kindOK errorKind = iota
	kindStore
	kindLocked
	kindForeign
	kindLayoutChanged
	kindCorrupt
	kindMalformed
	kindClosed
	kindNotFound
	kindBackup
	kindConfig
	kindRecovery
	kindDamaged
	kindUnauthenticated
	kindInterrupted
	kindCluster
)

var kindNames = [...]string{
	kindStore:         "store",
	kindLocked:        "locked",
	kindForeign:       "foreign",
	kindLayoutChanged: "layout_changed",
	kindCorrupt:       "corrupt",
	kindMalformed:     "malformed",
	kindClosed:        "closed",
	kindNotFound:      "not_found",
	kindBackup:        "backup",
	kindConfig:        "config",
	kindRecovery:      "recovery",
	kindDamaged:       "damaged",
	// A record the configured backup key did not seal.
	kindUnauthenticated: "unauthenticated",
	// A call cut short by SIGINT or SIGTERM (interrupt.go).
	kindInterrupted: "interrupted",
	// The cluster stopped (a peer lost, fenced out) or refused to start.
	kindCluster: "cluster",
}

// mp_error_kinds returns the kind names from kind 1 on, NUL-terminated one
// after another (malloc'd; the caller frees it).
//
//export mp_error_kinds
func mp_error_kinds(n *C.int) *C.char { return cNames(kindNames[1:], n) }

// cNames returns names, each NUL-terminated, as one malloc'd string (the
// caller frees it), with their count in *n: how the Go side's lists of
// names reach the module at import.
func cNames(names []string, n *C.int) *C.char {
	*n = C.int(len(names))
	return C.CString(strings.Join(names, "\x00") + "\x00")
}

var errBadHandle = errors.New("object is closed")

// kinded tags an error with the kind to report, keeping its message.
type kinded struct {
	kind errorKind
	err  error
}

func (k kinded) Error() string { return k.err.Error() }
func (k kinded) Unwrap() error { return k.err }

// withKind tags err with kind unless it already has a more specific one.
func withKind(kind errorKind, err error) error {
	if err == nil {
		return nil
	}
	if kindOf(err) != kindStore {
		return err
	}
	return kinded{kind: kind, err: err}
}

// kindOf classifies err. "Not found" is not among the sentinels: it is a
// kind only where the protocol says so (a backup download), which tags it.
func kindOf(err error) errorKind {
	var k kinded
	switch {
	case err == nil:
		return kindOK
	case errors.As(err, &k):
		return k.kind
	case errors.Is(err, context.Canceled) && interrupts.interrupted():
		return kindInterrupted
	case clusterLost(err):
		return kindCluster
	case errors.Is(err, localstore.ErrDamaged):
		return kindDamaged
	case errors.Is(err, durable.ErrUnauthenticated):
		return kindUnauthenticated
	case errors.Is(err, durable.ErrRaced), errors.Is(err, durable.ErrSuperseded),
		errors.Is(err, durable.ErrBackupLost), errors.Is(err, durable.ErrObjectsLost):
		return kindRecovery
	case errors.Is(err, localstore.ErrLocked):
		return kindLocked
	case errors.Is(err, localstore.ErrForeign):
		return kindForeign
	case errors.Is(err, localstore.ErrLayoutChanged):
		return kindLayoutChanged
	case errors.Is(err, snapfile.ErrNotSnapshotFile), errors.Is(err, durable.ErrCorrupt):
		return kindCorrupt
	case errors.Is(err, rowbatch.ErrMalformed):
		return kindMalformed
	case errors.Is(err, errBadHandle):
		return kindClosed
	case errors.Is(err, durable.ErrBackup):
		return kindBackup
	}
	return kindStore
}

// setErr reports err through the C out-parameters and returns its kind.
func setErr(err error, kind *C.int, msg **C.char) C.int {
	k := kindOf(err)
	*kind = C.int(k)
	if err != nil {
		*msg = C.CString(clusterMessage(err))
	}
	return C.int(k)
}
