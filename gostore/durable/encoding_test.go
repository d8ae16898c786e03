package durable

import (
	"bytes"
	"context"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup/dirbackup"
)

// fileOf writes data to a new file in a test directory and returns its path.
func fileOf(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "obj.sqlite")
	require.NoError(t, os.WriteFile(p, data, 0o600))
	return p
}

// contents the encoding tests round-trip: nothing, little, repetitive
// (the page structure of a SQLite file) and random (incompressible).
func contents() map[string][]byte {
	rng := rand.New(rand.NewSource(13))
	random := make([]byte, 3<<20)
	rng.Read(random)
	return map[string][]byte{
		"empty":      nil,
		"one byte":   {7},
		"repetitive": bytes.Repeat([]byte("key-000001\x00value\x00\x00\x00\x00"), 200_000),
		"random":     random,
	}
}

// An object file compresses and decompresses to the same bytes, with one
// encoder reused for every file (as an upload goroutine does, at the
// segments' level) or a new one per file (as a compaction does, at the
// compacted objects' level); the returned size and sha256 are those of
// the compressed file.
func TestEncodeRoundTrip(t *testing.T) {
	shared, err := newEncoder(segmentLevel)
	require.NoError(t, err)
	defer shared.Close()
	for name, data := range contents() {
		for _, reuse := range []bool{false, true} {
			t.Run(name, func(t *testing.T) {
				src := fileOf(t, data)
				var e encoded
				var err error
				if reuse {
					e, err = encodeFile(src, shared)
				} else {
					e, err = encodeFileAt(src, compactedLevel)
				}
				require.NoError(t, err)
				assert.Equal(t, src+".zst", e.Path)
				assert.Equal(t, int64(len(data)), e.Raw)
				sum, size, err := fileSHA256(e.Path)
				require.NoError(t, err)
				assert.Equal(t, size, e.Size)
				assert.Equal(t, sum, e.SHA256)
				if name == "repetitive" {
					assert.Less(t, e.Size*20, e.Raw, "compressed %d of %d bytes", e.Size, e.Raw)
				}
				out := filepath.Join(t.TempDir(), "out.sqlite")
				require.NoError(t, decodeFile(e.Path, out, "k"))
				got, err := os.ReadFile(out)
				require.NoError(t, err)
				assert.True(t, bytes.Equal(data, got), "round trip changed %d bytes into %d", len(data), len(got))
			})
		}
	}
}

// fetchObject checks the bytes as stored before it decodes anything: a
// damaged or truncated object is refused by its checksum, naming it; a
// stream that matches its checksum but does not decode (a record forged
// without a key) is refused too; objects of the format before compression
// (no encoding) are read as they are.
func TestFetchObject(t *testing.T) {
	ctx := context.Background()
	data := bytes.Repeat([]byte("SQLite format 3\x00 rows and pages "), 50_000)
	cases := []struct {
		name    string
		store   func(t *testing.T) (path string, ref ObjectRef) // the file uploaded and its reference
		damage  func(t *testing.T, path string)                 // applied to the stored object
		problem string                                          // "" when it reads back as data
	}{
		{"compressed", compressed(data), nil, ""},
		{"uncompressed, older format", plain(data), nil, ""},
		{"compressed, bytes flipped", compressed(data), flip, "expected"},
		{"compressed, truncated", compressed(data), truncate, "expected"},
		{"uncompressed, bytes flipped", plain(data), flip, "expected"},
		{"not zstd behind a matching checksum", func(t *testing.T) (string, ObjectRef) {
			p, ref := plain(data)(t)
			ref.Encoding = EncodingZstd
			return p, ref
		}, nil, "does not decompress"},
		{"unknown encoding", func(t *testing.T) (string, ObjectRef) {
			p, ref := compressed(data)(t)
			ref.Encoding = "brotli"
			return p, ref
		}, nil, `unknown encoding "brotli"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bdir := t.TempDir()
			b, err := dirbackup.New(bdir, nil)
			require.NoError(t, err)
			path, ref := c.store(t)
			ref.Key = "flow/segments/000000/w0000-e0000000001-s000000.sqlite"
			require.NoError(t, b.Upload(ctx, path, ref.Key))
			if c.damage != nil {
				c.damage(t, filepath.Join(bdir, filepath.FromSlash(ref.Key)))
			}
			out := filepath.Join(t.TempDir(), "got.sqlite")
			err = fetchObject(ctx, b, ref, out)
			if c.problem == "" {
				require.NoError(t, err)
				got, err := os.ReadFile(out)
				require.NoError(t, err)
				assert.True(t, bytes.Equal(data, got))
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrCorrupt)
			assert.Contains(t, err.Error(), ref.Key)
			assert.Contains(t, err.Error(), c.problem)
			_, statErr := os.Stat(out)
			assert.True(t, os.IsNotExist(statErr), "nothing is left at the destination of a refused object")
			_, statErr = os.Stat(out + ".zst")
			assert.True(t, os.IsNotExist(statErr), "the compressed download is removed")
		})
	}
}

func compressed(data []byte) func(t *testing.T) (string, ObjectRef) {
	return func(t *testing.T) (string, ObjectRef) {
		e, err := encodeFileAt(fileOf(t, data), segmentLevel)
		require.NoError(t, err)
		return e.Path, ObjectRef{Size: e.Size, SHA256: e.SHA256, Encoding: EncodingZstd}
	}
}

func plain(data []byte) func(t *testing.T) (string, ObjectRef) {
	return func(t *testing.T) (string, ObjectRef) {
		p := fileOf(t, data)
		sum, size, err := fileSHA256(p)
		require.NoError(t, err)
		return p, ObjectRef{Size: size, SHA256: sum}
	}
}

func flip(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	for i := len(data) / 2; i < len(data)/2+8; i++ {
		data[i] ^= 0x5a
	}
	require.NoError(t, os.WriteFile(path, data, 0o600))
}

func truncate(t *testing.T, path string) {
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(path, st.Size()/2))
}
