package s3backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
		{"PersistentFailureGivesUpAfterMaxAttempts", 100, 503, "ServiceUnavailable", `S3 request for bucket "millpond-test" at {url} failed: ServiceUnavailable: injected (HTTP 503, {n} attempts); the server is failing`, DefaultMaxAttempts},
		{"AccessDeniedFailsFast", 100, 403, "AccessDenied", `access to bucket "millpond-test" at {url} denied (AccessDenied); check the credentials`, 1},
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
			wantErr := strings.NewReplacer("{url}", url, "{n}", fmt.Sprint(DefaultMaxAttempts)).Replace(tt.wantErr)
			assert.Contains(t, err.Error(), wantErr)
			want := "upload " + src + " to s3://millpond-test/r/seg/1: " + wantErr
			assert.True(t, strings.HasPrefix(err.Error(), want), "%q\ndoes not start with\n%q", err.Error(), want)
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

// closedPort returns the URL of a port on 127.0.0.1 that nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	endpoint := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	return endpoint
}

// TestCheckErrorsAreOneReadableLine runs Check against the failures a user
// meets and pins the whole message: one line that names the bucket and the
// endpoint and says what to check, without the SDK's nested error chain.
func TestCheckErrorsAreOneReadableLine(t *testing.T) {
	deny := func(code string) func(http.Handler) http.Handler {
		var calls atomic.Int32
		return failFirst(1000, 403, code, func(*http.Request) bool { return true }, &calls)
	}
	tests := []struct {
		name    string
		wrap    func(http.Handler) http.Handler
		closed  bool // an endpoint nothing listens on
		bucket  string
		noCreds bool
		want    string // {url} stands for the endpoint
	}{
		{
			name:   "UnreachableEndpoint",
			closed: true,
			want: `cannot reach S3 endpoint {url} for bucket "millpond-test" (connection refused, 1 attempt); ` +
				`check the endpoint URL and that the server is running`,
		},
		{
			name:   "MissingBucket",
			bucket: "no-such-bucket",
			want:   `bucket "no-such-bucket" does not exist at {url}; check the bucket name in the URI, or create the bucket`,
		},
		{
			name: "AccessDenied",
			wrap: deny("AccessDenied"),
			want: `access to bucket "millpond-test" at {url} denied (AccessDenied); check the credentials ` +
				`(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN or AWS_PROFILE) and the bucket's policy`,
		},
		{
			name: "UnknownAccessKey",
			wrap: deny("InvalidAccessKeyId"),
			want: `access to bucket "millpond-test" at {url} denied (InvalidAccessKeyId); check the credentials ` +
				`(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN or AWS_PROFILE) and the bucket's policy`,
		},
		{
			name: "WrongRegion",
			wrap: func(h http.Handler) http.Handler {
				var calls atomic.Int32
				return failFirst(1000, 301, "PermanentRedirect", func(*http.Request) bool { return true }, &calls)(h)
			},
			want: `bucket "millpond-test" is not in region us-east-1 at {url} (PermanentRedirect); ` +
				`give its region with ?region= in the URI or AWS_REGION`,
		},
		{
			name: "ServerFailing",
			wrap: func(h http.Handler) http.Handler {
				var calls atomic.Int32
				return failFirst(1000, 500, "InternalError", func(*http.Request) bool { return true }, &calls)(h)
			},
			want: `S3 request for bucket "millpond-test" at {url} failed: InternalError: injected (HTTP 500, 1 attempt); ` +
				`the server is failing; try again later or check its health`,
		},
		{
			name:    "NoCredentials",
			noCreds: true,
			want: `no usable AWS credentials for bucket "millpond-test" at {url}: none were found, or they could not be ` +
				`refreshed; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var url string
			if tt.closed {
				url = closedPort(t)
			} else {
				url = backuptest.StartS3Server(t, tt.wrap, testBucket)
			}
			opts := testOptions(url, "x")
			opts.MaxAttempts = 1
			if tt.bucket != "" {
				opts.Bucket = tt.bucket
			}
			if tt.noCreds {
				for _, v := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"} {
					t.Setenv(v, "")
				}
				t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
				t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
				t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
				opts.AccessKeyID, opts.SecretAccessKey = "", ""
			}
			start := time.Now()
			err := newTestBackup(t, opts).Check(context.Background())
			require.Error(t, err)
			assert.Less(t, time.Since(start), 10*time.Second)
			assert.Equal(t, strings.ReplaceAll(tt.want, "{url}", url), err.Error())
			assert.NotContains(t, err.Error(), "\n")
			assert.NotContains(t, err.Error(), "operation error")
		})
	}
}

// TestOperationErrorsNameTheObject pins how each operation's error reads:
// the object as s3://bucket/key, then the one-line explanation.
func TestOperationErrorsNameTheObject(t *testing.T) {
	url := closedPort(t)
	opts := testOptions(url, "pre")
	opts.MaxAttempts = 1
	b := newTestBackup(t, opts)
	src, _ := backuptest.WriteRandomFile(t, t.TempDir(), 10)
	dst := filepath.Join(t.TempDir(), "out")
	why := `cannot reach S3 endpoint ` + url + ` for bucket "millpond-test" (connection refused, 1 attempt); ` +
		`check the endpoint URL and that the server is running`
	_, err := b.List(context.Background(), "flow/")
	assert.EqualError(t, err, "list s3://millpond-test/pre/flow/: "+why)
	assert.EqualError(t, b.Upload(context.Background(), src, "flow/k"), "upload "+src+" to s3://millpond-test/pre/flow/k: "+why)
	assert.EqualError(t, b.Download(context.Background(), "flow/k", dst), "download s3://millpond-test/pre/flow/k to "+dst+": "+why)
	assert.EqualError(t, b.Delete(context.Background(), "flow/k"), "delete s3://millpond-test/pre/flow/k: "+why)

	live := newTestBackup(t, testOptions(backuptest.StartS3Server(t, nil, testBucket), "pre"))
	err = live.Download(context.Background(), "flow/none", dst)
	require.ErrorIs(t, err, backup.ErrNotFound)
	assert.Contains(t, err.Error(), ": object not found: no such key at http://")
	assert.NotContains(t, err.Error(), "operation error")
}

func TestExplainedErrorsKeepTheSDKErrorForErrorsAs(t *testing.T) {
	url := closedPort(t)
	opts := testOptions(url, "x")
	opts.MaxAttempts = 2
	err := newTestBackup(t, opts).Check(context.Background())
	require.Error(t, err)
	var opErr *net.OpError
	assert.True(t, errors.As(err, &opErr), "the network error stays wrapped: %#v", err)
	assert.Contains(t, err.Error(), "(connection refused, 2 attempts)")
}

func TestExplainOfOtherFailures(t *testing.T) {
	b := newTestBackup(t, testOptions("http://127.0.0.1:9", "x"))
	aws := newTestBackup(t, Options{Bucket: testBucket, Region: "eu-west-1"})
	tests := []struct {
		name string
		b    *S3Backup
		err  error
		want string
	}{
		{
			"UnknownHost", b,
			fmt.Errorf("operation error S3: ListObjectsV2: %w", &net.DNSError{Err: "no such host", Name: "s3.example.invalid", IsNotFound: true}),
			`cannot reach S3 endpoint http://127.0.0.1:9 for bucket "millpond-test": host s3.example.invalid not found; check the endpoint URL`,
		},
		{
			"AWSEndpointIsNamedWithItsRegion", aws,
			fmt.Errorf("operation error S3: PutObject: %w", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: network is unreachable")}),
			`cannot reach S3 endpoint AWS S3 (region eu-west-1) for bucket "millpond-test" (network is unreachable); ` +
				`check the endpoint URL and that the server is running`,
		},
		{
			"OtherErrorGivesTheInnermostCause", b,
			fmt.Errorf("operation error S3: GetObject: %w", fmt.Errorf("request send failed: %w", errors.New("x509: certificate signed by unknown authority"))),
			`S3 request for bucket "millpond-test" at http://127.0.0.1:9 failed: x509: certificate signed by unknown authority`,
		},
		{"CanceledStaysAsIs", b, context.Canceled, "context canceled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.b.explain(tt.err)
			assert.Equal(t, tt.want, got.Error())
			assert.ErrorIs(t, got, tt.err)
		})
	}
}

