package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
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

	in        inbox
	wake      chan struct{} // Wait's wake-up token
	changed   chan struct{} // a stream came up (Start's loop looks again)
	flushing  chan struct{} // closed by Close: senders write what is queued and say goodbye
	aborting  chan struct{} // closed on failure: every stream tells its peer abortMsg
	abortMsg  string        // set before aborting closes
	congested atomic.Int32  // peers whose queue exceeds MaxInFlight
	sent      atomic.Int64
	received  atomic.Int64

	mu    sync.Mutex // the peers' connection fields
	state atomic.Int32

	errMu sync.Mutex
	err   error

	done         chan struct{} // closed on failure or close
	doneOnce     sync.Once
	finished     chan struct{} // closed when every goroutine has returned
	teardownOnce sync.Once
	closeOnce    sync.Once
	closeErr     error
}

// Start listens on Addresses[Index], dials every other process and runs
// the handshake on every stream. It returns once every pair is up in both
// directions, or with an error: a validation error, the own address in
// use, a peer that refuses or fails authentication or disagrees on the
// Identity, a foreign protocol on a peer's port, peers that did not join
// within StartTimeout, or ctx's end. Peers may start in any order.
func Start(ctx context.Context, cfg Config) (*Mesh, error) {
	s, err := validate(cfg)
	if err != nil {
		return nil, err
	}
	m := newMesh(s)
	if err := m.begin(); err != nil {
		return nil, err
	}
	if err := m.awaitJoined(ctx); err != nil {
		<-m.finished
		return nil, err
	}
	return m, nil
}

func newMesh(s *settings) *Mesh {
	m := &Mesh{
		s:        s,
		log:      s.Logger.With("process", s.Index),
		index:    s.Index,
		n:        len(s.Addresses),
		wake:     make(chan struct{}, 1),
		changed:  make(chan struct{}, 1),
		flushing: make(chan struct{}),
		aborting: make(chan struct{}),
		done:     make(chan struct{}),
		finished: make(chan struct{}),
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.in.init(m.n, s.InboxLimit)
	m.peers = make([]*peer, m.n)
	for i := range m.peers {
		m.peers[i] = newPeer(m, i)
	}
	return m
}

// begin listens, serves, and starts the dialers, the self loop and the
// watchdog.
func (m *Mesh) begin() error {
	m.deadline = time.Now().Add(m.s.StartTimeout)
	if m.n > 1 {
		lis, err := net.Listen("tcp", m.s.listen)
		if err != nil {
			m.cancel()
			close(m.finished)
			return m.listenError(err)
		}
		m.srv = grpc.NewServer(m.serverOptions()...)
		m.srv.RegisterService(serviceDesc(), m)
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			_ = m.srv.Serve(lis)
		}()
	}
	m.wg.Add(1)
	go m.peers[m.index].selfLoop()
	for _, p := range m.remote() {
		m.wg.Add(1)
		go m.dialLoop(p)
	}
	if m.n > 1 {
		m.wg.Add(1)
		go m.watch()
	}
	return nil
}

func (m *Mesh) listenError(err error) error {
	cause := err
	var se *os.SyscallError
	if errors.As(err, &se) {
		cause = se.Err
	} else if oe := (*net.OpError)(nil); errors.As(err, &oe) {
		cause = oe.Err
	}
	return fmt.Errorf("process %d cannot listen on %s: %w", m.index, m.s.Addresses[m.index], cause)
}

func (m *Mesh) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.MaxRecvMsgSize(maxMessage),
		grpc.MaxSendMsgSize(maxMessage),
		grpc.InitialWindowSize(m.s.window),
		grpc.InitialConnWindowSize(m.s.window),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: m.s.PeerTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveTime / 2, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(4),
		grpc.ConnectionTimeout(m.s.handshake),
		grpc.WaitForHandlers(true),
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

