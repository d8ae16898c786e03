package mesh

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// Dial attempts during Start back off from firstBackoff to maxBackoff.
const (
	firstBackoff = 50 * time.Millisecond
	maxBackoff   = time.Second
)

// outbound is an established stream to a peer.
type outbound struct {
	cc     *grpc.ClientConn
	stream grpc.ClientStream
	ctx    context.Context
	cancel context.CancelFunc
}

// dialFailure is a failed attempt: permanent ones fail Start at once.
type dialFailure struct {
	err       error
	permanent bool
	suspect   string // reached something that said nothing (reported at StartTimeout)
}

// dialLoop dials p until the stream is up, a permanent failure fails the
// mesh, or the mesh stops (StartTimeout is Start's to enforce).
func (m *Mesh) dialLoop(p *peer) {
	defer m.wg.Done()
	delay := firstBackoff
	for {
		timeout := min(m.s.handshake, max(time.Until(m.deadline), 100*time.Millisecond))
		ob, f := m.dialOnce(p, timeout)
		if f == nil {
			m.attach(p, ob)
			return
		}
		if !m.live() {
			return
		}
		if f.permanent {
			m.fail(f.err)
			return
		}
		m.log.Debug("cluster dial attempt failed", "peer", p.index, "address", p.addr, "error", f.err)
		m.mu.Lock()
		p.lastErr, p.lastErrAt, p.suspect = f.err, time.Now(), f.suspect
		m.mu.Unlock()
		jittered := delay/2 + rand.N(delay/2+1)
		select {
		case <-m.ctx.Done():
			return
		case <-time.After(jittered):
		}
		delay = min(delay*2, maxBackoff)
	}
}

// attach starts the sender and the back reader of an established
// outbound stream.
func (m *Mesh) attach(p *peer, ob *outbound) {
	m.mu.Lock()
	if !m.live() {
		m.mu.Unlock()
		ob.cancel()
		_ = ob.cc.Close()
		return
	}
	p.cc = ob.cc
	p.outUp = true
	p.heard()
	m.mu.Unlock()
	m.wg.Add(2)
	go p.sendLoop(ob.ctx, ob.stream)
	go p.readBack(ob.stream, ob.cancel)
	m.log.Debug("cluster stream up", "peer", p.index, "address", p.addr)
	m.signalChange()
}

// dialOnce makes one connection and runs the client's half of the
// handshake on it, within timeout.
func (m *Mesh) dialOnce(p *peer, timeout time.Duration) (*outbound, *dialFailure) {
	ctx, cancel := context.WithCancel(m.ctx)
	pr := &probe{onForeign: cancel, tls: m.s.tls != nil}
	m.mu.Lock()
	p.attempt = pr
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		p.attempt = nil
		m.mu.Unlock()
	}()
	var timedOut atomic.Bool
	timer := time.AfterFunc(timeout, func() { timedOut.Store(true); cancel() })
	cc, err := grpc.NewClient("passthrough:///"+p.addr, m.dialOptions(p, pr)...)
	if err != nil {
		timer.Stop()
		cancel()
		return nil, &dialFailure{err: fmt.Errorf("process %d (%s): cannot set up a connection: %w", p.index, p.addr, err), permanent: true}
	}
	stream, err := m.greet(ctx, cc, p, pr)
	if timer.Stop() && err == nil {
		return &outbound{cc: cc, stream: stream, ctx: ctx, cancel: cancel}, nil
	}
	cancel()
	_ = cc.Close()
	if err == nil {
		err = context.DeadlineExceeded
	}
	return nil, m.classify(p, pr, err, timedOut.Load(), timeout)
}

// handshakeError is a handshake step that went wrong on the millpond
// level (the peer spoke the protocol).
type handshakeError struct {
	err       error
	permanent bool
}

func (e *handshakeError) Error() string { return e.err.Error() }
func (e *handshakeError) Unwrap() error { return e.err }

