package s3backup

import (
	"errors"
	"fmt"
	"net"
	"net/http"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
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

// explain prefixes err with a hint for the mistakes a user can fix: an
// unreachable endpoint, a missing bucket, refused credentials. The original
// error stays wrapped.
func (b *S3Backup) explain(err error) error {
	// Only a failed network operation (dial, DNS, connection reset) means
	// the endpoint is unreachable; context errors also satisfy net.Error.
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return fmt.Errorf("cannot reach endpoint %s: %w", b.endpointName(), err)
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode() {
		case "NoSuchBucket":
			return fmt.Errorf("bucket %q does not exist: %w", b.bucket, err)
		case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken":
			return fmt.Errorf("access to bucket %q denied, check the credentials: %w", b.bucket, err)
		}
	}
	var respErr *awshttp.ResponseError
	if errors.As(err, &respErr) {
		switch respErr.HTTPStatusCode() {
		case http.StatusForbidden:
			return fmt.Errorf("access to bucket %q denied (HTTP 403), check the credentials: %w", b.bucket, err)
		case http.StatusNotFound:
			if !isNotFound(err) {
				return fmt.Errorf("bucket %q not found (HTTP 404): %w", b.bucket, err)
			}
		}
		return err
	}
	return err
}

func (b *S3Backup) endpointName() string {
	if b.endpoint != "" {
		return b.endpoint
	}
	return "AWS S3"
}
