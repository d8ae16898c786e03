package backupuri

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/backup/backuptest"
	"github.com/millpond/millpond/gostore/backup/dirbackup"
	"github.com/millpond/millpond/gostore/backup/s3backup"
)

func envOf(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		uri  string
		env  map[string]string
		want Spec
	}{
		{"AbsolutePath", "/var/lib/mp", nil, Spec{Scheme: SchemeFile, Dir: "/var/lib/mp"}},
		{"RelativePath", "backups/x", nil, Spec{Scheme: SchemeFile, Dir: "backups/x"}},
		{"PathWithColon", "data/a:b", nil, Spec{Scheme: SchemeFile, Dir: "data/a:b"}},
		{"FileURI", "file:///var/lib/mp", nil, Spec{Scheme: SchemeFile, Dir: "/var/lib/mp"}},
		{"FileURILocalhost", "file://localhost/srv/b", nil, Spec{Scheme: SchemeFile, Dir: "/srv/b"}},
		{"FileURIEscaped", "file:///srv/my%20backups", nil, Spec{Scheme: SchemeFile, Dir: "/srv/my backups"}},
		{"FileURIUppercase", "FILE:///srv", nil, Spec{Scheme: SchemeFile, Dir: "/srv"}},
		{"S3BucketOnly", "s3://bucket", nil, Spec{Scheme: SchemeS3, S3: s3backup.Options{Bucket: "bucket"}}},
		{"S3Prefix", "s3://bucket/a/b/", nil, Spec{Scheme: SchemeS3, S3: s3backup.Options{Bucket: "bucket", Prefix: "a/b"}}},
		{
			"S3Query", "s3://bucket/p?endpoint=http://127.0.0.1:9000&region=eu-west-1&part_size=6291456&max_attempts=7", nil,
			Spec{Scheme: SchemeS3, S3: s3backup.Options{
				Bucket: "bucket", Prefix: "p", Endpoint: "http://127.0.0.1:9000", Region: "eu-west-1",
				PartSize: 6 << 20, MaxAttempts: 7,
			}},
		},
		{
			"S3Environment", "s3://bucket/p",
			map[string]string{
				"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_DEFAULT_REGION": "ap-south-1",
				"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "tok",
			},
			Spec{Scheme: SchemeS3, S3: s3backup.Options{
				Bucket: "bucket", Prefix: "p", Endpoint: "http://127.0.0.1:1", Region: "ap-south-1",
				AccessKeyID: "id", SecretAccessKey: "secret", SessionToken: "tok",
			}},
		},
		{
			"S3EnvironmentPrecedence", "s3://bucket",
			map[string]string{
				"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:2",
				"AWS_REGION": "r1", "AWS_DEFAULT_REGION": "r2",
			},
			Spec{Scheme: SchemeS3, S3: s3backup.Options{Bucket: "bucket", Endpoint: "http://127.0.0.1:2", Region: "r1"}},
		},
		{
			"S3QueryBeatsEnvironment", "s3://bucket?endpoint=http://127.0.0.1:3&region=q",
			map[string]string{"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:2", "AWS_REGION": "r1"},
			Spec{Scheme: SchemeS3, S3: s3backup.Options{Bucket: "bucket", Endpoint: "http://127.0.0.1:3", Region: "q"}},
		},
		{
			"S3KeyWithoutSecretIgnored", "s3://bucket",
			map[string]string{"AWS_ACCESS_KEY_ID": "id"},
			Spec{Scheme: SchemeS3, S3: s3backup.Options{Bucket: "bucket"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.uri, envOf(tt.env))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, uri, wantErr string
	}{
		{"Empty", "", "empty backup URI"},
		{"UnknownScheme", "gs://bucket/p", `unsupported backup URI scheme "gs" in "gs://bucket/p": want a directory path, file:///path, or s3://`},
		{"HTTPScheme", "http://127.0.0.1/x", `unsupported backup URI scheme "http"`},
		{"FileRelative", "file:relative/dir", "needs an absolute path"},
		{"FileRemoteHost", "file://nas/share", "another host"},
		{"FileQuery", "file:///x?y=1", "no query"},
		{"S3NoBucket", "s3:///prefix", `backup URI "s3:///prefix" has no bucket: write s3://BUCKET or s3://BUCKET/PREFIX`},
		{"S3NothingAfterScheme", "s3://", `backup URI "s3://" has no bucket`},
		{"S3OneSlash", "s3:/bucket/p", `backup URI "s3:/bucket/p": an S3 URI starts with s3:// (two slashes)`},
		{"S3NoSlash", "S3:bucket", `an S3 URI starts with s3://`},
		{"S3Credentials", "s3://key:secret@bucket/p", "credentials in the URI are not supported"},
		{"S3UnknownParam", "s3://bucket?endpiont=x", `backup URI "s3://bucket?endpiont=xxxxx": unknown parameter "endpiont" (known: endpoint, max_attempts, max_backoff, part_size, region, stall_timeout, timeout)`},
		{"S3BadTimeout", "s3://bucket?timeout=10", `timeout="10": want a positive duration such as 10s or 1m`},
		{"S3BadStallTimeout", "s3://bucket?stall_timeout=-1s", `stall_timeout="-1s"`},
		{"S3BadMaxBackoff", "s3://bucket?max_backoff=x", `max_backoff="x"`},
		{"S3BadPartSize", "s3://bucket?part_size=big", "part_size"},
		{"S3BadMaxAttempts", "s3://bucket?max_attempts=0", "max_attempts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.uri, envOf(nil))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.NotContains(t, err.Error(), "secret")
		})
	}
}

