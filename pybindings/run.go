package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/millpond/millpond/gostore/cluster"
	"github.com/millpond/millpond/gostore/durable"
)

// mp_snapshot_modes returns the snapshot modes' names, each NUL-terminated
// (malloc'd), read at import as _core.SNAPSHOT_MODES.
//
//export mp_snapshot_modes
func mp_snapshot_modes(n *C.int) *C.char {
	var names []string
	for _, m := range durable.SnapshotModes() {
		names = append(names, m.String())
	}
	return cNames(names, n)
}

//export mp_run_open
func mp_run_open(localDir, flow *C.char, workers, keyGroups C.int, backupH C.uintptr_t, mode *C.char,
	maxInFlight, retain C.int, retainSeconds C.double, compactRatio C.double, compactMin C.longlong,
	key *C.char, keyLen C.longlong, clusterH C.uintptr_t, first, hosted C.int,
	out *C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	bh, err := lookup[*backupHandle](uintptr(backupH))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	var peers durable.Cluster
	if clusterH != 0 {
		node, err := lookup[*cluster.Node](uintptr(clusterH))
		if err != nil {
			return setErr(err, errKind, errMsg)
		}
		peers = node.Durable()
	}
	m, err := durable.ParseSnapshotMode(C.GoString(mode))
	if err != nil {
		return setErr(withKind(kindConfig, err), errKind, errMsg)
	}
	cfg := durable.Config{
		LocalDir: C.GoString(localDir), FlowID: C.GoString(flow),
		WorkerCount: int(workers), KeyGroupCount: int(keyGroups), Backup: bh.b,
		Mode: m, MaxEpochsInFlight: int(maxInFlight), RetainEpochs: int(retain),
		RetainFor:    time.Duration(float64(retainSeconds) * float64(time.Second)),
		CompactRatio: float64(compactRatio), CompactMinBytes: int64(compactMin),
		Key: goKey(key, keyLen), Logger: bridge.logger(),
		Cluster: peers, FirstWorker: int(first), Workers: int(hosted),
		// The mesh already stops the run when a process dies or goes
		// silent (its peer timeout); a process that is alive and
		// restoring a large state may legitimately take hours, so the
		// durable layer's own waits at start are not bounded apart.
		StartTimeout: 7 * 24 * time.Hour,
	}
	run, err := durable.Open(callCtx(), cfg)
	if err != nil {
		// What is wrong with a flow's recovery data or settings (another
		// key-group count, say) is a recovery error, unless more specific.
		return setErr(withKind(kindRecovery, err), errKind, errMsg)
	}
	*out = C.uintptr_t(newHandle(run))
	return 0
}

// mp_run_info returns, as JSON, the execution number, the resume epoch,
// the committed epoch at open and the newest commit's worker count.
//
//export mp_run_info
func mp_run_info(h C.uintptr_t, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	st := run.State()
	return setJSON(map[string]int64{
		"execution": run.Execution(), "resume_epoch": run.ResumeEpoch(),
		"committed_epoch": st.Commit.Epoch, "commit_worker_count": int64(st.Commit.WorkerCount),
	}, out, errKind, errMsg)
}

// mp_run_restore restores worker w and returns a store handle and, as
// JSON, how the worker's state came back (durable.RestoreInfo).
//
//export mp_run_restore
func mp_run_restore(h C.uintptr_t, w C.int, store *C.uintptr_t, info **C.char, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	ri, err := run.Restore(callCtx(), int(w))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	if k := setJSON(ri, info, errKind, errMsg); k != 0 {
		return k
	}
	*store = C.uintptr_t(newHandle(newRunStore(run.Worker(int(w)))))
	return 0
}

// mp_run_progress fills the restore counters: objects done and in all,
// bytes done and in all, rows restored and in the objects.
//
//export mp_run_progress
func mp_run_progress(h C.uintptr_t, out *C.longlong) {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return
	}
	p := run.Progress()
	vals := []int64{p.ObjectsDone.Load(), p.ObjectsTotal.Load(), p.BytesDone.Load(), p.BytesTotal.Load(),
		p.RowsRestored.Load(), p.RowsTotal.Load()}
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

// mp_run_metrics returns the run's commit and upload figures as JSON.
//
//export mp_run_metrics
func mp_run_metrics(h C.uintptr_t, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	m := run.Metrics()
	return setJSON(map[string]any{
		"committed_epoch": m.CommittedEpoch, "commits": m.Commits,
		"segments_uploaded": m.SegmentsUploaded, "bytes_uploaded": m.BytesUploaded,
		"segment_bytes": m.SegmentBytes, "segment_raw_bytes": m.SegmentRawBytes,
		"compacted_uploaded": m.CompactedUploaded, "compacted_bytes": m.CompactedBytes,
		"compacted_raw_bytes": m.CompactedRawBytes,
		"upload_seconds":      m.UploadSeconds, "backpressure_seconds": m.BackpressureSeconds,
		"compactions": m.Compactions, "whole_epochs": m.WholeEpochs, "objects_deleted": m.ObjectsDeleted,
		"local_write_seconds": m.LocalWriteSeconds, "local_gc_seconds": m.LocalGCSeconds, "compaction_seconds": m.CompactionSeconds,
		"commit_latency_p50": durable.Percentile(m.CommitLatencies, 50),
		"commit_latency_p99": durable.Percentile(m.CommitLatencies, 99),
		"commit_latencies":   m.CommitLatencies,
		// Cumulative, as Prometheus histograms count: [upper bound, commits
		// at or below it], the last bound +Inf (written as null).
		"commit_latency_buckets": commitLatencyBuckets(m),
		"commit_latency_sum":     m.CommitLatencySum,
		"upload_retries":         m.UploadRetries,
	}, out, errKind, errMsg)
}

// commitLatencyBuckets is the commit latency histogram as cumulative
// [bound, count] pairs; the last bound, +Inf, is nil (JSON has no
// infinity).
func commitLatencyBuckets(m durable.Metrics) [][2]any {
	out := make([][2]any, 0, len(m.CommitLatencyBuckets))
	var total int64
	for i, n := range m.CommitLatencyBuckets {
		total += n
		var bound any
		if i < len(durable.CommitLatencyBounds) {
			bound = durable.CommitLatencyBounds[i]
		}
		out = append(out, [2]any{bound, total})
	}
	return out
}

// mp_run_committed_epoch returns the newest epoch the run knows committed.
//
//export mp_run_committed_epoch
func mp_run_committed_epoch(h C.uintptr_t, epoch *C.longlong, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	*epoch = C.longlong(run.Committed())
	return 0
}

// mp_run_commits returns the commits since the last call, as JSON.
//
//export mp_run_commits
func mp_run_commits(h C.uintptr_t, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	run, err := lookup[*durable.Run](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	commits := run.DrainCommits()
	if commits == nil {
		commits = []durable.CommitEvent{}
	}
	return setJSON(commits, out, errKind, errMsg)
}
