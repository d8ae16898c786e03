package mesh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

func TestStartRefusesBadConfigAtOnce(t *testing.T) {
	checkLeaks(t)
	addrs := freeAddrs(t, 2)
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no addresses", Config{}, "no process addresses"},
		{"index too large", Config{Index: 2, Addresses: addrs}, "process index 2 is out of range for 2 addresses (0..1)"},
		{"negative index", Config{Index: -1, Addresses: addrs}, "process index -1 is out of range"},
		{"no port", Config{Addresses: []string{addrs[0], "127.0.0.1"}}, `address 1 "127.0.0.1" is malformed: missing port in address`},
		{"bad port", Config{Addresses: []string{addrs[0], "127.0.0.1:http"}}, `address 1 "127.0.0.1:http" is malformed: port "http" is not a number`},
		{"port zero", Config{Addresses: []string{addrs[0], "127.0.0.1:0"}}, `port "0" is not a number from 1 to 65535`},
		{"no host", Config{Addresses: []string{addrs[0], ":2101"}}, `address 1 ":2101" is malformed: it has no host`},
		{"duplicate", Config{Addresses: []string{addrs[0], addrs[1], addrs[0]}}, "processes 0 and 2 have the same address " + addrs[0]},
		{"one address not loopback", Config{Addresses: []string{addrs[0], "10.0.0.7:2101"}},
			"address 10.0.0.7:2101 is not loopback: set a cluster secret (MILLPOND_CLUSTER_SECRET)"},
		{"addresses not loopback", Config{Addresses: []string{"10.0.0.7:2101", "pod-1.flow:2101", "[::1]:2101"}},
			"addresses 10.0.0.7:2101, pod-1.flow:2101 are not loopback: set a cluster secret (MILLPOND_CLUSTER_SECRET)"},
		{"negative timeout", Config{Addresses: addrs, PeerTimeout: -time.Second}, "PeerTimeout is negative"},
		{"negative limit", Config{Addresses: addrs, InboxLimit: -1}, "InboxLimit is negative"},
		{"handler for data", Config{Addresses: addrs, Handlers: map[byte]func(int, []byte){0: func(int, []byte) {}}}, "kind 0 is data"},
		{"nil handler", Config{Addresses: addrs, Handlers: map[byte]func(int, []byte){3: nil}}, "control kind 3 is nil"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			m, err := Start(context.Background(), c.cfg)
			require.Nil(t, m)
			require.ErrorIs(t, err, ErrConfig)
			assert.Contains(t, err.Error(), c.want)
			assert.Less(t, time.Since(start), time.Second)
		})
	}
}

func TestLoopbackAddressesNeedNoSecret(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.3.2.1": true, "::1": true, "localhost": true, "LocalHost": true,
		"10.0.0.7": false, "0.0.0.0": false, "pod-0.flow.svc": false, "::": false,
	} {
		assert.Equal(t, want, isLoopback(host), host)
	}
}

func TestStartFailsWhenTheOwnAddressIsInUse(t *testing.T) {
	checkLeaks(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	addrs := []string{l.Addr().String(), freeAddrs(t, 1)[0]}
	_, err = Start(context.Background(), testConfig(addrs, 0))
	require.Error(t, err)
	assert.Equal(t, fmt.Sprintf("process 0 cannot listen on %s: address already in use", addrs[0]), err.Error())
	assert.ErrorIs(t, err, syscall.EADDRINUSE)
}

func TestStartTimeoutNamesEveryMissingPeer(t *testing.T) {
	checkLeaks(t)
	addrs := freeAddrs(t, 3)
	cases := []struct {
		name    string
		started []int
		want    string
	}{
		{"alone", []int{0}, fmt.Sprintf("processes 1 (%s), 2 (%s) did not join within 700ms (last error: ", addrs[1], addrs[2])},
		// The process that times out first tells the other why it
		// stopped; the other then stops with that cause.
		{"two of three", []int{0, 1}, fmt.Sprintf("process 2 (%s) did not join within 700ms (last error: ", addrs[2])},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var cfgs []Config
			for _, i := range c.started {
				cfg := testConfig(addrs, i)
				cfg.StartTimeout = 700 * time.Millisecond
				cfgs = append(cfgs, cfg)
			}
			start := time.Now()
			ms, errs := startAll(cfgs)
			elapsed := time.Since(start)
			for i, err := range errs {
				require.Nil(t, ms[i])
				if !errors.Is(err, ErrNotJoined) {
					require.ErrorIs(t, err, ErrPeerLost)
					other := 1 - c.started[i]
					require.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("process %d (%s) lost: it stopped: ", other, addrs[other])), "%v", err)
				}
				assert.Contains(t, err.Error(), c.want)
				assert.Contains(t, err.Error(), "connection refused")
			}
			assert.Less(t, elapsed, 3*time.Second)
		})
	}
}