// awaitJoined waits until every pair is up, then the mesh runs.
func (m *Mesh) awaitJoined(ctx context.Context) error {
	timer := time.NewTimer(time.Until(m.deadline))
	defer timer.Stop()
	for {
		if m.joined() {
			if m.state.CompareAndSwap(stateStarting, stateRunning) {
				m.log.Info("cluster mesh up", "processes", m.n)
				return nil
			}
			return m.Err()
		}
		select {
		case <-m.changed:
		case <-m.done:
			return m.Err()
		case <-ctx.Done():
			m.fail(fmt.Errorf("process %d stopped waiting for the cluster: %w", m.index, context.Cause(ctx)))
			return m.Err()
		case <-timer.C:
			m.fail(m.notJoined())
			return m.Err()
		}
	}
}

func (m *Mesh) joined() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.remote() {
		if !p.outUp || !p.inUp {
			return false
		}
	}
	return true
}

// notJoined is the StartTimeout error: every peer that is not up in both
// directions, with the latest dial error among them.
func (m *Mesh) notJoined() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var names []string
	var last error
	var lastAt time.Time
	within := formatDuration(m.s.StartTimeout)
	for _, p := range m.remote() {
		if p.outUp && p.inUp {
			continue
		}
		if p.attempt != nil && p.attempt.silence() > 100*time.Millisecond {
			p.suspect = fmt.Sprintf("it accepted the connection but sent nothing within %s", formatDuration(p.attempt.silence().Round(100*time.Millisecond)))
		}
		if p.suspect != "" && !p.outUp {
			return errorf(ErrForeignProtocol, nil, "process %d (%s) does not speak the millpond cluster protocol: %s", p.index, p.addr, p.suspect)
		}
		if p.unproven != "" && !p.inUp {
			return errorf(ErrAuthentication, nil, "process %d (%s) did not join within %s: %s (every process must be started with the same MILLPOND_CLUSTER_SECRET)", p.index, p.addr, within, p.unproven)
		}
		names = append(names, fmt.Sprintf("%d (%s)", p.index, p.addr))
		if p.lastErr != nil && !p.outUp && p.lastErrAt.After(lastAt) {
			last, lastAt = p.lastErr, p.lastErrAt
		}
	}
	who := "process " + names[0]
	if len(names) > 1 {
		who = "processes " + strings.Join(names, ", ")
	}
	if last == nil {
		return errorf(ErrNotJoined, nil, "%s did not join within %s (this process reached them, they did not connect back)", who, within)
	}
	return errorf(ErrNotJoined, last, "%s did not join within %s (last error: %v)", who, within, last)
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

// fail stops the mesh with err, unless it is stopped or closing already:
// the first failure is the one. Done closes at once; the peers are told
// why (an abort on every stream, so they stop naming the cause rather
// than a broken connection), then everything stops in the background
// (finished closes when it has).
func (m *Mesh) fail(err error) { m.stop(err, err.Error(), slog.LevelError) }

// Abort stops the mesh because this process failed for reason: queued
// frames are dropped and every peer stops at once with a *PeerLostError
// whose reason is "it stopped: " + reason. Err then wraps ErrAborted.
// It returns when everything stopped; after a failure or Close it only
// waits for that.
func (m *Mesh) Abort(reason string) {
	m.stop(errorf(ErrAborted, nil, "process %d aborted: %s", m.index, reason), reason, slog.LevelWarn)
	<-m.finished
}

func (m *Mesh) stop(err error, reason string, level slog.Level) {
	var was int32
	for {
		was = m.state.Load()
		if was == stateStopped || was == stateClosing {
			return
		}
		if m.state.CompareAndSwap(was, stateStopped) {
			break
		}
	}
	m.errMu.Lock()
	m.err = err
	m.errMu.Unlock()
	if was == stateStarting {
		level = slog.LevelDebug // Start returns the error; the caller reports it
	}
	m.log.Log(context.Background(), level, "cluster mesh stopped", "error", err)
	m.closeDone()
	m.in.stop()
	m.abortMsg = reason
	close(m.aborting)
	go m.abortAndTeardown()
}

// abortGrace bounds how long a failing process waits for its aborts to be
// written before it stops every connection.
const abortGrace = time.Second

