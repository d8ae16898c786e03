package durable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/millpond/millpond/gostore/localstore"
)

// Maintenance: after commits, a background round collects the local
// stores' superseded rows, compacts the durable state when it is due
// (compact.go) and deletes durable objects no retained commit names
// (gc.go). CloseEpoch holds the flow back when it falls too far behind.

// runMaintenance collects garbage and compacts after commits, off the path
// of the flow and of the commits themselves.
func (r *Run) runMaintenance() {
	defer r.wg.Done()
	// A local GC held back by pacing runs when its turn comes, even if no
	// commit wakes maintenance by then (a flow gone idle would otherwise
	// keep its last epochs' superseded rows until the next commit).
	paced := time.NewTimer(time.Hour)
	paced.Stop()
	defer paced.Stop()
	for {
		select {
		case _, ok := <-r.maint:
			if !ok {
				return
			}
		case <-paced.C:
		}
		if r.maintCtx.Err() != nil {
			continue // the run is finishing: drain the wake-ups
		}
		if !r.verified() {
			// Compaction reads the local stores, which are still being
			// checked; the first commit, after the check, wakes us.
			continue
		}
		// The newest commit, not the one that woke us: a wake-up dropped
		// while a round ran must not leave maintenance an epoch behind.
		committed := r.Committed()
		r.maintain(r.maintCtx, committed)
		r.mu.Lock()
		behind, failing := r.gcEpoch < committed, r.maintFailing
		r.mu.Unlock()
		if behind {
			wait := max(time.Until(r.gcNext), time.Millisecond)
			if failing {
				wait = max(wait, retryMaintenance)
			}
			paced.Reset(wait)
		}
	}
}

// retryMaintenance spaces the retries of a failing local GC that no
// commit wakes.
const retryMaintenance = time.Second

// dutyFactor spaces local GC rounds (they rewrite pages all over a store)
// so they use at most about a quarter of a core: after a round that took
// d, the next waits 3d. Rounds shorter than paceFrom run after every
// commit. The local store's growth stays bounded by the writes of the
// paced interval.
const (
	dutyFactor = 3
	paceFrom   = 100 * time.Millisecond
)

func nextRound(started time.Time) time.Time {
	d := time.Since(started)
	if d < paceFrom {
		return time.Time{}
	}
	return time.Now().Add(dutyFactor * d)
}

// maintain runs the background work due after epoch committed: local GC,
// durable compaction when segments outgrew the compacted state, and
// durable GC of objects no retained commit names. A failure here never
// touches committed state; it is logged and retried after a later commit.
func (r *Run) maintain(ctx context.Context, committed int64) {
	failed := false
	r.mu.Lock()
	lagging := committed-r.gcEpoch >= maxGCLag/2
	r.mu.Unlock()
	if now := time.Now(); lagging || !now.Before(r.gcNext) {
		defer r.addSeconds(&r.metrics.LocalGCSeconds, now)
		ok := true
		for w, s := range r.hosted() {
			if _, err := s.GC(ctx, committed); err != nil {
				ok = false
				if errors.Is(err, localstore.ErrDamaged) {
					r.fail(fmt.Errorf("local gc of worker %d: %w", w, err))
				} else if ctx.Err() == nil {
					r.cfg.Logger.Warn("local gc failed", "worker", w, "err", err)
					failed = true
				}
			}
		}
		r.gcNext = nextRound(now)
		if ok {
			r.mu.Lock()
			r.gcEpoch = max(r.gcEpoch, committed)
			r.mu.Unlock()
		}
	}
	// Compaction is not paced: it is what keeps the durable footprint
	// within its bound, so it runs whenever it is due. In a cluster only
	// the leader decides compactions and collects durable garbage.
	if !r.leads() {
		r.mu.Lock()
		r.maintFailing = failed
		r.cond.Broadcast()
		r.mu.Unlock()
		return
	}
	if ctx.Err() == nil && r.compactionDue() {
		start := time.Now()
		// The newest commit: the round started a while ago, and
		// compacting at an epoch already compacted would write over an
		// object that a commit record names (compact refuses that).
		committed = r.Committed()
		err := r.compact(ctx, committed)
		r.addSeconds(&r.metrics.CompactionSeconds, start)
		if errors.Is(err, localstore.ErrDamaged) {
			// Retrying would read the same damage; what this run
			// committed so far stands, and the next run rebuilds the
			// store from it.
			r.fail(fmt.Errorf("compaction at epoch %d: %w", committed, err))
		} else if errors.Is(err, errFollowerFinished) {
			r.cfg.Logger.Debug("compaction left to the next run", "epoch", committed, "err", err)
		} else if errors.Is(err, localstore.ErrReplaced) {
			// A whole-state epoch past this one already replaced a local
			// store's state: the next commit's round compacts from it.
			// Counted as failing, so the flow is not held back for it.
			r.cfg.Logger.Debug("compaction retried at a later epoch", "epoch", committed, "err", err)
			failed = true
		} else if err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("durable compaction failed; will retry", "epoch", committed, "err", err)
			failed = true
		}
	}
	if err := r.collectGarbage(ctx); err != nil && ctx.Err() == nil {
		r.cfg.Logger.Warn("durable gc failed; will retry", "err", err)
	}
	r.mu.Lock()
	r.maintFailing = failed
	r.cond.Broadcast() // CloseEpoch may wait for maintenance to catch up
	r.mu.Unlock()
}

