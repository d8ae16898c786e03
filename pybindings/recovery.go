package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unsafe"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// storeRef is a handle to a store a run owns: closing the handle does not
// close the store.
type storeRef struct {
	s *localstore.Store
}

//export mp_run_open
func mp_run_open(localDir, flow *C.char, workers, keyGroups C.int, backupH C.uintptr_t, mode C.int,
	maxInFlight, retain C.int, retainSeconds C.double, compactRatio C.double, compactMin C.longlong,
	out *C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	bh, err := lookup[*backupHandle](uintptr(backupH))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	cfg := durable.Config{
		LocalDir: C.GoString(localDir), FlowID: C.GoString(flow),
		WorkerCount: int(workers), KeyGroupCount: int(keyGroups), Backup: bh.b,
		Mode: durable.SnapshotMode(mode), MaxEpochsInFlight: int(maxInFlight), RetainEpochs: int(retain),
		RetainFor:    time.Duration(float64(retainSeconds) * float64(time.Second)),
		CompactRatio: float64(compactRatio), CompactMinBytes: int64(compactMin),
	}
	run, err := durable.Open(context.Background(), cfg)
	if err != nil {
		return setErr(withKind(kindOf(err), err), errKind, errMsg)
	}
	*out = C.uintptr_t(newHandle(run))
	return 0
}

// mp_run_info fills execution, resume epoch, committed epoch at open, and
// the newest commit's worker count.
//
//export mp_run_info
func mp_run_info(h C.uintptr_t, out *C.longlong, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	st := run.State()
	vals := []int64{run.Execution(), run.ResumeEpoch(), st.Commit.Epoch, int64(st.Commit.WorkerCount)}
	dst := unsafe.Slice((*C.longlong)(unsafe.Pointer(out)), len(vals))
	for i, v := range vals {
		dst[i] = C.longlong(v)
	}
	return 0
}

// mp_run_restore restores worker w and returns a store handle and a JSON
// description of the restore.
//
//export mp_run_restore
func mp_run_restore(h C.uintptr_t, w C.int, store *C.uintptr_t, info **C.char, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	ri, err := run.Restore(context.Background(), int(w))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	b, _ := json.Marshal(ri)
	*info = C.CString(string(b))
	*store = C.uintptr_t(newHandle(&storeRef{s: run.Store(int(w))}))
	return 0
}

//export mp_run_progress
func mp_run_progress(h C.uintptr_t, out *C.longlong) {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return
	}
	p := run.Progress()
	vals := []int64{p.ObjectsDone.Load(), p.ObjectsTotal.Load(), p.BytesDone.Load(), p.BytesTotal.Load(), p.RowsRestored.Load()}
	dst := unsafe.Slice((*C.longlong)(unsafe.Pointer(out)), len(vals))
	for i, v := range vals {
		dst[i] = C.longlong(v)
	}
}

//export mp_run_start
func mp_run_start(h C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	return setErr(run.Start(), errKind, errMsg)
}

//export mp_run_write
func mp_run_write(h C.uintptr_t, w C.int, epoch C.longlong, buf *C.char, n C.size_t, whole C.int,
	written *C.longlong, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	// One copy of the whole buffer, which the decoded rows then alias, is
	// cheaper than decoding the caller's buffer and copying row by row.
	var own []byte
	if n > 0 {
		own = make([]byte, int(n))
		copy(own, unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n)))
	}
	rows, err := rowbatch.Decode(own, int64(epoch))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	count, err := run.Write(context.Background(), int(w), rowbatch.Batch{Epoch: int64(epoch), Rows: rows, Whole: whole != 0})
	if err != nil {
		return setErr(withKind(kindRecovery, err), errKind, errMsg)
	}
	*written = C.longlong(count)
	return 0
}

//export mp_run_close_epoch
func mp_run_close_epoch(h C.uintptr_t, w C.int, epoch C.longlong, last C.int, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	if last != 0 {
		return setErr(withKind(kindRecovery, run.CloseLastEpoch(int(w), int64(epoch))), errKind, errMsg)
	}
	return setErr(withKind(kindRecovery, run.CloseEpoch(int(w), int64(epoch))), errKind, errMsg)
}

//export mp_run_finish
func mp_run_finish(h C.uintptr_t, aborted C.int, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	return setErr(withKind(kindRecovery, run.Finish(aborted != 0)), errKind, errMsg)
}

//export mp_run_close
func mp_run_close(h C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return 0
	}
	deleteHandle(uintptr(h))
	return setErr(run.Close(), errKind, errMsg)
}

//export mp_run_metrics
func mp_run_metrics(h C.uintptr_t, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	m := run.Metrics()
	b, _ := json.Marshal(map[string]any{
		"committed_epoch": m.CommittedEpoch, "commits": m.Commits,
		"segments_uploaded": m.SegmentsUploaded, "bytes_uploaded": m.BytesUploaded,
		"upload_seconds": m.UploadSeconds, "backpressure_seconds": m.BackpressureSeconds,
		"compactions": m.Compactions, "whole_epochs": m.WholeEpochs, "objects_deleted": m.ObjectsDeleted,
		"local_write_seconds": m.LocalWriteSeconds, "local_gc_seconds": m.LocalGCSeconds, "compaction_seconds": m.CompactionSeconds,
		"commit_latency_p50": durable.Percentile(m.CommitLatencies, 50),
		"commit_latency_p99": durable.Percentile(m.CommitLatencies, 99),
		"commit_latencies":   m.CommitLatencies,
	})
	*out = C.CString(string(b))
	return 0
}

// mp_run_commits returns the commits since the last call as JSON.
//
//export mp_run_commits
func mp_run_commits(h C.uintptr_t, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	b, _ := json.Marshal(run.DrainCommits())
	*out = C.CString(string(b))
	return 0
}

// mp_durable_report runs inspect (op 0, keys counted when withKeys), verify
// (op 1) or lists flows (op 2) and returns JSON.
//
//export mp_durable_report
func mp_durable_report(backupH C.uintptr_t, op C.int, flow *C.char, withKeys C.int, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	bh, err := lookup[*backupHandle](uintptr(backupH))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	ctx := context.Background()
	var v any
	switch op {
	case 0:
		v, err = durable.Inspect(ctx, bh.b, C.GoString(flow), withKeys != 0)
	case 1:
		v, err = durable.Verify(ctx, bh.b, C.GoString(flow))
	case 2:
		v, err = durable.Flows(ctx, bh.b)
	default:
		err = fmt.Errorf("unknown report %d", int(op))
	}
	if err != nil {
		return setErr(withKind(kindOf(err), err), errKind, errMsg)
	}
	b, _ := json.Marshal(v)
	*out = C.CString(string(b))
	return 0
}
