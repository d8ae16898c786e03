package mesh

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// inbox holds the data frames received and not yet drained, in arrival
// order. A peer's receive goroutine that pushed that peer's undrained
// bytes beyond the limit waits here until Drain, so it reads no more
// from the stream and HTTP/2 flow control pushes back on the sender.
type inbox struct {
	mu      sync.Mutex
	cond    sync.Cond
	frames  []Frame
	bytes   []int64 // undrained payload bytes per sender
	limit   int64
	stopped bool
}

func (in *inbox) init(n int, limit int64) {
	in.cond.L = &in.mu
	in.bytes = make([]int64, n)
	in.limit = limit
}

// stop releases every waiting receiver for good.
func (in *inbox) stop() {
	in.mu.Lock()
	in.stopped = true
	in.cond.Broadcast()
	in.mu.Unlock()
}

func (in *inbox) pending() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.frames) > 0
}

// deliver hands one received frame to the process: a control frame to its
// handler, a data frame to the inbox. It returns once the sender's
// undrained bytes are within InboxLimit again (or the mesh stopped).
func (m *Mesh) deliver(from int, kind byte, payload []byte) error {
	if kind != 0 {
		h := m.s.handlers[kind]
		if h == nil {
			return fmt.Errorf("sent a control frame of kind %d, which this process has no handler for", kind)
		}
		h(from, payload)
		return nil
	}
	in := &m.in
	in.mu.Lock()
	in.frames = append(in.frames, Frame{From: from, Payload: payload})
	in.bytes[from] += int64(len(payload))
	in.mu.Unlock()
	m.wakeUp()
	in.mu.Lock()
	for in.bytes[from] > in.limit && !in.stopped {
		in.cond.Wait()
	}
	in.mu.Unlock()
	return nil
}

// Drain returns every data frame received and not yet drained, in arrival
// order (so in send order per peer), and counts them as received. It
// returns nil when there is none. Receivers paused on InboxLimit resume.
func (m *Mesh) Drain() []Frame {
	in := &m.in
	in.mu.Lock()
	fs := in.frames
	if len(fs) == 0 {
		in.mu.Unlock()
		return nil
	}
	in.frames = nil
	clear(in.bytes)
	in.cond.Broadcast()
	in.mu.Unlock()
	m.received.Add(int64(len(fs)))
	return fs
}

// Wait returns when a data frame is waiting to be drained, Notify was
// called, the mesh failed or closed, ctx ends, d passed, or no peer is
// congested any more after one was. It may return early (a wake-up whose
// frame was drained already): callers loop. One goroutine waits at a time;
// a Notify while nobody waits makes the next Wait return at once.
func (m *Mesh) Wait(ctx context.Context, d time.Duration) {
	if d <= 0 || m.in.pending() {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-m.wake:
	case <-m.done:
	case <-ctx.Done():
	case <-t.C:
	}
}

// Notify wakes a Wait (used by control handlers that change what the
// waiter waits for).
func (m *Mesh) Notify() { m.wakeUp() }

func (m *Mesh) wakeUp() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}
