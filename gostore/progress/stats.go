package progress

import (
	"slices"
	"time"
)

// latencyWindow is how many recent epoch closes the latency figures cover.
const latencyWindow = 1024

// Stats are one tracker's figures. Latencies are the leader's, over the
// most recent epoch closes (phase-0 decisions, at most 1024); other
// processes report zero for them.
type Stats struct {
	// Leader is true on process 0.
	Leader bool
	// Waves counts the waves this process took part in: waves started on
	// the leader, probes answered elsewhere.
	Waves int64
	// Decisions counts the decisions known here.
	Decisions int64
	// LastWaves is how many waves the last decision took (leader only).
	LastWaves int
	// CloseSamples is how many epoch closes the latency figures cover.
	CloseSamples int
	// CloseP50, CloseP99 and CloseMax describe the epoch-close latency:
	// the time from the leader's first probe of (epoch, phase 0), sent
	// when it first reports the epoch, to its decision. This includes the
	// time until every process is ready (the epoch interval, usually).
	CloseP50, CloseP99, CloseMax time.Duration
	// SettleP50, SettleP99 and SettleMax describe what the protocol adds:
	// the time from the moment the leader held a reply for (epoch, phase 0)
	// from every process (each had reported Ready) to its decision. It
	// covers draining messages in flight and the confirming wave.
	SettleP50, SettleP99, SettleMax time.Duration
}

// stats is the tracker's running record, guarded by the tracker's mutex.
type stats struct {
	waves     int64
	decisions int64
	lastWaves int
	close     window
	settle    window
}

func (s *stats) snapshot(leader bool) Stats {
	out := Stats{Leader: leader, Waves: s.waves, Decisions: s.decisions, LastWaves: s.lastWaves}
	out.CloseSamples = min(s.close.n, latencyWindow)
	out.CloseP50, out.CloseP99, out.CloseMax = s.close.percentiles()
	out.SettleP50, out.SettleP99, out.SettleMax = s.settle.percentiles()
	return out
}

// window keeps the latest latencyWindow samples.
type window struct {
	ring [latencyWindow]time.Duration
	n    int // samples ever added; the next goes to ring[n % latencyWindow]
}

func (w *window) add(d time.Duration) {
	w.ring[w.n%latencyWindow] = d
	w.n++
}

// percentiles returns the nearest-rank p50, p99 and max of the window.
func (w *window) percentiles() (p50, p99, maxi time.Duration) {
	n := min(w.n, latencyWindow)
	if n == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(w.ring[:n])
	slices.Sort(s)
	return percentile(s, 50), percentile(s, 99), s[n-1]
}

// percentile returns the nearest-rank p-th percentile of sorted values.
func percentile(sorted []time.Duration, p int) time.Duration {
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 * n)
	return sorted[max(rank, 1)-1]
}