// addSeconds adds the time since start to a metric.
func (r *Run) addSeconds(metric *float64, start time.Time) {
	d := time.Since(start).Seconds()
	r.mu.Lock()
	*metric += d
	r.mu.Unlock()
}

// maxGCLag is how many committed epochs local GC may fall behind before
// CloseEpoch waits for it, which bounds the local store's growth whatever
// the epoch interval.
const maxGCLag = 4

// maintenanceBehindLocked reports whether the flow must wait for
// maintenance to keep the stores within their bounds: local GC too many
// epochs behind, or segments since the last compaction past 1.5 times
// what makes compaction due. (A looser margin let compaction overlap the
// next epoch of a flow that rewrites its whole state every epoch, but did
// not make that flow faster, and took the durable footprint past 3x the
// state at the end of some runs: the retention window can hold the
// previous compaction too.) A failing maintenance is not waited for (its
// errors are logged; waiting would stop the flow for good). r.mu is held.
func (r *Run) maintenanceBehindLocked() bool {
	if r.maintFailing || r.stopped {
		return false
	}
	if r.committed-r.gcEpoch > maxGCLag {
		return true
	}
	if !r.leads() {
		// A follower does not know whether the leader's compaction is
		// failing (then the leader does not wait for it); holding the
		// leader back holds the cluster.
		return false
	}
	floor := max(r.compactedBytes, r.cfg.CompactMinBytes)
	return float64(r.segmentBytes) > 1.5*r.cfg.CompactRatio*float64(floor)+float64(r.cfg.CompactMinBytes)
}

// finalGCRows bounds the rows a finishing run's local GC examines: about
// 0.1 s of collection. A larger backlog (a flow that rewrote most of a
// large state in its last epochs) is left to the next run, which collects
// it in the background once it started; it would hold up this run's end
// and the next one's resume alike.
const finalGCRows = 20_000

// finalLocalGC collects the local stores' superseded rows at the end of a
// run that committed its last epoch, when the backlog is small: what the
// run leaves on disk is then its state, not the last few epochs' versions
// of it (their GC lags the commits by up to maxGCLag epochs). A failure
// is logged; the next run collects them.
func (r *Run) finalLocalGC() {
	committed := r.Committed()
	for w, s := range r.hosted() {
		if _, err := s.FinalGC(context.Background(), committed, finalGCRows); err != nil {
			r.cfg.Logger.Warn("local gc at the end of the run failed; the next run collects", "worker", w, "err", err)
		}
	}
}

// finalMaintenance collects durable garbage at the end of a run. It does
// not compact: the segments left are within the bound the run kept while
// it was going (CloseEpoch held the flow back for that), and compacting
// them only to exit made every run end with a full rewrite of its state.
// The next run compacts after its first commit, when it is due.
func (r *Run) finalMaintenance(ctx context.Context) {
	if err := r.collectGarbage(ctx); err != nil {
		r.cfg.Logger.Warn("durable gc failed; the next run retries", "err", err)
	}
}
