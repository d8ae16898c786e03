package backuptest

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/stretchr/testify/require"
)

// Static credentials accepted by the test S3 server (gofakes3 does not check
// signatures; any value works).
const (
	TestAccessKeyID     = "millpond-test"
	TestSecretAccessKey = "millpond-test-secret"
)

// StartS3Server starts an in-memory S3-protocol server (gofakes3) on
// 127.0.0.1 with the given buckets, stopped when the test ends, and returns
// its base URL. wrap, if non-nil, wraps the S3 handler, to count or fail
// requests.
func StartS3Server(t testing.TB, wrap func(http.Handler) http.Handler, buckets ...string) string {
	t.Helper()
	mem := s3mem.New()
	for _, bucket := range buckets {
		require.NoError(t, mem.CreateBucket(bucket))
	}
	var h http.Handler = gofakes3.New(mem).Server()
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
