package mesh

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// outbox is the unbounded FIFO queue of frames for one peer, drained by
// that peer's sender goroutine. Send appends and returns at once; the
// queue's size beyond MaxInFlight is the back-pressure signal.
type outbox struct {
	m   *Mesh
	max int64 // MaxInFlight

	mu      sync.Mutex
	frames  []outFrame
	queued  int64 // payload bytes accepted and not yet handed to the stream
	waiting int   // frames accepted and not yet handed to the stream (queued or taken)
	closed  bool  // no more frames: the mesh is closing or stopped, or the peer left
	dropped bool  // the queue was forgotten: frames the sender still writes are not in queued

	congested bool          // queued > max
	since     time.Time     // when the current congestion began
	blocked   time.Duration // congestion time before the current one

	framesOut, bytesOut int64

	ready chan struct{} // a frame was appended (one token is enough)
}

func newOutbox(m *Mesh, max int64) outbox {
	return outbox{m: m, max: max, ready: make(chan struct{}, 1)}
}

// put appends a frame; false if the outbox is closed.
func (o *outbox) put(f outFrame) bool {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return false
	}
	o.frames = append(o.frames, f)
	o.queued += int64(len(f.payload))
	o.waiting++
	if !o.congested && o.queued > o.max {
		o.congested = true
		o.since = time.Now()
		o.m.congested.Add(1)
	}
	o.mu.Unlock()
	select {
	case o.ready <- struct{}{}:
	default:
	}
	return true
}

// take removes every queued frame; they stay counted in queued until
// wrote reports them written.
func (o *outbox) take() []outFrame {
	o.mu.Lock()
	defer o.mu.Unlock()
	fs := o.frames
	o.frames = nil
	return fs
}

// wrote records one frame handed to the stream.
func (o *outbox) wrote(n int) {
	o.mu.Lock()
	if !o.dropped {
		o.queued -= int64(n)
		o.waiting--
	}
	o.framesOut++
	o.bytesOut += int64(n)
	o.relieveLocked()
	o.mu.Unlock()
}

// relieveLocked ends a congestion once the queue is back within max.
func (o *outbox) relieveLocked() {
	if o.congested && o.queued <= o.max {
		o.congested = false
		o.blocked += time.Since(o.since)
		if o.m.congested.Add(-1) == 0 {
			o.m.wakeUp() // a waiter may resume reading its sources
		}
	}
}

// close refuses further frames; the sender still writes what is queued.
func (o *outbox) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
}

// drop closes the outbox and forgets what is queued, returning how many
// frames and bytes were never handed to the stream. The sender may still
// hold frames it took; they are counted here and no longer in queued.
func (o *outbox) drop() (frames int, bytes int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	o.dropped = true
	frames, bytes = o.waiting, o.queued
	o.frames = nil
	o.queued = 0
	o.waiting = 0
	o.relieveLocked()
	return frames, bytes
}

// untaken is the number of frames the sender has not taken yet.
func (o *outbox) untaken() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.frames)
}

// pending returns what is not yet handed to the stream.
func (o *outbox) pending() (frames int, bytes int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.waiting, o.queued
}

// sendLoop writes a remote peer's queue to its stream in order. When the
// mesh closes it writes what is left, then a goodbye, then half-closes.
// It returns quietly on a stream error: the stream's reader (readBack)
// sees the same end and decides whether the peer left or was lost.
func (p *peer) sendLoop(ctx context.Context, stream grpc.ClientStream) {
	defer p.m.wg.Done()
	defer close(p.sendDone)
	o := &p.out
	abort := func() {
		o.drop()
		_ = stream.SendMsg(&msg{typ: msgAbort, body: []byte(p.m.abortMsg)})
	}
	for {
		batch := o.take()
		if len(batch) == 0 {
			select {
			case <-o.ready:
				continue
			case <-p.m.aborting:
				abort()
				return
			case <-p.m.flushing:
				if o.untaken() > 0 {
					continue
				}
				if stream.SendMsg(&msg{typ: msgGoodbye}) == nil {
					_ = stream.CloseSend()
				}
				return
			case <-ctx.Done():
				return
			}
		}
		for i := range batch {
			select {
			case <-p.m.aborting:
				abort()
				return
			default:
			}
			f := &batch[i]
			if err := stream.SendMsg(&msg{typ: msgFrame, kind: f.kind, body: f.payload}); err != nil {
				return
			}
			o.wrote(len(f.payload))
			*f = outFrame{}
		}
	}
}

// selfLoop hands frames a process sends itself to its own inbox and
// handlers, in order, through the same path as a remote peer's frames.
func (p *peer) selfLoop() {
	defer p.m.wg.Done()
	o := &p.out
	for {
		batch := o.take()
		if len(batch) == 0 {
			select {
			case <-o.ready:
				continue
			case <-p.m.flushing:
				return
			case <-p.m.ctx.Done():
				return
			}
		}
		for i := range batch {
			f := &batch[i]
			o.wrote(len(f.payload))
			p.framesIn.Add(1)
			p.bytesIn.Add(int64(len(f.payload)))
			if err := p.m.deliver(p.index, f.kind, f.payload); err != nil {
				p.m.fail(errorf(ErrProtocol, err, "process %d (%s, this process) %v", p.index, p.addr, err))
				return
			}
			*f = outFrame{}
		}
	}
}
