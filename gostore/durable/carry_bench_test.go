package durable

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/millpond/millpond/gostore/rowbatch"
)

// BenchmarkCarriedWholeEpoch: a worker of 100k keys (about 100-byte
// states, as in the windowing benchmark) whose epoch touches a quarter of
// them, written whole from the carried state.
func BenchmarkCarriedWholeEpoch(b *testing.B) {
	const keys, touched = 100_000, 25_000
	rng := rand.New(rand.NewSource(1))
	value := make([]byte, 100)
	batch := func(e int64, n int) rowbatch.Batch {
		rows := make([]rowbatch.Row, n)
		for i := range rows {
			k := i
			if n < keys {
				k = rng.Intn(keys)
			}
			rows[i] = rowbatch.Row{StepID: "windowing.fold_window", Key: fmt.Sprintf("user-%08d", k), Value: value}
		}
		return rowbatch.Batch{Epoch: e, Rows: rows}
	}
	c := newCarried(true, 1<<30)
	c.take(batch(1, keys), false)
	batches := make([]rowbatch.Batch, b.N)
	for i := range batches {
		batches[i] = batch(int64(i+2), touched)
	}
	b.ResetTimer()
	for i := range batches {
		out, added := c.take(batches[i], true)
		if added < 0 || len(out.Rows) < keys/2 {
			b.Fatalf("not whole: %d rows, %d added", len(out.Rows), added)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/keys, "ns/key")
}

// BenchmarkCarriedPackedWhole: the same worker whose every epoch the flow
// packs whole (it touched nearly every key, as a word count does): the
// carried state keeps each batch as it came.
func BenchmarkCarriedPackedWhole(b *testing.B) {
	const keys = 100_000
	value := make([]byte, 100)
	rows := make([]rowbatch.Row, keys)
	for k := range rows {
		rows[k] = rowbatch.Row{StepID: "windowing.fold_window", Key: fmt.Sprintf("user-%08d", (k*7919)%keys), Value: value}
	}
	c := newCarried(true, 1<<30)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, added := c.take(rowbatch.Batch{Epoch: int64(i + 1), Rows: rows, Whole: true}, false); added != -1 {
			b.Fatalf("a whole batch is written as it is: %d added", added)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/keys, "ns/key")
}
