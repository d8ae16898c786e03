package mesh

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// peer is one process of the cluster as this process sees it: the
// outbound stream it dials (frames from here to there, heartbeats back),
// the inbound stream the peer dialed (frames from there, heartbeats from
// here), and the queue feeding the outbound stream. The peer whose index
// is this process's own has no streams: its queue feeds the own inbox.
type peer struct {
	m     *Mesh
	index int
	addr  string

	out outbox

	// Guarded by m.mu.
	outUp     bool             // the outbound handshake completed
	inUp      bool             // an inbound handshake completed
	inServing chan struct{}    // closed when the current inbound handler returns; nil when none runs
	cc        *grpc.ClientConn // the outbound connection
	lastErr   error            // of the latest failed dial attempt during Start
	lastErrAt time.Time
	suspect   string // the latest attempt reached something that said nothing
	unproven  string // a connection as this peer failed authentication
	attempt   *probe // the dial attempt under way

	leave    chan struct{} // closed by Close: the inbound handler says goodbye and returns
	outDone  chan struct{} // closed when the outbound stream's reader returned
	sendDone chan struct{} // closed when the outbound stream's sender returned

	lastHeard         atomic.Int64 // when the latest message from the peer came, as time since m.epoch (monotonic)
	left              atomic.Bool  // the peer said goodbye
	framesIn, bytesIn atomic.Int64
}

func newPeer(m *Mesh, index int) *peer {
	p := &peer{
		m:        m,
		index:    index,
		addr:     m.s.Addresses[index],
		leave:    make(chan struct{}),
		outDone:  make(chan struct{}),
		sendDone: make(chan struct{}),
	}
	p.out = newOutbox(m, m.s.MaxInFlight)
	return p
}

// heard records a sign of life.
func (p *peer) heard() { p.lastHeard.Store(int64(time.Since(p.m.epoch))) }

// silentFor is the time since the peer was last heard. Both are read from
// the monotonic clock: a wall-clock step does not make anyone silent.
func (p *peer) silentFor(now time.Time) time.Duration {
	return now.Sub(p.m.epoch) - time.Duration(p.lastHeard.Load())
}

// markLeft records the peer's goodbye: its streams may end without it
// being lost, and frames still queued for it are dropped.
func (p *peer) markLeft() {
	if p.left.Swap(true) {
		return
	}
	frames, bytes := p.out.drop()
	if frames > 0 || bytes > 0 {
		p.m.log.Warn("a process left the cluster with frames still queued for it; they were dropped",
			"peer", p.index, "address", p.addr, "frames", frames, "bytes", bytes)
		return
	}
	p.m.log.Info("a process left the cluster", "peer", p.index, "address", p.addr)
}

// ended handles the end of one of the peer's streams: nothing if the peer
// said goodbye or this process is closing or stopped, else the peer is
// lost and the mesh fails.
func (p *peer) ended(reason string) {
	if p.left.Load() || !p.m.live() {
		return
	}
	p.m.fail(&PeerLostError{Peer: p.index, Address: p.addr, Reason: reason})
}

// readBack reads what the peer sends back on the outbound stream
// (heartbeats, at last a goodbye) until the stream ends, then reports the
// end and stops the stream's sender.
func (p *peer) readBack(stream grpc.ClientStream, cancel func()) {
	defer p.m.wg.Done()
	defer close(p.outDone)
	defer cancel()
	for {
		var w msg
		err := stream.RecvMsg(&w)
		if err != nil {
			p.out.drop()
			if errors.Is(err, io.EOF) {
				p.ended("it ended the stream from this process without saying goodbye")
			} else {
				p.ended("the stream from this process to it broke: " + statusMessage(err))
			}
			return
		}
		p.heard()
		switch w.typ {
		case msgHeartbeat:
		case msgGoodbye:
			p.markLeft()
		case msgAbort:
			p.ended("it stopped: " + string(w.body))
			return
		default:
			p.out.drop()
			p.ended(fmt.Sprintf("it sent message type %d on the stream from this process", w.typ))
			return
		}
	}
}

// statusMessage is a gRPC error's message without the "rpc error: code =
// ..." wrapping.
func statusMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}