// abortAndTeardown waits (at most abortGrace) until every served stream
// sent its abort and every sender its own, then stops everything.
func (m *Mesh) abortAndTeardown() {
	var waits []chan struct{}
	m.mu.Lock()
	for _, p := range m.remote() {
		if p.inServing != nil {
			waits = append(waits, p.inServing)
		}
		if p.outUp {
			waits = append(waits, p.sendDone)
		}
	}
	m.mu.Unlock()
	grace := time.NewTimer(abortGrace)
	defer grace.Stop()
	for _, ch := range waits {
		select {
		case <-ch:
		case <-grace.C:
			m.teardown(false)
			return
		}
	}
	m.teardown(true)
}

func (m *Mesh) closeDone() { m.doneOnce.Do(func() { close(m.done) }) }

// teardown stops the server and every connection and waits for every
// goroutine. graceful lets the server finish answering what it was
// answering (the goodbyes of Close) for a moment first.
func (m *Mesh) teardown(graceful bool) {
	m.teardownOnce.Do(func() {
		m.cancel()
		m.in.stop()
		if m.srv != nil {
			if graceful {
				stopped := make(chan struct{})
				go func() { m.srv.GracefulStop(); close(stopped) }()
				select {
				case <-stopped:
				case <-time.After(time.Second):
					m.srv.Stop()
					<-stopped
				}
			} else {
				m.srv.Stop()
			}
		}
		m.mu.Lock()
		var ccs []*grpc.ClientConn
		for _, p := range m.peers {
			if p.cc != nil {
				ccs = append(ccs, p.cc)
			}
		}
		m.mu.Unlock()
		for _, cc := range ccs {
			_ = cc.Close()
		}
		m.wg.Wait()
		close(m.finished)
	})
}

// Close stops the mesh gracefully: it refuses further Sends, writes what
// is queued for every peer (waiting at most PeerTimeout in all), says
// goodbye on every stream so that the peers do not report this process
// lost, and stops everything. It returns an error naming the peers that
// did not get everything in time (frames still queued, or written but not
// read); those are not told goodbye, so they report this process lost
// rather than miss frames silently. After a failure Close only waits for the goroutines to end
// and returns nil (Err has the failure). It is idempotent.
func (m *Mesh) Close() error {
	m.closeOnce.Do(func() { m.closeErr = m.close() })
	return m.closeErr
}

func (m *Mesh) close() error {
	if !m.state.CompareAndSwap(stateRunning, stateClosing) {
		<-m.finished
		return nil
	}
	m.log.Info("closing the cluster mesh")
	for _, p := range m.peers {
		p.out.close()
	}
	close(m.flushing)
	deadline := time.NewTimer(m.s.PeerTimeout)
	defer deadline.Stop()
	expired := false
	var problems []string
	var flushed []*peer
	for _, p := range m.remote() {
		if !expired {
			select {
			case <-p.outDone:
			case <-deadline.C:
				expired = true
			}
		}
		select {
		case <-p.outDone:
			flushed = append(flushed, p)
			continue
		default:
		}
		if frames, bytes := p.out.pending(); frames > 0 {
			problems = append(problems, fmt.Sprintf("%d frames (%d bytes) for process %d (%s) were not written", frames, bytes, p.index, p.addr))
		} else {
			problems = append(problems, fmt.Sprintf("process %d (%s) did not read what was written to it (its inbox is full or it is hung)", p.index, p.addr))
		}
	}
	// Goodbye on the inbound streams of the peers that got everything.
	var serving []chan struct{}
	m.mu.Lock()
	for _, p := range flushed {
		close(p.leave)
		if p.inServing != nil {
			serving = append(serving, p.inServing)
		}
	}
	m.mu.Unlock()
	grace := time.NewTimer(time.Second)
	defer grace.Stop()
	for _, ch := range serving {
		select {
		case <-ch:
		case <-grace.C:
		}
	}
	m.state.Store(stateStopped)
	m.closeDone()
	m.teardown(true)
	m.log.Info("cluster mesh closed")
	if len(problems) > 0 {
		return fmt.Errorf("closing process %d: within %s, %s", m.index, formatDuration(m.s.PeerTimeout), strings.Join(problems, "; "))
	}
	return nil
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
