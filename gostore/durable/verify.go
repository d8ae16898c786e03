package durable

import (
	"context"
	"fmt"
	"time"
)

// Checking a fast-resumed local store. Every row read from a local store is
// checked against its own checksum, but a damaged b-tree page can hide rows
// from a lookup without any row failing its check: a key would then look
// new and its state start over. So a store that a run resumes from without
// rebuilding it is checked whole (its structure and every row), in the
// background, while the flow already runs on it. Nothing of this run
// commits, and no compaction reads the store, until every check passed;
// a check that fails stops the run with the damage named, and the store
// is marked so that the next run rebuilds it from the backup. A full
// check at open would cost a fast resume of a large state most of its
// speed (it reads every page); in the background it costs the commits of
// the first epochs some latency instead.

// startVerification checks every fast-resumed store in the background.
// The checks count in uploadWG: like an upload, a check's end may commit.
func (r *Run) startVerification() {
	ctx, cancel := context.WithCancel(r.ctx)
	r.stopVerify = cancel
	for w, s := range r.hosted() {
		if r.restores[w].Kind != ResumeFast {
			continue
		}
		r.mu.Lock()
		r.verifying++
		r.mu.Unlock()
		r.uploadWG.Add(1)
		go func() {
			defer r.uploadWG.Done()
			start := time.Now()
			err := s.Verify(ctx)
			r.mu.Lock()
			r.verifying--
			r.metrics.VerifySeconds += time.Since(start).Seconds()
			pending := r.verifying
			r.mu.Unlock()
			if err != nil {
				if ctx.Err() == nil {
					r.fail(fmt.Errorf("check of worker %d's local store after a fast resume: %w", w, err))
				}
				return
			}
			r.cfg.Logger.Debug("local store checked", "flow", r.cfg.FlowID, "worker", w, "seconds", time.Since(start).Seconds())
			if pending == 0 {
				// Epochs closed meanwhile waited for this.
				r.tryCommit()
				r.mu.Lock()
				r.cond.Broadcast()
				r.mu.Unlock()
			}
		}()
	}
}

// verifiedLocked reports whether every fast-resumed store passed its
// check. r.mu is held.
func (r *Run) verifiedLocked() bool { return r.verifying == 0 }

// verified is verifiedLocked taking r.mu.
func (r *Run) verified() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.verifiedLocked()
}
