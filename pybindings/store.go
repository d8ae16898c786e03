package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// The exported functions share one shape: plain C inputs, results through
// out-parameters, and an error kind as the return value (0 on success)
// with the message in *errMsg.

// batchWriter is what a store handle's snapshots are written to: the store
// itself when it was opened alone, the recovery run's worker when a run
// owns it. Both take over the batch (rowbatch.Batch).
type batchWriter interface {
	Write(ctx context.Context, b rowbatch.Batch) (int, error)
}

// carrier is a batchWriter that can write an epoch whole from its touched
// keys (durable.Worker: see durable.Run.WriteCarried).
type carrier interface {
	WriteCarried(ctx context.Context, b rowbatch.Batch) (int, int, error)
	Carries() bool
	StopCarrying()
}

// storeHandle is what a store handle holds: the store to read, where its
// snapshots go, and whether closing the handle closes the store.
type storeHandle struct {
	store  *localstore.Store
	writer batchWriter
	owned  bool
}

// newRunStore is the handle of a store that a run's worker owns.
func newRunStore(w *durable.Worker) *storeHandle {
	return &storeHandle{store: w.Store(), writer: w}
}

//export mp_store_open
func mp_store_open(dir, flow *C.char, workerIndex, workerCount, keyGroups C.int,
	execution, resumeEpoch C.longlong, out *C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	cfg := localstore.Config{
		Dir: C.GoString(dir), FlowID: C.GoString(flow),
		WorkerIndex: int(workerIndex), WorkerCount: int(workerCount),
		KeyGroupCount: int(keyGroups), Execution: int64(execution),
	}
	s, err := localstore.Open(callCtx(), cfg, int64(resumeEpoch))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	*out = C.uintptr_t(newHandle(&storeHandle{store: s, writer: s, owned: true}))
	return 0
}

//export mp_store_close
func mp_store_close(h C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	sh, err := lookup[*storeHandle](uintptr(h))
	if err != nil {
		return 0 // closing twice is fine
	}
	deleteHandle(uintptr(h))
	if !sh.owned {
		return 0 // the run closes its stores itself
	}
	return setErr(sh.store.Close(), errKind, errMsg)
}

// mp_store_write takes over a packed snapshot batch (rowbatch format, in
// memory from malloc) and writes it at epoch: to the store, or through the
// run that owns it. whole is 0 for a batch of touched keys, 1 for the
// worker's whole state, 2 for touched keys to be written whole from the
// state the run carries (durable.Run.WriteCarried; as 0 when it carries
// none). *written counts the rows written, *carried those of them the run
// added (-1 when the batch was not written whole from the carried state). The buffer is freed once the last reader of the batch is done
// with it, which may be after the call returns; the caller must not touch
// it again, error or not.
//
//export mp_store_write
func mp_store_write(h C.uintptr_t, epoch C.longlong, whole C.int, buf *C.char, n C.size_t,
	written, carried *C.longlong, errKind *C.int, errMsg **C.char) C.int {
	mem := rowbatch.NewMemory(func() { C.free(unsafe.Pointer(buf)) })
	batch := rowbatch.Batch{Epoch: int64(epoch), Whole: whole == 1, Mem: mem}
	sh, err := lookup[*storeHandle](uintptr(h))
	if err != nil {
		batch.Release()
		return setErr(err, errKind, errMsg)
	}
	var data []byte
	if n > 0 {
		data = unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	}
	if batch.Rows, err = rowbatch.Decode(data, int64(epoch)); err != nil {
		batch.Release()
		return setErr(err, errKind, errMsg)
	}
	count, added := 0, -1
	if c, ok := sh.writer.(carrier); ok && whole == 2 {
		count, added, err = c.WriteCarried(callCtx(), batch)
	} else {
		count, err = sh.writer.Write(callCtx(), batch)
	}
	if err != nil {
		if !sh.owned {
			err = withKind(kindRecovery, err)
		}
		return setErr(err, errKind, errMsg)
	}
	*written, *carried = C.longlong(count), C.longlong(added)
	return 0
}

