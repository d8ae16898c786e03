package main

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
*/
import "C"

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/millpond/millpond/gostore/cluster"
	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/mesh"
)

// Cluster membership: the engine's thread sends and drains exchange
// batches and reports epoch progress through a cluster.Node; a recovery
// run of a cluster process is opened with the node's handle.

// clusterOptions is what Python passes to mp_cluster_open, as JSON.
type clusterOptions struct {
	Index               int               `json:"index"`
	Addresses           []string          `json:"addresses"`
	Identity            map[string]string `json:"identity"`
	StartTimeoutSeconds float64           `json:"start_timeout_seconds"`
	PeerTimeoutSeconds  float64           `json:"peer_timeout_seconds"`
	MaxInFlightBytes    int64             `json:"max_in_flight_bytes"`
	InboxLimitBytes     int64             `json:"inbox_limit_bytes"`
	// TLS between the processes: the PEM files of this process's
	// certificate and key, and of the CA that turns on mutual TLS (all
	// empty: no TLS).
	TLSCert string `json:"tls_cert"`
	TLSKey  string `json:"tls_key"`
	TLSCA   string `json:"tls_ca"`
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// mp_cluster_open joins the cluster the JSON options describe (secret
// apart, as bytes) and returns the node's handle once every process is
// connected.
//
//export mp_cluster_open
func mp_cluster_open(opts *C.char, secret *C.char, secretLen C.longlong, out *C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	var o clusterOptions
	if err := json.Unmarshal([]byte(C.GoString(opts)), &o); err != nil {
		return setErr(withKind(kindConfig, fmt.Errorf("cluster options: %w", err)), errKind, errMsg)
	}
	cfg := mesh.Config{
		Index: o.Index, Addresses: o.Addresses, Identity: o.Identity,
		StartTimeout: seconds(o.StartTimeoutSeconds), PeerTimeout: seconds(o.PeerTimeoutSeconds),
		MaxInFlight: o.MaxInFlightBytes, InboxLimit: o.InboxLimitBytes,
		Logger: bridge.logger(),
	}
	if secretLen > 0 {
		cfg.Secret = C.GoBytes(unsafe.Pointer(secret), C.int(secretLen))
	}
	if o.TLSCert != "" || o.TLSKey != "" || o.TLSCA != "" {
		cfg.TLS = &mesh.TLSFiles{CertFile: o.TLSCert, KeyFile: o.TLSKey, CAFile: o.TLSCA}
	}
	n, err := cluster.Start(callCtx(), cfg)
	if errors.Is(err, mesh.ErrConfig) {
		// Settings wrong in themselves (a TLS file that cannot be used,
		// say): nothing was started, and Python reports a ValueError.
		return setErr(kinded{kind: kindConfig, err: err}, errKind, errMsg)
	}
	if err != nil {
		return setErr(withKind(kindCluster, err), errKind, errMsg)
	}
	*out = C.uintptr_t(newHandle(n))
	return 0
}

// mp_cluster_send queues an encoded exchange batch for process to.
//
//export mp_cluster_send
func mp_cluster_send(h C.uintptr_t, to C.int, data *C.char, n C.longlong, errKind *C.int, errMsg **C.char) C.int {
	node, err := lookup[*cluster.Node](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	if err := node.Send(int(to), C.GoBytes(unsafe.Pointer(data), C.int(n))); err != nil {
		return setErr(withKind(kindCluster, err), errKind, errMsg)
	}
	return 0
}

// mp_cluster_drain returns every received batch as one malloc'd buffer:
// per batch, the sender's index and the length (4 bytes each, little
// endian), then the bytes. *count is the number of batches.
//
//export mp_cluster_drain
func mp_cluster_drain(h C.uintptr_t, out **C.char, outLen *C.longlong, count *C.int, errKind *C.int, errMsg **C.char) C.int {
	node, err := lookup[*cluster.Node](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	frames, err := node.Drain()
	if err != nil {
		return setErr(withKind(kindCluster, err), errKind, errMsg)
	}
	*count = C.int(len(frames))
	if len(frames) == 0 {
		*out, *outLen = nil, 0
		return 0
	}
	size := 0
	for _, f := range frames {
		size += 8 + len(f.Payload)
	}
	buf := C.malloc(C.size_t(size))
	dst := unsafe.Slice((*byte)(buf), size)
	off := 0
	for _, f := range frames {
		binary.LittleEndian.PutUint32(dst[off:], uint32(f.From))
		binary.LittleEndian.PutUint32(dst[off+4:], uint32(len(f.Payload)))
		off += 8
		off += copy(dst[off:], f.Payload)
	}
	*out, *outLen = (*C.char)(buf), C.longlong(size)
	return 0
}

// mp_cluster_wait blocks (GIL released) until a batch or a progress
// message arrives, the cluster fails, an interrupt, or the timeout.
//
//export mp_cluster_wait
func mp_cluster_wait(h C.uintptr_t, timeout C.double) {
	if node, err := lookup[*cluster.Node](uintptr(h)); err == nil {
		node.Wait(callCtx(), seconds(float64(timeout)))
	}
}

// mp_cluster_congested reports whether a peer's queue is over its limit.
//
//export mp_cluster_congested
func mp_cluster_congested(h C.uintptr_t) C.int {
	if node, err := lookup[*cluster.Node](uintptr(h)); err == nil && node.Congested() {
		return 1
	}
	return 0
}

// mp_cluster_report reports this process's view of (epoch, phase); *decided
// is set once the cluster decided, with the inputs ended everywhere as
// JSON in *done.
//
//export mp_cluster_report
func mp_cluster_report(h C.uintptr_t, epoch C.longlong, phase C.int, ready C.int, doneJSON *C.char,
	decided *C.int, done **C.char, errKind *C.int, errMsg **C.char) C.int {
	node, err := lookup[*cluster.Node](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	var local []int
	if err := json.Unmarshal([]byte(C.GoString(doneJSON)), &local); err != nil {
		return setErr(withKind(kindConfig, fmt.Errorf("done inputs: %w", err)), errKind, errMsg)
	}
	d, ok, err := node.Report(int64(epoch), int(phase), ready != 0, local)
	if err != nil {
		return setErr(withKind(kindCluster, err), errKind, errMsg)
	}
	*decided = 0
	if ok {
		*decided = 1
		if d.Done == nil {
			d.Done = []int{}
		}
		return setJSON(d.Done, done, errKind, errMsg)
	}
	return 0
}

// mp_cluster_stats returns the node's figures as JSON: per peer, and the
// epoch decisions.
//
//export mp_cluster_stats
func mp_cluster_stats(h C.uintptr_t, out **C.char, errKind *C.int, errMsg **C.char) C.int {
	node, err := lookup[*cluster.Node](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	peers, prog := node.Stats()
	ps := make([]map[string]any, 0, len(peers))
	for _, p := range peers {
		if p.Peer == node.Index() {
			continue
		}
		ps = append(ps, map[string]any{
			"peer": p.Peer, "address": p.Address, "frames_out": p.FramesOut, "frames_in": p.FramesIn,
			"bytes_out": p.BytesOut, "bytes_in": p.BytesIn, "blocked_seconds": p.BlockedSeconds, "queued": p.Queued,
		})
	}
	return setJSON(map[string]any{"peers": ps, "progress": map[string]any{
		"leader": prog.Leader, "waves": prog.Waves, "decisions": prog.Decisions,
		"close_p50_seconds": prog.CloseP50.Seconds(), "close_p99_seconds": prog.CloseP99.Seconds(),
		"close_max_seconds": prog.CloseMax.Seconds(), "settle_p50_seconds": prog.SettleP50.Seconds(),
		"settle_p99_seconds": prog.SettleP99.Seconds(), "settle_max_seconds": prog.SettleMax.Seconds(),
	}}, out, errKind, errMsg)
}

// mp_cluster_error returns why the cluster stopped ("" while healthy).
//
//export mp_cluster_error
func mp_cluster_error(h C.uintptr_t) *C.char {
	node, err := lookup[*cluster.Node](uintptr(h))
	if err != nil {
		return C.CString("")
	}
	if err := node.Err(); err != nil {
		return C.CString(err.Error())
	}
	return C.CString("")
}

// mp_cluster_close leaves the cluster and releases the handle.
//
//export mp_cluster_close
func mp_cluster_close(h C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	node, err := lookup[*cluster.Node](uintptr(h))
	if err != nil {
		return 0 // closing twice is fine
	}
	deleteHandle(uintptr(h))
	if err := node.Close(); err != nil {
		return setErr(withKind(kindCluster, err), errKind, errMsg)
	}
	return 0
}

// clusterLost reports whether err is a peer lost or another failure of
// the cluster, which the engine reports as one line naming the peer.
func clusterLost(err error) bool {
	return errors.Is(err, mesh.ErrMesh) || errors.Is(err, durable.ErrCluster)
}

// mp_cluster_abort leaves the cluster because this process failed: the
// peers stop at once, naming this process and reason.
//
//export mp_cluster_abort
func mp_cluster_abort(h C.uintptr_t, reason *C.char, errKind *C.int, errMsg **C.char) C.int {
	node, err := lookup[*cluster.Node](uintptr(h))
	if err != nil {
		return 0
	}
	deleteHandle(uintptr(h))
	node.Abort(C.GoString(reason))
	return 0
}

// clusterMessage is err's text, except for a lost process: wherever the
// loss surfaced (a commit, a restore, the engine's loop), the user gets the
// one line that names the process and why, as every other process does.
func clusterMessage(err error) string {
	var lost *mesh.PeerLostError
	if errors.As(err, &lost) {
		return lost.Error()
	}
	return err.Error()
}
