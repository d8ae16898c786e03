package rowbatch

import "sync/atomic"

// Batch is one snapshot batch of one worker: the rows of the keys an epoch
// touched, all at that epoch. It is the one unit in which state is written,
// to a worker's local store and to its durable segments alike.
//
// A batch is handed over, not lent: whoever is given one (a store's Write,
// a recovery run's Write) may read its rows in the background and must
// Release it exactly once when it is done with them; the giver neither
// changes the rows nor releases the batch afterwards.
type Batch struct {
	Epoch int64
	Rows  []Row
	// Whole says the rows are the worker's whole state at Epoch: every key
	// it holds is in them, and a key it dropped is a deletion. A store can
	// then replace what it held instead of writing over it, and an epoch
	// whole on every worker stands for all older state.
	Whole bool
	// Mem is the memory the rows alias, when the batch owns it (a buffer
	// packed outside Go, say); nil for rows in ordinary Go memory.
	Mem *Memory
}

// NewBatch stamps rows with epoch and returns them as a batch.
func NewBatch(epoch int64, rows []Row, whole bool) Batch {
	for i := range rows {
		rows[i].Epoch = epoch
	}
	return Batch{Epoch: epoch, Rows: rows, Whole: whole}
}

// Hold registers one more holder of b's memory, for a batch passed on to
// two readers: each of them releases it.
func (b Batch) Hold() Batch {
	if b.Mem != nil {
		b.Mem.holders.Add(1)
	}
	return b
}

// Release ends one holder's use of b's rows; the last one frees the memory
// they alias. A batch in Go memory needs no release, but may get one.
func (b Batch) Release() {
	if b.Mem == nil {
		return
	}
	switch n := b.Mem.holders.Add(-1); {
	case n == 0:
		b.Mem.free()
	case n < 0:
		panic("rowbatch: batch released more often than held")
	}
}

// Memory is memory that rows alias and that must be freed when the last
// holder of their batch releases it.
type Memory struct {
	holders atomic.Int64
	free    func()
}

// NewMemory returns memory with one holder, freed by free when the last
// holder releases it.
func NewMemory(free func()) *Memory {
	m := &Memory{free: free}
	m.holders.Store(1)
	return m
}
