// Package s3backup implements [backup.Backup] on Amazon S3 or any
// S3-compatible server (MinIO, Ceph, gofakes3...) with aws-sdk-go-v2.
//
// Objects live under an optional key prefix in one bucket: key "flow/seg" of
// a store with prefix "prod" is the S3 object "prod/flow/seg". Large files
// are uploaded in parts (multipart upload), which S3 makes visible only when
// complete, so a listing never shows a partial object. Small objects
// (records) move in memory ([backup.Small]); Create is a PUT with
// "If-None-Match: *", which S3 makes atomic.
//
// Every request is retried with exponential backoff on throttling, 5xx
// responses, connection errors and timeouts; other errors (access denied,
// missing bucket) fail at once with an error naming the store.
//
// # Deadlines
//
// No call waits for an endpoint forever. Connecting, the TLS handshake and
// the wait for response headers are each bounded by Timeout (default 10 s).
// A small request (List's pages, Get, Put, Create, Delete, Check) has
// Timeout for each whole attempt; a large transfer (Upload, Download) has
// no fixed total but fails an attempt when no byte has moved for
// StallTimeout (default 30 s). At most MaxAttempts attempts are made
// (default 4), MaxBackoff apart at most (default 10 s), so a small call to
// an endpoint that accepts connections and never answers fails in under a
// minute (4 x 10 s plus at most 14 s of backoff), and Check, which gives up
// after 1.5 x Timeout, in 15 s. The error says so:
//
//	s3://bucket/prefix (endpoint http://127.0.0.1:9000) did not answer within 10s (2 attempts);
//	check that the endpoint is up and reachable, or raise timeout= in the backup URI
//
// A call whose context is cancelled returns at once. The URI parameters of
// backupuri set these options (timeout=, stall_timeout=, max_attempts=,
// max_backoff=).
//
// A password in the endpoint URL (http://user:PASS@host) is never shown:
// String, errors and logs show http://user:xxxxx@host.
package s3backup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/feature/s3/manager"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/millpond/millpond/gostore/backup"
)

// Defaults for the zero values of [Options].
const (
	DefaultRegion      = "us-east-1"
	DefaultPartSize    = 8 << 20
	DefaultConcurrency = 4
	DefaultMaxAttempts = 4
	DefaultMaxBackoff  = 10 * time.Second
	// DefaultTimeout bounds each attempt of a small request, and the
	// connect, TLS handshake and response-header waits of every request.
	DefaultTimeout = 10 * time.Second
	// DefaultStallTimeout fails an attempt of a large transfer when no byte
	// has moved for that long.
	DefaultStallTimeout = 30 * time.Second
)

// checkMaxAttempts and checkMaxBackoff bound the retries of [S3Backup.Check],
// so that a wrong endpoint is reported in seconds, not minutes; the whole
// check also gives up after 1.5 x Timeout (see checkDeadline).
const (
	checkMaxAttempts = 3
	checkMaxBackoff  = time.Second
)

// Options configures an [S3Backup]. Only Bucket is required.
type Options struct {
	// Bucket is the bucket name.
	Bucket string
	// Prefix is prepended (with a "/") to every key; leading and trailing
	// slashes are ignored. Empty means the whole bucket.
	Prefix string
	// Endpoint is the base URL of an S3-compatible server, e.g.
	// "http://127.0.0.1:9000". When set, path-style addressing is used and
	// credentials are never looked up from the EC2 instance metadata service.
	// Empty means AWS S3.
	Endpoint string
	// Region defaults to the region of the standard AWS configuration
	// (AWS_REGION, AWS_DEFAULT_REGION, the shared config file), then to
	// DefaultRegion.
	Region string
	// AccessKeyID, SecretAccessKey and SessionToken are explicit static
	// credentials. When AccessKeyID is empty the standard AWS credential
	// chain is used (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
	// AWS_SESSION_TOKEN, shared files, SSO, instance roles).
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	// PartSize is the size of each part of a multipart upload; files smaller
	// than one part are uploaded with a single PUT. Default DefaultPartSize;
	// values below 5 MiB (the S3 minimum) are raised to 5 MiB.
	PartSize int64
	// Concurrency is the number of parts of one upload sent in parallel.
	// Default DefaultConcurrency.
	Concurrency int
	// MaxAttempts is the number of attempts of each request (1 means no
	// retry). Default DefaultMaxAttempts.
	MaxAttempts int
	// MaxBackoff caps the delay between attempts. Default DefaultMaxBackoff.
	MaxBackoff time.Duration
	// Timeout bounds each attempt of a small request (a page of List, Get,
	// Put, Create, Delete, Check), its response included, and the time to
	// connect, to complete a TLS handshake and to receive response headers
	// of any request. Default DefaultTimeout.
	Timeout time.Duration
	// StallTimeout fails an attempt of a large transfer (Upload, Download)
	// when no byte has moved for that long; such transfers have no fixed
	// total, so a big file on a slow link still gets through. Default
	// DefaultStallTimeout.
	StallTimeout time.Duration
	// HTTPClient overrides the SDK's HTTP client (tests, proxies). Timeout
	// and StallTimeout still apply to every attempt; the dial, TLS and
	// header timeouts are then the client's own.
	HTTPClient *http.Client
	// Logger receives debug logs of operations and, at Debug level too,
	// the AWS SDK's own log entries; nil discards them. Nothing is ever
	// written to stderr directly.
	Logger *slog.Logger
}

