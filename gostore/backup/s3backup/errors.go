package s3backup

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/logging"
)

// isNotFound reports whether err means the object does not exist (and not
// that the bucket does not).
func isNotFound(err error) bool {
	var nsk *types.NoSuchKey
	if errors.As(err, &nsk) {
		return true
	}
	var nf *types.NotFound
	if errors.As(err, &nf) {
		return true
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode() {
		case "NoSuchKey", "NotFound":
			return true
		case "NoSuchBucket":
			return false
		}
	}
	return false
}

// explainedError is an S3 failure said in one line for a user: which bucket,
// which endpoint, what went wrong and what to check. The SDK's own error,
// with its nested chain of operation, retry and transport errors, stays
// reachable with errors.Is/As but is not part of the message.
type explainedError struct {
	msg string
	err error
}

func (e *explainedError) Error() string { return e.msg }
func (e *explainedError) Unwrap() error { return e.err }

// credentialsError marks a failure to find or refresh credentials, so that
// explain can tell it from a failure of the request itself.
type credentialsError struct{ err error }

func (e *credentialsError) Error() string { return e.err.Error() }
func (e *credentialsError) Unwrap() error { return e.err }

// taggedCredentials wraps the configured credentials provider so that its
// failures carry a credentialsError.
type taggedCredentials struct{ aws.CredentialsProvider }

func (t taggedCredentials) Retrieve(ctx context.Context) (aws.Credentials, error) {
	c, err := t.CredentialsProvider.Retrieve(ctx)
	if err != nil {
		return c, &credentialsError{err}
	}
	return c, nil
}

// accessCodes are the S3 error codes that mean the credentials or the
// bucket's policy refuse the request.
var accessCodes = map[string]bool{
	"AccessDenied": true, "InvalidAccessKeyId": true, "SignatureDoesNotMatch": true,
	"ExpiredToken": true, "InvalidToken": true, "TokenRefreshRequired": true,
	"AllAccessDisabled": true, "AccountProblem": true,
}

// regionCodes are the S3 error codes of a request sent to the wrong region.
var regionCodes = map[string]bool{
	"PermanentRedirect": true, "AuthorizationHeaderMalformed": true,
	"IllegalLocationConstraintException": true,
}

