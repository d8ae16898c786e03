package snapfile

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	benchGetMany(b, 100_000, 1000, 7919)
}

// BenchmarkGetManyPacked1M is BenchmarkGetManyPacked on a 1M-row store.
func BenchmarkGetManyPacked1M(b *testing.B) {
	benchGetMany(b, 1_000_000, 1000, 7919)
}

// BenchmarkGetManyPacked1MKeyOrder reads a 1M-row store's keys 1000 at a
// time in key order (a resumed flow whose input comes in key order).
func BenchmarkGetManyPacked1MKeyOrder(b *testing.B) {
	benchGetMany(b, 1_000_000, 1000, 1)
}

// benchGetMany reads batches of keys stride apart (modulo rows).
func benchGetMany(b *testing.B, rows, batch, stride int) {
	ctx := context.Background()
	f := benchStore(b, rows)
	keys := make([]string, batch)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for j := range keys {
			keys[j] = fmt.Sprintf("key-%028d", ((i*batch+j)*stride)%rows)
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

// BenchmarkFoldRecent folds 20k rows of the recent table, scattered over
// a 200k-row snaps, in statements of foldChunkRows rows and in one
// statement (what the fold did before); peak-MiB is how far the process's
// resident memory rose above where it was as the fold began (Linux), most
// of it the statement journal SQLite keeps in memory of every page a
// statement changes inside a transaction.
func BenchmarkFoldRecent(b *testing.B) {
	ctx := context.Background()
	for _, bc := range []struct {
		name  string
		chunk int
	}{{"chunked", 0}, {"one-statement", 1 << 30}} {
		b.Run(bc.name, func(b *testing.B) {
			var peak, rows int64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				f := benchStore(b, 200_000)
				f.foldChunk = bc.chunk
				// Small batches, every tenth key: each lands in recent.
				for start := 0; start < 200_000; start += 10_000 {
					batch := make([]rowbatch.Row, 0, 1000)
					for k := start; k < start+10_000; k += 10 {
						batch = append(batch, rowbatch.Row{StepID: "flow.step", Key: fmt.Sprintf("key-%028d", k),
							Epoch: 2, Value: []byte(fmt.Sprintf("value-two-%010d", k))})
					}
					if _, err := f.Write(ctx, batch); err != nil {
						b.Fatal(err)
					}
				}
				if f.RecentRows() != 20_000 {
					b.Fatalf("recent holds %d rows, want 20000", f.RecentRows())
				}
				// Writing 5 to clear_refs resets the peak (VmHWM) to now.
				if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
					b.Skipf("cannot reset the peak resident memory: %v", err)
				}
				before := procStatusKiB(b, "VmRSS")
				b.StartTimer()
				n, err := f.FoldRecent(ctx)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				rows += n
				peak = max(peak, procStatusKiB(b, "VmHWM")-before)
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(rows), "ns/row")
			b.ReportMetric(float64(peak)/1024, "peak-MiB")
		})
	}
}

// procStatusKiB reads a "Name: N kB" line of /proc/self/status.
func procStatusKiB(b *testing.B, name string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, name+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("%s in /proc/self/status: %v", name, err)
			}
			return n
		}
	}
	b.Fatalf("no %s in /proc/self/status", name)
	return 0
}

// BenchmarkSegment100k writes a whole-state epoch's segment of 100k rows,
// built (snapfile.Build, what the cutter does) and through SQLite's
// INSERTs (Create + Write, what it did before): ns a row of each. The rows
// come as a snapshot hands them over: in no key order (the order its keys
// were first touched), packed into one buffer they alias.
func BenchmarkSegment100k(b *testing.B) {
	ctx := context.Background()
	rows := benchRows(100_000, 1)
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	rows, err := rowbatch.Decode(rowbatch.Encode(rows), 1)
	if err != nil {
		b.Fatal(err)
	}
	opts := Options{Segment: true, LargePages: true}
	for _, how := range []string{"build", "insert"} {
		b.Run(how, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				path := filepath.Join(b.TempDir(), "seg.sqlite")
				var f *File
				var err error
				if how == "build" {
					f, err = Build(ctx, path, testMeta(), opts, rows)
				} else if f, err = Create(ctx, path, testMeta(), opts); err == nil {
					_, err = f.Write(ctx, rows)
				}
				if err != nil {
					b.Fatal(err)
				}
				if err := f.Seal(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rows)), "ns/row")
		})
	}
}
