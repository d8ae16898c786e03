package mesh

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is a slog handler that keeps the records.
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.records = append(r.records, rec)
	r.mu.Unlock()
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func (r *recorder) at(level slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.records {
		if rec.Level == level {
			rec.Attrs(func(a slog.Attr) bool {
				if a.Key == "error" {
					out = append(out, a.Value.String())
				}
				return true
			})
		}
	}
	return out
}

func TestAFailureIsLoggedOnce(t *testing.T) {
	checkLeaks(t)
	recs := make([]*recorder, 3)
	i := 0
	ms := startCluster(t, 3, func(cfg *Config) {
		recs[i] = &recorder{}
		cfg.Logger = slog.New(recs[i])
		i++
	})
	ms[2].Abort("disk full")
	for _, m := range ms[:2] {
		<-m.Done()
		require.NoError(t, m.Close())
	}
	for _, i := range []int{0, 1} {
		errs := recs[i].at(slog.LevelError)
		require.Len(t, errs, 1, "process %d", i)
		assert.Contains(t, errs[0], fmt.Sprintf("process 2 (%s) lost: it stopped: disk full", ms[2].Address(2)))
	}
	assert.Empty(t, recs[2].at(slog.LevelError))
	assert.Len(t, recs[2].at(slog.LevelWarn), 1)
}

func TestCloseReportsAPeerThatDidNotReadEverything(t *testing.T) {
	checkLeaks(t)
	ms := startCluster(t, 2, func(cfg *Config) {
		cfg.PeerTimeout = 300 * time.Millisecond
		cfg.MaxInFlight = 64 << 10
		cfg.InboxLimit = 64 << 10
	})
	for range 40 {
		require.NoError(t, ms[0].Send(1, 0, make([]byte, 64<<10)))
	}
	err := ms[0].Close() // process 1 never drains
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("closing process 0: within 300ms, "))
	assert.Contains(t, err.Error(), fmt.Sprintf("for process 1 (%s) were not written", ms[0].Address(1)))
	// No goodbye: process 1 must not take the missing frames for an end.
	select {
	case <-ms[1].Done():
	case <-time.After(5 * time.Second):
		t.Fatal("process 1 did not stop")
	}
	assert.ErrorIs(t, ms[1].Err(), ErrPeerLost)
}

func TestAProcessCannotRejoinARunningCluster(t *testing.T) {
	checkLeaks(t)
	addrs := freeAddrs(t, 3)
	ms, errs := startAll([]Config{testConfig(addrs, 0), testConfig(addrs, 1), testConfig(addrs, 2)})
	for _, err := range errs {
		require.NoError(t, err)
	}
	defer ms[0].Close()
	defer ms[1].Close()
	require.NoError(t, ms[2].Close())
	again := testConfig(addrs, 2)
	again.StartTimeout = 5 * time.Second
	start := time.Now()
	_, err := Start(context.Background(), again)
	require.ErrorIs(t, err, ErrRefused)
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.Contains(t, err.Error(), "refused the connection: process 2 left its running cluster before; restart the whole cluster")
}

// Start and stop in every way, several times: nothing stays behind.
func TestNoGoroutineOutlivesItsMesh(t *testing.T) {
	checkLeaks(t)
	for range 3 {
		ms := startCluster(t, 3, nil)
		require.NoError(t, ms[0].Send(1, 0, []byte("x")))
		require.NoError(t, ms[0].Close())
		ms[1].Abort("test")
		<-ms[2].Done()
		require.NoError(t, ms[2].Close())

		cfg := testConfig(freeAddrs(t, 2), 0)
		cfg.StartTimeout = 100 * time.Millisecond
		_, err := Start(context.Background(), cfg)
		require.ErrorIs(t, err, ErrNotJoined)
	}
}
