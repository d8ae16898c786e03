package durable

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	"github.com/klauspost/compress/zstd"

	"github.com/millpond/millpond/gostore/backup"
)

// Object encoding: segments and compacted objects are SQLite files, mostly
// page structure and short rows, and are stored compressed with zstd. An
// ObjectRef's Size and SHA256 describe the bytes as stored, so a damaged
// object is refused by its checksum before anything decompresses it;
// Encoding says how to turn them back into the SQLite file. Objects
// written before compression have no Encoding and are read as they are.

// EncodingZstd marks an object stored as one zstd stream of its file.
const EncodingZstd = "zstd"

// The zstd levels objects are written at. A segment is compressed at the
// fastest level (zstd's 1): a whole-state epoch compresses every key every
// epoch, and at the default level (3) that was 30% of a word count's
// background CPU; on 100k-row segments of small states the fastest level
// takes about half the time (370-460 ns a row against 670-930) and
// stores 1-2% more bytes (go test -run XXX -bench Encode
// ./gostore/durable/). A compacted object, made far less often and what
// the backup mostly holds, keeps the default level: 3-4% fewer bytes of
// durable state for small states.
const (
	segmentLevel   = zstd.SpeedFastest
	compactedLevel = zstd.SpeedDefault
)

// newEncoder makes a zstd encoder at level for object files, to be Reset
// onto each output. One goroutine uses it at a time.
func newEncoder(level zstd.EncoderLevel) (*zstd.Encoder, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(level), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, fmt.Errorf("zstd encoder: %w", err)
	}
	return enc, nil
}

// encoded is what encodeFile wrote: the bytes as stored and the file's
// own size.
type encoded struct {
	Path   string
	Size   int64
	SHA256 string
	Raw    int64
}

// encodeFileAt compresses src as encodeFile does, with an encoder at
// level made for this call (a compaction's, made now and then).
func encodeFileAt(src string, level zstd.EncoderLevel) (encoded, error) {
	enc, err := newEncoder(level)
	if err != nil {
		return encoded{}, err
	}
	defer enc.Close()
	return encodeFile(src, enc)
}

// encodeFile compresses src into src+".zst" with enc, streaming, and
// returns the compressed file's size and sha256 and src's size. The caller
// removes both files.
func encodeFile(src string, enc *zstd.Encoder) (encoded, error) {
	in, err := os.Open(src)
	if err != nil {
		return encoded{}, fmt.Errorf("compress %s: %w", src, err)
	}
	defer in.Close()
	dst := src + ".zst"
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return encoded{}, fmt.Errorf("compress %s: %w", src, err)
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(out, h)}
	bw := bufio.NewWriterSize(cw, 256<<10)
	enc.Reset(bw)
	raw, err := io.Copy(enc, in)
	if err == nil {
		err = enc.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return encoded{}, fmt.Errorf("compress %s: %w", src, err)
	}
	return encoded{Path: dst, Size: cw.n, SHA256: hex.EncodeToString(h.Sum(nil)), Raw: raw}, nil
}

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// decodeFile decompresses src (one zstd stream) into dst, streaming. A
// stream that does not decode is ErrCorrupt, naming key.
func decodeFile(src, dst, key string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("decompress %s: %w", key, err)
	}
	defer in.Close()
	dec, err := zstd.NewReader(bufio.NewReaderSize(in, 256<<10), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return fmt.Errorf("decompress %s: zstd decoder: %w", key, err)
	}
	defer dec.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("decompress %s: %w", key, err)
	}
	ew := &errWriter{w: out}
	_, err = io.Copy(ew, dec)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	switch {
	case err == nil:
		return nil
	case ew.err != nil:
		os.Remove(dst)
		return fmt.Errorf("decompress %s to %s: %w", key, dst, ew.err)
	}
	os.Remove(dst)
	return fmt.Errorf("%w: %s: does not decompress (%s): %v", ErrCorrupt, key, EncodingZstd, err)
}

// errWriter keeps the error of a failed write, so a full disk is not
// taken for a damaged stream.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, err
}

// checkEncoding refuses an object whose encoding this version cannot read
// (a record written by a newer version).
func checkEncoding(o ObjectRef) error {
	switch o.Encoding {
	case "", EncodingZstd:
		return nil
	}
	return fmt.Errorf("%w: %s: unknown encoding %q (written by a newer millpond?)", ErrCorrupt, o.Key, o.Encoding)
}

// fetchObject downloads object o to path as its SQLite file: it checks
// the size and sha256 of the bytes as stored, then decompresses them when
// the object is encoded. A download that does not match is ErrCorrupt,
// naming the object, and nothing is decompressed.
func fetchObject(ctx context.Context, b backup.Backup, o ObjectRef, path string) error {
	if err := checkEncoding(o); err != nil {
		return err
	}
	stored := path
	if o.Encoding != "" {
		stored = path + ".zst"
		defer os.Remove(stored)
	}
	if err := b.Download(ctx, o.Key, stored); err != nil {
		return backupFailed(err) // it names the object and the store
	}
	if err := checkStored(o, stored); err != nil {
		os.Remove(stored)
		return err
	}
	if o.Encoding == "" {
		return nil
	}
	return decodeFile(stored, path, o.Key)
}

// checkStored checks a downloaded object's size and sha256 against its
// reference.
func checkStored(o ObjectRef, path string) error {
	sum, size, err := fileSHA256(path)
	if err != nil {
		return fmt.Errorf("checksum %s: %w", o.Key, err)
	}
	if size != o.Size || sum != o.SHA256 {
		return fmt.Errorf("%w: %s: expected %d bytes with sha256 %s, got %d bytes with %s", ErrCorrupt, o.Key, o.Size, o.SHA256, size, sum)
	}
	return nil
}
