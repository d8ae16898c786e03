package s3backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/backup/backuptest"
)

const testBucket = "millpond-test"

// testOptions returns options for a server at endpoint with fast retries.
func testOptions(endpoint, prefix string) Options {
	return Options{
		Bucket:          testBucket,
		Prefix:          prefix,
		Endpoint:        endpoint,
		Region:          "us-east-1",
		AccessKeyID:     backuptest.TestAccessKeyID,
		SecretAccessKey: backuptest.TestSecretAccessKey,
		MaxBackoff:      10 * time.Millisecond,
	}
}

func newTestBackup(t *testing.T, opts Options) *S3Backup {
	t.Helper()
	b, err := New(context.Background(), opts)
	require.NoError(t, err)
	return b
}

func TestConformance(t *testing.T) {
	for _, prefix := range []string{"", "root/nested"} {
		t.Run(fmt.Sprintf("prefix=%q", prefix), func(t *testing.T) {
			backuptest.RunConformance(t, func(t *testing.T) backup.Backup {
				url := backuptest.StartS3Server(t, nil, testBucket)
				return newTestBackup(t, testOptions(url, prefix))
			})
		})
	}
}

func TestStringNamesBucketPrefixAndEndpoint(t *testing.T) {
	b := newTestBackup(t, testOptions("http://127.0.0.1:9", "/p/q/"))
	assert.Equal(t, "s3://millpond-test/p/q at http://127.0.0.1:9", b.String())
}

func TestPrefixesIsolateStores(t *testing.T) {
	url := backuptest.StartS3Server(t, nil, testBucket)
	a := newTestBackup(t, testOptions(url, "a"))
	ab := newTestBackup(t, testOptions(url, "ab"))
	whole := newTestBackup(t, testOptions(url, ""))
	backuptest.Put(t, a, "k", []byte("a"))
	backuptest.Put(t, ab, "k", []byte("ab"))
	assert.Equal(t, []string{"k"}, backuptest.Keys(t, a, ""))
	assert.Equal(t, "ab", string(backuptest.Get(t, ab, "k")))
	assert.Equal(t, []string{"a/k", "ab/k"}, backuptest.Keys(t, whole, ""))
}

// requestLog records the requests that reach the server.
type requestLog struct {
	mu   sync.Mutex
	reqs []string
	auth []string
}

func (l *requestLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.reqs = append(l.reqs, r.Method+" "+r.URL.RequestURI())
		l.auth = append(l.auth, r.Header.Get("Authorization"))
		l.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

func (l *requestLog) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.reqs {
		if strings.Contains(r, substr) {
			n++
		}
	}
	return n
}

func TestLargeObjectUsesMultipartUpload(t *testing.T) {
	var log requestLog
	url := backuptest.StartS3Server(t, log.wrap, testBucket)
	opts := testOptions(url, "big")
	opts.PartSize = 5 << 20
	b := newTestBackup(t, opts)
	src, data := backuptest.WriteRandomFile(t, t.TempDir(), 12<<20)
	require.NoError(t, b.Upload(context.Background(), src, "seg/large"))
	assert.Equal(t, 3, log.count("partNumber="), "12 MiB in 5 MiB parts")
	assert.Equal(t, 1, log.count("POST /millpond-test/big/seg/large?uploads"), "one multipart upload created")
	infos, err := b.List(context.Background(), "seg/")
	require.NoError(t, err)
	assert.Equal(t, []backup.ObjectInfo{{Key: "seg/large", Size: 12 << 20}}, infos)
	assert.True(t, bytes.Equal(data, backuptest.Get(t, b, "seg/large")))
}

func TestListFollowsPages(t *testing.T) {
	var log requestLog
	url := backuptest.StartS3Server(t, log.wrap, testBucket)
	b := newTestBackup(t, testOptions(url, "p"))
	var want []string
	for i := range 1005 {
		want = append(want, fmt.Sprintf("k/%04d", i))
	}
	// Upload concurrently to keep the test quick.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	src := filepath.Join(t.TempDir(), "one")
	require.NoError(t, os.WriteFile(src, []byte("1"), 0o600))
	for _, k := range want {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			assert.NoError(t, b.Upload(context.Background(), src, k))
		}()
	}
	wg.Wait()
	assert.Equal(t, want, backuptest.Keys(t, b, "k/"))
	assert.GreaterOrEqual(t, log.count("list-type=2"), 2, "listing 1005 keys takes more than one page")
}

