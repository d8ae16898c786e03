package mesh

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// The life of a mesh.
const (
	stateStarting int32 = iota // Start waits for every pair
	stateRunning               // every pair is up
	stateClosing               // Close flushes and says goodbye
	stateStopped               // failed or closed
)

// Mesh is one process's connections to every other process of a cluster.
// Its methods are safe for concurrent use.
type Mesh struct {
	s     *settings
	log   *slog.Logger
	index int
	n     int
	peers []*peer // by index; peers[index] is this process

	ctx      context.Context // ends when the mesh stops: every stream and goroutine
	cancel   context.CancelFunc
	wg       sync.WaitGroup // every goroutine of the mesh
	srv      *grpc.Server
	deadline time.Time // of Start
	epoch    time.Time // origin of the peers' lastHeard (monotonic)

	in        inbox
	wake      chan struct{} // Wait's wake-up token
	changed   chan struct{} // a stream came up (Start's loop looks again)
	flushing  chan struct{} // closed by Close: senders write what is queued and say goodbye
	aborting  chan struct{} // closed on failure: every stream tells its peer abortMsg
	abortMsg  string        // set before aborting closes
	congested atomic.Int32  // peers whose queue exceeds MaxInFlight
	sent      atomic.Int64
	received  atomic.Int64

	mu         sync.Mutex // the peers' connection fields, and tlsRefusal
	tlsRefusal string     // the latest connection refused by TLS during Start, for its timeout error
	state      atomic.Int32

	errMu sync.Mutex
	err   error

	done         chan struct{} // closed on failure or close
	doneOnce     sync.Once
	finished     chan struct{} // closed when every goroutine has returned
	teardownOnce sync.Once
	closeOnce    sync.Once
	closeErr     error
}

// live reports whether a broken stream is a failure (not closing or
// stopped).
func (m *Mesh) live() bool {
	st := m.state.Load()
	return st == stateStarting || st == stateRunning
}

func (m *Mesh) signalChange() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// remote returns the other processes.
func (m *Mesh) remote() []*peer {
	out := make([]*peer, 0, m.n-1)
	for _, p := range m.peers {
		if p.index != m.index {
			out = append(out, p)
		}
	}
	return out
}

// Index returns this process's index.
func (m *Mesh) Index() int { return m.index }

// Count returns the number of processes.
func (m *Mesh) Count() int { return m.n }

// Address returns process i's address, "" if there is no process i.
func (m *Mesh) Address(i int) string {
	if i < 0 || i >= m.n {
		return ""
	}
	return m.s.Addresses[i]
}

// Send queues a frame for process to and returns at once: it never
// blocks. kind 0 is data (the receiver's Drain returns it), 1..255 a
// control frame for the receiver's handler of that kind. Frames from one
// process to another arrive in Send order, data and control together.
// Sending to this process's own index delivers to its own inbox and
// handlers through the same queue. payload is copied. The error says the
// mesh failed (wrapping Err) or closed (ErrClosed), to is no process, to
// left the cluster (ErrPeerLeft), or the payload exceeds MaxPayload.
func (m *Mesh) Send(to int, kind byte, payload []byte) error {
	if to < 0 || to >= m.n {
		return fmt.Errorf("send to process %d: there is no such process (the cluster has processes 0..%d)", to, m.n-1)
	}
	if len(payload) > MaxPayload {
		return fmt.Errorf("send to process %d: a payload of %d bytes exceeds the limit of %d", to, len(payload), MaxPayload)
	}
	if err := m.sendable(to); err != nil {
		return err
	}
	p := m.peers[to]
	if p.left.Load() {
		return fmt.Errorf("send to process %d (%s): %w", to, p.addr, ErrPeerLeft)
	}
	buf := make([]byte, len(payload))
	copy(buf, payload)
	if kind == 0 {
		m.sent.Add(1) // before the frame can be received anywhere
	}
	if !p.out.put(outFrame{kind: kind, payload: buf}) {
		if kind == 0 {
			m.sent.Add(-1)
		}
		if p.left.Load() {
			return fmt.Errorf("send to process %d (%s): %w", to, p.addr, ErrPeerLeft)
		}
		if err := m.sendable(to); err != nil {
			return err
		}
		return fmt.Errorf("send to process %d: %w", to, ErrClosed)
	}
	return nil
}

func (m *Mesh) sendable(to int) error {
	switch m.state.Load() {
	case stateRunning:
		return nil
	case stateStopped:
		if err := m.Err(); err != nil {
			return fmt.Errorf("send to process %d: %w", to, err)
		}
	}
	return fmt.Errorf("send to process %d: %w", to, ErrClosed)
}

// Congested reports whether some peer's outbound queue exceeds
// MaxInFlight: the caller should stop reading its sources (and keep
// draining) until it is false again.
func (m *Mesh) Congested() bool { return m.congested.Load() > 0 }

// Counts returns the data frames (kind 0) this process sent (accepted by
// Send, to any process, itself included) and received (returned by
// Drain).
func (m *Mesh) Counts() (sent, received int64) {
	return m.sent.Load(), m.received.Load()
}

// Err returns the failure that stopped the mesh (a *PeerLostError when a
// peer was lost), nil while healthy and after a clean Close.
func (m *Mesh) Err() error {
	m.errMu.Lock()
	defer m.errMu.Unlock()
	return m.err
}

// Done is closed when the mesh failed or was closed.
func (m *Mesh) Done() <-chan struct{} { return m.done }