// S3Backup is a [backup.Backup] on an S3 bucket. It is safe for concurrent
// use.
type S3Backup struct {
	client   *s3.Client
	uploader *manager.Uploader
	bucket   string
	prefix   string // without slashes at either end
	endpoint string // as given, for the SDK
	shown    string // endpoint with any password masked, for people
	secret   string // the endpoint's password, masked wherever it shows
	region   string
	attempts int
	backoff  time.Duration
	timeout  time.Duration
	stall    time.Duration
	logger   *slog.Logger
}

var (
	_ backup.Backup  = (*S3Backup)(nil)
	_ backup.Checker = (*S3Backup)(nil)
	_ backup.Small   = (*S3Backup)(nil)
)

// New returns an S3Backup for opts. It loads the standard AWS configuration
// for what opts leaves out but makes no request; call [S3Backup.Check] to
// validate the endpoint, bucket and credentials before first use.
func New(ctx context.Context, opts Options) (*S3Backup, error) {
	if err := validateBucket(opts.Bucket); err != nil {
		return nil, err
	}
	prefix := strings.Trim(opts.Prefix, "/")
	if prefix != "" {
		if err := backup.ValidateKey(prefix); err != nil {
			return nil, fmt.Errorf("s3 prefix: %w", err)
		}
	}
	shown, secret := RedactEndpoint(opts.Endpoint)
	if opts.Endpoint != "" && !strings.HasPrefix(opts.Endpoint, "http://") && !strings.HasPrefix(opts.Endpoint, "https://") {
		return nil, fmt.Errorf("s3 endpoint %q: want an http:// or https:// URL", shown)
	}
	if opts.PartSize <= 0 {
		opts.PartSize = DefaultPartSize
	}
	opts.PartSize = max(opts.PartSize, manager.MinUploadPartSize)
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = DefaultMaxAttempts
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = DefaultMaxBackoff
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.StallTimeout <= 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	mask := func(s string) string {
		if secret == "" {
			return s
		}
		return strings.ReplaceAll(s, secret, "xxxxx")
	}

	loadOpts := []func(*config.LoadOptions) error{
		config.WithLogger(newSDKLogger(logger.Debug, mask)),
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = opts.MaxAttempts
				o.MaxBackoff = opts.MaxBackoff
				// Retries are not rationed: a durable store must ride out
				// long throttling rather than give up early.
				o.RateLimiter = ratelimit.None
			})
		}),
	}
	if opts.Region != "" {
		loadOpts = append(loadOpts, config.WithRegion(opts.Region))
	}
	if opts.AccessKeyID != "" {
		loadOpts = append(loadOpts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(opts.AccessKeyID, opts.SecretAccessKey, opts.SessionToken)))
	}
	if opts.Endpoint != "" {
		loadOpts = append(loadOpts, config.WithEC2IMDSClientEnableState(imds.ClientDisabled))
	}
	if opts.HTTPClient != nil {
		loadOpts = append(loadOpts, config.WithHTTPClient(opts.HTTPClient))
	} else {
		loadOpts = append(loadOpts, config.WithHTTPClient(newHTTPClient(opts.Timeout)))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("s3://%s: cannot load the AWS configuration (AWS_CONFIG_FILE, AWS_PROFILE, ...): %s", opts.Bucket, mask(err.Error()))
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	if cfg.Credentials != nil {
		cfg.Credentials = taggedCredentials{cfg.Credentials}
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		// S3-compatible servers often return no checksum; do not log that.
		o.DisableLogOutputChecksumValidationSkipped = true
		o.HTTPClient = &deadlineClient{base: o.HTTPClient, timeout: opts.Timeout, stall: opts.StallTimeout}
		if opts.Endpoint != "" {
			o.BaseEndpoint = aws.String(opts.Endpoint)
			o.UsePathStyle = true
		}
	})
	uploader := manager.NewUploader(client, func(u *manager.Uploader) {
		u.PartSize = opts.PartSize
		u.Concurrency = opts.Concurrency
	})
	return &S3Backup{
		client:   client,
		uploader: uploader,
		bucket:   opts.Bucket,
		prefix:   prefix,
		endpoint: opts.Endpoint,
		shown:    shown,
		secret:   secret,
		region:   cfg.Region,
		attempts: opts.MaxAttempts,
		backoff:  opts.MaxBackoff,
		timeout:  opts.Timeout,
		stall:    opts.StallTimeout,
		logger:   logger,
	}, nil
}

