package durable

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// BenchmarkEncode compresses a whole-state epoch's segment (100k rows as a
// word count or a 20-byte-state flow makes them, built as the cutter
// builds them) at zstd's levels: the stored share of the file's bytes and
// the time a row. encoderLevel is the one objects are written at.
func BenchmarkEncode(b *testing.B) {
	shapes := []struct {
		name  string
		value func(i int) []byte
	}{
		// A pickled small int, as a word count's state.
		{"count", func(i int) []byte { return []byte{0x80, 4, 0x4b, byte(i % 200), 0x2e} }},
		// A 20-byte pickle of varying digits.
		{"20B", func(i int) []byte { return []byte(fmt.Sprintf("\x80\x04\x95%015d.", i*7919%100000)) }},
	}
	levels := []zstd.EncoderLevel{zstd.SpeedFastest, zstd.SpeedDefault, zstd.SpeedBetterCompression}
	for _, shape := range shapes {
		rows := make([]rowbatch.Row, 100_000)
		for i := range rows {
			rows[i] = rowbatch.Row{StepID: "wordcount.count", Key: fmt.Sprintf("w%07d", i*7919%1000003), Epoch: 5,
				Value: shape.value(i)}
		}
		path := filepath.Join(b.TempDir(), "seg.sqlite")
		f, err := snapfile.Build(context.Background(), path, snapfile.Meta{FlowID: "f", Kind: snapfile.KindSegment,
			WorkerCount: 1, KeyGroupCount: 16}, snapfile.Options{Segment: true, LargePages: true}, rows)
		if err != nil {
			b.Fatal(err)
		}
		if err := f.Seal(); err != nil {
			b.Fatal(err)
		}
		f.Close()
		st, err := os.Stat(path)
		if err != nil {
			b.Fatal(err)
		}
		for _, level := range levels {
			b.Run(fmt.Sprintf("%s/%s", shape.name, level), func(b *testing.B) {
				enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(level), zstd.WithEncoderConcurrency(1))
				if err != nil {
					b.Fatal(err)
				}
				defer enc.Close()
				var e encoded
				for i := 0; i < b.N; i++ {
					if e, err = encodeFile(path, enc); err != nil {
						b.Fatal(err)
					}
					os.Remove(e.Path)
				}
				b.ReportMetric(float64(e.Size)/float64(st.Size()), "stored/raw")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rows)), "ns/row")
			})
		}
	}
}
