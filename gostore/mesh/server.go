package mesh

import (
	"crypto/hmac"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The gRPC service, written by hand (no protoc): one streaming method. A
// stream from process i to process j carries i's frames to j; the
// direction back carries only j's handshake answers, heartbeats and
// goodbye, which is why it is declared bidirectional.
const (
	serviceName = "millpond.mesh.v1.Mesh"
	streamName  = "Stream"
	fullMethod  = "/" + serviceName + "/" + streamName
)

// maxMessage is the largest message on a stream: a frame header and the
// largest payload.
const maxMessage = MaxPayload + 2

// streamServer is what the service's handler calls.
type streamServer interface {
	serveStream(grpc.ServerStream) error
}

func streamDesc() grpc.StreamDesc {
	return grpc.StreamDesc{
		StreamName:    streamName,
		Handler:       func(srv any, ss grpc.ServerStream) error { return srv.(streamServer).serveStream(ss) },
		ClientStreams: true,
		ServerStreams: true,
	}
}

func serviceDesc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: serviceName,
		HandlerType: (*streamServer)(nil),
		Streams:     []grpc.StreamDesc{streamDesc()},
		Metadata:    "gostore/mesh",
	}
}

// serveStream serves one inbound stream: the handshake, then a receive
// goroutine that delivers the peer's frames while this goroutine sends
// heartbeats back, until the peer says goodbye, the stream breaks, this
// process closes (goodbye back) or stops.
func (m *Mesh) serveStream(ss grpc.ServerStream) error {
	remote := remoteAddr(ss)
	from, err := m.answerWithin(ss)
	if err != nil {
		var r *refusedError
		if errors.As(err, &r) {
			m.log.Warn("refused a cluster connection", "remote", remote, "reason", r.reason)
		} else {
			m.log.Debug("a cluster handshake did not complete", "remote", remote, "error", err)
		}
		return status.Error(codes.Unavailable, "handshake did not complete")
	}
	p := m.peers[from]
	served, why, retry := m.register(p)
	if served == nil {
		_ = ss.SendMsg(&msg{typ: msgRefuse, body: refusal{retry: retry, reason: why}.encode()})
		m.log.Warn("refused a cluster connection", "remote", remote, "peer", from, "reason", why)
		return status.Error(codes.Unavailable, why)
	}
	defer m.unregister(p, served)
	p.heard()
	if err := ss.SendMsg(&msg{typ: msgAccept}); err != nil {
		p.ended("the stream from it broke during the handshake: " + statusMessage(err))
		return nil
	}
	m.log.Debug("accepted a cluster stream", "peer", from, "remote", remote)
	m.signalChange()

	received := make(chan error, 1)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		received <- m.receive(p, ss)
	}()
	tick := time.NewTicker(m.s.heartbeat)
	defer tick.Stop()
	for {
		select {
		case err := <-received:
			switch {
			case err == nil:
			case errors.As(err, new(abortedError)):
				p.ended("it stopped: " + err.Error())
			case errors.Is(err, io.EOF):
				p.ended("it closed its stream to this process without saying goodbye")
			case errors.Is(err, ErrProtocol):
				if p.m.live() {
					m.fail(errorf(ErrProtocol, err, "process %d (%s) broke the cluster protocol: %v", p.index, p.addr, errors.Unwrap(err)))
				}
			default:
				p.ended("its stream to this process broke: " + statusMessage(err))
			}
			// If that (or anything) failed the mesh, say why before the
			// stream ends: an end without a word would reach the peer
			// first and hide the cause.
			select {
			case <-m.aborting:
				_ = ss.SendMsg(&msg{typ: msgAbort, body: []byte(m.abortMsg)})
			default:
			}
			return nil
		case <-tick.C:
			_ = ss.SendMsg(&msg{typ: msgHeartbeat})
		case <-p.leave:
			_ = ss.SendMsg(&msg{typ: msgGoodbye})
			return nil
		case <-m.aborting:
			_ = ss.SendMsg(&msg{typ: msgAbort, body: []byte(m.abortMsg)})
			return nil
		case <-m.ctx.Done():
			return status.Error(codes.Unavailable, "the process is stopping")
		}
	}
}

// abortedError is the reason an aborting peer sent.
type abortedError string

func (e abortedError) Error() string { return string(e) }

// protocolError marks a receive error that is the peer's fault.
type protocolError struct{ err error }

func (e protocolError) Error() string   { return e.err.Error() }
func (e protocolError) Unwrap() error   { return e.err }
func (e protocolError) Is(t error) bool { return t == ErrProtocol }

// receive reads the peer's frames and delivers them in order. It returns
// nil after the peer's goodbye, else the error that ended the stream.
func (m *Mesh) receive(p *peer, ss grpc.ServerStream) error {
	for {
		var w msg
		if err := ss.RecvMsg(&w); err != nil {
			return err
		}
		p.heard()
		switch w.typ {
		case msgFrame:
			p.framesIn.Add(1)
			p.bytesIn.Add(int64(len(w.body)))
			if err := m.deliver(p.index, w.kind, w.body); err != nil {
				return protocolError{err}
			}
		case msgHeartbeat:
		case msgGoodbye:
			p.markLeft()
			return nil
		case msgAbort:
			return abortedError(w.body)
		default:
			return protocolError{fmt.Errorf("sent message type %d after the handshake", w.typ)}
		}
	}
}