// TestSDKLogsGoToTheLoggerNotStderr makes the SDK log a warning (a response
// whose Date header it cannot parse) and checks that the warning reaches
// the backend's slog logger, at Debug level, and that nothing is written to
// stderr, where the SDK's default logger would print it.
func TestSDKLogsGoToTheLoggerNotStderr(t *testing.T) {
	badDate := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Date", "not a date")
			h.ServeHTTP(w, r)
		})
	}
	url := backuptest.StartS3Server(t, badDate, testBucket)

	r, w, err := os.Pipe()
	require.NoError(t, err)
	saved := os.Stderr
	os.Stderr = w
	defer func() { os.Stderr = saved }()

	var logs bytes.Buffer
	var mu sync.Mutex
	opts := testOptions(url, "p")
	opts.Logger = slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b := newTestBackup(t, opts)
	require.NoError(t, b.Check(context.Background()))
	backuptest.Put(t, b, "k", []byte("v"))
	assert.Equal(t, "v", string(backuptest.Get(t, b, "k")))

	os.Stderr = saved
	require.NoError(t, w.Close())
	leaked, err := io.ReadAll(r)
	require.NoError(t, err)
	assert.Empty(t, string(leaked), "nothing reaches stderr")
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, logs.String(), `level=DEBUG msg="aws sdk: warn: failed to parse response Date header value`)
	assert.NotContains(t, logs.String(), "level=WARN")
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
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
