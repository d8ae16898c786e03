package durable

import (
	"sort"
	"time"
)

// CommitEvent describes one commit, for logs.
type CommitEvent struct {
	Epoch          int64   `json:"epoch"`
	Objects        int     `json:"objects"`
	Rows           int64   `json:"rows"`
	Bytes          int64   `json:"bytes"`
	LatencySeconds float64 `json:"latency_seconds"`
}

// DrainCommits returns the commits since the last call (at most 1024 are
// kept between calls).
func (r *Run) DrainCommits() []CommitEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.commitLog
	r.commitLog = nil
	return out
}

// Metrics reports what the pipeline did, for users and benchmarks.
type Metrics struct {
	CommittedEpoch   int64
	Commits          int64
	SegmentsUploaded int64
	// BytesUploaded is every object this run uploaded (segments and its
	// compacted objects), as stored: compressed.
	BytesUploaded int64
	// SegmentBytes and SegmentRawBytes are the segments' bytes as stored
	// and before compression (the SQLite files the cutters wrote).
	SegmentBytes    int64
	SegmentRawBytes int64
	// CompactedUploaded counts the compacted objects this process wrote;
	// CompactedBytes and CompactedRawBytes are their bytes as stored and
	// before compression.
	CompactedUploaded   int64
	CompactedBytes      int64
	CompactedRawBytes   int64
	UploadSeconds       float64
	BackpressureSeconds float64
	Compactions         int64
	// WholeEpochs counts commits whose newest whole-state epoch (markWhole)
	// took the place of a compaction.
	WholeEpochs    int64
	ObjectsDeleted int64
	// LocalGCSeconds and CompactionSeconds are the background time spent
	// collecting the local stores and compacting the durable store.
	LocalGCSeconds    float64
	CompactionSeconds float64
	// VerifySeconds is the background time spent checking fast-resumed
	// local stores (verify.go).
	VerifySeconds float64
	// Heals counts compactions that rebuilt committed objects the backup
	// had lost (heal.go).
	Heals int64
	// LocalWriteSeconds is the time the local stores spent writing
	// snapshot batches (in the background, beside the flow).
	LocalWriteSeconds float64
	// Cluster mode: ClusterSent and ClusterReceived count the control
	// messages this process sent and took while it ran. On the leader,
	// RemoteUploads counts the epochs followers reported uploaded and
	// RemoteSegments the segments they named; on a follower,
	// CommitWaitSeconds adds up, per commit, the time from reporting its
	// newest epoch to learning it committed (Commits, CommittedEpoch and
	// CommitLatencies count the commits it learned of; Compactions, its
	// parts of the leader's compactions).
	ClusterSent       int64
	ClusterReceived   int64
	RemoteUploads     int64
	RemoteSegments    int64
	CommitWaitSeconds float64
	// CommitLatencies are seconds from the first close of an epoch to its
	// commit, newest last (at most 4096 kept).
	CommitLatencies []float64
	// CommitLatencyBuckets counts every commit latency of the run (not
	// only the kept ones) by bucket: CommitLatencyBuckets[i] counts those
	// at most CommitLatencyBounds[i] and above the bound before it, the
	// last one those above every bound. CommitLatencySum adds them up.
	// A Prometheus histogram is made from these (millpond.metrics).
	CommitLatencyBuckets [len(CommitLatencyBounds) + 1]int64
	CommitLatencySum     float64
	// UploadRetries counts the failed backup calls (uploads, listings,
	// commit records) that were tried again.
	UploadRetries int64
}

// CommitLatencyBounds are the upper bounds, in seconds, of the commit
// latency buckets (CommitLatencyBuckets).
var CommitLatencyBounds = [...]float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

func (m *Metrics) observeCommit(d time.Duration) {
	s := d.Seconds()
	i := sort.SearchFloat64s(CommitLatencyBounds[:], s)
	m.CommitLatencyBuckets[i]++
	m.CommitLatencySum += s
	m.CommitLatencies = append(m.CommitLatencies, d.Seconds())
	if len(m.CommitLatencies) > 4096 {
		m.CommitLatencies = m.CommitLatencies[len(m.CommitLatencies)-4096:]
	}
}

// Metrics returns a copy of the run's metrics.
func (r *Run) Metrics() Metrics {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.metrics
	m.CommitLatencies = append([]float64(nil), r.metrics.CommitLatencies...)
	m.CommittedEpoch = r.committed
	m.UploadRetries = r.uploadRetries.Load()
	for _, s := range r.stores {
		if s != nil {
			m.LocalWriteSeconds += s.WriteSeconds()
		}
	}
	return m
}

// Percentile returns the p-th percentile (0-100) of xs, 0 if empty.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}