// register makes p's inbound stream the served one. It returns nil, why
// and whether a later try may pass when that cannot be: this process is
// stopping, it serves a stream from that process already (two processes
// with one index), or that process's stream ended before (it left or was
// restarted: a cluster restarts as a whole, it does not take a process
// back).
func (m *Mesh) register(p *peer) (served chan struct{}, why string, retry bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case !m.live():
		return nil, "it is shutting down", true
	case p.inServing != nil:
		return nil, fmt.Sprintf("it already has a stream from process %d (were two processes started with index %d?)", p.index, p.index), true
	case p.inUp:
		return nil, fmt.Sprintf("process %d left its running cluster before; restart the whole cluster", p.index), false
	}
	p.inServing = make(chan struct{})
	p.inUp = true
	return p.inServing, "", false
}

func (m *Mesh) unregister(p *peer, served chan struct{}) {
	m.mu.Lock()
	p.inServing = nil
	m.mu.Unlock()
	close(served)
}

// answerWithin runs the server's half of the handshake, giving up after
// the handshake timeout or when the mesh stops.
func (m *Mesh) answerWithin(ss grpc.ServerStream) (int, error) {
	type result struct {
		from int
		err  error
	}
	done := make(chan result, 1)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		from, err := m.answer(ss)
		done <- result{from, err}
	}()
	t := time.NewTimer(m.s.handshake)
	defer t.Stop()
	select {
	case r := <-done:
		return r.from, r.err
	case <-t.C:
		return -1, fmt.Errorf("no handshake within %s", formatDuration(m.s.handshake))
	case <-m.ctx.Done():
		return -1, errors.New("the process is stopping")
	}
}

// refusedError is a handshake this process refused, with the reason it
// sent.
type refusedError struct{ reason string }

func (e *refusedError) Error() string { return "refused: " + e.reason }

// answer is the server's half of the handshake (see handshake.go). It
// returns the proven peer's index.
func (m *Mesh) answer(ss grpc.ServerStream) (int, error) {
	refuse := func(code refusalCode, reason string) error {
		_ = ss.SendMsg(&msg{typ: msgRefuse, body: refusal{code: code, reason: reason}.encode()})
		return &refusedError{reason}
	}
	var w msg
	if err := ss.RecvMsg(&w); err != nil {
		return -1, fmt.Errorf("reading its hello: %w", err)
	}
	if w.typ != msgHello {
		return -1, fmt.Errorf("it sent message type %d instead of a hello", w.typ)
	}
	helloBytes := w.body
	h, err := decodeHello(helloBytes)
	var ve errVersion
	if errors.As(err, &ve) {
		return -1, refuse(refusedVersion, fmt.Sprintf("it speaks version %d of the millpond cluster protocol, this process version %d", protocolVersion, ve.version))
	}
	if err != nil {
		return -1, err
	}
	c := challenge{index: m.index, count: m.n, nonce: newNonce(), identity: m.s.Identity}
	body, signed := signedChallenge(m.s.Secret, helloBytes, &c)
	if err := ss.SendMsg(&msg{typ: msgChallenge, body: signed}); err != nil {
		return -1, fmt.Errorf("sending its challenge: %w", err)
	}
	if err := ss.RecvMsg(&w); err != nil {
		return -1, fmt.Errorf("waiting for its proof: %w", err)
	}
	if w.typ == msgRefuse {
		m.unproven(h, ss, "could not check this process's proof of the cluster secret")
		return -1, fmt.Errorf("it could not check this process's MAC: %s", decodeRefusal(w.body).reason)
	}
	want := handshakeMAC(m.s.Secret, "client", helloBytes, body)
	if w.typ != msgProof || !hmac.Equal(w.body, want) {
		m.unproven(h, ss, "could not prove it knows the cluster secret")
		return -1, refuse(refusedAuth, "the connecting process did not prove it knows the cluster secret: every process must be started with the same secret (MILLPOND_CLUSTER_SECRET)")
	}
	// Proven. Check its claims as the client checked this process's; a
	// disagreement with a process of the cluster stops a Start here too.
	var bad error
	switch {
	case h.to != m.index || h.from < 0 || h.from >= m.n || h.from == m.index:
		bad = errorf(ErrIdentityMismatch, nil, "the process at %s (process %d of %d by its own list) dialed this process as process %d, but this is process %d of %d: the processes were started with different address lists",
			remoteAddr(ss), h.from, h.count, h.to, m.index, m.n)
	default:
		if d := disagreement(m.n, h.count, m.s.Identity, h.identity); d != "" {
			bad = errorf(ErrIdentityMismatch, nil, "process %d (%s) disagrees on %s", h.from, m.s.Addresses[h.from], d)
		}
	}
	if bad != nil {
		if m.state.Load() == stateStarting {
			m.fail(bad)
		}
		return -1, refuse(refusedIdentity, "it disagrees: "+bad.Error())
	}
	return h.from, nil
}

// remoteAddr is the network address a served stream comes from.
func remoteAddr(ss grpc.ServerStream) string {
	if pr, ok := grpcpeer.FromContext(ss.Context()); ok {
		return pr.Addr.String()
	}
	return "an unknown address"
}

// unproven records, for StartTimeout's error, that a connection claiming
// to come from a process of the cluster failed authentication. The claim
// itself is unproven, so it fails nothing.
func (m *Mesh) unproven(h hello, ss grpc.ServerStream, what string) {
	if h.from < 0 || h.from >= m.n || h.from == m.index {
		return
	}
	p := m.peers[h.from]
	m.mu.Lock()
	p.unproven = fmt.Sprintf("a process connected from %s as process %d but %s", remoteAddr(ss), h.from, what)
	m.mu.Unlock()
}
