package mesh

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// seqPayload is a frame carrying its sequence number among all frames
// (data and control) of one (sender, receiver) pair, padded to size.
func seqPayload(seq, size int) []byte {
	b := make([]byte, max(size, 8))
	binary.BigEndian.PutUint64(b, uint64(seq))
	return b
}

func seqOf(b []byte) int { return int(binary.BigEndian.Uint64(b)) }

func TestOrderOfDataAndControlFramesPerPair(t *testing.T) {
	checkLeaks(t)
	const n, frames = 3, 1500
	// Every control frame must find exactly its predecessors (data and
	// control) of the same pair already read from the stream.
	var meshes [n]atomic.Pointer[Mesh]
	var mu sync.Mutex
	controlSeqs := make(map[[2]int][]int)
	var misplaced atomic.Int64
	ms := startCluster(t, n, func(cfg *Config) {
		self := cfg.Index
		cfg.Handlers = map[byte]func(int, []byte){7: func(from int, payload []byte) {
			seq := seqOf(payload)
			if m := meshes[self].Load(); m == nil || m.peers[from].framesIn.Load() != int64(seq+1) {
				misplaced.Add(1)
			}
			mu.Lock()
			controlSeqs[[2]int{from, self}] = append(controlSeqs[[2]int{from, self}], seq)
			mu.Unlock()
		}}
	})
	for i, m := range ms {
		meshes[i].Store(m)
	}
	var wg sync.WaitGroup
	dataSeqs := make([]map[int][]int, n)
	for i, m := range ms {
		wg.Go(func() {
			for seq := range frames {
				for to := range n {
					if to == i {
						continue
					}
					kind := byte(0)
					if seq%5 == 4 {
						kind = 7
					}
					require.NoError(t, m.Send(to, kind, seqPayload(seq, 8+seq%300)))
				}
			}
		})
		wg.Go(func() {
			got := drainUntil(t, m, (n-1)*frames*4/5, 20*time.Second)
			dataSeqs[i] = make(map[int][]int)
			for _, f := range got {
				dataSeqs[i][f.From] = append(dataSeqs[i][f.From], seqOf(f.Payload))
			}
		})
	}
	wg.Wait()
	eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		total := 0
		for _, seqs := range controlSeqs {
			total += len(seqs)
		}
		return total == n*(n-1)*frames/5
	}, "every control frame handled")
	require.Zero(t, misplaced.Load(), "control frames that overtook or fell behind data frames")
	for to := range n {
		for from := range n {
			if from == to {
				continue
			}
			var data, control []int
			for seq := range frames {
				if seq%5 == 4 {
					control = append(control, seq)
				} else {
					data = append(data, seq)
				}
			}
			assert.Equal(t, data, dataSeqs[to][from], "data %d→%d", from, to)
			mu.Lock()
			assert.Equal(t, control, controlSeqs[[2]int{from, to}], "control %d→%d", from, to)
			mu.Unlock()
		}
	}
}

func TestControlHandlersRunInArrivalOrderAcrossKinds(t *testing.T) {
	checkLeaks(t)
	type call struct {
		kind byte
		seq  int
	}
	var mu sync.Mutex
	calls := map[int][]call{} // by sender, at process 0
	handler := func(kind byte) func(int, []byte) {
		return func(from int, payload []byte) {
			mu.Lock()
			calls[from] = append(calls[from], call{kind, seqOf(payload)})
			mu.Unlock()
		}
	}
	ms := startCluster(t, 3, func(cfg *Config) {
		cfg.Handlers = map[byte]func(int, []byte){1: handler(1), 2: handler(2), 255: handler(255)}
	})
	kinds := []byte{1, 2, 255, 2, 1, 1, 255}
	const each = 300
	for _, from := range []int{0, 1, 2} { // 0 sends to itself
		for seq := range each {
			require.NoError(t, ms[from].Send(0, kinds[seq%len(kinds)], seqPayload(seq, 8)))
		}
	}
	eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls[0]) == each && len(calls[1]) == each && len(calls[2]) == each
	}, "every control frame handled")
	mu.Lock()
	defer mu.Unlock()
	for from := range 3 {
		for seq, c := range calls[from] {
			require.Equal(t, call{kinds[seq%len(kinds)], seq}, c, "from %d", from)
		}
	}
	assert.Nil(t, ms[0].Drain(), "control frames are not data")
	sent, received := ms[0].Counts()
	assert.Zero(t, sent)
	assert.Zero(t, received)
}