func TestPeersMayStartLate(t *testing.T) {
	checkLeaks(t)
	addrs := freeAddrs(t, 3)
	ms := make([]*Mesh, 3)
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			time.Sleep(time.Duration(2-i) * 300 * time.Millisecond) // 2 first, 0 last
			var err error
			ms[i], err = Start(context.Background(), testConfig(addrs, i))
			errs <- err
		}()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	for _, m := range ms {
		require.NoError(t, m.Send((m.Index()+1)%3, 0, []byte("hi")))
	}
	for _, m := range ms {
		drainUntil(t, m, 1, 5*time.Second)
		require.NoError(t, m.Close())
	}
}

func TestStartStopsWhenTheContextEnds(t *testing.T) {
	checkLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := Start(ctx, testConfig(freeAddrs(t, 2), 0))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "process 0 stopped waiting for the cluster")
}

func TestWrongSecretIsRefusedOnBothSides(t *testing.T) {
	checkLeaks(t)
	addrs := freeAddrs(t, 2)
	var handled atomic.Int64
	cfgs := []Config{testConfig(addrs, 0), testConfig(addrs, 1)}
	cfgs[0].Secret = []byte("the cluster secret")
	cfgs[1].Secret = []byte("another secret")
	for i := range cfgs {
		cfgs[i].StartTimeout = time.Second
		cfgs[i].Handlers = map[byte]func(int, []byte){1: func(int, []byte) { handled.Add(1) }}
	}
	start := time.Now()
	ms, errs := startAll(cfgs)
	assert.Less(t, time.Since(start), 3*time.Second)
	for i, err := range errs {
		require.Nil(t, ms[i])
		require.ErrorIs(t, err, ErrAuthentication)
		// The process that checks the other's MAC first stops at once; the
		// other learns it only from an unproven connection, so it stops at
		// StartTimeout, saying what it saw.
		other := 1 - i
		fast := fmt.Sprintf("process %d (%s) failed authentication: it does not know this process's cluster secret (every process must be started with the same MILLPOND_CLUSTER_SECRET)", other, addrs[other])
		slow := fmt.Sprintf("process %d (%s) did not join within 1s: a process connected from 127.0.0.1:", other, addrs[other])
		if err.Error() != fast {
			assert.True(t, strings.HasPrefix(err.Error(), slow), "%v", err)
			assert.Contains(t, err.Error(), fmt.Sprintf("as process %d but could not check this process's proof of the cluster secret (every process must be started with the same MILLPOND_CLUSTER_SECRET)", other))
		}
	}
	assert.Zero(t, handled.Load())
}

func TestIdentityMismatchNamesTheKeyAndBothValues(t *testing.T) {
	checkLeaks(t)
	cases := []struct {
		name  string
		edit  func(addrs []string, cfgs []Config)
		want0 string // process 0's error; %[1]s is process 1's address
		want1 string // process 1's error; %[1]s is process 0's address
	}{
		{
			"a value", func(_ []string, cfgs []Config) {
				cfgs[0].Identity = map[string]string{"flow": "f", "workers_per_process": "2"}
				cfgs[1].Identity = map[string]string{"flow": "f", "workers_per_process": "3"}
			},
			"process 1 (%[1]s) disagrees on workers_per_process: 2 here, 3 there",
			"process 0 (%[1]s) disagrees on workers_per_process: 3 here, 2 there",
		},
		{
			"a key only one has", func(_ []string, cfgs []Config) {
				cfgs[1].Identity = map[string]string{"flow": "test", "fingerprint": "abc"}
			},
			"process 1 (%[1]s) disagrees on fingerprint: unset here, abc there",
			"process 0 (%[1]s) disagrees on fingerprint: abc here, unset there",
		},
		{
			"the number of processes", func(addrs []string, cfgs []Config) {
				cfgs[1].Addresses = append(append([]string(nil), addrs...), freeAddrs(t, 1)[0])
			},
			"process 1 (%[1]s) disagrees on the number of processes: 2 here, 3 there",
			"process 0 (%[1]s) disagrees on the number of processes: 3 here, 2 there",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addrs := freeAddrs(t, 2)
			cfgs := []Config{testConfig(addrs, 0), testConfig(addrs, 1)}
			c.edit(addrs, cfgs)
			start := time.Now()
			_, errs := startAll(cfgs)
			assert.Less(t, time.Since(start), 5*time.Second)
			require.ErrorIs(t, errs[0], ErrIdentityMismatch)
			require.ErrorIs(t, errs[1], ErrIdentityMismatch)
			assert.Equal(t, fmt.Sprintf(c.want0, addrs[1]), errs[0].Error())
			assert.Equal(t, fmt.Sprintf(c.want1, addrs[0]), errs[1].Error())
		})
	}
}

