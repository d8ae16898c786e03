package durable

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/segment"
	"github.com/millpond/millpond/gostore/snapfile"
)

// pipe feeds one worker's segment cutter from a goroutine, so segments are
// written while the worker goes on with the next epoch.
type pipe struct {
	events chan pipeEvent
	done   chan struct{}
}

// pipeEvent is one entry of a worker's change log on its way to the
// segment cutter, with the batch its rows belong to, released once cut.
type pipeEvent struct {
	segment.Event
	batch rowbatch.Batch
}

type uploadJob struct {
	seg   segment.Segment
	ref   ObjectRef
	epoch int64
}

// errNotRunning is returned by Write and CloseEpoch before Start or after
// Finish (the pipes they feed do not exist then).
var errNotRunning = errors.New("recovery run is not started or already finished")

// Write hands worker w's snapshot batch b to the run: it is written to the
// worker's local store in the background and cut into the worker's segment
// of b.Epoch, and it returns at once. The run takes over b (see
// rowbatch.Batch) and releases it when both are done. A whole batch
// (b.Whole) must be the worker's only batch of its epoch (whole.go).
// Once the pipeline failed, Write returns its error.
func (r *Run) Write(ctx context.Context, w int, b rowbatch.Batch) (int, error) {
	n, _, err := r.write(w, b, false)
	return n, err
}

// WriteCarried is Write for a batch of the keys worker w's epoch touched
// (and deletions of those it dropped), to be written as the worker's
// whole state: merged into the state the run carries for the worker
// (carry.go), the batch becomes every key the worker holds, as if b were
// whole. When the run does not carry the worker's state (see Carries) b
// is written as it is. It returns the rows written and how many of them
// came from the carried state, -1 when b was written as it is.
func (r *Run) WriteCarried(ctx context.Context, w int, b rowbatch.Batch) (int, int, error) {
	return r.write(w, b, true)
}

// Carries reports whether the run carries worker w's whole state, so that
// WriteCarried can write an epoch whole from the keys it touched: in batch
// mode, from the start of a fresh run or after the worker's last whole
// batch, while the state fits Config.CarryBytes.
func (r *Run) Carries(w int) bool {
	if r.checkHosted(w) != nil || r.carry[w] == nil {
		return false
	}
	return r.carry[w].valid()
}

// StopCarrying drops worker w's carried state and carries none for the
// rest of the run: for a worker whose state is bounded in memory, which a
// copy in the run would make a bound on nothing.
func (r *Run) StopCarrying(w int) {
	if r.checkHosted(w) == nil && r.carry[w] != nil {
		r.carry[w].stop()
	}
}

func (r *Run) write(w int, b rowbatch.Batch, whole bool) (int, int, error) {
	if err := r.checkHosted(w); err != nil {
		b.Release()
		return 0, -1, err
	}
	if err := r.Err(); err != nil {
		b.Release()
		return 0, -1, err
	}
	if r.pipes == nil {
		b.Release()
		return 0, -1, errNotRunning
	}
	carried := -1
	if c := r.carry[w]; c != nil {
		b, carried = c.take(b, whole)
	}
	n, err := r.hand(w, b)
	return n, carried, err
}

// hand passes b on to worker w's local store and segment.
func (r *Run) hand(w int, b rowbatch.Batch) (int, error) {
	for i := range b.Rows {
		b.Rows[i].Epoch = b.Epoch
	}
	cut, staged := b.Rows, (<-chan localstore.Staged)(nil)
	if b.Whole {
		var err error
		if cut, staged, err = r.takeWhole(w, b); err != nil {
			b.Release()
			return 0, err
		}
	}
	if err := r.stores[w].WriteAsync(b.Hold(), staged); err != nil {
		b.Release()
		return 0, err
	}
	if len(cut) == 0 {
		b.Release()
		return len(b.Rows), nil
	}
	r.pipes[w].events <- pipeEvent{Event: segment.Event{Epoch: b.Epoch, Rows: cut}, batch: b}
	return len(b.Rows), nil
}

func (r *Run) segmentDir(w int) string {
	return filepath.Join(r.cfg.LocalDir, r.cfg.FlowID, fmt.Sprintf("worker-%04d", w), "outbox")
}

func (r *Run) newCutter(w int) (*segment.Cutter, error) {
	dir := r.segmentDir(w)
	// Segments left by a crashed run were never committed: start clean.
	os.RemoveAll(dir)
	rng := keygroup.OwnedBy(w, r.cfg.WorkerCount, r.cfg.KeyGroupCount)
	return segment.NewCutter(segment.Config{
		Mode: r.cfg.Mode.cutMode(),
		Dir:  dir,
		Meta: snapfile.Meta{
			FlowID: r.cfg.FlowID, WorkerIndex: w, WorkerCount: r.cfg.WorkerCount,
			KeyGroupCount: r.cfg.KeyGroupCount, Execution: r.execution,
		},
		Emit: func(seg segment.Segment) error {
			r.stage(w, seg)
			// Size and checksum come with the compression, in the upload
			// goroutine (runUploads).
			m := seg.Meta
			ref := ObjectRef{
				Key:  segmentKey(r.cfg.FlowID, r.execution, w, m.FirstEpoch, seg.Seq),
				Kind: KindSegment, Execution: r.execution, Worker: w, WorkerCount: r.cfg.WorkerCount,
				GroupLo: rng.Lo, GroupHi: rng.Hi, FirstEpoch: m.FirstEpoch, LastEpoch: m.LastEpoch,
				Seq: seg.Seq, Rows: seg.Rows,
			}
			r.mu.Lock()
			r.epochLocked(m.LastEpoch).pending++
			r.mu.Unlock()
			select {
			case r.uploads <- uploadJob{seg: seg, ref: ref, epoch: m.LastEpoch}:
				return nil
			case <-r.ctx.Done():
				return errStopped
			}
		},
	})
}