func TestParseDeadlines(t *testing.T) {
	spec, err := Parse("s3://b/p?timeout=2s&stall_timeout=1m&max_attempts=2&max_backoff=500ms", envOf(nil))
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, spec.S3.Timeout)
	assert.Equal(t, time.Minute, spec.S3.StallTimeout)
	assert.Equal(t, 2, spec.S3.MaxAttempts)
	assert.Equal(t, 500*time.Millisecond, spec.S3.MaxBackoff)
}

// TestSecretsNeverEchoed puts a secret where users put them by mistake (the
// endpoint's userinfo, an unknown parameter, credentials in the URI) and
// checks that no error shows it.
func TestSecretsNeverEchoed(t *testing.T) {
	const secret = "TOPs3cret"
	tests := []struct{ name, uri, want string }{
		{"UnknownParam", "s3://bucket/p?secret_key=" + secret, `unknown parameter "secret_key"`},
		{"UnknownParamWithEndpointPassword", "s3://bucket/p?endpoint=http://u:" + secret + "@h:9&aws_secret=" + secret,
			`"s3://bucket/p?aws_secret=xxxxx&endpoint=http://u:xxxxx@h:9": unknown parameter "aws_secret"`},
		{"BadParamNextToEndpointPassword", "s3://bucket?endpoint=http://u:" + secret + "@h:9&timeout=x", `timeout="x"`},
		{"CredentialsInURI", "s3://AKIA:" + secret + "@bucket/p", "credentials in the URI are not supported"},
		{"Unparsable", "s3://bucket:" + secret + "/p%zz", "not a valid URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.uri, envOf(nil))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), secret)
		})
	}
	// An endpoint password that parses is shown masked by the backend.
	b, err := Open(context.Background(), "s3://bucket/p?endpoint=http://u:"+secret+"@127.0.0.1:9", WithGetenv(envOf(nil)))
	require.NoError(t, err)
	assert.Equal(t, "s3://bucket/p at http://u:xxxxx@127.0.0.1:9", b.String())
}

func TestOpenDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	for _, uri := range []string{dir, "file://" + dir} {
		b, err := Open(context.Background(), uri)
		require.NoError(t, err)
		require.IsType(t, &dirbackup.DirBackup{}, b)
		assert.Equal(t, "dir "+dir, b.String())
	}
	_, err := Open(context.Background(), filepath.Join(t.TempDir(), "missing", "store"))
	assert.ErrorContains(t, err, "does not exist")
}

func TestOpenS3RoundTrip(t *testing.T) {
	url := backuptest.StartS3Server(t, nil, "mp-bucket")
	env := envOf(map[string]string{"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"})
	b, err := Open(context.Background(), "s3://mp-bucket/flows?endpoint="+url+"&region=us-east-1", WithGetenv(env))
	require.NoError(t, err)
	require.IsType(t, &s3backup.S3Backup{}, b)
	assert.Equal(t, "s3://mp-bucket/flows at "+url, b.String())
	require.NoError(t, b.(backup.Checker).Check(context.Background()))
	backuptest.Put(t, b, "f1/seg", []byte("data"))
	assert.Equal(t, "data", string(backuptest.Get(t, b, "f1/seg")))
}

func TestOpenS3BadBucket(t *testing.T) {
	_, err := Open(context.Background(), "s3://UPPER/x", WithGetenv(envOf(nil)))
	assert.ErrorContains(t, err, "lowercase")
}

func TestOpenUsesProcessEnvironmentByDefault(t *testing.T) {
	url := backuptest.StartS3Server(t, nil, "env-bucket")
	t.Setenv("AWS_ENDPOINT_URL_S3", url)
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "id")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	b, err := Open(context.Background(), "s3://env-bucket/p")
	require.NoError(t, err)
	require.NoError(t, b.(backup.Checker).Check(context.Background()))
}