// greet is the client's half of the handshake (see handshake.go).
func (m *Mesh) greet(ctx context.Context, cc *grpc.ClientConn, p *peer, pr *probe) (grpc.ClientStream, error) {
	desc := streamDesc()
	stream, err := cc.NewStream(ctx, &desc, fullMethod)
	if err != nil {
		return nil, err
	}
	h := hello{version: protocolVersion, from: m.index, to: p.index, count: m.n, nonce: newNonce(), identity: m.s.Identity}
	helloBytes := h.encode()
	if err := stream.SendMsg(&msg{typ: msgHello, body: helloBytes}); err != nil {
		return nil, m.streamEnd(stream, err)
	}
	var w msg
	if err := stream.RecvMsg(&w); err != nil {
		return nil, err
	}
	pr.spoke.Store(true)
	permanent := func(kind error, format string, args ...any) error {
		args = append([]any{p.index, p.addr}, args...)
		return &handshakeError{err: errorf(kind, nil, "process %d (%s) "+format, args...), permanent: true}
	}
	if w.typ == msgRefuse {
		return nil, refusedBy(p, decodeRefusal(w.body))
	}
	if w.typ != msgChallenge {
		return nil, permanent(ErrProtocol, "answered the hello with message type %d", w.typ)
	}
	body, mac, err := splitMAC(w.body)
	if err != nil {
		return nil, permanent(ErrProtocol, "sent a malformed challenge: %v", err)
	}
	if !hmac.Equal(mac, handshakeMAC(m.s.Secret, "server", helloBytes, body)) {
		// Say so (unproven, so the server only notes it) and hang up, once
		// the note is out: the caller's cancel right after could reset the
		// stream before gRPC wrote it. The server ends the stream when it
		// has read it; a server that does not is waited for one second.
		_ = stream.SendMsg(&msg{typ: msgRefuse, body: refusal{code: refusedAuth, reason: "bad server MAC"}.encode()})
		drainAfterRefusal(stream)
		return nil, permanent(ErrAuthentication, "failed authentication: it does not know this process's cluster secret (every process must be started with the same MILLPOND_CLUSTER_SECRET)")
	}
	c, err := decodeChallenge(body)
	if err != nil {
		return nil, permanent(ErrProtocol, "sent a malformed challenge: %v", err)
	}
	// The server is proven. Prove this process too, even when the two
	// disagree: the server then knows the disagreement comes from a
	// process of its cluster and stops its own Start as well.
	proof := handshakeMAC(m.s.Secret, "client", helloBytes, body)
	sendErr := stream.SendMsg(&msg{typ: msgProof, body: proof})
	var bad error
	if c.index != p.index {
		bad = permanent(ErrIdentityMismatch, "answers as process %d: the processes were started with different address lists", c.index)
	} else if d := disagreement(m.n, c.count, m.s.Identity, c.identity); d != "" {
		bad = permanent(ErrIdentityMismatch, "disagrees on %s", d)
	}
	if bad != nil {
		// This Start fails now and closes this process's listener; the
		// server must have read the proof first, or it would learn of the
		// disagreement from nobody and wait out its start timeout as for
		// a process that never came (the cancel right after could reset
		// the stream before gRPC wrote the proof). It ends the stream
		// with its refusal once it has.
		if sendErr == nil {
			drainAfterRefusal(stream)
		}
		return nil, bad
	}
	if sendErr != nil {
		return nil, m.streamEnd(stream, sendErr)
	}
	if err := stream.RecvMsg(&w); err != nil {
		return nil, err
	}
	switch w.typ {
	case msgAccept:
		return stream, nil
	case msgRefuse:
		return nil, refusedBy(p, decodeRefusal(w.body))
	}
	return nil, permanent(ErrProtocol, "answered the proof with message type %d", w.typ)
}

// streamEnd turns a failed SendMsg into the stream's status: SendMsg
// reports io.EOF when the stream ended, RecvMsg says why.
func (m *Mesh) streamEnd(stream grpc.ClientStream, err error) error {
	var w msg
	if rerr := stream.RecvMsg(&w); rerr != nil {
		return rerr
	}
	return err
}

func refusedBy(p *peer, r refusal) error {
	err := errorf(r.code.kind(), nil, "process %d (%s) refused the connection: %s", p.index, p.addr, r.reason)
	return &handshakeError{err: err, permanent: !r.retry}
}

