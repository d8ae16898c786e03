package mesh

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAllToAllUnderPressure is the deadlock test of doc.go: every process
// sends large frames to every other at once with limits far below one
// frame, so every inbox is over its limit and every stream is held by
// flow control most of the time. Each process loops like the engine:
// send (never blocking), drain, wait. Everything must arrive, in order.
func TestAllToAllUnderPressure(t *testing.T) {
	checkLeaks(t)
	const n, size = 4, 256 << 10
	frames := 32
	if testing.Short() {
		frames = 8 // still 32 times the limits per pair
	}
	cases := []struct {
		name      string
		respectBP bool // stop sending while Congested, as the engine does
	}{
		{"sources pause while congested", true},
		{"sources ignore congestion", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ms := startCluster(t, n, func(cfg *Config) {
				cfg.MaxInFlight = 64 << 10
				cfg.InboxLimit = 64 << 10
			})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for i, m := range ms {
				wg.Go(func() {
					next := 0
					want := make([]int, n)
					received := 0
					for received < (n-1)*frames || next < frames {
						if ctx.Err() != nil {
							t.Errorf("process %d: sent %d rounds, received %d of %d frames, congested %v: deadlock?",
								i, next, received, (n-1)*frames, m.Congested())
							return
						}
						progress := false
						if next < frames && (!c.respectBP || !m.Congested()) {
							p := seqPayload(next, size)
							p[size-1] = byte(i)
							for to := range n {
								if to != i {
									require.NoError(t, m.Send(to, 0, p))
								}
							}
							next++
							progress = true
						}
						for _, f := range m.Drain() {
							if seqOf(f.Payload) != want[f.From] || len(f.Payload) != size || f.Payload[size-1] != byte(f.From) {
								t.Errorf("process %d: frame %d from %d out of order or damaged (want %d)", i, seqOf(f.Payload), f.From, want[f.From])
								return
							}
							want[f.From]++
							received++
							progress = true
						}
						if !progress {
							m.Wait(ctx, 20*time.Millisecond)
						}
					}
				})
			}
			wg.Wait()
			for _, m := range ms {
				sent, received := m.Counts()
				assert.Equal(t, int64((n-1)*frames), sent)
				assert.Equal(t, int64((n-1)*frames), received)
				assert.NoError(t, m.Err())
				eventually(t, 5*time.Second, func() bool {
					for _, st := range m.Stats() {
						if st.Queued != 0 {
							return false
						}
					}
					return true
				}, "every queue empty")
			}
		})
	}
}

// A receiver that does not drain for several PeerTimeouts holds its
// sender back, but heartbeats still flow: nobody is reported lost.
func TestFullInboxIsNotSilence(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 2, func(cfg *Config) {
		cfg.PeerTimeout = 600 * time.Millisecond
		cfg.MaxInFlight = 64 << 10
		cfg.InboxLimit = 64 << 10
	})
	for range 100 {
		require.NoError(t, ms[0].Send(1, 0, make([]byte, 64<<10)))
	}
	time.Sleep(1500 * time.Millisecond) // 2.5 PeerTimeouts
	require.NoError(t, ms[0].Err())
	require.NoError(t, ms[1].Err())
	assert.True(t, ms[0].Congested())
	drainUntil(t, ms[1], 100, 10*time.Second)
}
