// Package backupuri opens a [backup.Backup] from a URI:
//
//	/var/lib/millpond/backup             a directory (dirbackup)
//	file:///var/lib/millpond/backup      the same
//	s3://bucket/prefix                   an S3 bucket (s3backup)
//	s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1
//
// For s3:// the query may hold:
//
//	endpoint=URL         an S3-compatible server (default: AWS S3)
//	region=R             the bucket's region
//	part_size=BYTES      multipart upload part size (default 8 MiB)
//	timeout=DUR          each attempt of a small request, and connect, TLS and
//	                     response-header waits (default 10s)
//	stall_timeout=DUR    a transfer attempt fails when no byte moved for DUR
//	                     (default 30s)
//	max_attempts=N       attempts per request (default 4)
//	max_backoff=DUR      cap of the delay between attempts (default 10s)
//
// DUR is a Go duration ("10s", "1m30s"). With the defaults a call to an
// endpoint that accepts connections and never answers fails in under a
// minute, and Check in 15 s (see s3backup). What the URI leaves out comes from the standard AWS
// environment: AWS_ENDPOINT_URL_S3 then AWS_ENDPOINT_URL for the endpoint,
// AWS_REGION then AWS_DEFAULT_REGION for the region, AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN for credentials (and, when
// those are unset, the rest of the AWS credential chain). Credentials are
// never accepted in the URI itself, so they do not end up in logs. Error
// messages never show the password of an endpoint URL
// (http://user:xxxxx@host) nor the value of an unknown parameter, which may
// be a secret put in the wrong place.
package backupuri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/backup/dirbackup"
	"github.com/millpond/millpond/gostore/backup/s3backup"
)

// Supported lists the accepted URI forms, for help and error messages.
const Supported = "a directory path, file:///path, or s3://bucket/prefix[?endpoint=URL&region=R&timeout=10s]"

// Schemes of a parsed [Spec].
const (
	SchemeFile = "file"
	SchemeS3   = "s3"
)

// Spec is a parsed backup URI with the environment applied.
type Spec struct {
	// Scheme is SchemeFile or SchemeS3.
	Scheme string
	// Dir is the directory of a SchemeFile spec, as given (maybe relative).
	Dir string
	// S3 holds the options of a SchemeS3 spec.
	S3 s3backup.Options
}

// Option adjusts how [Open] works.
type Option func(*config)

type config struct {
	logger *slog.Logger
	getenv func(string) string
}

// WithLogger passes logger to the backend.
func WithLogger(logger *slog.Logger) Option { return func(c *config) { c.logger = logger } }

// WithGetenv replaces os.Getenv as the source of AWS_* variables.
func WithGetenv(getenv func(string) string) Option { return func(c *config) { c.getenv = getenv } }

// Open parses uri and returns the backend it names. It makes no network
// request; a backend implementing [backup.Checker] can be checked afterwards.
// A directory whose parent is missing is an error (see [dirbackup.New]).
func Open(ctx context.Context, uri string, opts ...Option) (backup.Backup, error) {
	cfg := config{getenv: os.Getenv}
	for _, o := range opts {
		o(&cfg)
	}
	spec, err := Parse(uri, cfg.getenv)
	if err != nil {
		return nil, err
	}
	switch spec.Scheme {
	case SchemeFile:
		return dirbackup.New(spec.Dir, cfg.logger)
	default:
		spec.S3.Logger = cfg.logger
		return s3backup.New(ctx, spec.S3)
	}
}

