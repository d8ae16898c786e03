package durable

import (
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/segment"
)

// heldDeletions are the deletions of a worker's whole batch in batch mode,
// held back from its segment until the worker closes the epoch: if by then
// every worker's batch is whole, the epoch's segments are committed as
// compacted state, which holds nothing older for a deletion to hide, and
// they are dropped. A flow whose keys all end at once (a final count at
// EOF) then commits its last epoch without a segment of deletions.
type heldDeletions struct {
	epoch int64
	rows  []rowbatch.Row
	// batch holds the memory rows alias (when there are any).
	batch rowbatch.Batch
	// live counts the batch's other rows (those sent to the segment).
	live int
}

// handoff carries the staged copy of a whole epoch's segment to the local
// store's writer (localstore.Store.WriteAsync).
type handoff struct {
	epoch  int64
	staged chan localstore.Staged
}

// takeWhole registers worker w's whole batch b (see Write). It marks the
// epoch whole for w; in batch mode it holds b's deletions back until w
// closes the epoch (releaseHeld), and when the local store takes b as a new
// generation, it asks for a copy of the epoch's segment, which holds
// exactly b's other rows, to be staged for the store (stage) rather than
// have the store write the rows a second time. It returns the rows to cut
// into the segment and the staging channel for the store, if any.
//
// In cluster mode whether every worker's batch of the epoch is whole is
// known only to the leader, once every process reported the epoch
// uploaded (with its workers' marks, follower.go), long after this worker
// cut its segment: the deletions stay in the segment, which a plain epoch
// needs and compacted state does without (a restore and a compaction skip
// them, and so does the local store when it adopts the staged copy). A
// worker whose whole batch is empty cuts no segment: it is bare.
func (r *Run) takeWhole(w int, b rowbatch.Batch) ([]rowbatch.Row, <-chan localstore.Staged, error) {
	r.markWhole(w, b.Epoch)
	if r.cfg.Mode != SnapshotBatch {
		return b.Rows, nil, nil
	}
	rows := b.Rows
	if r.clustered() {
		if len(rows) == 0 {
			r.markBare(w, b.Epoch)
		}
	} else {
		rows = r.holdDeletions(w, b)
	}
	if len(rows) == 0 || !r.stores[w].StartsGeneration(b) {
		// A batch of only deletions starts an empty generation: there
		// is no segment to copy.
		return rows, nil, nil
	}
	h := &handoff{epoch: b.Epoch, staged: make(chan localstore.Staged, 1)}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.err; err != nil {
		// fail dropped the handoffs already; this one would wait for a
		// segment no pipe will cut.
		return nil, nil, err
	}
	r.handoffs[w] = append(r.handoffs[w], h)
	return rows, h.staged, nil
}

// holdDeletions holds whole batch b's deletions back until worker w closes
// its epoch (releaseHeld) and returns the rest, to be cut now.
func (r *Run) holdDeletions(w int, b rowbatch.Batch) []rowbatch.Row {
	deleted := 0
	for i := range b.Rows {
		if b.Rows[i].Deleted {
			deleted++
		}
	}
	live, dels := splitDeletions(b.Rows, deleted)
	held := &heldDeletions{epoch: b.Epoch, rows: dels, live: len(live)}
	if len(dels) > 0 {
		held.batch = b.Hold()
	}
	r.mu.Lock()
	earlier := r.held[w]
	r.held[w] = held
	r.mu.Unlock()
	if earlier != nil {
		// A second batch before the close (not what the engine does):
		// the first one's deletions go first, in order.
		r.sendHeld(w, earlier)
	}
	return live
}

// sendHeld sends held deletions on to worker w's segment, or releases them
// when there are none.
func (r *Run) sendHeld(w int, h *heldDeletions) {
	if len(h.rows) == 0 {
		h.batch.Release()
		return
	}
	r.pipes[w].events <- pipeEvent{Event: segment.Event{Epoch: h.epoch, Rows: h.rows}, batch: h.batch}
}

// releaseAllHeld releases the deletions still held when the run stops
// (an epoch snapshotted but never closed).
func (r *Run) releaseAllHeld() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w, h := range r.held {
		if h != nil {
			h.batch.Release()
			r.held[w] = nil
		}
	}
}

// splitDeletions returns batch's rows that are not deletions and those
// that are, as two views of one new array (batch itself is left as it is:
// the local store reads it). deleted is how many deletions batch holds.
func splitDeletions(batch []rowbatch.Row, deleted int) (live, dels []rowbatch.Row) {
	if deleted == 0 {
		return batch, nil
	}
	out := make([]rowbatch.Row, len(batch))
	n, d := 0, len(batch)-deleted
	for i := range batch {
		if batch[i].Deleted {
			out[d] = batch[i]
			d++
		} else {
			out[n] = batch[i]
			n++
		}
	}
	return out[:n:n], out[n:]
}

