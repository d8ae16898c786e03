package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"unsafe"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/durable"
)

// The inspect and verify tools: reports on a backup's recovery data, as
// JSON.

//export mp_durable_inspect
func mp_durable_inspect(h C.uintptr_t, flow *C.char, withKeys C.int, key *C.char, keyLen C.longlong, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	return report(h, out, errKind, errMsg, func(ctx context.Context, b backup.Backup) (any, error) {
		return durable.Inspect(ctx, b, C.GoString(flow), withKeys != 0, goKey(key, keyLen))
	})
}

//export mp_durable_verify
func mp_durable_verify(h C.uintptr_t, flow *C.char, key *C.char, keyLen C.longlong, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	return report(h, out, errKind, errMsg, func(ctx context.Context, b backup.Backup) (any, error) {
		problems, err := durable.Verify(ctx, b, C.GoString(flow), goKey(key, keyLen))
		if problems == nil {
			problems = []durable.Problem{}
		}
		return problems, err
	})
}

//export mp_durable_flows
func mp_durable_flows(h C.uintptr_t, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	return report(h, out, errKind, errMsg, func(ctx context.Context, b backup.Backup) (any, error) {
		flows, err := durable.Flows(ctx, b)
		if flows == nil {
			flows = []string{}
		}
		return flows, err
	})
}

// goKey copies a backup key passed from Python; empty means none.
func goKey(key *C.char, n C.longlong) durable.Key {
	if n <= 0 {
		return nil
	}
	return durable.Key(C.GoBytes(unsafe.Pointer(key), C.int(n)))
}

func report(h C.uintptr_t, out **C.char, errKind *C.int, errMsg **C.char, make func(context.Context, backup.Backup) (any, error)) C.int {
	bh, err := lookup[*backupHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	v, err := make(callCtx(), bh.b)
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	return setJSON(v, out, errKind, errMsg)
}