// classify turns a failed attempt into a dialFailure: retry, give up now,
// or retry but suspect the peer is no millpond process.
func (m *Mesh) classify(p *peer, pr *probe, err error, timedOut bool, timeout time.Duration) *dialFailure {
	var he *handshakeError
	if errors.As(err, &he) {
		return &dialFailure{err: he.err, permanent: he.permanent}
	}
	foreign := func(format string, args ...any) *dialFailure {
		args = append([]any{p.index, p.addr}, args...)
		return &dialFailure{err: errorf(ErrForeignProtocol, nil, "process %d (%s) does not speak the millpond cluster protocol: "+format, args...), permanent: true}
	}
	pr.mu.Lock()
	connected, dialErr, head, closed := !pr.connected.IsZero(), pr.dialErr, string(pr.head), pr.closed
	isForeign, plain, tlsPeer, tlsErr := pr.foreign, pr.plain, pr.tlsPeer, pr.tlsErr
	pr.mu.Unlock()
	mismatch := func(format string) *dialFailure {
		return &dialFailure{err: errorf(ErrTLSMismatch, nil, format+": every process must be started with the same TLS settings", p.index, p.addr), permanent: true}
	}
	switch {
	case plain:
		return mismatch("process %d (%s) does not use TLS (it answered in plain text) and this process does")
	case tlsPeer:
		return mismatch("process %d (%s) uses TLS (it answered with a TLS record) and this process does not")
	case tlsErr != nil:
		if f := m.tlsFailure(p, tlsErr); f != nil {
			return f
		}
	}
	switch {
	case isForeign:
		return foreign("it answered %s", strconv.Quote(head))
	case !connected && dialErr != nil:
		return &dialFailure{err: dialErr}
	case timedOut && connected && head == "":
		return &dialFailure{err: fmt.Errorf("no answer within %s", formatDuration(timeout)),
			suspect: fmt.Sprintf("it accepted the connection but sent nothing within %s", formatDuration(timeout))}
	case timedOut:
		return &dialFailure{err: fmt.Errorf("no answer to the handshake within %s", formatDuration(timeout))}
	}
	code := status.Code(err)
	switch code {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
		if connected && head == "" && closed {
			return &dialFailure{err: errors.New("it closed the connection without a word"),
				suspect: "it accepted the connection and closed it without a word"}
		}
		return &dialFailure{err: errors.New(statusMessage(err))}
	}
	if !pr.spoke.Load() {
		return foreign("it answered with %s (%s)", code, statusMessage(err))
	}
	return &dialFailure{err: errors.New(statusMessage(err))}
}

// dialOptions sets up one attempt's connection to p.
func (m *Mesh) dialOptions(p *peer, pr *probe) []grpc.DialOption {
	var d net.Dialer
	creds := insecure.NewCredentials()
	if m.s.tls != nil {
		host, _, _ := net.SplitHostPort(p.addr)
		creds = &clientCreds{TransportCredentials: credentials.NewTLS(m.s.tls.client(host)), pr: pr}
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, "tcp", addr)
			pr.dialed(err)
			if err != nil {
				return nil, err
			}
			return &sniffConn{Conn: c, p: pr}, nil
		}),
		grpc.WithNoProxy(),
		grpc.WithDisableRetry(),
		grpc.WithDisableServiceConfig(),
		grpc.WithUserAgent("millpond-mesh/" + strconv.Itoa(protocolVersion)),
		grpc.WithInitialWindowSize(m.s.window),
		grpc.WithInitialConnWindowSize(m.s.window),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: m.s.PeerTimeout, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: firstBackoff, Multiplier: 2, Jitter: 0.2, MaxDelay: maxBackoff},
			MinConnectTimeout: m.s.handshake,
		}),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)),
	}
}

// probe watches one attempt's connection: whether it connected, and
// whether the first bytes the peer sent can be the start of an HTTP/2
// server's greeting (a SETTINGS frame on stream 0) or, with TLS, of a TLS
// record. Anything else is a foreign protocol, known at its first wrong
// byte, and the attempt stops; so does a peer that answers with TLS to a
// process without, or in plain HTTP/2 to a process with TLS.
type probe struct {
	onForeign func()
	tls       bool        // this process dials with TLS
	spoke     atomic.Bool // a millpond handshake message arrived
	full      atomic.Bool // enough bytes seen

	mu        sync.Mutex
	connected time.Time // zero until the TCP connection is up
	dialErr   error
	head      []byte // the first bytes the peer sent (at most headSize)
	closed    bool   // the connection ended before any byte
	foreign   bool
	plain     bool  // TLS expected, an HTTP/2 greeting came
	tlsPeer   bool  // plain text expected, a TLS record came
	tlsErr    error // why the TLS handshake failed, or the alert the peer sent after it
}