// mp_store_carries sets *out to 1 when the run that owns the store
// carries its worker's whole state, so that a batch of touched keys can be
// written whole (mp_store_write's whole 2), else to 0.
//
//export mp_store_carries
func mp_store_carries(h C.uintptr_t, out *C.int, errKind *C.int, errMsg **C.char) C.int {
	sh, err := lookup[*storeHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	*out = 0
	if c, ok := sh.writer.(carrier); ok && c.Carries() {
		*out = 1
	}
	return 0
}

// mp_store_get looks up the newest row of (step, key). *found is 0 when
// there is none, 1 for a value (in *val, malloc'd), 2 for a deletion.
//
//export mp_store_get
func mp_store_get(h C.uintptr_t, step *C.char, stepLen C.size_t, key *C.char, keyLen C.size_t,
	found *C.int, epoch *C.longlong, val **C.char, valLen *C.size_t, errKind *C.int, errMsg **C.char) C.int {
	sh, err := lookup[*storeHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	r, ok, err := sh.store.Get(callCtx(), C.GoStringN(step, C.int(stepLen)), C.GoStringN(key, C.int(keyLen)))
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

// mp_store_get_many looks up many keys of a step at once: keys holds
// count keys, each as uvarint(len) and its UTF-8 bytes. *out receives the
// newest row of every key that has one, in key order, deletions included,
// packed as a scan page (see mp_scan_next; malloc'd).
//
//export mp_store_get_many
func mp_store_get_many(h C.uintptr_t, step *C.char, stepLen C.size_t, keys *C.char, keysLen, count C.size_t,
	out **C.char, outLen *C.size_t, errKind *C.int, errMsg **C.char) C.int {
	sh, err := lookup[*storeHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	list, err := unpackKeys(unsafe.Slice((*byte)(unsafe.Pointer(keys)), int(keysLen)), int(count))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	packed, err := sh.store.GetManyPacked(callCtx(), C.GoStringN(step, C.int(stepLen)), list)
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	*out, *outLen = (*C.char)(C.CBytes(packed)), C.size_t(len(packed))
	return 0
}

// unpackKeys copies count length-prefixed keys out of buf.
func unpackKeys(buf []byte, count int) ([]string, error) {
	if count > len(buf) {
		return nil, fmt.Errorf("get many: %w: %d keys cannot fit in %d bytes", rowbatch.ErrMalformed, count, len(buf))
	}
	keys := make([]string, 0, count)
	for range count {
		n, w := binary.Uvarint(buf)
		if w <= 0 || n > uint64(len(buf)-w) {
			return nil, fmt.Errorf("get many: %w: key list cut short after %d keys", rowbatch.ErrMalformed, len(keys))
		}
		keys = append(keys, string(buf[w:w+int(n)]))
		buf = buf[w+int(n):]
	}
	if len(buf) != 0 {
		return nil, fmt.Errorf("get many: %w: %d bytes after the last of %d keys", rowbatch.ErrMalformed, len(buf), count)
	}
	return keys, nil
}

// mp_store_steps returns the step ids with rows, each NUL-terminated,
// malloc'd.
//
//export mp_store_steps
func mp_store_steps(h C.uintptr_t, out **C.char, outLen *C.size_t, errKind *C.int, errMsg **C.char) C.int {
	sh, err := lookup[*storeHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	steps, err := sh.store.Steps(callCtx())
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

// mp_store_meta returns the store's metadata and row counts as JSON.
//
//export mp_store_meta
func mp_store_meta(h C.uintptr_t, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	sh, err := lookup[*storeHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	st, err := sh.store.Stats(callCtx())
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	m := sh.store.Meta()
	return setJSON(map[string]int64{
		"worker_index": int64(m.WorkerIndex), "worker_count": int64(m.WorkerCount),
		"key_group_count": int64(m.KeyGroupCount), "execution": m.Execution,
		"last_epoch": m.LastEpoch, "gc_epoch": m.GCEpoch,
		"rows": st.Rows, "deletions": st.Deletions, "value_bytes": st.ValueBytes,
	}, out, errKind, errMsg)
}

//export mp_store_gc
func mp_store_gc(h C.uintptr_t, committed C.longlong, removed *C.longlong, errKind *C.int, errMsg **C.char) C.int {
	sh, err := lookup[*storeHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	n, err := sh.store.GC(callCtx(), int64(committed))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	*removed = C.longlong(n)
	return 0
}

// mp_store_carry_off makes the run that owns the store drop its worker's
// carried state and carry none for the rest of the run (a store bounded in
// memory). A store of its own carries nothing anyway.
//
//export mp_store_carry_off
func mp_store_carry_off(h C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	sh, err := lookup[*storeHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	if c, ok := sh.writer.(carrier); ok {
		c.StopCarrying()
	}
	return 0
}