func TestSendToSelfDeliversThroughTheInbox(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 2, nil)
	for i := range 10 {
		require.NoError(t, ms[1].Send(1, 0, seqPayload(i, 16)))
	}
	got := drainUntil(t, ms[1], 10, 5*time.Second)
	for i, f := range got {
		assert.Equal(t, 1, f.From)
		assert.Equal(t, i, seqOf(f.Payload))
	}
	sent, received := ms[1].Counts()
	assert.Equal(t, [2]int64{10, 10}, [2]int64{sent, received})
	st := ms[1].Stats()[1]
	assert.Equal(t, int64(10), st.FramesOut)
	assert.Equal(t, int64(10), st.FramesIn)
}

func TestSendCopiesThePayload(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 2, nil)
	b := []byte("before")
	require.NoError(t, ms[0].Send(1, 0, b))
	copy(b, "AFTER!")
	got := drainUntil(t, ms[1], 1, 5*time.Second)
	assert.Equal(t, "before", string(got[0].Payload))
}

func TestStatsAndCountsAreExact(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 3, func(cfg *Config) {
		cfg.Handlers = map[byte]func(int, []byte){9: func(int, []byte) {}}
	})
	sizes := []int{0, 1, 100, 70_000, 3}
	var bytes int64
	for _, s := range sizes {
		bytes += int64(s)
		require.NoError(t, ms[0].Send(1, 0, make([]byte, s)))
		require.NoError(t, ms[0].Send(2, 0, make([]byte, s)))
	}
	require.NoError(t, ms[0].Send(1, 9, make([]byte, 10))) // control: in the stats, not the counts
	drainUntil(t, ms[1], len(sizes), 5*time.Second)
	drainUntil(t, ms[2], len(sizes), 5*time.Second)
	eventually(t, 5*time.Second, func() bool { return ms[1].Stats()[0].FramesIn == int64(len(sizes)+1) }, "control frame read")
	// The sender counts a frame once gRPC took it, which can be a moment
	// after the receiver has it.
	eventually(t, 5*time.Second, func() bool { return ms[0].Stats()[1].Queued == 0 && ms[0].Stats()[2].Queued == 0 }, "queues empty")

	sent, received := ms[0].Counts()
	assert.Equal(t, int64(2*len(sizes)), sent)
	assert.Zero(t, received)
	for _, to := range []int{1, 2} {
		_, received := ms[to].Counts()
		assert.Equal(t, int64(len(sizes)), received)
	}
	out := ms[0].Stats()
	require.Len(t, out, 3)
	want1 := PeerStats{Peer: 1, Address: ms[0].Address(1), FramesOut: int64(len(sizes) + 1), BytesOut: bytes + 10}
	want2 := PeerStats{Peer: 2, Address: ms[0].Address(2), FramesOut: int64(len(sizes)), BytesOut: bytes}
	assert.Equal(t, want1, out[1])
	assert.Equal(t, want2, out[2])
	assert.Equal(t, PeerStats{Peer: 0, Address: ms[0].Address(0)}, out[0])
	in := ms[1].Stats()[0]
	assert.Equal(t, PeerStats{Peer: 0, Address: ms[1].Address(0), FramesIn: int64(len(sizes) + 1), BytesIn: bytes + 10}, in)
}

func TestCongestionIsTimedAndWakesTheWaiter(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 2, func(cfg *Config) {
		cfg.MaxInFlight = 64 << 10
		cfg.InboxLimit = 64 << 10
	})
	// Process 1 does not drain: its receiver pauses, flow control stops
	// the stream, process 0's queue grows beyond MaxInFlight.
	for range 64 {
		require.NoError(t, ms[0].Send(1, 0, make([]byte, 64<<10)))
	}
	eventually(t, 5*time.Second, ms[0].Congested, "congested")
	time.Sleep(100 * time.Millisecond)
	st := ms[0].Stats()[1]
	assert.Greater(t, st.BlockedSeconds, 0.09)
	assert.Greater(t, st.Queued, int64(64<<10))

	woke := make(chan struct{})
	go func() {
		for ms[0].Congested() {
			ms[0].Wait(context.Background(), 10*time.Second)
		}
		close(woke)
	}()
	drainUntil(t, ms[1], 64, 10*time.Second)
	select {
	case <-woke:
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return when the congestion ended")
	}
	eventually(t, 5*time.Second, func() bool { return ms[0].Stats()[1].Queued == 0 }, "queue empty")
	blocked := ms[0].Stats()[1].BlockedSeconds
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, blocked, ms[0].Stats()[1].BlockedSeconds, "no congestion, no blocked time")
}

