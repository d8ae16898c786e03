package mesh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

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
	m.epoch = time.Now()
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
	var lis net.Listener
	if m.n > 1 {
		var err error
		lis, err = net.Listen("tcp", m.s.listen)
		if err != nil {
			m.cancel()
			close(m.finished)
			return m.listenError(err)
		}
		m.srv = grpc.NewServer(m.serverOptions()...)
		m.srv.RegisterService(serviceDesc(), m)
	}
	// Every goroutine is counted before the first starts: a dialer that
	// fails at once (a peer that fails authentication) tears the mesh
	// down, which waits for them all, and an Add once that Wait has begun
	// is a race.
	remote := m.remote()
	count := 1 + len(remote) // the self loop and a dialer per peer
	if m.n > 1 {
		count += 2 // the server and the watchdog
	}
	m.wg.Add(count)
	if m.n > 1 {
		go func() {
			defer m.wg.Done()
			_ = m.srv.Serve(lis)
		}()
	}
	go m.peers[m.index].selfLoop()
	for _, p := range remote {
		go m.dialLoop(p)
	}
	if m.n > 1 {
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
		grpc.Creds(newServerCreds(m.s.tls, m.refusedConnection)),
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
	connecting := false
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
		if !p.outUp && p.lastErr == nil {
			// Its first attempt has not ended: a slow machine, or a
			// peer that accepted just now and has not answered yet.
			connecting = true
		}
	}
	who := "process " + names[0]
	if len(names) > 1 {
		who = "processes " + strings.Join(names, ", ")
	}
	refused := ""
	if m.tlsRefusal != "" {
		refused = "; " + m.tlsRefusal
	}
	if last == nil && connecting {
		return errorf(ErrNotJoined, nil, "%s did not join within %s (this process's first connection to them had not been answered yet)%s", who, within, refused)
	}
	if last == nil {
		return errorf(ErrNotJoined, nil, "%s did not join within %s (this process reached them, they did not connect back)%s", who, within, refused)
	}
	return errorf(ErrNotJoined, last, "%s did not join within %s (last error: %v)%s", who, within, last, refused)
}
