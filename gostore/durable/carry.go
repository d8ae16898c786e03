package durable

import (
	"strings"
	"sync"
	"unsafe"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// carryRowOverhead is what a carried row costs beside its key and value
// bytes (its rowbatch.Row), counted against Config.CarryBytes.
const carryRowOverhead = int64(unsafe.Sizeof(rowbatch.Row{}))

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
// included, its bytes copied into an arena of its own. A batch costs a
// sort and a copy of its own rows; folding (for a whole batch, or when the
// batches since outgrow half the base) a pass over the base's rows, which
// keep pointing into the arenas they were copied to. Once those hold more
// than twice the live bytes (keys changed since hold their older values
// there too), a fold copies the live rows into one new arena. A whole
// batch is the base as it is, in key order: the segment cutter's sort
// finds it sorted and its build reads it in order.
//
// A run carries a worker's state from the start of a fresh run (the state
// is empty) or from the worker's last whole batch, and updates it with
// every batch after that. It stops carrying when the state outgrows
// Config.CarryBytes; a whole batch within it starts again.
//
// A whole batch the flow packed itself is kept as it came (its rows, their
// bytes still in its memory, held) until a batch that is not whole needs
// it as the base: a flow whose epochs touch nearly every key, written
// whole epoch after epoch, costs no sort and no copy of its keys here (the
// segment cutter sorts each batch anyway). Step ids are interned, so that
// comparing the rows of a base and a batch compares their step ids'
// pointers, not their bytes.
type carried struct {
	mu sync.Mutex
	// ok says base (or whole) and runs are the worker's whole state.
	ok   bool
	base []rowbatch.Row
	// whole, when not nil, is the last whole batch's rows, in its order,
	// aliasing wholeMem; base and runs are then empty (settle).
	whole    []rowbatch.Row
	wholeMem rowbatch.Batch
	// steps interns step ids: one string for each.
	steps map[string]string
	// runs are the batches since the base, oldest first.
	runs    [][]rowbatch.Row
	runRows int
	// live counts the key and value bytes of the base's rows; held the
	// bytes of the arenas base and runs point into.
	live, held int64
	// epoch is the last batch's; a second batch of one epoch is merged
	// but never written whole (a whole batch is its epoch's only one).
	epoch int64
	limit int64
	// foldFloor and compactFloor, for tests.
	foldFloor, compactFloor int64
}

// foldFloor: batches merged since the last fold are folded into the base
// once they hold more rows than half the base and this many.
const foldFloor = 4096

// compactFloor: arenas are compacted only once they hold this many bytes
// more than twice the live ones.
const compactFloor = 1 << 20

func newCarried(ok bool, limit int64) *carried {
	return &carried{
		ok: ok && limit > 0, limit: limit, foldFloor: foldFloor, compactFloor: compactFloor,
		steps: map[string]string{},
	}
}

// valid reports whether the worker's whole state is carried.
func (c *carried) valid() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ok
}

// stop drops the state and carries none from now on.
func (c *carried) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limit = 0
	c.drop(false)
}

// drop empties the state; ok says the empty state is the worker's.
func (c *carried) drop(ok bool) {
	c.ok, c.base, c.runs, c.runRows, c.live, c.held = ok, nil, nil, 0, 0, 0
	c.releaseWhole()
}

// releaseWhole lets go of a whole batch kept unsorted.
func (c *carried) releaseWhole() {
	if c.whole != nil {
		c.wholeMem.Release()
	}
	c.whole, c.wholeMem = nil, rowbatch.Batch{}
}

// adopt makes whole batch b the state, kept as it is until settle needs
// it sorted: its rows are copied (their readers downstream may stamp or
// reorder b's), its memory held.
func (c *carried) adopt(b rowbatch.Batch) {
	c.drop(true)
	var size int64
	for i := range b.Rows {
		size += int64(len(b.Rows[i].Key) + len(b.Rows[i].Value))
	}
	if size+carryRowOverhead*int64(len(b.Rows)) > c.limit {
		c.drop(false)
		return
	}
	// (not nil even for a batch without rows)
	c.whole = append(make([]rowbatch.Row, 0, len(b.Rows)), b.Rows...)
	c.wholeMem, c.held = b.Hold(), size
}

// settle turns a whole batch kept unsorted into the base: sorted, a row
// per live key, its bytes copied into an arena of the state's own.
func (c *carried) settle() {
	if c.whole == nil {
		return
	}
	run, size := c.sortedRun(c.whole)
	c.releaseWhole()
	// (folded into the empty base: its deletions go, live is counted)
	c.runs, c.runRows, c.held = [][]rowbatch.Row{run}, len(run), size
	c.fold()
}