// failFirst answers the first n requests matching match with status and an
// S3 error code, then passes requests through.
func failFirst(n int32, status int, code string, match func(*http.Request) bool, calls *atomic.Int32) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !match(r) {
				h.ServeHTTP(w, r)
				return
			}
			if calls.Add(1) <= n {
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(status)
				fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected</Message></Error>`, code)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
}

func isPut(r *http.Request) bool { return r.Method == http.MethodPut }

func TestRetries(t *testing.T) {
	tests := []struct {
		name      string
		failures  int32
		status    int
		code      string
		wantErr   string // empty: the upload succeeds
		wantCalls int32
	}{
		{"ServiceUnavailableTwiceThenSuccess", 2, 503, "ServiceUnavailable", "", 3},
		{"SlowDownThrottlingThenSuccess", 2, 503, "SlowDown", "", 3},
		{"InternalErrorThenSuccess", 1, 500, "InternalError", "", 2},
		{"PersistentFailureGivesUpAfterMaxAttempts", 100, 503, "ServiceUnavailable", "ServiceUnavailable", DefaultMaxAttempts},
		{"AccessDeniedFailsFast", 100, 403, "AccessDenied", "denied, check the credentials", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			url := backuptest.StartS3Server(t, failFirst(tt.failures, tt.status, tt.code, isPut, &calls), testBucket)
			b := newTestBackup(t, testOptions(url, "r"))
			src, data := backuptest.WriteRandomFile(t, t.TempDir(), 1000)
			start := time.Now()
			err := b.Upload(context.Background(), src, "seg/1")
			assert.Less(t, time.Since(start), 5*time.Second)
			assert.Equal(t, tt.wantCalls, calls.Load(), "attempts")
			if tt.wantErr == "" {
				require.NoError(t, err)
				assert.True(t, bytes.Equal(data, backuptest.Get(t, b, "seg/1")))
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.Contains(t, err.Error(), "s3://millpond-test/r at "+url)
			assert.Contains(t, err.Error(), src)
			assert.Empty(t, backuptest.Keys(t, b, ""))
		})
	}
}

func TestMultipartPartRetried(t *testing.T) {
	var calls atomic.Int32
	isPart := func(r *http.Request) bool {
		return r.Method == http.MethodPut && r.URL.Query().Get("partNumber") == "2"
	}
	url := backuptest.StartS3Server(t, failFirst(2, 503, "SlowDown", isPart, &calls), testBucket)
	opts := testOptions(url, "")
	opts.PartSize = 5 << 20
	b := newTestBackup(t, opts)
	src, data := backuptest.WriteRandomFile(t, t.TempDir(), 11<<20)
	require.NoError(t, b.Upload(context.Background(), src, "big"))
	assert.Equal(t, int32(3), calls.Load())
	assert.True(t, bytes.Equal(data, backuptest.Get(t, b, "big")))
}

func TestDownloadRetriesTruncatedBody(t *testing.T) {
	var truncated atomic.Int32
	wrap := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/obj") && truncated.Add(1) == 1 {
				// Promise 100 bytes, send 10, then drop the connection.
				w.Header().Set("Content-Length", "100")
				w.WriteHeader(http.StatusOK)
				_, _ = w.Write(make([]byte, 10))
				panic(http.ErrAbortHandler)
			}
			h.ServeHTTP(w, r)
		})
	}
	url := backuptest.StartS3Server(t, wrap, testBucket)
	b := newTestBackup(t, testOptions(url, ""))
	backuptest.Put(t, b, "obj", bytes.Repeat([]byte("z"), 100))
	assert.Equal(t, bytes.Repeat([]byte("z"), 100), backuptest.Get(t, b, "obj"))
	assert.Equal(t, int32(2), truncated.Load())
}

func TestUnreachableEndpointNamesEndpointAndBucket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	endpoint := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	b := newTestBackup(t, testOptions(endpoint, "x"))
	start := time.Now()
	err = b.Check(context.Background())
	require.Error(t, err)
	assert.Less(t, time.Since(start), 10*time.Second)
	assert.Contains(t, err.Error(), "cannot reach endpoint "+endpoint)
	assert.Contains(t, err.Error(), "s3://millpond-test/x")
}

func TestCheck(t *testing.T) {
	url := backuptest.StartS3Server(t, nil, testBucket)
	tests := []struct {
		name    string
		bucket  string
		wantErr string
	}{
		{"ExistingBucket", testBucket, ""},
		{"MissingBucket", "no-such-bucket", `bucket "no-such-bucket" does not exist`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := testOptions(url, "p")
			opts.Bucket = tt.bucket
			err := newTestBackup(t, opts).Check(context.Background())
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"NoBucket", Options{}, "bucket name is required"},
		{"ShortBucket", Options{Bucket: "ab"}, "3 to 63"},
		{"UppercaseBucket", Options{Bucket: "Bucket"}, "lowercase"},
		{"BadPrefix", Options{Bucket: "abc", Prefix: "a//b"}, "empty segment"},
		{"BadEndpoint", Options{Bucket: "abc", Endpoint: "127.0.0.1:9000"}, "http:// or https://"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(context.Background(), tt.opts)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestCredentialsFromEnvironment(t *testing.T) {
	var log requestLog
	url := backuptest.StartS3Server(t, log.wrap, testBucket)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFROMENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	opts := testOptions(url, "")
	opts.AccessKeyID, opts.SecretAccessKey = "", ""
	b := newTestBackup(t, opts)
	require.NoError(t, b.Check(context.Background()))
	log.mu.Lock()
	defer log.mu.Unlock()
	require.NotEmpty(t, log.auth)
	assert.Contains(t, log.auth[0], "Credential=AKIDFROMENV/")
}

func TestDownloadMissingBucketIsNotErrNotFound(t *testing.T) {
	url := backuptest.StartS3Server(t, nil, testBucket)
	opts := testOptions(url, "")
	opts.Bucket = "other-bucket"
	b := newTestBackup(t, opts)
	err := b.Download(context.Background(), "k", filepath.Join(t.TempDir(), "x"))
	require.Error(t, err)
	assert.False(t, errors.Is(err, backup.ErrNotFound), "a missing bucket is a configuration error: %v", err)
	assert.Contains(t, err.Error(), "other-bucket")
}