func TestWaitReturnsOnNotifyDataDeadlineAndContext(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 2, nil)
	m := ms[0]
	cases := []struct {
		name string
		poke func()
		ctx  func() (context.Context, context.CancelFunc)
		d    time.Duration
	}{
		{"notify", func() { m.Notify() }, nil, time.Minute},
		{"data", func() { _ = ms[1].Send(0, 0, []byte("x")) }, nil, time.Minute},
		{"deadline", func() {}, nil, 50 * time.Millisecond},
		{"context", func() {}, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}, time.Minute},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m.Drain()
			ctx, cancel := context.Background(), func() {}
			if c.ctx != nil {
				ctx, cancel = c.ctx()
			}
			defer cancel()
			time.AfterFunc(20*time.Millisecond, c.poke)
			start := time.Now()
			m.Wait(ctx, c.d)
			assert.Less(t, time.Since(start), 5*time.Second)
		})
	}
}

func TestCloseFlushesSaysGoodbyeAndIsIdempotent(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 3, func(cfg *Config) { cfg.PeerTimeout = time.Second })
	const frames = 200
	for i := range frames {
		require.NoError(t, ms[0].Send(1, 0, seqPayload(i, 1000)))
	}
	require.NoError(t, ms[0].Close())
	require.NoError(t, ms[0].Close(), "a second Close")
	<-ms[0].Done()
	assert.NoError(t, ms[0].Err())
	assert.ErrorIs(t, ms[0].Send(1, 0, nil), ErrClosed)

	got := drainUntil(t, ms[1], frames, 5*time.Second)
	for i, f := range got {
		require.Equal(t, i, seqOf(f.Payload))
	}
	// Well past PeerTimeout: the others did not report process 0 lost.
	time.Sleep(ms[1].s.PeerTimeout + 300*time.Millisecond)
	for _, m := range ms[1:] {
		assert.NoError(t, m.Err())
		select {
		case <-m.Done():
			t.Fatalf("process %d stopped after process 0 said goodbye", m.Index())
		default:
		}
		assert.True(t, m.Stats()[0].Left)
		assert.ErrorIs(t, m.Send(0, 0, []byte("x")), ErrPeerLeft)
	}
	// The two left still talk.
	require.NoError(t, ms[1].Send(2, 0, []byte("still here")))
	assert.Equal(t, "still here", string(drainUntil(t, ms[2], 1, 5*time.Second)[0].Payload))
	for _, m := range ms[1:] {
		require.NoError(t, m.Close())
	}
}

func TestCloseAllAtOnce(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 4, nil)
	for _, m := range ms {
		for to := range 4 {
			require.NoError(t, m.Send(to, 0, make([]byte, 1000)))
		}
	}
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() { assert.NoError(t, m.Close()) })
	}
	wg.Wait()
	for _, m := range ms {
		assert.NoError(t, m.Err())
	}
}

func TestSendRejectsBadArguments(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 2, nil)
	for _, to := range []int{-1, 2} {
		err := ms[0].Send(to, 0, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no such process")
	}
	assert.Equal(t, "", ms[0].Address(5))
	assert.Equal(t, 2, ms[0].Count())
	assert.Equal(t, 1, ms[1].Index())
}

func TestUnknownControlKindFailsTheReceiver(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 2, nil)
	require.NoError(t, ms[0].Send(1, 42, []byte("?")))
	select {
	case <-ms[1].Done():
	case <-time.After(5 * time.Second):
		t.Fatal("no failure")
	}
	require.ErrorIs(t, ms[1].Err(), ErrProtocol)
	assert.Equal(t, "process 0 ("+ms[1].Address(0)+") broke the cluster protocol: sent a control frame of kind 42, which this process has no handler for", ms[1].Err().Error())
}

func TestSingleProcessNeedsNoNetwork(t *testing.T) {
	checkLeaks(t)
	m, err := Start(context.Background(), Config{Addresses: []string{"127.0.0.1:1"}, Logger: testLogger()})
	require.NoError(t, err)
	require.NoError(t, m.Send(0, 0, []byte("self")))
	assert.Equal(t, "self", string(drainUntil(t, m, 1, time.Second)[0].Payload))
	require.NoError(t, m.Close())
	assert.True(t, errors.Is(m.Send(0, 0, nil), ErrClosed))
}

func TestFramesWrittenAfterADropAreNotCountedTwice(t *testing.T) {
	m := &Mesh{}
	o := newOutbox(m, 10)
	require.True(t, o.put(outFrame{payload: make([]byte, 100)}))
	require.True(t, o.put(outFrame{payload: make([]byte, 5)}))
	batch := o.take()
	require.Len(t, batch, 2)
	frames, bytes := o.drop() // the peer left while the sender held the batch
	assert.Equal(t, 2, frames)
	assert.Equal(t, int64(105), bytes)
	o.wrote(100) // the sender's write in flight went through
	assert.Zero(t, o.queued)
	assert.Equal(t, int64(1), o.framesOut)
	assert.False(t, o.congested)
	assert.Zero(t, m.congested.Load())
	assert.False(t, o.put(outFrame{}))
}