// String returns "s3://bucket/prefix", followed by " at ENDPOINT" for a
// custom endpoint (its password masked).
func (b *S3Backup) String() string {
	s := b.storeURL()
	if b.endpoint != "" {
		s += " at " + b.shown
	}
	return s
}

// storeURL is "s3://bucket/prefix".
func (b *S3Backup) storeURL() string {
	s := "s3://" + b.bucket
	if b.prefix != "" {
		s += "/" + b.prefix
	}
	return s
}

// RedactEndpoint returns endpoint with the password of its userinfo masked
// ("http://user:xxxxx@host"), and the password itself (empty if none), so
// that callers can mask it in any text. A URL that does not parse is
// returned as "(unparsable endpoint URL)" lest it hold a secret.
func RedactEndpoint(endpoint string) (shown, password string) {
	if endpoint == "" || !strings.Contains(endpoint, "@") {
		return endpoint, ""
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "(unparsable endpoint URL)", ""
	}
	if u.User == nil {
		return endpoint, ""
	}
	password, _ = u.User.Password()
	return u.Redacted(), password
}

// checkDeadline bounds the whole of Check: one full attempt and quick
// retries of failures that come fast (a refused connection, a 5xx).
func (b *S3Backup) checkDeadline() time.Duration { return b.timeout + b.timeout/2 }

// Check lists at most one object under the prefix, which proves the endpoint
// is reachable, the bucket exists and the credentials may list it. It
// retries less than other calls and gives up after 1.5 x Timeout, so that a
// wrong or hung endpoint fails quickly.
func (b *S3Backup) Check(ctx context.Context) error {
	parent := ctx
	ctx, ci, done := b.begin(ctx, false, b.checkDeadline())
	defer done()
	_, err := b.client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{
		Bucket:  aws.String(b.bucket),
		Prefix:  aws.String(b.objectKey("")),
		MaxKeys: aws.Int32(1),
	}, func(o *s3.Options) {
		o.Retryer = retry.AddWithMaxBackoffDelay(
			retry.AddWithMaxAttempts(o.Retryer, min(b.attempts, checkMaxAttempts)),
			min(b.backoff, checkMaxBackoff))
	})
	// The explained error names the bucket and the endpoint; callers
	// name the store (prefix included) when they wrap it.
	return b.explainCall(parent, ctx, ci, err, true)
}

// objectURL is "s3://bucket/objectkey" of key (or of a listing prefix),
// which names an object in an error next to an explanation that names the
// endpoint.
func (b *S3Backup) objectURL(key string) string {
	return "s3://" + b.bucket + "/" + b.objectKey(key)
}

// objectKey maps a store key (or listing prefix) to the S3 object key.
func (b *S3Backup) objectKey(key string) string {
	if b.prefix == "" {
		return key
	}
	return b.prefix + "/" + key
}

// validateBucket applies the S3 bucket naming rules that matter for a clear
// early error: 3 to 63 characters of lowercase letters, digits, '.' and '-'.
func validateBucket(bucket string) error {
	if bucket == "" {
		return errors.New("s3: bucket name is required")
	}
	if len(bucket) < 3 || len(bucket) > 63 {
		return fmt.Errorf("s3 bucket %q: name must be 3 to 63 characters long", bucket)
	}
	for _, c := range bucket {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return fmt.Errorf("s3 bucket %q: name may only hold lowercase letters, digits, '.' and '-'", bucket)
		}
	}
	return nil
}
