package s3backup

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup/backuptest"
	"github.com/millpond/millpond/gostore/internal/testlog"
)

// hungEndpoint listens on 127.0.0.1, accepts connections and never answers
// (nor reads), until the test ends.
func hungEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

// slowHeaders delays every response by d before the S3 server answers.
func slowHeaders(d time.Duration) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
			h.ServeHTTP(w, r)
		})
	}
}

func fastOptions(endpoint string) Options {
	opts := testOptions(endpoint, "p")
	opts.Timeout = 200 * time.Millisecond
	opts.StallTimeout = 300 * time.Millisecond
	opts.MaxAttempts = 3
	opts.MaxBackoff = 20 * time.Millisecond
	return opts
}

// calls runs every operation of the backend once and returns each one's error.
func calls(t *testing.T, b *S3Backup, ctx context.Context) map[string]error {
	src, _ := backuptest.WriteRandomFile(t, t.TempDir(), 100)
	dst := filepath.Join(t.TempDir(), "dst")
	_, listErr := b.List(ctx, "")
	_, getErr := b.Get(ctx, "k")
	return map[string]error{
		"check":    b.Check(ctx),
		"list":     listErr,
		"get":      getErr,
		"put":      b.Put(ctx, "k", []byte("x")),
		"create":   b.Create(ctx, "k", []byte("x")),
		"delete":   b.Delete(ctx, "k"),
		"upload":   b.Upload(ctx, src, "k"),
		"download": b.Download(ctx, "k", dst),
	}
}

func TestHungEndpointFailsInBoundedTimeWithAClearError(t *testing.T) {
	url := hungEndpoint(t)
	b := newTestBackup(t, fastOptions(url))
	for name, err := range callsTimed(t, b, context.Background(), 3*time.Second) {
		require.Error(t, err, name)
		if name == "check" {
			continue // below
		}
		assert.Contains(t, err.Error(), "endpoint "+url+" did not answer within 200ms (3 attempts); "+
			"check that the endpoint is up and reachable, or raise timeout= in the backup URI", name)
		assert.NotContains(t, err.Error(), "context", name)
	}
	err := b.Check(context.Background())
	assert.Equal(t, "s3://millpond-test/p (endpoint "+url+") did not answer within 200ms (2 attempts); "+
		"check that the endpoint is up and reachable, or raise timeout= in the backup URI", err.Error(),
		"Check gives up after 1.5 x Timeout")
}

// callsTimed is calls, each call bounded by limit.
func callsTimed(t *testing.T, b *S3Backup, ctx context.Context, limit time.Duration) map[string]error {
	t.Helper()
	start := time.Now()
	errs := calls(t, b, ctx)
	assert.Less(t, time.Since(start), time.Duration(len(errs))*limit)
	return errs
}

func TestSlowEndpoint(t *testing.T) {
	t.Run("SlowerThanTimeoutFails", func(t *testing.T) {
		url := backuptest.StartS3Server(t, slowHeaders(time.Second), testBucket)
		b := newTestBackup(t, fastOptions(url))
		start := time.Now()
		err := b.Put(context.Background(), "k", []byte("x"))
		require.Error(t, err)
		assert.Less(t, time.Since(start), 2*time.Second)
		assert.Contains(t, err.Error(), "did not answer within 200ms (3 attempts)")
	})
	t.Run("WithinTimeoutSucceeds", func(t *testing.T) {
		url := backuptest.StartS3Server(t, slowHeaders(50*time.Millisecond), testBucket)
		b := newTestBackup(t, fastOptions(url))
		require.NoError(t, b.Put(context.Background(), "k", []byte("x")))
		got, err := b.Get(context.Background(), "k")
		require.NoError(t, err)
		assert.Equal(t, "x", string(got))
		data := bytes.Repeat([]byte("y"), 1<<20)
		backuptest.Put(t, b, "big", data)
		assert.Equal(t, data, backuptest.Get(t, b, "big"))
	})
}

func TestFailingEndpointGivesUpAfterAttempts(t *testing.T) {
	var n atomic.Int32
	url := backuptest.StartS3Server(t, failFirst(1<<30, 500, "InternalError", func(*http.Request) bool { return true }, &n), testBucket)
	b := newTestBackup(t, fastOptions(url))
	for name, err := range callsTimed(t, b, context.Background(), time.Second) {
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "(HTTP 500, 3 attempts)", name)
	}
}

func TestCanceledContextReturnsPromptly(t *testing.T) {
	url := hungEndpoint(t)
	opts := fastOptions(url)
	opts.Timeout, opts.StallTimeout = time.Minute, time.Minute
	b := newTestBackup(t, opts)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	for name, err := range callsTimed(t, b, ctx, 500*time.Millisecond) {
		require.Error(t, err, name)
		assert.ErrorIs(t, err, context.Canceled, name)
	}
}

func TestEndpointPasswordNeverShown(t *testing.T) {
	const secret = "s3cr3tPASS"
	url := hungEndpoint(t)
	withPass := strings.Replace(url, "http://", "http://user:"+secret+"@", 1)
	var logs testlog.Buffer
	opts := fastOptions(withPass)
	opts.Logger = logs.Logger()
	b := newTestBackup(t, opts)
	assert.Equal(t, "s3://millpond-test/p at http://user:xxxxx@"+strings.TrimPrefix(url, "http://"), b.String())
	for name, err := range calls(t, b, context.Background()) {
		require.Error(t, err, name)
		assert.NotContains(t, err.Error(), secret, name)
		assert.Contains(t, err.Error(), "user:xxxxx@", name)
	}
	assert.NotContains(t, logs.String(), secret)
	_, err := New(context.Background(), Options{Bucket: testBucket, Endpoint: "ftp://u:" + secret + "@h"})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), secret)
}
