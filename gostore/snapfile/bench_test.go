package snapfile

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/millpond/millpond/gostore/rowbatch"
)

// benchRows makes n rows with 32-byte keys and 20-byte values.
func benchRows(n int, epoch int64) []rowbatch.Row {
	rows := make([]rowbatch.Row, n)
	for i := range rows {
		rows[i] = rowbatch.Row{StepID: "flow.step", Key: fmt.Sprintf("key-%028d", i), Epoch: epoch,
			Value: []byte(fmt.Sprintf("value-%014d", i))}
	}
	return rows
}

// benchStore makes a local store holding n such rows.
func benchStore(b *testing.B, n int) *File {
	ctx := context.Background()
	f, err := Create(ctx, filepath.Join(b.TempDir(), "s.sqlite"), testMeta(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	rows := benchRows(n, 1)
	for start := 0; start < n; start += 100_000 {
		if _, err := f.Write(ctx, rows[start:min(n, start+100_000)]); err != nil {
			b.Fatal(err)
		}
	}
	return f
}

// BenchmarkWrite100k writes 100k rows into an empty local store: the
// cost of a row checksum on the write path.
func BenchmarkWrite100k(b *testing.B) {
	ctx := context.Background()
	rows := benchRows(100_000, 1)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		f, err := Create(ctx, filepath.Join(b.TempDir(), "s.sqlite"), testMeta(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := f.Write(ctx, rows); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		f.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rows)), "ns/row")
}

// BenchmarkGet reads single keys of a 100k-row store.
func BenchmarkGet(b *testing.B) {
	ctx := context.Background()
	f := benchStore(b, 100_000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, found, err := f.Get(ctx, "flow.step", fmt.Sprintf("key-%028d", (i*7919)%100_000), 0); err != nil || !found {
			b.Fatal(err, found)
		}
	}
}

// BenchmarkGetManyPacked reads the keys of BenchmarkGet 1000 at a time,
// scattered over a 100k-row store: compare its ns/key with BenchmarkGet's
// ns/op.
func BenchmarkGetManyPacked(b *testing.B) {
	benchGetMany(b, 100_000, 1000)
}

// BenchmarkGetManyPacked1M is BenchmarkGetManyPacked on a 1M-row store.
func BenchmarkGetManyPacked1M(b *testing.B) {
	benchGetMany(b, 1_000_000, 1000)
}

func benchGetMany(b *testing.B, rows, batch int) {
	ctx := context.Background()
	f := benchStore(b, rows)
	keys := make([]string, batch)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for j := range keys {
			keys[j] = fmt.Sprintf("key-%028d", ((i*batch+j)*7919)%rows)
		}
		b.StartTimer()
		packed, err := f.GetManyPacked(ctx, "flow.step", keys, 0)
		if err != nil || len(packed) < batch*50 {
			b.Fatal(err, len(packed))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/key")
}

// BenchmarkScanPage scans a 100k-row store page by page.
func BenchmarkScanPage(b *testing.B) {
	ctx := context.Background()
	f := benchStore(b, 100_000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n := 0
		var cur Cursor
		for {
			rows, next, done, err := f.ScanPage(ctx, ScanOptions{}, cur)
			if err != nil {
				b.Fatal(err)
			}
			n += len(rows)
			if done {
				break
			}
			cur = next
		}
		if n != 100_000 {
			b.Fatal(n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100_000), "ns/row")
}

// BenchmarkVerify1M checks a store of 1M rows in full.
func BenchmarkVerify1M(b *testing.B) {
	ctx := context.Background()
	f := benchStore(b, 1_000_000)
	if err := f.Checkpoint(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := f.Verify(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
