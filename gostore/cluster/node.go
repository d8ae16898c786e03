// Package cluster ties together what one process of a multi-process flow
// needs from the others: the mesh that carries exchange batches and control
// messages (package mesh), the tracker that decides when an epoch may close
// (package progress), and the control channel of the durable layer's
// commit protocol (durable.Cluster).
//
// A Node is started once per process, before the flow's recovery run is
// opened, and closed after it finished. The engine's thread calls Send,
// Drain, Report and Wait between activations; everything else (reading
// streams, heartbeats, answering the durable layer) runs in goroutines and
// never needs the engine's thread.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/mesh"
	"github.com/millpond/millpond/gostore/progress"
)

// Control-frame kinds on the mesh.
const (
	kindProgress byte = 1
	kindDurable  byte = 2
)

// Node is this process's membership in the cluster.
type Node struct {
	mesh    *mesh.Mesh
	tracker *progress.Tracker
	durable *durableLink

	mu  sync.Mutex
	err error // a protocol error found by a handler
}

// Start connects this process to every other process of the cluster
// described by cfg (its Handlers are set here) and returns once all are
// connected and agree on cfg.Identity.
func Start(ctx context.Context, cfg mesh.Config) (*Node, error) {
	n := &Node{durable: newDurableLink(cfg.Index, len(cfg.Addresses))}
	// The tracker needs the mesh to send, and the mesh's handlers need the
	// tracker: handlers reach the tracker through n, set before any frame
	// can arrive (Start returns only once every peer is connected, but a
	// peer may already send then).
	ready := make(chan struct{})
	cfg.Handlers = map[byte]func(int, []byte){
		kindProgress: func(from int, p []byte) {
			<-ready
			if err := n.tracker.Deliver(from, p); err != nil {
				n.protocolError(fmt.Errorf("progress message from process %d: %w", from, err))
			}
		},
		kindDurable: func(from int, p []byte) {
			n.durable.deliver(from, p)
		},
	}
	m, err := mesh.Start(ctx, cfg)
	if err != nil {
		close(ready)
		return nil, err
	}
	n.mesh = m
	n.durable.attach(m, kindDurable)
	n.tracker = progress.New(cfg.Index, len(cfg.Addresses), func(to int, p []byte) error {
		return m.Send(to, kindProgress, p)
	}, m.Notify)
	close(ready)
	return n, nil
}

func (n *Node) protocolError(err error) {
	n.mu.Lock()
	if n.err == nil {
		n.err = err
	}
	n.mu.Unlock()
	n.mesh.Notify()
	n.durable.fail(err)
}

// Err returns why the cluster cannot go on: a lost peer, a protocol error.
func (n *Node) Err() error {
	n.mu.Lock()
	err := n.err
	n.mu.Unlock()
	if err != nil {
		return err
	}
	return n.mesh.Err()
}

// Index is this process's index; Count the number of processes.
func (n *Node) Index() int { return n.mesh.Index() }

// Count is the number of processes in the cluster.
func (n *Node) Count() int { return n.mesh.Count() }

// Send queues a batch of exchange messages (already encoded) for process
// to. It never blocks.
func (n *Node) Send(to int, payload []byte) error {
	if err := n.Err(); err != nil {
		return err
	}
	return n.mesh.Send(to, 0, payload)
}

// Drain returns every exchange batch received and not yet drained.
func (n *Node) Drain() ([]mesh.Frame, error) {
	if err := n.Err(); err != nil {
		return nil, err
	}
	return n.mesh.Drain(), nil
}

// Congested reports whether some peer has more queued than its limit: the
// engine then stops reading its sources until the queues drain.
func (n *Node) Congested() bool { return n.mesh.Congested() }

// Wait blocks until a batch arrives, the progress of the epoch changes,
// the cluster fails, ctx ends, or d passed.
func (n *Node) Wait(ctx context.Context, d time.Duration) { n.mesh.Wait(ctx, d) }

// Report gives the tracker this process's view of (epoch, phase) at a
// quiescent point of the engine's loop, and returns the cluster's decision
// once it is known.
func (n *Node) Report(epoch int64, phase int, ready bool, done []int) (progress.Decision, bool, error) {
	if err := n.Err(); err != nil {
		return progress.Decision{}, false, err
	}
	sent, received := n.mesh.Counts()
	return n.tracker.Report(progress.Report{
		Epoch: epoch, Phase: phase, Ready: ready, Done: done, Sent: sent, Received: received,
	})
}

// Durable is the control channel of the durable layer's commit protocol.
func (n *Node) Durable() durable.Cluster { return n.durable }

// Stats returns the mesh's per-peer figures and the tracker's.
func (n *Node) Stats() ([]mesh.PeerStats, progress.Stats) {
	return n.mesh.Stats(), n.tracker.Stats()
}

// Close leaves the cluster: queued frames are flushed and the peers told,
// so they do not report this process lost.
func (n *Node) Close() error {
	err := n.mesh.Close()
	n.durable.end(errClosed)
	return err
}

// Abort leaves the cluster because this process failed: the peers stop at
// once, naming this process and reason.
func (n *Node) Abort(reason string) {
	n.mesh.Abort(reason)
	n.durable.fail(fmt.Errorf("this process stopped: %s", reason))
}

var errClosed = errors.New("cluster node closed")
