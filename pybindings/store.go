package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"unsafe"

	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// The exported functions share one shape: plain C inputs, results through
// out-parameters, and an error kind as the return value (0 on success) with
// the message in *errMsg.

//export mp_store_open
func mp_store_open(dir, flow *C.char, workerIndex, workerCount, keyGroups C.int,
	execution, resumeEpoch C.longlong, out *C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	cfg := localstore.Config{
		Dir: C.GoString(dir), FlowID: C.GoString(flow),
		WorkerIndex: int(workerIndex), WorkerCount: int(workerCount),
		KeyGroupCount: int(keyGroups), Execution: int64(execution),
	}
	s, err := localstore.Open(context.Background(), cfg, int64(resumeEpoch))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	*out = C.uintptr_t(newHandle(s))
	return 0
}

// storeOf resolves a store handle: a store this handle owns, or one a
// recovery run owns.
func storeOf(h uintptr) (*localstore.Store, error) {
	if ref, err := lookup[*storeRef](h); err == nil {
		return ref.s, nil
	}
	return lookup[*localstore.Store](h)
}

//export mp_store_close
func mp_store_close(h C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	if _, err := lookup[*storeRef](uintptr(h)); err == nil {
		deleteHandle(uintptr(h)) // the run closes the store itself
		return 0
	}
	s, err := lookup[*localstore.Store](uintptr(h))
	if err != nil {
		return 0 // closing twice is fine
	}
	deleteHandle(uintptr(h))
	return setErr(s.Close(), errKind, errMsg)
}

// mp_store_write decodes a packed batch (rowbatch format) and writes it at
// epoch. The buffer is only read during the call.
//
// decodeBatch decodes a packed batch the C side passed in; the rows alias
// the buffer, which is only valid during the call.
func decodeBatch(buf *C.char, n C.size_t, epoch C.longlong) ([]rowbatch.Row, error) {
	var data []byte
	if n > 0 {
		data = unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	}
	return rowbatch.Decode(data, int64(epoch))
}

//export mp_store_write
func mp_store_write(h C.uintptr_t, epoch C.longlong, buf *C.char, n C.size_t,
	written *C.longlong, errKind *C.int, errMsg **C.char) C.int {
	s, err := storeOf(uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	rows, err := decodeBatch(buf, n, epoch)
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	count, err := s.Write(context.Background(), rowbatch.Batch{Epoch: int64(epoch), Rows: rows})
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	*written = C.longlong(count)
	return 0
}

// mp_store_get looks up the newest row of (step, key). *found is 0 when
// there is none, 1 for a value (in *val, malloc'd), 2 for a deletion.
//
//export mp_store_get
func mp_store_get(h C.uintptr_t, step *C.char, stepLen C.size_t, key *C.char, keyLen C.size_t,
	found *C.int, epoch *C.longlong, val **C.char, valLen *C.size_t, errKind *C.int, errMsg **C.char) C.int {
	s, err := storeOf(uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	r, ok, err := s.Get(context.Background(), C.GoStringN(step, C.int(stepLen)), C.GoStringN(key, C.int(keyLen)))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	switch {
	case !ok:
		*found = 0
	case r.Deleted:
		*found = 2
		*epoch = C.longlong(r.Epoch)
	default:
		*found = 1
		*epoch = C.longlong(r.Epoch)
		*val = (*C.char)(C.CBytes(r.Value))
		*valLen = C.size_t(len(r.Value))
	}
	return 0
}

// mp_store_steps returns the step ids with rows, NUL-separated, malloc'd.
//
//export mp_store_steps
func mp_store_steps(h C.uintptr_t, out **C.char, outLen *C.size_t, errKind *C.int, errMsg **C.char) C.int {
	s, err := storeOf(uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	steps, err := s.Steps(context.Background())
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	var b []byte
	for _, st := range steps {
		b = append(b, st...)
		b = append(b, 0)
	}
	*out, *outLen = (*C.char)(C.CBytes(b)), C.size_t(len(b))
	return 0
}

// mp_store_meta returns the store's metadata and row statistics in a fixed
// array: worker index, worker count, key groups, execution, last epoch, gc
// epoch, rows, deletions, value bytes.
//
//export mp_store_meta
func mp_store_meta(h C.uintptr_t, out *C.longlong, errKind *C.int, errMsg **C.char) C.int {
	s, err := storeOf(uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	st, err := s.Stats(context.Background())
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	m := s.Meta()
	vals := []int64{int64(m.WorkerIndex), int64(m.WorkerCount), int64(m.KeyGroupCount), m.Execution,
		m.LastEpoch, m.GCEpoch, st.Rows, st.Deletions, st.ValueBytes}
	dst := unsafe.Slice((*C.longlong)(unsafe.Pointer(out)), len(vals))
	for i, v := range vals {
		dst[i] = C.longlong(v)
	}
	return 0
}

//export mp_store_gc
func mp_store_gc(h C.uintptr_t, committed C.longlong, removed *C.longlong, errKind *C.int, errMsg **C.char) C.int {
	s, err := storeOf(uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	n, err := s.GC(context.Background(), int64(committed))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	*removed = C.longlong(n)
	return 0
}

//export mp_store_delete_from
func mp_store_delete_from(h C.uintptr_t, epoch C.longlong, removed *C.longlong, errKind *C.int, errMsg **C.char) C.int {
	s, err := storeOf(uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	n, err := s.DeleteFrom(context.Background(), int64(epoch))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	*removed = C.longlong(n)
	return 0
}
