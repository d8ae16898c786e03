package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"runtime/cgo"
)

// lookup resolves a handle the C side passed in to a value of type T. A
// zero, stale or mistyped handle is an error, never a crash.
func lookup[T any](h uintptr) (T, error) {
	var zero T
	if h == 0 {
		return zero, errBadHandle
	}
	v, ok := safeValue(cgo.Handle(h))
	if !ok {
		return zero, errBadHandle
	}
	t, ok := v.(T)
	if !ok {
		return zero, fmt.Errorf("%w: handle of type %T", errBadHandle, v)
	}
	return t, nil
}

// safeValue turns cgo.Handle.Value's panic on an invalid handle into ok=false.
func safeValue(h cgo.Handle) (v any, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return h.Value(), true
}

func newHandle(v any) uintptr { return uintptr(cgo.NewHandle(v)) }

func deleteHandle(h uintptr) {
	if _, ok := safeValue(cgo.Handle(h)); ok {
		cgo.Handle(h).Delete()
	}
}

// setJSON returns v through *out as malloc'd JSON, the one form in which
// records cross to Python (the C side decodes them; keys are snake_case).
func setJSON(v any, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	b, err := json.Marshal(v)
	if err != nil {
		return setErr(fmt.Errorf("encode result: %w", err), errKind, errMsg)
	}
	*out = C.CString(string(b))
	return 0
}
