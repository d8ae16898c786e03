package cluster

import (
	"sync"

	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/mesh"
)

// durableLink is the durable layer's view of the cluster (durable.Cluster).
// Messages are queued without bound as they arrive: the mesh's receive
// goroutine must never wait for the durable layer (which may itself wait
// for the mesh), and control messages are few and small.
type durableLink struct {
	index, count int

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []durable.ClusterMessage
	err     error
	out     chan durable.ClusterMessage
	started bool

	mesh *mesh.Mesh
	kind byte
}

func newDurableLink(index, count int) *durableLink {
	l := &durableLink{index: index, count: count, out: make(chan durable.ClusterMessage)}
	l.cond = sync.NewCond(&l.mu)
	go l.pump()
	return l
}

func (l *durableLink) attach(m *mesh.Mesh, kind byte) {
	l.mu.Lock()
	l.mesh, l.kind = m, kind
	l.mu.Unlock()
	go func() {
		<-m.Done()
		if err := m.Err(); err != nil {
			l.fail(err)
		} else {
			// Closed in good order: what the peers sent before they said
			// goodbye (the leader's last commit) is still delivered.
			l.end(errClosed)
		}
	}()
}

// pump hands queued messages to Inbox's reader in order, and closes the
// inbox once the cluster failed and the queue is empty.
func (l *durableLink) pump() {
	for {
		l.mu.Lock()
		for len(l.queue) == 0 && l.err == nil {
			l.cond.Wait()
		}
		if len(l.queue) == 0 {
			l.mu.Unlock()
			close(l.out)
			return
		}
		m := l.queue[0]
		l.queue = l.queue[1:]
		l.mu.Unlock()
		l.out <- m
	}
}

func (l *durableLink) deliver(from int, p []byte) {
	l.mu.Lock()
	if l.err == nil {
		l.queue = append(l.queue, durable.ClusterMessage{From: from, Payload: append([]byte(nil), p...)})
		l.cond.Signal()
	}
	l.mu.Unlock()
}

// end closes the inbox once the messages already queued were taken.
func (l *durableLink) end(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.cond.Broadcast()
	l.mu.Unlock()
}

// fail closes the inbox at once: messages not yet taken are dropped.
func (l *durableLink) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
		// Messages not yet taken are of no use once the cluster failed:
		// a run reading them would commit after the failure.
		l.queue = nil
	}
	l.cond.Broadcast()
	l.mu.Unlock()
}

func (l *durableLink) Index() int { return l.index }
func (l *durableLink) Count() int { return l.count }

func (l *durableLink) Send(to int, payload []byte) error {
	l.mu.Lock()
	err, m := l.err, l.mesh
	l.mu.Unlock()
	if err != nil {
		return err
	}
	return m.Send(to, l.kind, payload)
}

func (l *durableLink) Inbox() <-chan durable.ClusterMessage { return l.out }

func (l *durableLink) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
