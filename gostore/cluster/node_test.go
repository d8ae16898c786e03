package cluster

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/mesh"
)

func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var ls []net.Listener
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

// startNodes starts n nodes of one cluster in this process.
func startNodes(t *testing.T, n int) []*Node {
	t.Helper()
	addrs := freeAddrs(t, n)
	nodes := make([]*Node, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i], errs[i] = Start(context.Background(), mesh.Config{
				Index: i, Addresses: addrs, Identity: map[string]string{"flow": "t"},
				StartTimeout: 10 * time.Second, PeerTimeout: 3 * time.Second,
			})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return nodes
}

// report drives Report on every node until each knows the decision, as
// the engines' loops would, and returns node 0's.
func decideAll(t *testing.T, nodes []*Node, epoch int64, phase int, done [][]int) []int {
	t.Helper()
	decided := make([]bool, len(nodes))
	var first []int
	deadline := time.Now().Add(10 * time.Second)
	for {
		all := true
		for i, n := range nodes {
			if decided[i] {
				continue
			}
			d, ok, err := n.Report(epoch, phase, true, done[i])
			require.NoError(t, err)
			if ok {
				decided[i] = true
				if i == 0 {
					first = d.Done
				}
			} else {
				all = false
			}
		}
		if all {
			return first
		}
		require.True(t, time.Now().Before(deadline), "no decision for epoch %d phase %d", epoch, phase)
		nodes[0].Wait(context.Background(), time.Millisecond)
	}
}

func TestNodeCarriesBatchesAndDecidesEpochs(t *testing.T) {
	nodes := startNodes(t, 3)
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	for i, n := range nodes {
		for j := range nodes {
			if i != j {
				require.NoError(t, n.Send(j, []byte{byte(i), byte(j)}))
			}
		}
	}
	// Every batch reaches its process before the epoch can be decided:
	// the decision needs every sent batch drained.
	got := make([][]mesh.Frame, len(nodes))
	for i, n := range nodes {
		require.Eventually(t, func() bool {
			f, err := n.Drain()
			require.NoError(t, err)
			got[i] = append(got[i], f...)
			return len(got[i]) == len(nodes)-1
		}, 5*time.Second, time.Millisecond)
		for _, f := range got[i] {
			assert.Equal(t, []byte{byte(f.From), byte(i)}, f.Payload)
		}
	}
	done := decideAll(t, nodes, 1, 0, [][]int{{0, 2}, {2}, {1, 2}})
	assert.Equal(t, []int{2}, done, "inputs ended everywhere: the intersection")
	decideAll(t, nodes, 1, 1, [][]int{{0, 2}, {2}, {1, 2}})
	decideAll(t, nodes, 2, 0, [][]int{{0, 2}, {2}, {1, 2}})
}

func TestDurableLinkDeliversInOrderAndEndsAfterGoodbye(t *testing.T) {
	nodes := startNodes(t, 2)
	leader, follower := nodes[0].Durable(), nodes[1].Durable()
	assert.Equal(t, 0, leader.Index())
	assert.Equal(t, 2, follower.Count())
	for i := 0; i < 50; i++ {
		require.NoError(t, leader.Send(1, []byte{byte(i)}))
	}
	// The leader leaves in good order right after its last message: the
	// follower still gets every message.
	require.NoError(t, nodes[0].Close())
	var got []byte
	for len(got) < 50 {
		select {
		case m, ok := <-follower.Inbox():
			require.True(t, ok, "the inbox closed after %d messages", len(got))
			assert.Equal(t, 0, m.From)
			got = append(got, m.Payload...)
		case <-time.After(5 * time.Second):
			t.Fatalf("got %d of 50 messages", len(got))
		}
	}
	for i, b := range got {
		assert.Equal(t, byte(i), b)
	}
	assert.NoError(t, nodes[1].Err(), "a peer that said goodbye is not lost")
	// Closing this process ends its inbox.
	require.NoError(t, nodes[1].Close())
	select {
	case _, ok := <-follower.Inbox():
		assert.False(t, ok)
	case <-time.After(5 * time.Second):
		t.Fatal("the durable inbox stayed open after Close")
	}
}

func TestAbortStopsThePeersNamingTheProcess(t *testing.T) {
	nodes := startNodes(t, 2)
	defer nodes[1].Close()
	nodes[0].Abort("DataflowError: boom")
	require.Eventually(t, func() bool { return nodes[1].Err() != nil }, 5*time.Second, 5*time.Millisecond)
	err := nodes[1].Err()
	assert.ErrorIs(t, err, mesh.ErrPeerLost)
	assert.Contains(t, err.Error(), "process 0 (")
	assert.Contains(t, err.Error(), "boom")
	_, _, rerr := nodes[1].Report(1, 0, true, nil)
	assert.Error(t, rerr, "a failed cluster decides nothing")
	// The durable layer's inbox closes at once: nothing more is committed.
	select {
	case _, ok := <-nodes[1].Durable().Inbox():
		assert.False(t, ok)
	case <-time.After(5 * time.Second):
		t.Fatal("the durable inbox stayed open after the cluster failed")
	}
}