// tlsFailed records the first TLS error of the attempt.
func (pr *probe) tlsFailed(err error) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.tlsErr == nil {
		pr.tlsErr = err
	}
}

// headSize is how much of a foreign greeting an error message quotes.
const headSize = 32

func (pr *probe) dialed(err error) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if err != nil {
		pr.dialErr = err
		return
	}
	pr.connected = time.Now()
}

// silence is how long the connection has been up without the peer sending
// a byte; zero if it is not up or the peer sent something.
func (pr *probe) silence() time.Duration {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.connected.IsZero() || len(pr.head) > 0 || pr.closed {
		return 0
	}
	return time.Since(pr.connected)
}

func (pr *probe) observe(b []byte, err error) {
	pr.mu.Lock()
	start := len(pr.head)
	pr.head = append(pr.head, b[:min(len(b), headSize-start)]...)
	if len(pr.head) == 0 && err != nil {
		pr.closed = true
	}
	wasDecided := pr.foreign || pr.plain || pr.tlsPeer
	decided := wasDecided
	if !wasDecided {
		switch judgeHead(pr.head, pr.tls) {
		case headForeign:
			pr.foreign, decided = true, true
		case headPlain:
			pr.plain, decided = true, true
		case headTLS:
			pr.tlsPeer, decided = true, true
		case headOK:
			pr.full.Store(true)
		}
	}
	if len(pr.head) >= headSize || decided {
		pr.full.Store(true)
	}
	pr.mu.Unlock()
	if decided && !wasDecided {
		pr.onForeign()
	}
}

// headVerdict is what the first bytes from a peer say.
type headVerdict int

const (
	headUndecided headVerdict = iota // too few bytes yet
	headOK                           // what this process expects
	headForeign                      // another protocol
	headPlain                        // an HTTP/2 greeting where TLS was expected
	headTLS                          // a TLS record where an HTTP/2 greeting was expected
)

// judgeHead tells from the first bytes of a peer whether they start what
// this process expects: a TLS record when tlsMode, else an HTTP/2
// server's SETTINGS frame.
func judgeHead(head []byte, tlsMode bool) headVerdict {
	if len(head) == 0 {
		return headUndecided
	}
	if head[0] == 0x15 || head[0] == tlsHandshakeRecord { // alert or handshake record
		if len(head) < 3 {
			return headUndecided
		}
		if head[1] != 0x03 || head[2] > 0x04 { // record version 3.x
			return headForeign
		}
		if tlsMode {
			return headOK
		}
		return headTLS
	}
	for i := 0; i < len(head) && i < 9; i++ {
		if !settingsByteOK(i, head[i]) {
			return headForeign
		}
	}
	switch {
	case tlsMode && len(head) >= 4:
		return headPlain // the type byte says SETTINGS
	case !tlsMode && len(head) >= 9:
		return headOK
	}
	return headUndecided
}

// settingsByteOK reports whether byte i of a frame header can be that of
// an HTTP/2 server's first frame: a non-ACK SETTINGS frame on stream 0,
// of length under 64 KiB.
func settingsByteOK(i int, b byte) bool {
	switch i {
	case 0: // length, high byte
		return b == 0
	case 3: // type
		return b == 0x4
	case 4, 5, 6, 7, 8: // flags, stream id
		return b == 0
	}
	return true
}

// sniffConn is a connection whose first bytes read go to its probe.
type sniffConn struct {
	net.Conn
	p *probe
}

func (c *sniffConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if !c.p.full.Load() {
		c.p.observe(b[:n], err)
	}
	return n, err
}

// keepaliveTime is gRPC's keepalive ping interval, the smallest it allows
// a client; heartbeats detect silence sooner.
const keepaliveTime = 10 * time.Second

// drainAfterRefusal half-closes stream and waits (at most a second) until
// the server ends it, so that what was sent last reaches the server.
func drainAfterRefusal(stream grpc.ClientStream) {
	_ = stream.CloseSend()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var w msg
		for stream.RecvMsg(&w) == nil {
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		// The caller's cancel ends the stream, and the reader with it.
	}
}