// releaseHeld settles worker w's held deletions of epoch as it closes it:
// dropped when every worker's batch of the epoch is whole (the epoch will
// be committed as compacted state, see wholeLocked), sent to the segment
// otherwise (returned, for sendHeld). Workers close an epoch after all of
// them wrote it (the engine snapshots every worker first), so the marks are
// complete by then; a mark still missing only costs the deletions being
// written.
func (r *Run) releaseHeld(w int, epoch int64) *heldDeletions {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.held[w]
	if h == nil || h.epoch != epoch {
		return nil
	}
	r.held[w] = nil
	es := r.epochLocked(epoch)
	if len(es.whole) != r.cfg.WorkerCount {
		return h
	}
	if len(h.rows) > 0 {
		es.dropped = true
	}
	h.batch.Release()
	if h.live == 0 {
		es.markBare(w)
	}
	return nil
}

// markBare records that worker w's whole batch of epoch cuts no segment.
func (r *Run) markBare(w int, epoch int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epochLocked(epoch).markBare(w)
}

func (es *epochState) markBare(w int) {
	if es.bare == nil {
		es.bare = map[int]bool{}
	}
	es.bare[w] = true
}

// marked returns the workers of marks (whole or bare) in [first,
// first+n), in order: what a follower reports of its own workers.
func marked(marks map[int]bool, first, n int) []int {
	var out []int
	for w := first; w < first+n; w++ {
		if marks[w] {
			out = append(out, w)
		}
	}
	return out
}

// markWhole records that the rows worker w wrote at epoch are its whole
// state (a whole batch). When every worker marks an epoch so, in batch mode,
// its segments are committed as compacted state that replaces every older
// object: a flow that rewrites all its keys each epoch then never needs a
// compaction pass that would write the same state a second time.
func (r *Run) markWhole(w int, epoch int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epochLocked(epoch).markWhole(w)
}

func (es *epochState) markWhole(w int) {
	if es.whole == nil {
		es.whole = map[int]bool{}
	}
	es.whole[w] = true
}

// wholeLocked reports whether es's segments are the whole state of every
// worker: each marked it whole and cut exactly one segment (batch mode; an
// immediate-mode epoch spans several). r.mu is held.
func (r *Run) wholeLocked(es *epochState) bool {
	if r.cfg.Mode != SnapshotBatch || len(es.whole) != r.cfg.WorkerCount || len(es.objects)+len(es.bare) != r.cfg.WorkerCount {
		return false
	}
	seen := map[int]bool{}
	for _, o := range es.objects {
		if seen[o.Worker] || !es.whole[o.Worker] || es.bare[o.Worker] {
			return false
		}
		seen[o.Worker] = true
	}
	return true
}

// promoteWhole returns objs with the segments of whole-state epoch at (at
// most one per worker: a worker left without keys cuts none) taking the
// place of every object up to that epoch, as a compaction at that epoch
// would: they are named compacted state, so a restore reads nothing older
// and compaction counts from them. With no segment at all the state is
// empty at at, and so is the list up to it.
func promoteWhole(objs, whole []ObjectRef, at int64) []ObjectRef {
	keep := make([]ObjectRef, 0, len(objs))
	for _, o := range whole {
		o.Kind = KindCompacted
		keep = append(keep, o)
	}
	for _, o := range objs {
		if o.LastEpoch > at {
			keep = append(keep, o)
		}
	}
	sortObjects(keep)
	return keep
}

// stage hands a copy of seg to worker w's local store when seg is the
// segment of the whole batch the store waits for. The copy is made before
// the segment is uploaded (an upload may move or delete it).
func (r *Run) stage(w int, seg segment.Segment) {
	r.mu.Lock()
	queue := r.handoffs[w]
	for len(queue) > 0 && queue[0].epoch < seg.Meta.FirstEpoch {
		close(queue[0].staged) // its epoch cut no segment of its own
		queue = queue[1:]
	}
	var h *handoff
	if len(queue) > 0 && queue[0].epoch == seg.Meta.FirstEpoch && seg.Meta.LastEpoch == seg.Meta.FirstEpoch {
		h, queue = queue[0], queue[1:]
	}
	r.handoffs[w] = queue
	r.mu.Unlock()
	if h == nil {
		return
	}
	defer close(h.staged)
	if copied, err := r.stores[w].StageGeneration(seg.Path, seg.Deletions); err == nil {
		h.staged <- copied
	} else {
		// The store writes the batch's rows instead.
		r.cfg.Logger.Warn("staging a whole epoch's segment for the local store failed", "worker", w, "epoch", h.epoch, "err", err)
	}
}

// dropHandoffs closes the handoffs no segment will fulfil (the pipes are
// done), so the local stores write those batches' rows themselves.
func (r *Run) dropHandoffs() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropHandoffsLocked()
}

func (r *Run) dropHandoffsLocked() {
	for w, queue := range r.handoffs {
		for _, h := range queue {
			close(h.staged)
		}
		r.handoffs[w] = nil
	}
}