var schemeRE = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9+.-]*):`)

// s3Params are the query parameters accepted by s3:// URIs.
var s3Params = []string{"endpoint", "max_attempts", "max_backoff", "part_size", "region", "stall_timeout", "timeout"}

// Parse parses uri, taking missing S3 settings from getenv (os.Getenv in
// [Open]). It checks the URI's shape only; the backend constructors check the
// rest.
func Parse(uri string, getenv func(string) string) (Spec, error) {
	if uri == "" {
		return Spec{}, fmt.Errorf("empty backup URI: want %s", Supported)
	}
	m := schemeRE.FindStringSubmatch(uri)
	if m != nil && strings.EqualFold(m[1], SchemeS3) && !strings.HasPrefix(strings.ToLower(uri), "s3://") {
		// "s3:/bucket" or "s3:bucket" is a mistyped S3 URI, not a directory
		// named "s3:".
		return Spec{}, fmt.Errorf("backup URI %q: an S3 URI starts with s3:// (two slashes), as in s3://bucket/prefix", uri)
	}
	if m == nil || (!strings.Contains(uri, "://") && !strings.EqualFold(m[1], SchemeFile)) {
		// No scheme: a plain path (which may contain ':').
		return Spec{Scheme: SchemeFile, Dir: uri}, nil
	}
	switch scheme := strings.ToLower(m[1]); scheme {
	case SchemeFile:
		return parseFile(uri)
	case SchemeS3:
		return parseS3(uri, getenv)
	default:
		return Spec{}, fmt.Errorf("unsupported backup URI scheme %q in %q: want %s", scheme, uri, Supported)
	}
}

func parseFile(uri string) (Spec, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return Spec{}, fmt.Errorf("backup URI %q: %w", uri, err)
	}
	if u.Opaque != "" || !strings.HasPrefix(u.Path, "/") {
		return Spec{}, fmt.Errorf("backup URI %q: a file URI needs an absolute path, as in file:///var/lib/millpond", uri)
	}
	if u.Host != "" && u.Host != "localhost" {
		return Spec{}, fmt.Errorf("backup URI %q: file URIs on another host (%q) are not supported; mount it and use the local path", uri, u.Host)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return Spec{}, fmt.Errorf("backup URI %q: a file URI takes no query or fragment", uri)
	}
	return Spec{Scheme: SchemeFile, Dir: u.Path}, nil
}

func parseS3(raw string, getenv func(string) string) (Spec, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// The parser's error quotes the URI or a part of it, which may be
		// a secret; it is not shown.
		return Spec{}, errors.New("backup URI s3://...: not a valid URL; check the bucket name, the parameters and their %-escapes")
	}
	uri := safeURI(u)
	if u.User != nil {
		return Spec{}, fmt.Errorf("backup URI %q: credentials in the URI are not supported; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", uri)
	}
	if u.Host == "" {
		return Spec{}, fmt.Errorf("backup URI %q has no bucket: write s3://BUCKET or s3://BUCKET/PREFIX", uri)
	}
	if u.Fragment != "" {
		return Spec{}, fmt.Errorf("backup URI %q: an s3 URI takes no fragment", uri)
	}
	opts := s3backup.Options{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/")}
	q := u.Query()
	for name := range q {
		if i := sort.SearchStrings(s3Params, name); i == len(s3Params) || s3Params[i] != name {
			return Spec{}, fmt.Errorf("backup URI %q: unknown parameter %q (known: %s)", uri, name, strings.Join(s3Params, ", "))
		}
	}
	opts.Endpoint = firstNonEmpty(q.Get("endpoint"), getenv("AWS_ENDPOINT_URL_S3"), getenv("AWS_ENDPOINT_URL"))
	opts.Region = firstNonEmpty(q.Get("region"), getenv("AWS_REGION"), getenv("AWS_DEFAULT_REGION"))
	if id, secret := getenv("AWS_ACCESS_KEY_ID"), getenv("AWS_SECRET_ACCESS_KEY"); id != "" && secret != "" {
		opts.AccessKeyID, opts.SecretAccessKey, opts.SessionToken = id, secret, getenv("AWS_SESSION_TOKEN")
	}
	if v := q.Get("part_size"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return Spec{}, fmt.Errorf("backup URI %q: part_size=%q: want a positive number of bytes", uri, v)
		}
		opts.PartSize = n
	}
	if v := q.Get("max_attempts"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return Spec{}, fmt.Errorf("backup URI %q: max_attempts=%q: want a positive integer", uri, v)
		}
		opts.MaxAttempts = n
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"timeout", &opts.Timeout}, {"stall_timeout", &opts.StallTimeout}, {"max_backoff", &opts.MaxBackoff}} {
		if v := q.Get(d.name); v != "" {
			n, err := time.ParseDuration(v)
			if err != nil || n <= 0 {
				return Spec{}, fmt.Errorf("backup URI %q: %s=%q: want a positive duration such as 10s or 1m", uri, d.name, v)
			}
			*d.dst = n
		}
	}
	return Spec{Scheme: SchemeS3, S3: opts}, nil
}

// safeURI renders u for messages: the userinfo replaced, the endpoint's
// password masked, and unknown parameters named without their values.
func safeURI(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.User("REDACTED")
	}
	q := u.Query()
	for name, vals := range q {
		i := sort.SearchStrings(s3Params, name)
		known := i < len(s3Params) && s3Params[i] == name
		for j := range vals {
			switch {
			case !known:
				vals[j] = "xxxxx"
			case name == "endpoint":
				vals[j], _ = s3backup.RedactEndpoint(vals[j])
			}
		}
	}
	c.RawQuery = q.Encode()
	c.Fragment = ""
	s := c.String()
	if !strings.Contains(s, "://") {
		s = strings.Replace(s, ":", "://", 1) // "s3:" for an empty host
	}
	// Encode escapes the mask's ':' and '@'; unescape them for reading.
	if r, err := url.QueryUnescape(s); err == nil {
		return r
	}
	return s
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
