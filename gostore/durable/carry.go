package durable

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/millpond/millpond/gostore/rowbatch"
)

// carryRowOverhead is what a carried row costs beside its key and value
// bytes (its rowbatch.Row), counted against Config.CarryBytes.
const carryRowOverhead = int64(unsafe.Sizeof(rowbatch.Row{}))

// foldFloor: batches merged since the last fold are folded into the base
// once they hold more rows than half the base and this many.
const foldFloor = 4096

// carried is a worker's whole state as of the last batch it wrote, in
// batch mode, with each key and value copied into memory of the run's own.
// With it, an epoch that touched a good share of the keys is written whole
// (Run.WriteCarried) from the keys it touched alone: the run merges them
// into the state it carries, where the flow would otherwise hand over
// every key it did not touch as well (a copy of each one's last pickle, a
// few microseconds a key on the flow's thread, most of them missing the
// cache).
//
// The state is a base, one row per live key sorted by (step id, key), and
// the batches written since it was last folded, each sorted, deletions
// included. A batch costs a sort of its own rows; folding (for a whole
// batch, or when the batches since outgrow half the base) costs a pass
// over the base.
//
// A run carries a worker's state from the start of a fresh run (the state
// is empty) or from the worker's last whole batch, and updates it with
// every batch after that. It stops carrying when the state outgrows
// Config.CarryBytes; a whole batch within it starts again.
type carried struct {
	mu sync.Mutex
	// ok says base and runs are the worker's whole state.
	ok   bool
	base []rowbatch.Row
	// runs are the batches since the base, oldest first.
	runs    [][]rowbatch.Row
	runRows int
	// bytes counts the step, key and value bytes of base and runs.
	bytes int64
	// epoch is the last batch's; a second batch of one epoch is merged
	// but never written whole (a whole batch is its epoch's only one).
	epoch int64
	limit int64
}

func newCarried(ok bool, limit int64) *carried {
	return &carried{ok: ok && limit > 0, limit: limit}
}

// valid reports whether the worker's whole state is carried.
func (c *carried) valid() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ok
}

// take updates the carried state with batch b: a whole batch replaces it,
// any other is merged into it. With whole set and b not whole, it returns
// the batch to write instead of b: every key of the merged state, then b's
// deletions, marked whole (the deletions' keys alias b's memory, which the
// batch keeps); or b itself, not whole, when the state is not carried (or
// b is its epoch's second batch). The second result counts the rows added
// from the carried state, -1 when b is returned.
func (c *carried) take(b rowbatch.Batch, whole bool) (rowbatch.Batch, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	again := c.epoch == b.Epoch
	c.epoch = b.Epoch
	switch {
	case c.limit <= 0:
		return b, -1
	case b.Whole:
		c.ok = true
		c.base, c.runs, c.runRows, c.bytes = nil, nil, 0, 0
	case !c.ok:
		return b, -1
	}
	run, size := sortedRun(b.Rows)
	c.runs = append(c.runs, run)
	c.runRows += len(run)
	c.bytes += size
	write := whole && !b.Whole && !again
	if write || b.Whole || c.runRows > max(len(c.base)/2, foldFloor) {
		c.fold()
	}
	if c.bytes+carryRowOverhead*int64(len(c.base)+c.runRows) > c.limit {
		c.ok, c.base, c.runs, c.runRows, c.bytes = false, nil, nil, 0, 0
		return b, -1
	}
	if !write {
		return b, -1
	}
	live := 0
	rows := make([]rowbatch.Row, 0, len(c.base)+len(b.Rows))
	rows = append(rows, c.base...)
	for i := range run {
		if run[i].Deleted {
			rows = append(rows, run[i])
		} else {
			live++
		}
	}
	return rowbatch.Batch{Epoch: b.Epoch, Rows: rows, Whole: true, Mem: b.Mem}, len(c.base) - live
}

