package progress

import (
	"sync"
	"testing"
	"time"
)

// BenchmarkDecisionLatency: n=3 trackers in memory, control messages
// carried FIFO by one goroutine per pair with no delay, no data traffic;
// every process reports Ready for key after key. One op is one decision.
func BenchmarkDecisionLatency(b *testing.B) {
	const n = 3
	stop := make(chan struct{})
	trackers := make([]*Tracker, n)
	notify := make([]chan struct{}, n)
	links := make([][]chan []byte, n)
	var wg sync.WaitGroup
	for i := range n {
		notify[i] = make(chan struct{}, 1)
		links[i] = make([]chan []byte, n)
		for j := range n {
			if i != j {
				links[i][j] = make(chan []byte, 64)
			}
		}
	}
	for i := range n {
		trackers[i] = New(i, n, func(to int, p []byte) error {
			links[i][to] <- p
			return nil
		}, func() {
			select {
			case notify[i] <- struct{}{}:
			default:
			}
		})
		for j := range n {
			if i != j {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						case p := <-links[i][j]:
							if err := trackers[j].Deliver(i, p); err != nil {
								panic(err)
							}
						}
					}
				}()
			}
		}
	}
	decide := func(i int, epoch int64) {
		for {
			_, ok, err := trackers[i].Report(Report{Epoch: epoch, Ready: true})
			if err != nil {
				panic(err)
			}
			if ok {
				return
			}
			<-notify[i]
		}
	}
	b.ResetTimer()
	start := time.Now()
	var drivers sync.WaitGroup
	for i := range n {
		drivers.Add(1)
		go func() {
			defer drivers.Done()
			for e := range b.N {
				decide(i, int64(e))
			}
		}()
	}
	drivers.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(stop)
	wg.Wait()
	st := trackers[0].Stats()
	b.ReportMetric(float64(st.Waves)/float64(st.Decisions), "waves/decision")
	b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "µs/decision")
	b.ReportMetric(float64(st.CloseP50.Microseconds()), "p50-µs")
	b.ReportMetric(float64(st.CloseP99.Microseconds()), "p99-µs")
	b.ReportMetric(float64(st.SettleP50.Microseconds()), "settle-p50-µs")
}
