package mesh

import (
	"context"
	"testing"
	"time"
)

// BenchmarkThroughput sends 64 KiB data frames from one process to
// another over loopback, the sender pausing while Congested as the engine
// does, and reports MB/s of payload.
func BenchmarkThroughput(b *testing.B) {
	const size = 64 << 10
	addrs := freeAddrs(b, 2)
	cfgs := []Config{testConfig(addrs, 0), testConfig(addrs, 1)}
	ms, errs := startAll(cfgs)
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	defer func() {
		for _, m := range ms {
			_ = m.Close()
		}
	}()
	sender, receiver := ms[0], ms[1]
	payload := make([]byte, size)
	ctx := context.Background()
	done := make(chan int)
	b.SetBytes(size)
	b.ResetTimer()
	go func() {
		got := 0
		for got < b.N {
			got += len(receiver.Drain())
			if got < b.N {
				receiver.Wait(ctx, 10*time.Millisecond)
			}
		}
		done <- got
	}()
	for range b.N {
		for sender.Congested() {
			sender.Wait(ctx, 10*time.Millisecond)
		}
		if err := sender.Send(1, 0, payload); err != nil {
			b.Fatal(err)
		}
	}
	<-done
	b.StopTimer()
	st := sender.Stats()[1]
	b.ReportMetric(st.BlockedSeconds/b.Elapsed().Seconds()*100, "%blocked")
}
