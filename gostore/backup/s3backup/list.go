package s3backup

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/millpond/millpond/gostore/backup"
)

// List returns the objects whose key starts with prefix, sorted by key,
// following every page of the listing. Objects under the store prefix whose
// names are not valid keys (such as "folder/" markers made by consoles) are
// skipped.
func (b *S3Backup) List(ctx context.Context, prefix string) ([]backup.ObjectInfo, error) {
	if err := backup.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("list %s: %w", b, err)
	}
	strip := b.objectKey("")
	parent := ctx
	// The deadline is per page: a long listing is many small requests.
	ctx, ci, done := b.begin(ctx, false, 0)
	defer done()
	var out []backup.ObjectInfo
	pages := s3.NewListObjectsV2Paginator(b.client, &s3.ListObjectsV2Input{
		Bucket: aws.String(b.bucket),
		Prefix: aws.String(b.objectKey(prefix)),
	})
	for pages.HasMorePages() {
		pageCtx, cancel := context.WithTimeoutCause(ctx, b.smallDeadline(), &timeoutError{after: b.timeout})
		page, err := pages.NextPage(pageCtx)
		if err != nil {
			err = b.explainCall(parent, pageCtx, ci, err, false)
			cancel()
			return nil, fmt.Errorf("list %s: %w", b.objectURL(prefix), err)
		}
		cancel()
		for _, obj := range page.Contents {
			key, ok := strings.CutPrefix(aws.ToString(obj.Key), strip)
			if !ok || backup.ValidateKey(key) != nil {
				b.logger.Debug("skipping object that is not a valid key", "store", b.String(), "object", aws.ToString(obj.Key))
				continue
			}
			out = append(out, backup.ObjectInfo{Key: key, Size: aws.ToInt64(obj.Size)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