func TestSwappedAddressListsAreRefusedOnBothSides(t *testing.T) {
	checkLeaks(t)
	addrs := freeAddrs(t, 2)
	// The second process listens on addrs[1] but was given the list in
	// another order, so it believes it is process 0 too.
	cfgs := []Config{testConfig(addrs, 0), testConfig([]string{addrs[1], addrs[0]}, 0)}
	start := time.Now()
	_, errs := startAll(cfgs)
	assert.Less(t, time.Since(start), 3*time.Second)
	for i, err := range errs {
		require.ErrorIs(t, err, ErrIdentityMismatch)
		// As a client: the peer answers as another index; as a server: the
		// client (proven) dialed the wrong index. Whichever comes first.
		asClient := fmt.Sprintf("process 1 (%s) answers as process 0: the processes were started with different address lists", addrs[1-i])
		asServer := "dialed this process as process 1, but this is process 0 of 2: the processes were started with different address lists"
		if err.Error() != asClient {
			assert.Contains(t, err.Error(), asServer)
		}
	}
}

func TestForeignProtocolOnAPeersPort(t *testing.T) {
	checkLeaks(t)
	httpSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("hello")) }))
	defer httpSrv.Close()
	grpcLis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	grpcSrv := grpc.NewServer()
	go func() { _ = grpcSrv.Serve(grpcLis) }()
	defer grpcSrv.Stop()

	cases := []struct {
		name string
		addr string
		fast bool // known at the first answer, not at StartTimeout
		want string
	}{
		{"plain HTTP", strings.TrimPrefix(httpSrv.URL, "http://"), true, `it answered "HTTP/1.1 `},
		{"a banner", fakeServer(t, func(c net.Conn) { _, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n")); silently(c) }), true, `it answered "SSH-2.0-OpenSSH_9.6\r\n"`},
		{"gRPC without the service", grpcLis.Addr().String(), true, "it answered with Unimplemented (unknown service millpond.mesh.v1.Mesh)"},
		{"silent TCP", fakeServer(t, silently), false, "it accepted the connection but sent nothing within "},
		{"TCP that hangs up", fakeServer(t, func(c net.Conn) { _ = c.Close() }), false, "it accepted the connection and closed it without a word"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig([]string{freeAddrs(t, 1)[0], c.addr}, 0)
			cfg.StartTimeout = 20 * time.Second
			if !c.fast {
				// Long enough for the first connection to be made and
				// found silent on a machine loaded by -race and other
				// tests (at 700 ms it once was not).
				cfg.StartTimeout = 2 * time.Second
			}
			start := time.Now()
			_, err := Start(context.Background(), cfg)
			require.ErrorIs(t, err, ErrForeignProtocol)
			assert.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("process 1 (%s) does not speak the millpond cluster protocol: %s", c.addr, c.want)), "%v", err)
			if c.fast {
				assert.Less(t, time.Since(start), 3*time.Second)
			}
		})
	}
}

func TestTwoProcessesWithOneIndexAreRefused(t *testing.T) {
	checkLeaks(t)
	addrs := freeAddrs(t, 3)
	// A healthy cluster of 0 and 1; a second "process 1" on a third
	// address dials process 0, which already has a stream from process 1.
	cfg0 := testConfig(addrs[:2], 0)
	cfg1 := testConfig(addrs[:2], 1)
	pair, errs := startAll([]Config{cfg0, cfg1})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	defer pair[0].Close()
	defer pair[1].Close()
	twin := testConfig([]string{addrs[0], addrs[2]}, 1)
	twin.StartTimeout = 700 * time.Millisecond
	_, err := Start(context.Background(), twin)
	require.ErrorIs(t, err, ErrNotJoined)
	assert.Contains(t, err.Error(), fmt.Sprintf("refused the connection: it already has a stream from process 1 (were two processes started with index 1?)"))
	assert.NoError(t, pair[0].Err(), "the healthy pair goes on")
}
