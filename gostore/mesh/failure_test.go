package mesh

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain runs the test binary as a helper process when asked: a mesh
// process the tests can stop with SIGSTOP or kill with SIGKILL.
func TestMain(m *testing.M) {
	if os.Getenv("MESH_TEST_HELPER") != "" {
		os.Exit(runHelper())
	}
	os.Exit(m.Run())
}

func runHelper() int {
	index, _ := strconv.Atoi(os.Getenv("MESH_TEST_INDEX"))
	peerTimeout, _ := time.ParseDuration(os.Getenv("MESH_TEST_PEER_TIMEOUT"))
	cfg := testConfig(strings.Split(os.Getenv("MESH_TEST_ADDRS"), ","), index)
	cfg.PeerTimeout = peerTimeout
	m, err := Start(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	fmt.Println("up")
	// Never outlive a test that forgot to kill it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		m.Drain()
		m.Wait(ctx, 100*time.Millisecond)
		select {
		case <-m.Done():
			return 2
		default:
		}
	}
	return 0
}

// startHelper runs process index of addrs in a helper process and returns
// it once its Start returned; the test's end kills it.
func startHelper(t *testing.T, addrs []string, index int, peerTimeout time.Duration, started <-chan struct{}) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		"MESH_TEST_HELPER=1",
		"MESH_TEST_INDEX="+strconv.Itoa(index),
		"MESH_TEST_ADDRS="+strings.Join(addrs, ","),
		"MESH_TEST_PEER_TIMEOUT="+peerTimeout.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	up := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		up <- line == "up\n"
		_, _ = bufio.NewReader(out).WriteTo(nopWriter{})
	}()
	select {
	case ok := <-up:
		require.True(t, ok, "the helper did not start")
	case <-time.After(20 * time.Second):
		t.Fatal("the helper did not start within 20s")
	}
	return cmd
}

type nopWriter struct{}

func (nopWriter) Write(b []byte) (int, error) { return len(b), nil }

// clusterWithHelper starts process 0 here and process 1 in a helper.
func clusterWithHelper(t *testing.T, peerTimeout time.Duration) (*Mesh, *exec.Cmd) {
	t.Helper()
	addrs := freeAddrs(t, 2)
	cfg := testConfig(addrs, 0)
	cfg.PeerTimeout = peerTimeout
	type result struct {
		m   *Mesh
		err error
	}
	res := make(chan result, 1)
	go func() {
		m, err := Start(context.Background(), cfg)
		res <- result{m, err}
	}()
	helper := startHelper(t, addrs, 1, peerTimeout, nil)
	r := <-res
	require.NoError(t, r.err)
	t.Cleanup(func() { _ = r.m.Close() })
	return r.m, helper
}

func TestPeerLostWhenItsProcessStops(t *testing.T) {
	checkLeaks(t)
	const peerTimeout = time.Second
	cases := []struct {
		name     string
		signal   syscall.Signal
		reason   string
		min, max time.Duration
	}{
		// A stopped process keeps its sockets: only its silence tells.
		{"SIGSTOP", syscall.SIGSTOP, "silent for more than 1s (no heartbeat: the process is hung, stopped or cut off)", peerTimeout - 300*time.Millisecond, peerTimeout + 1500*time.Millisecond},
		// A killed process's connections break at once.
		{"SIGKILL", syscall.SIGKILL, "broke", 0, 1500 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, helper := clusterWithHelper(t, peerTimeout)
			require.NoError(t, m.Send(1, 0, []byte("before")))
			time.Sleep(300 * time.Millisecond) // a few heartbeats
			require.NoError(t, m.Err())

			start := time.Now()
			require.NoError(t, helper.Process.Signal(c.signal))
			waited := make(chan struct{})
			go func() {
				m.Wait(context.Background(), time.Minute)
				close(waited)
			}()
			select {
			case <-m.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the peer was not reported lost")
			}
			elapsed := time.Since(start)
			<-waited
			assert.GreaterOrEqual(t, elapsed, c.min)
			assert.LessOrEqual(t, elapsed, c.max)

			err := m.Err()
			var lost *PeerLostError
			require.ErrorAs(t, err, &lost)
			assert.ErrorIs(t, err, ErrPeerLost)
			assert.Equal(t, 1, lost.Peer)
			assert.Equal(t, m.Address(1), lost.Address)
			assert.Contains(t, lost.Reason, c.reason)
			assert.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("process 1 (%s) lost: ", m.Address(1))), err.Error())

			sendErr := m.Send(1, 0, []byte("after"))
			assert.ErrorIs(t, sendErr, ErrPeerLost)
			require.NoError(t, m.Close(), "Close after a failure")
			assert.Equal(t, err, m.Err(), "Close keeps the failure")
		})
	}
}

func TestAbortTellsEveryPeerWhy(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 3, func(cfg *Config) {
		cfg.MaxInFlight = 64 << 10
		cfg.InboxLimit = 64 << 10
	})
	// Frames queued behind flow control do not hold the abort back.
	for range 20 {
		require.NoError(t, ms[1].Send(0, 0, make([]byte, 256<<10)))
	}
	eventually(t, 5*time.Second, ms[1].Congested, "congested")
	ms[1].Abort("the flow raised ValueError in step 'parse'")
	require.ErrorIs(t, ms[1].Err(), ErrAborted)
	assert.Equal(t, "process 1 aborted: the flow raised ValueError in step 'parse'", ms[1].Err().Error())
	for _, i := range []int{0, 2} {
		select {
		case <-ms[i].Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("process %d did not stop", i)
		}
		var lost *PeerLostError
		require.ErrorAs(t, ms[i].Err(), &lost, "process %d", i)
		// From process 1 itself, or relayed by the other (whose abort
		// can come first): either way the cause is named.
		direct := fmt.Sprintf("process 1 (%s) lost: it stopped: the flow raised ValueError in step 'parse'", ms[1].Address(1))
		if lost.Error() != direct {
			other := 2 - i
			assert.Equal(t, fmt.Sprintf("process %d (%s) lost: it stopped: %s", other, ms[1].Address(other), direct), lost.Error())
		}
	}
	ms[1].Abort("twice") // no-op
	assert.Contains(t, ms[1].Err().Error(), "ValueError")
}

func TestAFailureReachesEveryPeerWithItsCause(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 3, nil)
	// Process 2 fails on its own (here: a control kind it cannot handle);
	// process 1 learns the cause, not just a broken connection.
	require.NoError(t, ms[0].Send(2, 99, nil))
	for _, m := range ms {
		select {
		case <-m.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("process %d did not stop", m.Index())
		}
	}
	require.ErrorIs(t, ms[2].Err(), ErrProtocol)
	var lost *PeerLostError
	require.ErrorAs(t, ms[1].Err(), &lost)
	// From process 2 itself, or relayed by process 0 (which learns of it
	// first and can reach process 1 first): either way the cause is named.
	assert.Contains(t, []int{0, 2}, lost.Peer)
	assert.Contains(t, lost.Reason, "it stopped: process 0 ("+ms[0].Address(0)+") broke the cluster protocol: sent a control frame of kind 99")
	assert.True(t, errors.Is(ms[0].Err(), ErrPeerLost))
}
