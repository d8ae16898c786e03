package mesh

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// impostorServer speaks the protocol but does not know the secret: it
// answers a hello with a challenge under another secret and records every
// message it gets after that.
type impostorServer struct {
	mu   sync.Mutex
	got  []msgType
	done chan struct{}
}

func (s *impostorServer) serveStream(ss grpc.ServerStream) error {
	defer close(s.done)
	var w msg
	if err := ss.RecvMsg(&w); err != nil {
		return err
	}
	s.record(w.typ)
	c := challenge{index: 1, count: 2, nonce: newNonce(), identity: map[string]string{"flow": "test"}}
	_, signed := signedChallenge([]byte("not the secret"), w.body, &c)
	if err := ss.SendMsg(&msg{typ: msgChallenge, body: signed}); err != nil {
		return err
	}
	for {
		if err := ss.RecvMsg(&w); err != nil {
			return nil
		}
		s.record(w.typ)
	}
}

func (s *impostorServer) record(t msgType) {
	s.mu.Lock()
	s.got = append(s.got, t)
	s.mu.Unlock()
}

func TestAServerWithoutTheSecretReceivesNothing(t *testing.T) {
	checkLeaks(t)
	imp := &impostorServer{done: make(chan struct{})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}))
	srv.RegisterService(serviceDesc(), imp)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	cfg := testConfig([]string{freeAddrs(t, 1)[0], lis.Addr().String()}, 0)
	cfg.Secret = []byte("the secret")
	_, err = Start(context.Background(), cfg)
	require.ErrorIs(t, err, ErrAuthentication)
	select {
	case <-imp.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the impostor's stream did not end")
	}
	imp.mu.Lock()
	defer imp.mu.Unlock()
	// The hello, and a note that its MAC did not check out: no proof, no
	// frame, no heartbeat.
	assert.Equal(t, []msgType{msgHello, msgRefuse}, imp.got)
}

func TestAClientWithoutTheSecretDeliversNothing(t *testing.T) {
	checkLeaks(t)
	cases := []struct {
		name  string
		proof []byte // nil: frames instead of a proof
	}{
		{"wrong proof", make([]byte, macSize)},
		{"frames instead of a proof", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addrs := freeAddrs(t, 2) // process 1 never starts: process 0 waits
			cfg := testConfig(addrs, 0)
			cfg.Secret = []byte("the secret")
			var handled atomic.Int64
			cfg.Handlers = map[byte]func(int, []byte){5: func(int, []byte) { handled.Add(1) }}
			s, err := validate(cfg)
			require.NoError(t, err)
			m := newMesh(s)
			require.NoError(t, m.begin())
			defer func() {
				m.fail(errors.New("test over"))
				<-m.finished
			}()

			cc, err := grpc.NewClient("passthrough:///"+addrs[0],
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
			require.NoError(t, err)
			defer cc.Close()
			desc := streamDesc()
			stream, err := cc.NewStream(context.Background(), &desc, fullMethod)
			require.NoError(t, err)
			h := hello{version: protocolVersion, from: 1, to: 0, count: 2, nonce: newNonce(), identity: map[string]string{"flow": "test"}}
			require.NoError(t, stream.SendMsg(&msg{typ: msgHello, body: h.encode()}))
			var w msg
			require.NoError(t, stream.RecvMsg(&w))
			require.Equal(t, msgChallenge, w.typ)
			if c.proof != nil {
				_ = stream.SendMsg(&msg{typ: msgProof, body: c.proof})
			}
			for range 10 {
				_ = stream.SendMsg(&msg{typ: msgFrame, kind: 0, body: []byte("data")})
				_ = stream.SendMsg(&msg{typ: msgFrame, kind: 5, body: []byte("control")})
			}
			// The server answers with a refusal and ends the stream.
			var types []msgType
			for {
				if err := stream.RecvMsg(&w); err != nil {
					break
				}
				types = append(types, w.typ)
			}
			require.Equal(t, []msgType{msgRefuse}, types)
			r := decodeRefusal(w.body)
			assert.Equal(t, refusedAuth, r.code)
			assert.False(t, r.retry)

			time.Sleep(100 * time.Millisecond)
			assert.Nil(t, m.Drain())
			assert.Zero(t, handled.Load())
			assert.Zero(t, m.peers[1].framesIn.Load())
			m.mu.Lock()
			assert.False(t, m.peers[1].inUp)
			assert.Contains(t, m.peers[1].unproven, "as process 1 but could not prove it knows the cluster secret")
			m.mu.Unlock()
		})
	}
}
