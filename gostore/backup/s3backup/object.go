package s3backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/millpond/millpond/gostore/backup"
)

// Upload sends localPath to key: one PUT for files smaller than the part
// size, a multipart upload otherwise (aborted on failure). Either way the
// object becomes visible only once complete.
func (b *S3Backup) Upload(ctx context.Context, localPath, key string) error {
	if err := backup.ValidateKey(key); err != nil {
		return fmt.Errorf("upload %s to %s: %w", localPath, b, err)
	}
	f, err := os.Open(localPath)
	if err != nil {
		return fmt.Errorf("upload %s to %s in %s: %w", localPath, key, b, err)
	}
	defer f.Close()
	_, err = b.uploader.Upload(ctx, &s3.PutObjectInput{
		Bucket: aws.String(b.bucket),
		Key:    aws.String(b.objectKey(key)),
		Body:   f,
	})
	if err != nil {
		return fmt.Errorf("upload %s to %s: %w", localPath, b.objectURL(key), b.explain(err))
	}
	b.logger.Debug("uploaded", "store", b.String(), "key", key)
	return nil
}

// Download writes the object at key to localPath atomically. A response
// body that breaks off midway is fetched again, up to the configured number
// of attempts. A missing key gives an error wrapping [backup.ErrNotFound].
func (b *S3Backup) Download(ctx context.Context, key, localPath string) error {
	if err := backup.ValidateKey(key); err != nil {
		return fmt.Errorf("download from %s: %w", b, err)
	}
	var err error
	for attempt := 1; attempt <= b.attempts; attempt++ {
		var retryable bool
		retryable, err = b.downloadOnce(ctx, key, localPath)
		if err == nil || !retryable || ctx.Err() != nil {
			break
		}
		b.logger.Debug("retrying interrupted download", "store", b.String(), "key", key, "attempt", attempt, "err", err)
	}
	if err != nil {
		if errors.As(err, new(*explainedError)) {
			return fmt.Errorf("download %s to %s: %w", b.objectURL(key), localPath, err)
		}
		return fmt.Errorf("download %s from %s to %s: %w", key, b, localPath, err)
	}
	return nil
}

// downloadOnce makes one GET (itself retried by the SDK) and streams the
// body to localPath. It reports whether a failure happened while reading the
// body, which is worth another GET.
func (b *S3Backup) downloadOnce(ctx context.Context, key, localPath string) (retryable bool, err error) {
	out, err := b.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(b.bucket),
		Key:    aws.String(b.objectKey(key)),
	})
	if err != nil {
		if isNotFound(err) {
			return false, fmt.Errorf("%w: %w", backup.ErrNotFound, &explainedError{msg: "no such key at " + b.endpointName(), err: err})
		}
		return false, b.explain(err)
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

// Delete removes the object at key. S3 reports success for a missing key,
// and so does Delete.
func (b *S3Backup) Delete(ctx context.Context, key string) error {
	if err := backup.ValidateKey(key); err != nil {
		return fmt.Errorf("delete from %s: %w", b, err)
	}
	_, err := b.client.DeleteObject(ctx, &s3.DeleteObjectInput{
		Bucket: aws.String(b.bucket),
		Key:    aws.String(b.objectKey(key)),
	})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("delete %s: %w", b.objectURL(key), b.explain(err))
	}
	return nil
}
