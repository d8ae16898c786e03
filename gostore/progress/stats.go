package progress

import (
	"slices"
	"time"
)

// latencyWindow is how many recent epoch closes the latency figures cover.
const latencyWindow = 1024

// Stats are one tracker's figures. Latencies are the leader's: other
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
	// CloseSamples is how many epoch closes (phase-0 decisions) the
	// latency figures cover: the most recent ones, at most 1024.
	CloseSamples int
	// CloseP50 and CloseP99 are percentiles of the epoch-close latency: the
	// time from the leader's first probe of (epoch, phase 0) to its
	// decision.
	CloseP50, CloseP99 time.Duration
	// CloseMax is the largest of those samples.
	CloseMax time.Duration
}

// stats is the tracker's running record, guarded by the tracker's mutex.
type stats struct {
	waves     int64
	decisions int64
	lastWaves int
	ring      [latencyWindow]time.Duration
	samples   int // total phase-0 decisions recorded; ring index is samples % window
}

func (s *stats) closed(d time.Duration) {
	s.ring[s.samples%latencyWindow] = d
	s.samples++
}

func (s *stats) snapshot(leader bool) Stats {
	out := Stats{Leader: leader, Waves: s.waves, Decisions: s.decisions, LastWaves: s.lastWaves}
	n := min(s.samples, latencyWindow)
	if n == 0 {
		return out
	}
	lat := slices.Clone(s.ring[:n])
	slices.Sort(lat)
	out.CloseSamples = n
	out.CloseP50 = percentile(lat, 50)
	out.CloseP99 = percentile(lat, 99)
	out.CloseMax = lat[n-1]
	return out
}

// percentile returns the nearest-rank p-th percentile of sorted values.
func percentile(sorted []time.Duration, p int) time.Duration {
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 * n)
	return sorted[max(rank, 1)-1]
}