// fold merges the runs into the base.
func (c *carried) fold() {
	if len(c.runs) == 0 {
		return
	}
	// Newer runs first among themselves (small), then once with the base.
	newer := c.runs[0]
	for _, r := range c.runs[1:] {
		newer = mergeRows(newer, r, true)
	}
	c.base = mergeRows(c.base, newer, false)
	c.runs, c.runRows = nil, 0
	c.bytes = 0
	for i := range c.base {
		c.bytes += int64(len(c.base[i].Key) + len(c.base[i].Value))
	}
}

// sortedRun copies batch's rows, sorted by (step id, key), into memory of
// its own, keeping the last row of a key that appears twice; it returns
// them and their bytes.
func sortedRun(batch []rowbatch.Row) ([]rowbatch.Row, int64) {
	order := make([]*rowbatch.Row, len(batch))
	var size int64
	for i := range batch {
		order[i] = &batch[i]
		size += int64(len(batch[i].StepID) + len(batch[i].Key) + len(batch[i].Value))
	}
	slices.SortStableFunc(order, compareRows)
	a := arena{buf: make([]byte, 0, size)}
	run := make([]rowbatch.Row, 0, len(order))
	for i, r := range order {
		if i+1 < len(order) && compareRows(r, order[i+1]) == 0 {
			continue // superseded by the next
		}
		run = append(run, a.row(r, run))
	}
	return run, int64(len(a.buf))
}

// mergeRows merges two sorted runs into a new one, newer's row winning
// for a key both hold. A deletion in newer drops the key, or stays as a
// deletion with tombstones set.
func mergeRows(older, newer []rowbatch.Row, tombstones bool) []rowbatch.Row {
	var size int64
	for _, rows := range [2][]rowbatch.Row{older, newer} {
		for i := range rows {
			size += int64(len(rows[i].StepID) + len(rows[i].Key) + len(rows[i].Value))
		}
	}
	a := arena{buf: make([]byte, 0, size)}
	out := make([]rowbatch.Row, 0, len(older)+len(newer))
	i, j := 0, 0
	for i < len(older) || j < len(newer) {
		var r *rowbatch.Row
		switch {
		case j == len(newer):
			r, i = &older[i], i+1
		case i == len(older):
			r, j = &newer[j], j+1
		default:
			switch compareRows(&older[i], &newer[j]) {
			case -1:
				r, i = &older[i], i+1
			case 0:
				r, i, j = &newer[j], i+1, j+1
			default:
				r, j = &newer[j], j+1
			}
		}
		if r.Deleted && !tombstones {
			continue
		}
		out = append(out, a.row(r, out))
	}
	return out
}

// compareRows orders rows by (step id, key).
func compareRows(a, b *rowbatch.Row) int {
	if c := strings.Compare(a.StepID, b.StepID); c != 0 {
		return c
	}
	return cmp.Compare(a.Key, b.Key)
}

// arena holds carried rows' bytes: one allocation sized up front, so the
// strings and slices into it never move.
type arena struct {
	buf []byte
}

// row copies r into the arena, without its epoch; its step id is the
// previous row's when they are equal, so a step's id is stored once.
func (a *arena) row(r *rowbatch.Row, before []rowbatch.Row) rowbatch.Row {
	var step string
	if n := len(before); n > 0 && before[n-1].StepID == r.StepID {
		step = before[n-1].StepID
	} else {
		step = a.str(r.StepID)
	}
	out := rowbatch.Row{StepID: step, Key: a.str(r.Key), Deleted: r.Deleted}
	if !r.Deleted {
		off := len(a.buf)
		a.buf = append(a.buf, r.Value...)
		out.Value = a.buf[off:len(a.buf):len(a.buf)]
	}
	return out
}

func (a *arena) str(s string) string {
	if s == "" {
		return ""
	}
	off := len(a.buf)
	a.buf = append(a.buf, s...)
	return unsafe.String(&a.buf[off], len(s))
}
