// Package segment cuts a worker's change log (snapshot batches and epoch
// closes) into sealed segment files, the immutable objects that recovery
// uploads to the durable store.
//
// PerEpoch mode starts a segment at an epoch's first batch and finishes it
// at the epoch's close: one segment per worker per epoch. PerBatch mode
// finishes a segment after every batch. A finished segment is sealed
// (closed and fsynced) before it is handed on, so what gets uploaded is
// what is on disk.
package segment

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// Mode says when a segment is finished.
type Mode int

// The cutting modes.
const (
	// PerEpoch finishes a segment at every epoch close.
	PerEpoch Mode = iota
	// PerBatch finishes a segment after every batch.
	PerBatch
)

// String names the mode.
func (m Mode) String() string {
	switch m {
	case PerEpoch:
		return "per-epoch"
	case PerBatch:
		return "per-batch"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Event is one entry of the change log: a batch of rows at an epoch, or
// the close of an epoch.
type Event struct {
	Epoch int64
	Rows  []rowbatch.Row
	// Close marks the end of Epoch; Rows is empty then.
	Close bool
}

// Segment is a finished, sealed segment file.
type Segment struct {
	Path string
	Meta snapfile.Meta
	Rows int64
	// Deletions counts the deletion records among Rows (a reader that
	// must drop them can skip a scan for none).
	Deletions int64
	// Seq orders the segments one cutter finished.
	Seq int64
}

// Config sets up a cutter.
type Config struct {
	Mode Mode
	// Dir receives the segment files.
	Dir string
	// Meta is stamped on every segment; epochs and kind are filled in.
	Meta snapfile.Meta
	// Emit is called with each finished segment, in order.
	Emit func(Segment) error
	// FirstSeq numbers the first segment.
	FirstSeq int64
}

// Cutter applies change-log events. It is not safe for concurrent use:
// one goroutine feeds it.
type Cutter struct {
	cfg     Config
	cur     *snapfile.File
	curMeta snapfile.Meta
	curRows int64
	curDels int64
	seq     int64
}

// NewCutter returns a cutter for cfg.
func NewCutter(cfg Config) (*Cutter, error) {
	if cfg.Mode != PerEpoch && cfg.Mode != PerBatch {
		return nil, fmt.Errorf("segment cutter: unknown mode %d", cfg.Mode)
	}
	if cfg.Dir == "" || cfg.Emit == nil {
		return nil, errors.New("segment cutter: needs a directory and an emit function")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("segment cutter: %w", err)
	}
	return &Cutter{cfg: cfg, seq: cfg.FirstSeq}, nil
}

// Apply consumes one event.
func (c *Cutter) Apply(ctx context.Context, ev Event) error {
	if c.cfg.Mode == PerBatch {
		if ev.Close || len(ev.Rows) == 0 {
			return nil
		}
		if err := c.write(ctx, ev); err != nil {
			return err
		}
		return c.finish()
	}
	if ev.Close {
		return c.finish()
	}
	if c.cur != nil && c.curMeta.FirstEpoch != ev.Epoch {
		// A batch of a new epoch without a close of the old one: the old
		// epoch's segment is complete all the same.
		if err := c.finish(); err != nil {
			return err
		}
	}
	return c.write(ctx, ev)
}

func (c *Cutter) write(ctx context.Context, ev Event) error {
	if len(ev.Rows) == 0 {
		return nil
	}
	var dels int64
	for i := range ev.Rows {
		if ev.Rows[i].Epoch != ev.Epoch { // batches may be shared: write only if needed
			ev.Rows[i].Epoch = ev.Epoch
		}
		if ev.Rows[i].Deleted {
			dels++
		}
	}
	if c.cur == nil {
		m := c.cfg.Meta
		m.Kind = snapfile.KindSegment
		m.FirstEpoch, m.LastEpoch = ev.Epoch, ev.Epoch
		path := filepath.Join(c.cfg.Dir, fmt.Sprintf("w%04d-e%010d-s%06d.sqlite", m.WorkerIndex, ev.Epoch, c.seq))
		os.Remove(path) // a leftover of a crashed run is never uploaded; start over
		// A batch is usually the whole epoch's snapshot: its size says
		// what the segment will hold.
		opts := snapfile.Options{Segment: true, LargePages: len(ev.Rows) >= snapfile.LargePageRows}
		if opts.LargePages {
			// A large segment's first batch is laid out in pages directly
			// (snapfile.Build): a whole-state epoch's segment costs a
			// fraction of the CPU its INSERTs did.
			f, err := snapfile.Build(ctx, path, m, opts, ev.Rows)
			if err == nil {
				c.cur, c.curMeta, c.curRows, c.curDels = f, m, int64(len(ev.Rows)), dels
				return nil
			}
			if !errors.Is(err, snapfile.ErrTooLarge) {
				return fmt.Errorf("segment cutter: %w", err)
			}
		}
		f, err := snapfile.Create(ctx, path, m, opts)
		if err != nil {
			return fmt.Errorf("segment cutter: %w", err)
		}
		c.cur, c.curMeta, c.curRows, c.curDels = f, m, 0, 0
	}
	n, err := c.cur.Write(ctx, ev.Rows)
	if err != nil {
		return fmt.Errorf("segment cutter: %w", err)
	}
	c.curRows += int64(n)
	c.curDels += dels
	return nil
}

// finish seals the current segment, if any, and emits it.
func (c *Cutter) finish() error {
	if c.cur == nil {
		return nil
	}
	f, meta, rows, dels := c.cur, c.cur.Meta(), c.curRows, c.curDels
	c.cur = nil
	if err := f.Seal(); err != nil {
		return fmt.Errorf("segment cutter: %w", err)
	}
	seg := Segment{Path: f.Path(), Meta: meta, Rows: rows, Deletions: dels, Seq: c.seq}
	c.seq++
	return c.cfg.Emit(seg)
}

// Close stops the cutter: a segment still open is discarded (its epoch
// never closed, so it must not be shipped).
func (c *Cutter) Close() error {
	if c.cur == nil {
		return nil
	}
	path := c.cur.Path()
	err := c.cur.Close()
	c.cur = nil
	os.Remove(path)
	return err
}
