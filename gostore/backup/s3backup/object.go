package s3backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/millpond/millpond/gostore/backup"
)

// Upload sends localPath to key: one PUT for files smaller than the part
// size, a multipart upload otherwise (aborted on failure). Either way the
// object becomes visible only once complete. An attempt fails when no byte
// has moved for StallTimeout.
func (b *S3Backup) Upload(ctx context.Context, localPath, key string) error {
	if err := backup.ValidateKey(key); err != nil {
		return fmt.Errorf("upload %s to %s: %w", localPath, b, err)
	}
	f, err := os.Open(localPath)
	if err != nil {
		return fmt.Errorf("upload %s to %s in %s: %w", localPath, key, b, err)
	}
	defer f.Close()
	parent := ctx
	ctx, ci, done := b.begin(ctx, true, 0)
	defer done()
	_, err = b.uploader.Upload(ctx, &s3.PutObjectInput{
		Bucket: aws.String(b.bucket),
		Key:    aws.String(b.objectKey(key)),
		Body:   f,
	})
	if err != nil {
		return fmt.Errorf("upload %s to %s: %w", localPath, b.objectURL(key), b.explainCall(parent, ctx, ci, err, false))
	}
	b.logger.Debug("uploaded", "store", b.String(), "key", key)
	return nil
}

// Download writes the object at key to localPath atomically. A response
// body that breaks off midway is fetched again, up to the configured number
// of attempts. A missing key gives an error wrapping [backup.ErrNotFound].
// An attempt fails when no byte has moved for StallTimeout.
func (b *S3Backup) Download(ctx context.Context, key, localPath string) error {
	if err := backup.ValidateKey(key); err != nil {
		return fmt.Errorf("download from %s: %w", b, err)
	}
	parent := ctx
	ctx, ci, done := b.begin(ctx, true, 0)
	defer done()
	err := b.retryBody(ctx, key, func() (bool, error) { return b.downloadOnce(ctx, key, localPath) })
	if err != nil {
		return fmt.Errorf("download %s to %s: %w", b.objectURL(key), localPath, b.explainCall(parent, ctx, ci, err, false))
	}
	return nil
}

// retryBody runs once, a GET (itself retried by the SDK) and the reading of
// its body, again while the body breaks off midway, up to the configured
// number of attempts.
func (b *S3Backup) retryBody(ctx context.Context, key string, once func() (retryable bool, err error)) error {
	var err error
	for attempt := 1; attempt <= b.attempts; attempt++ {
		var retryable bool
		retryable, err = once()
		if err == nil || !retryable || ctx.Err() != nil {
			break
		}
		b.logger.Debug("retrying interrupted download", "store", b.String(), "key", key, "attempt", attempt, "err", b.mask(err.Error()))
	}
	return err
}

// getObject makes one GET of key; a missing key is an error wrapping
// [backup.ErrNotFound] that says where it was looked for.
func (b *S3Backup) getObject(ctx context.Context, key string) (*s3.GetObjectOutput, error) {
	out, err := b.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(b.bucket),
		Key:    aws.String(b.objectKey(key)),
	})
	if err != nil && isNotFound(err) {
		return nil, fmt.Errorf("%w: %w", backup.ErrNotFound, &explainedError{msg: "no such key at " + b.endpointName(), err: err})
	}
	return out, err
}

// downloadOnce makes one GET (itself retried by the SDK) and streams the
// body to localPath. It reports whether a failure happened while reading the
// body, which is worth another GET.
func (b *S3Backup) downloadOnce(ctx context.Context, key, localPath string) (retryable bool, err error) {
	out, err := b.getObject(ctx, key)
	if err != nil {
		return false, err
	}
	defer out.Body.Close()
	err = backup.WriteFileAtomic(localPath, func(f *os.File) error {
		n, err := io.Copy(f, out.Body)
		if err != nil {
			retryable = true
			return fmt.Errorf("read body: %w", err)
		}
		if out.ContentLength != nil && n != *out.ContentLength {
			retryable = true
			return fmt.Errorf("read body: got %d of %d bytes", n, *out.ContentLength)
		}
		return nil
	})
	return retryable, err
}