// intern returns the state's one string equal to step.
func (c *carried) intern(step string) string {
	if s, ok := c.steps[step]; ok {
		return s
	}
	s := strings.Clone(step)
	c.steps[s] = s
	return s
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
		c.adopt(b)
		return b, -1
	case !c.ok:
		return b, -1
	}
	c.settle()
	run, size := c.sortedRun(b.Rows)
	c.runs = append(c.runs, run)
	c.runRows += len(run)
	c.held += size
	write := whole && !again
	if write || int64(c.runRows) > max(int64(len(c.base)/2), c.foldFloor) {
		c.fold()
	}
	if c.held+carryRowOverhead*int64(len(c.base)+c.runRows) > c.limit {
		c.drop(false)
		return b, -1
	}
	if !write {
		return b, -1
	}
	// The batch is the base the fold just made (the next fold makes a
	// new one), then the deletions.
	live, dels := 0, 0
	for i := range run {
		if run[i].Deleted {
			dels++
		} else {
			live++
		}
	}
	rows := c.base
	if dels > 0 {
		rows = make([]rowbatch.Row, len(c.base), len(c.base)+dels)
		copy(rows, c.base)
		for i := range run {
			if run[i].Deleted {
				rows = append(rows, run[i])
			}
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
	c.live = 0
	for i := range c.base {
		c.live += int64(len(c.base[i].Key) + len(c.base[i].Value))
	}
	if len(c.base) == 0 {
		c.held = 0
		return
	}
	if c.held > 2*c.live+c.compactFloor {
		a := arena{buf: make([]byte, 0, c.live)}
		for i := range c.base {
			r := &c.base[i]
			r.Key, r.Value = a.str(r.Key), a.bytes(r.Value)
		}
		c.held = int64(cap(a.buf))
	}
}

// sortedRun copies batch's rows, sorted by (step id, key), into memory of
// its own, keeping the last row of a key that appears twice; it returns
// them and the bytes of that memory.
func (c *carried) sortedRun(batch []rowbatch.Row) ([]rowbatch.Row, int64) {
	var size int64
	for i := range batch {
		size += int64(len(batch[i].Key) + len(batch[i].Value))
	}
	order := snapfile.SortedOrder(batch)
	a := arena{buf: make([]byte, 0, size)}
	run := make([]rowbatch.Row, 0, len(order))
	for i, at := range order {
		r := &batch[at]
		if i+1 < len(order) && compareRows(r, &batch[order[i+1]]) == 0 {
			continue // superseded by the next
		}
		out := rowbatch.Row{Key: a.str(r.Key), Deleted: r.Deleted}
		if n := len(run); n > 0 && run[n-1].StepID == r.StepID {
			out.StepID = run[n-1].StepID
		} else {
			out.StepID = c.intern(r.StepID)
		}
		if !r.Deleted {
			out.Value = a.bytes(r.Value)
		}
		run = append(run, out)
	}
	return run, int64(cap(a.buf))
}

// mergeRows merges two sorted runs into a new array of rows, newer's row
// winning for a key both hold; the rows keep pointing where they did. A
// deletion in newer drops the key, or stays as a deletion with tombstones
// set.
func mergeRows(older, newer []rowbatch.Row, tombstones bool) []rowbatch.Row {
	out := make([]rowbatch.Row, 0, len(older)+len(newer))
	i, j := 0, 0
	for i < len(older) || j < len(newer) {
		var r *rowbatch.Row
		switch {
		case j == len(newer):
			// The rest of older as it is.
			out = append(out, older[i:]...)
			i = len(older)
			continue
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
		out = append(out, *r)
	}
	return out
}

// compareRows orders rows by (step id, key).
func compareRows(a, b *rowbatch.Row) int {
	if a.StepID != b.StepID {
		return strings.Compare(a.StepID, b.StepID)
	}
	return strings.Compare(a.Key, b.Key)
}

// arena holds carried rows' bytes: one allocation sized up front, so the
// strings and slices into it never move (were it to grow, what points
// into its old memory would keep that alive).
type arena struct {
	buf []byte
}

func (a *arena) bytes(v []byte) []byte {
	off := len(a.buf)
	a.buf = append(a.buf, v...)
	return a.buf[off:len(a.buf):len(a.buf)]
}

func (a *arena) str(s string) string {
	if s == "" {
		return ""
	}
	off := len(a.buf)
	a.buf = append(a.buf, s...)
	return unsafe.String(&a.buf[off], len(s))
}
