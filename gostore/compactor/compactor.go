// Package compactor turns a change log of snapshot batches and epoch-close
// markers into snapshot files.
//
// One component serves every place state is written: in Retained mode it
// writes into one long-lived file (a worker's local store, or a store
// being rebuilt from the durable store); in Batch mode it starts a new
// segment for each epoch and hands the finished one on at the epoch's
// close; in Immediate mode every batch becomes its own finished segment.
// A finished segment is sealed (closed and fsynced) before it is handed on,
// so what gets uploaded is what is on disk.
package compactor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// Mode says when the compactor swaps to a new file.
type Mode int

// The compactor modes.
const (
	// Retained never swaps: every batch goes into one file that is kept.
	Retained Mode = iota
	// Batch swaps at every epoch close: one segment per epoch.
	Batch
	// Immediate swaps after every batch: one segment per batch.
	Immediate
)

// String names the mode.
func (m Mode) String() string {
	switch m {
	case Retained:
		return "retained"
	case Batch:
		return "batch"
	case Immediate:
		return "immediate"
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
	// Seq orders the segments one compactor emitted.
	Seq int64
}

// Writer is where a Retained compactor writes.
type Writer interface {
	Write(ctx context.Context, epoch int64, rows []rowbatch.Row) (int, error)
}

// Config sets up a compactor.
type Config struct {
	Mode Mode
	// Dir receives segment files (Batch and Immediate).
	Dir string
	// Meta is stamped on every segment; epochs and kind are filled in.
	Meta snapfile.Meta
	// Target receives the rows in Retained mode.
	Target Writer
	// Emit is called with each finished segment, in order.
	Emit func(Segment) error
	// FirstSeq numbers the first segment.
	FirstSeq int64
}

// Compactor applies change-log events. It is not safe for concurrent use:
// one goroutine feeds it.
type Compactor struct {
	cfg     Config
	cur     *snapfile.File
	curMeta snapfile.Meta
	curRows int64
	seq     int64
}

// New returns a compactor for cfg.
func New(cfg Config) (*Compactor, error) {
	switch cfg.Mode {
	case Retained:
		if cfg.Target == nil {
			return nil, errors.New("compactor: retained mode needs a target")
		}
	case Batch, Immediate:
		if cfg.Dir == "" || cfg.Emit == nil {
			return nil, fmt.Errorf("compactor: %s mode needs a directory and an emit function", cfg.Mode)
		}
		if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("compactor: %w", err)
		}
	default:
		return nil, fmt.Errorf("compactor: unknown mode %d", cfg.Mode)
	}
	return &Compactor{cfg: cfg, seq: cfg.FirstSeq}, nil
}

// Apply consumes one event.
func (c *Compactor) Apply(ctx context.Context, ev Event) error {
	switch c.cfg.Mode {
	case Retained:
		if ev.Close {
			return nil
		}
		_, err := c.cfg.Target.Write(ctx, ev.Epoch, ev.Rows)
		return err
	case Batch:
		if ev.Close {
			return c.swap()
		}
		if c.cur != nil && c.curMeta.FirstEpoch != ev.Epoch {
			// A batch of a new epoch without a close of the old one: the old
			// epoch's segment is complete all the same.
			if err := c.swap(); err != nil {
				return err
			}
		}
		return c.write(ctx, ev)
	case Immediate:
		if ev.Close || len(ev.Rows) == 0 {
			return nil
		}
		if err := c.write(ctx, ev); err != nil {
			return err
		}
		return c.swap()
	}
	return nil
}

func (c *Compactor) write(ctx context.Context, ev Event) error {
	if len(ev.Rows) == 0 {
		return nil
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
		f, err := snapfile.Create(ctx, path, m, opts)
		if err != nil {
			return fmt.Errorf("compactor: %w", err)
		}
		c.cur, c.curMeta, c.curRows = f, m, 0
	}
	for i := range ev.Rows {
		if ev.Rows[i].Epoch != ev.Epoch { // batches may be shared: write only if needed
			ev.Rows[i].Epoch = ev.Epoch
		}
	}
	n, err := c.cur.Write(ctx, ev.Rows)
	if err != nil {
		return fmt.Errorf("compactor: %w", err)
	}
	c.curRows += int64(n)
	return nil
}

// swap seals the current segment, if any, and emits it.
func (c *Compactor) swap() error {
	if c.cur == nil {
		return nil
	}
	f, meta, rows := c.cur, c.cur.Meta(), c.curRows
	c.cur = nil
	if err := f.Seal(); err != nil {
		return fmt.Errorf("compactor: %w", err)
	}
	seg := Segment{Path: f.Path(), Meta: meta, Rows: rows, Seq: c.seq}
	c.seq++
	return c.cfg.Emit(seg)
}

// Close finishes: an open segment is discarded (its epoch never closed, so
// it must not be shipped), a retained target is left to its owner.
func (c *Compactor) Close() error {
	if c.cur == nil {
		return nil
	}
	path := c.cur.Path()
	err := c.cur.Close()
	c.cur = nil
	os.Remove(path)
	return err
}