// Get returns the content of the object at key, read into memory. A
// missing key gives an error wrapping [backup.ErrNotFound].
func (b *S3Backup) Get(ctx context.Context, key string) ([]byte, error) {
	if err := backup.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("get from %s: %w", b, err)
	}
	parent := ctx
	ctx, ci, done := b.begin(ctx, false, b.smallDeadline())
	defer done()
	var data []byte
	err := b.retryBody(ctx, key, func() (bool, error) {
		out, err := b.getObject(ctx, key)
		if err != nil {
			return false, err
		}
		defer out.Body.Close()
		data, err = io.ReadAll(out.Body)
		if err != nil {
			return true, fmt.Errorf("read body: %w", err)
		}
		if out.ContentLength != nil && int64(len(data)) != *out.ContentLength {
			return true, fmt.Errorf("read body: got %d of %d bytes", len(data), *out.ContentLength)
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", b.objectURL(key), b.explainCall(parent, ctx, ci, err, false))
	}
	return data, nil
}

// Put stores data under key with one PUT, replacing any previous object.
func (b *S3Backup) Put(ctx context.Context, key string, data []byte) error {
	if err := backup.ValidateKey(key); err != nil {
		return fmt.Errorf("put to %s: %w", b, err)
	}
	parent := ctx
	ctx, ci, done := b.begin(ctx, false, b.smallDeadline())
	defer done()
	_, err := b.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        aws.String(b.bucket),
		Key:           aws.String(b.objectKey(key)),
		Body:          bytes.NewReader(data),
		ContentLength: aws.Int64(int64(len(data))),
	})
	if err != nil {
		return fmt.Errorf("put %s: %w", b.objectURL(key), b.explainCall(parent, ctx, ci, err, false))
	}
	b.logger.Debug("put", "store", b.String(), "key", key)
	return nil
}

// Create stores data under key with a PUT carrying "If-None-Match: *": S3
// refuses it (412 PreconditionFailed) if the key exists, and of concurrent
// conditional PUTs of one key lets exactly one through (the others get 412,
// or 409 ConditionalRequestConflict while the winner is in flight). Both
// answers give an error wrapping [backup.ErrExists], and neither is
// retried.
//
// A Create whose success was not heard (the answer lost, the attempt timed
// out) and that the SDK retried gets 412 from its own object: a caller that
// must tell that from losing a race reads the object back and compares.
func (b *S3Backup) Create(ctx context.Context, key string, data []byte) error {
	if err := backup.ValidateKey(key); err != nil {
		return fmt.Errorf("create in %s: %w", b, err)
	}
	parent := ctx
	ctx, ci, done := b.begin(ctx, false, b.smallDeadline())
	defer done()
	_, err := b.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        aws.String(b.bucket),
		Key:           aws.String(b.objectKey(key)),
		Body:          bytes.NewReader(data),
		ContentLength: aws.Int64(int64(len(data))),
		IfNoneMatch:   aws.String("*"),
	})
	if err != nil && isExists(err) {
		return fmt.Errorf("create %s: %w (at %s)", b.objectURL(key), backup.ErrExists, b.endpointName())
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", b.objectURL(key), b.explainCall(parent, ctx, ci, err, false))
	}
	b.logger.Debug("created", "store", b.String(), "key", key)
	return nil
}

// isExists reports whether err is S3's refusal of a conditional PUT because
// the key exists: 412 PreconditionFailed, or 409 ConditionalRequestConflict
// (another conditional write of the key in flight).
func isExists(err error) bool {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode() {
		case "PreconditionFailed", "ConditionalRequestConflict":
			return true
		}
	}
	var respErr *awshttp.ResponseError
	return errors.As(err, &respErr) && respErr.HTTPStatusCode() == http.StatusPreconditionFailed
}

// Delete removes the object at key. S3 reports success for a missing key,
// and so does Delete.
func (b *S3Backup) Delete(ctx context.Context, key string) error {
	if err := backup.ValidateKey(key); err != nil {
		return fmt.Errorf("delete from %s: %w", b, err)
	}
	parent := ctx
	ctx, ci, done := b.begin(ctx, false, b.smallDeadline())
	defer done()
	_, err := b.client.DeleteObject(ctx, &s3.DeleteObjectInput{
		Bucket: aws.String(b.bucket),
		Key:    aws.String(b.objectKey(key)),
	})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("delete %s: %w", b.objectURL(key), b.explainCall(parent, ctx, ci, err, false))
	}
	return nil
}
