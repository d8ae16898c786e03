// Package s3backup implements [backup.Backup] on Amazon S3 or any
// S3-compatible server (MinIO, Ceph, gofakes3...) with aws-sdk-go-v2.
//
// Objects live under an optional key prefix in one bucket: key "flow/seg" of
// a store with prefix "prod" is the S3 object "prod/flow/seg". Large files
// are uploaded in parts (multipart upload), which S3 makes visible only when
// complete, so a listing never shows a partial object. Every request is
// retried with exponential backoff on throttling, 5xx responses and
// connection errors; other errors (access denied, missing bucket) fail at
// once with an error naming the store.
package s3backup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
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
	DefaultMaxAttempts = 5
	DefaultMaxBackoff  = 20 * time.Second
)

// checkMaxAttempts and checkMaxBackoff bound the retries of [S3Backup.Check],
// so that a wrong endpoint is reported in seconds, not minutes.
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
	// HTTPClient overrides the SDK's HTTP client (tests, proxies).
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
	endpoint string
	region   string
	attempts int
	backoff  time.Duration
	logger   *slog.Logger
}

var (
	_ backup.Backup  = (*S3Backup)(nil)
	_ backup.Checker = (*S3Backup)(nil)
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
	if opts.Endpoint != "" && !strings.HasPrefix(opts.Endpoint, "http://") && !strings.HasPrefix(opts.Endpoint, "https://") {
		return nil, fmt.Errorf("s3 endpoint %q: want an http:// or https:// URL", opts.Endpoint)
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
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}

	loadOpts := []func(*config.LoadOptions) error{
		config.WithLogger(newSDKLogger(logger.Debug)),
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
	}
	cfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("s3://%s: cannot load the AWS configuration (AWS_CONFIG_FILE, AWS_PROFILE, ...): %w", opts.Bucket, err)
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
		region:   cfg.Region,
		attempts: opts.MaxAttempts,
		backoff:  opts.MaxBackoff,
		logger:   logger,
	}, nil
}

// String returns "s3://bucket/prefix", followed by " at ENDPOINT" for a
// custom endpoint.
func (b *S3Backup) String() string {
	s := "s3://" + b.bucket
	if b.prefix != "" {
		s += "/" + b.prefix
	}
	if b.endpoint != "" {
		s += " at " + b.endpoint
	}
	return s
}

// Check lists at most one object under the prefix, which proves the endpoint
// is reachable, the bucket exists and the credentials may list it. It
// retries less than other calls so that a wrong endpoint fails quickly.
func (b *S3Backup) Check(ctx context.Context) error {
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
	return b.explain(err)
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
