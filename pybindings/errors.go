package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"errors"
	"os"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// Error kinds understood by millpond/_corebridge.py, which maps them to the
// exception classes of millpond.errors. Keep the two lists in step.
const (
	kindOK            = 0
	kindGeneric       = 1
	kindLocked        = 2
	kindForeign       = 3
	kindLayoutChanged = 4
	kindCorrupt       = 5
	kindMalformed     = 6
	kindClosed        = 7
	kindNotFound      = 8
	kindBackup        = 9
	kindConfig        = 10
	kindRecovery      = 11
)

var errBadHandle = errors.New("object is closed")

// kinded tags an error with the kind to report, keeping its message.
type kinded struct {
	kind int
	err  error
}

func (k kinded) Error() string { return k.err.Error() }
func (k kinded) Unwrap() error { return k.err }

// withKind tags err with kind unless it already has a more specific one.
func withKind(kind int, err error) error {
	if err == nil {
		return nil
	}
	if k := kindOf(err); k != kindGeneric {
		return err
	}
	return kinded{kind: kind, err: err}
}

func kindOf(err error) int {
	switch {
	case err == nil:
		return kindOK
	case errors.As(err, new(kinded)):
		var k kinded
		errors.As(err, &k)
		if k.kind == kindBackup && errors.Is(err, backup.ErrNotFound) {
			return kindNotFound
		}
		return k.kind
	case errors.Is(err, localstore.ErrLocked):
		return kindLocked
	case errors.Is(err, localstore.ErrForeign):
		return kindForeign
	case errors.Is(err, localstore.ErrLayoutChanged):
		return kindLayoutChanged
	case errors.Is(err, snapfile.ErrNotSnapshotFile):
		return kindCorrupt
	case errors.Is(err, rowbatch.ErrMalformed):
		return kindMalformed
	case errors.Is(err, errBadHandle):
		return kindClosed
	case errors.Is(err, durable.ErrCorrupt):
		return kindCorrupt
	case errors.Is(err, durable.ErrBackup):
		return kindBackup
	case errors.Is(err, os.ErrNotExist), errors.Is(err, backup.ErrNotFound):
		return kindNotFound
	}
	return kindGeneric
}

// setErr reports err through the C out-parameters and returns its kind.
func setErr(err error, kind *C.int, msg **C.char) C.int {
	k := kindOf(err)
	*kind = C.int(k)
	if err != nil {
		*msg = C.CString(err.Error())
	}
	return C.int(k)
}