// explain turns an SDK error into one line for a user (see explainedError);
// the original error stays wrapped. Errors of the caller's own context are
// returned unchanged.
func (b *S3Backup) explain(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var already *explainedError
	if errors.As(err, &already) {
		return err
	}
	b.logger.Debug("s3 request failed", "store", b.String(), "err", b.mask(err.Error()))
	explained := func(format string, args ...any) error {
		return &explainedError{msg: b.mask(fmt.Sprintf(format, args...)), err: err}
	}
	attempts := ""
	var maxErr *retry.MaxAttemptsError
	if errors.As(err, &maxErr) {
		attempts = fmt.Sprintf(", %d attempts", maxErr.Attempt)
		if maxErr.Attempt == 1 {
			attempts = ", 1 attempt"
		}
	}
	var credErr *credentialsError
	if errors.As(err, &credErr) {
		return explained("no usable AWS credentials for bucket %q at %s: none were found, or they could not be "+
			"refreshed; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)", b.bucket, b.endpointName())
	}
	// Only a failed network operation (dial, DNS, connection reset) means
	// the endpoint is unreachable; context errors also satisfy net.Error.
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return explained("cannot reach S3 endpoint %s for bucket %q: host %s not found%s; check the endpoint URL",
			b.endpointName(), b.bucket, dnsErr.Name, attempts)
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		cause := "network error"
		if opErr.Err != nil {
			cause = opErr.Err.Error()
			// "connect: connection refused" -> "connection refused"
			if i := strings.LastIndex(cause, ": "); i >= 0 {
				cause = cause[i+2:]
			}
		}
		if opErr.Timeout() {
			cause = "timed out"
		}
		return explained("cannot reach S3 endpoint %s for bucket %q (%s%s); check the endpoint URL and that the server is running",
			b.endpointName(), b.bucket, cause, attempts)
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		code := apiErr.ErrorCode()
		switch {
		case code == "NoSuchBucket":
			return explained("bucket %q does not exist at %s; check the bucket name in the URI, or create the bucket",
				b.bucket, b.endpointName())
		case accessCodes[code]:
			return explained("access to bucket %q at %s denied (%s); check the credentials (AWS_ACCESS_KEY_ID, "+
				"AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN or AWS_PROFILE) and the bucket's policy",
				b.bucket, b.endpointName(), code)
		case regionCodes[code]:
			return explained("bucket %q is not in region %s at %s (%s); give its region with ?region= in the URI or AWS_REGION",
				b.bucket, b.region, b.endpointName(), code)
		}
	}
	var respErr *awshttp.ResponseError
	if errors.As(err, &respErr) && respErr.HTTPStatusCode() > 0 {
		status := respErr.HTTPStatusCode()
		switch {
		case status == http.StatusForbidden:
			return explained("access to bucket %q at %s denied (HTTP 403); check the credentials (AWS_ACCESS_KEY_ID, "+
				"AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN or AWS_PROFILE) and the bucket's policy",
				b.bucket, b.endpointName())
		case status == http.StatusNotFound && !isNotFound(err):
			return explained("bucket %q not found at %s (HTTP 404); check the bucket name and the endpoint",
				b.bucket, b.endpointName())
		case status == http.StatusMovedPermanently || status == http.StatusTemporaryRedirect:
			return explained("bucket %q is not in region %s at %s (HTTP %d); give its region with ?region= in the URI or AWS_REGION",
				b.bucket, b.region, b.endpointName(), status)
		}
		what := http.StatusText(status)
		if apiErr != nil {
			what = apiErr.ErrorCode()
			if m := apiErr.ErrorMessage(); m != "" && m != what {
				what += ": " + m
			}
		}
		hint := "check the endpoint and the bucket"
		if status >= 500 {
			hint = "the server is failing; try again later or check its health"
		}
		return explained("S3 request for bucket %q at %s failed: %s (HTTP %d%s); %s",
			b.bucket, b.endpointName(), what, status, attempts, hint)
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return explained("S3 endpoint %s did not answer in time for bucket %q (timed out%s); check that the endpoint is reachable",
			b.endpointName(), b.bucket, attempts)
	}
	// Anything else (a TLS failure, a malformed answer): name the bucket and
	// endpoint, and give the innermost cause rather than the whole chain.
	return explained("S3 request for bucket %q at %s failed: %s%s", b.bucket, b.endpointName(), innermost(err), attempts)
}

// innermost returns the message of the deepest error in err's chain that
// still says something, skipping the SDK's operation and retry wrappers.
func innermost(err error) string {
	msg := err.Error()
	for {
		next := errors.Unwrap(err)
		if next == nil || next.Error() == "" {
			return msg
		}
		err, msg = next, next.Error()
	}
}

func (b *S3Backup) endpointName() string {
	if b.endpoint != "" {
		return b.shown
	}
	return "AWS S3 (region " + b.region + ")"
}

// newSDKLogger routes the SDK's log entries (checksum notices, IMDS
// fallbacks, response-body warnings, retry notes) to the backend's slog
// logger at Debug level: they are the SDK's internals, and a failure that
// matters reaches the caller as an explained error. Left alone, the SDK
// would write them to the process's stderr as raw "SDK ... WARN" lines.
// mask hides the endpoint's password in what the SDK says.
func newSDKLogger(debug logFunc, mask func(string) string) logging.Logger {
	return logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
		debug(mask("aws sdk: " + strings.ToLower(string(c)) + ": " + fmt.Sprintf(format, v...)))
	})
}

// mask hides the endpoint's password in s.
func (b *S3Backup) mask(s string) string {
	if b.secret == "" {
		return s
	}
	return strings.ReplaceAll(s, b.secret, "xxxxx")
}

type logFunc func(msg string, args ...any)
