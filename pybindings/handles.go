package main

import (
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