func (r *Run) runPipe(w int, p *pipe, cut *segment.Cutter) {
	defer r.wg.Done()
	defer close(p.done)
	defer cut.Close()
	for ev := range p.events {
		if r.Err() != nil {
			ev.batch.Release()
			continue // drain; the run has failed
		}
		err := cut.Apply(r.ctx, ev.Event)
		ev.batch.Release()
		if err != nil {
			r.fail(fmt.Errorf("worker %d epoch %d: %w", w, ev.Epoch, err))
			continue
		}
		if ev.Close {
			r.mu.Lock()
			r.epochLocked(ev.Epoch).closed++
			r.cond.Broadcast()
			r.mu.Unlock()
			r.tryCommit()
		}
	}
}

// runUploads compresses and uploads segments until the queue closes. Each
// upload goroutine holds one zstd encoder, reset for every segment.
func (r *Run) runUploads() {
	defer r.uploadWG.Done()
	enc, err := newEncoder(segmentLevel)
	if err != nil {
		r.fail(err)
	} else {
		defer enc.Close()
	}
	for job := range r.uploads {
		if r.Err() != nil {
			os.Remove(job.seg.Path)
			continue
		}
		start := time.Now()
		ref, raw, err := r.uploadSegment(job, enc)
		if err != nil {
			r.fail(fmt.Errorf("upload segment %s of worker %d epoch %d: %w", job.ref.Key, job.ref.Worker, job.epoch, err))
			continue
		}
		r.mu.Lock()
		es := r.epochLocked(job.epoch)
		es.pending--
		es.objects = append(es.objects, ref)
		r.metrics.SegmentsUploaded++
		r.metrics.BytesUploaded += ref.Size
		r.metrics.SegmentBytes += ref.Size
		r.metrics.SegmentRawBytes += raw
		r.metrics.UploadSeconds += time.Since(start).Seconds()
		r.mu.Unlock()
		r.tryCommit()
	}
}

// uploadSegment compresses a cut segment next to it, uploads the
// compressed file, removes both, and returns the segment's reference with
// the stored size and checksum, and the segment's own size.
func (r *Run) uploadSegment(job uploadJob, enc *zstd.Encoder) (ObjectRef, int64, error) {
	defer os.Remove(job.seg.Path)
	e, err := encodeFile(job.seg.Path, enc)
	if err != nil {
		return ObjectRef{}, 0, err
	}
	defer os.Remove(e.Path)
	ref := job.ref
	ref.Size, ref.SHA256, ref.Encoding = e.Size, e.SHA256, EncodingZstd
	if err := r.uploadWithRetry(e.Path, ref.Key); err != nil {
		return ObjectRef{}, 0, err
	}
	return ref, e.Raw, nil
}

func (r *Run) uploadWithRetry(path, key string) error {
	return r.retry("segment upload", key, func() error { return store(r.ctx, r.cfg.Backup, path, key) })
}

// store ships a sealed local file: adopted where the backend can take it
// over without a copy, uploaded otherwise.
func store(ctx context.Context, b backup.Backup, path, key string) error {
	if a, ok := b.(backup.Adopter); ok {
		return a.Adopt(ctx, path, key)
	}
	return b.Upload(ctx, path, key)
}

// retry runs op up to UploadAttempts times with backoff, until it
// succeeds or the run stops.
func (r *Run) retry(what, key string, op func() error) error {
	var err error
	delay := 50 * time.Millisecond
	for attempt := 1; attempt <= r.cfg.UploadAttempts; attempt++ {
		if err = op(); err == nil {
			return nil
		}
		if r.ctx.Err() != nil || attempt == r.cfg.UploadAttempts || timedOut(err) {
			// A backend whose calls time out has retried them within its
			// own bound already: trying again here would multiply the
			// time a hung endpoint holds the run.
			break
		}
		r.cfg.Logger.Warn(what+" failed; retrying", "key", key, "attempt", attempt, "err", err)
		r.uploadRetries.Add(1)
		select {
		case <-time.After(delay):
		case <-r.ctx.Done():
			return err
		}
		delay = min(delay*2, 2*time.Second)
	}
	if r.ctx.Err() != nil {
		return err
	}
	return backupFailed(fmt.Errorf("gave up after %d attempts: %w", r.cfg.UploadAttempts, err))
}

// timedOut reports whether err is a backend call that ran out of time.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
