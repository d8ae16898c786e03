package mesh

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// freeAddrs returns n loopback addresses whose ports were free a moment
// ago (all listened on at once, so they differ, then closed).
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	var ls []net.Listener
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ls = append(ls, l)
		addrs[i] = l.Addr().String()
	}
	for _, l := range ls {
		require.NoError(t, l.Close())
	}
	return addrs
}

// testLogger discards unless MESH_TEST_LOG is set (then debug to stderr).
func testLogger() *slog.Logger {
	if os.Getenv("MESH_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testConfig is process i of a loopback cluster with test-sized timeouts.
func testConfig(addrs []string, i int) Config {
	return Config{
		Index:        i,
		Addresses:    addrs,
		Identity:     map[string]string{"flow": "test"},
		StartTimeout: 10 * time.Second,
		PeerTimeout:  2 * time.Second,
		Logger:       testLogger(),
	}
}

// startAll starts one mesh per config concurrently and returns them, or
// every Start error.
func startAll(cfgs []Config) ([]*Mesh, []error) {
	ms := make([]*Mesh, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() { ms[i], errs[i] = Start(context.Background(), cfg) })
	}
	wg.Wait()
	return ms, errs
}

// startCluster starts an n-process loopback cluster (edit adjusts each
// config) and closes it when the test ends.
func startCluster(t *testing.T, n int, edit func(cfg *Config)) []*Mesh {
	t.Helper()
	addrs := freeAddrs(t, n)
	cfgs := make([]Config, n)
	for i := range cfgs {
		cfgs[i] = testConfig(addrs, i)
		if edit != nil {
			edit(&cfgs[i])
		}
	}
	ms, errs := startAll(cfgs)
	t.Cleanup(func() {
		for _, m := range ms {
			if m != nil {
				_ = m.Close()
			}
		}
	})
	for i, err := range errs {
		require.NoError(t, err, "process %d", i)
	}
	return ms
}

// checkLeaks fails the test if, once its cleanups ran, more goroutines run
// than before it (polling for a few seconds: gRPC ends some lazily).
func checkLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("%d goroutines before the test, %d after:\n%s", before, runtime.NumGoroutine(), buf)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// eventually fails the test unless cond holds within d.
func eventually(t *testing.T, d time.Duration, cond func() bool, what string) {
	t.Helper()
	require.Eventually(t, cond, d, 5*time.Millisecond, what)
}

// drainUntil drains m until want data frames arrived, or fails after d.
func drainUntil(t *testing.T, m *Mesh, want int, d time.Duration) []Frame {
	t.Helper()
	var got []Frame
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for len(got) < want {
		got = append(got, m.Drain()...)
		if len(got) >= want {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("process %d drained %d of %d frames within %s (err %v)", m.Index(), len(got), want, d, m.Err())
		}
		m.Wait(ctx, 50*time.Millisecond)
	}
	return got
}

// fakeServer accepts TCP connections and hands each to serve.
func fakeServer(t *testing.T, serve func(c net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

// silently reads and discards until the connection closes.
func silently(c net.Conn) { _, _ = io.Copy(io.Discard, c) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }
