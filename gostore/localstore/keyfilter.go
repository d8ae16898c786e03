package localstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// Each batch queued for the writer has a small filter of its own, of the
// keys it holds, dropped once the batch is written: a read of many keys
// looks for each key only in the queued batches that may hold it (and
// takes the row from the newest that does), and a single-key read waits
// only for those batches, however long the queue stays busy. A queued
// whole batch (a new generation) makes every read wait, as it changes
// what every key reads.
//
// The key filter: a Bloom filter of every (step, key) the store may hold a
// row of, so that a read of a key it never held (a new key of a resumed
// or memory-bounded flow: most keys a flow touches, early on) answers "not
// found" without waiting for queued writes, taking the lock or reading a
// page. Every write adds its keys before it is queued, so a key the filter
// has never seen has no row and no row on its way; rows dropped since
// (GC, rollback) only leave false positives, which cost the read the
// filter spares. A store opened over an existing file answers "maybe" for
// every key until a background scan has added the file's keys.

// filterBitsPerKey and filterHashes give about 1% false positives per
// part of the filter.
const (
	filterBitsPerKey = 10
	filterHashes     = 7
	// filterFirstKeys sizes the first part; each later one is twice the
	// one before, so a filter of n keys has about log2(n/64k) parts.
	filterFirstKeys = 1 << 16
)

// keyFilter is a scalable Bloom filter over (step, key).
type keyFilter struct {
	seed  maphash.Seed
	mu    sync.RWMutex
	parts []*bloomPart
	// ready is set once every key of the file the store opened is in the
	// filter; until then mayHold says yes to everything.
	ready atomic.Bool
	// skipped counts reads the filter answered alone.
	skipped atomic.Int64
}

// bloomPart is one fixed-size Bloom filter of the chain.
type bloomPart struct {
	bits     []uint64
	capacity int
	count    int
}

func newKeyFilter(seed maphash.Seed) *keyFilter {
	f := &keyFilter{seed: seed}
	f.parts = []*bloomPart{newBloomPart(filterFirstKeys)}
	return f
}

// newBatchFilter is a filter sized for the n keys of one queued batch.
func newBatchFilter(seed maphash.Seed, n int) *keyFilter {
	f := &keyFilter{seed: seed}
	f.parts = []*bloomPart{newBloomPart(max(n, 1))}
	f.ready.Store(true)
	return f
}

func newBloomPart(capacity int) *bloomPart {
	words := (capacity*filterBitsPerKey + 63) / 64
	return &bloomPart{bits: make([]uint64, words), capacity: capacity}
}

// hash returns the two hashes the filter's probes are derived from.
func (f *keyFilter) hash(step, key string) (uint64, uint64) {
	var h maphash.Hash
	h.SetSeed(f.seed)
	h.WriteString(step)
	h.WriteByte(0)
	h.WriteString(key)
	a := h.Sum64()
	// The second hash: a different mix of the same bits (double hashing
	// needs it odd, so every probe of a part is distinct).
	b := (a>>33 ^ a*0x9e3779b97f4a7c15) | 1
	return a, b
}

func (p *bloomPart) add(a, b uint64) {
	n := uint64(len(p.bits) * 64)
	for i := uint64(0); i < filterHashes; i++ {
		bit := (a + i*b) % n
		p.bits[bit/64] |= 1 << (bit % 64)
	}
	p.count++
}

func (p *bloomPart) has(a, b uint64) bool {
	n := uint64(len(p.bits) * 64)
	for i := uint64(0); i < filterHashes; i++ {
		bit := (a + i*b) % n
		if p.bits[bit/64]&(1<<(bit%64)) == 0 {
			return false
		}
	}
	return true
}

// addRows adds the keys of rows, to pending too if it is not nil (the
// rows are on their way to the file: see pendingFilter).
func (f *keyFilter) addRows(rows []rowbatch.Row, pending *keyFilter) {
	if len(rows) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if pending != nil {
		pending.mu.Lock()
		defer pending.mu.Unlock()
	}
	for i := range rows {
		a, b := f.hash(rows[i].StepID, rows[i].Key)
		f.addLocked(a, b)
		if pending != nil {
			pending.addLocked(a, b)
		}
	}
}

// has reports whether any part holds the hashes (from hash).
func (f *keyFilter) has(a, b uint64) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.hasLocked(a, b)
}

// hasLocked reports whether any part holds the hashes; f.mu is held.
func (f *keyFilter) hasLocked(a, b uint64) bool {
	for _, p := range f.parts {
		if p.has(a, b) {
			return true
		}
	}
	return false
}

// anyMayHold reports whether any of keys of step may be in the filter.
func (f *keyFilter) anyMayHold(step string, keys []string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, k := range keys {
		if f.hasLocked(f.hash(step, k)) {
			return true
		}
	}
	return false
}

func (f *keyFilter) addLocked(a, b uint64) {
	// A key the filter holds already is not counted again: a flow writes
	// the same keys epoch after epoch, and counting every write would
	// grow the filter (and each read's probes) with the rows written
	// rather than the keys.
	if f.hasLocked(a, b) {
		return
	}
	last := f.parts[len(f.parts)-1]
	if last.count >= last.capacity {
		last = newBloomPart(last.capacity * 2)
		f.parts = append(f.parts, last)
	}
	last.add(a, b)
}

// mayHold reports whether the store may hold a row of (step, key).
func (f *keyFilter) mayHold(step, key string) bool {
	if !f.ready.Load() {
		return true
	}
	a, b := f.hash(step, key)
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.hasLocked(a, b) {
		return true
	}
	f.skipped.Add(1)
	return false
}

// filterKeys returns the keys of step the store may hold rows of.
func (f *keyFilter) filterKeys(step string, keys []string) []string {
	if !f.ready.Load() {
		return keys
	}
	var out []string
	f.mu.RLock()
	defer f.mu.RUnlock()
	skipped := int64(0)
	for _, k := range keys {
		if f.hasLocked(f.hash(step, k)) {
			out = append(out, k)
		} else {
			skipped++
		}
	}
	f.skipped.Add(skipped)
	return out
}

// fillFilter adds every key of the store's file to the filter, a page at
// a time, then marks it ready; it stops early (leaving the filter not
// ready: every key "maybe") if the store closes or a read fails. Keys
// written meanwhile are added by their writes, so pages need not wait for
// queued writes.
//
// It reads on read-only connections of its own (filterPage), not through
// the store's lock: a store opened to be restored is scanned by the
// restore at the same time (hydrate_all), and the two scans took turns at
// the lock page after page, so restoring 1M keys took twice as long as it
// did before the filter.
func (s *Store) fillFilter(ctx context.Context) {
	defer close(s.filterDone)
	// Deletions too: Get returns a key's deletion row, filter or not.
	opts := snapfile.ScanOptions{ChunkRows: 8192, IncludeDeleted: true}
	var cur snapfile.Cursor
	for {
		select {
		case <-s.quit:
			return
		default:
		}
		rows, next, done, err := s.filterPage(ctx, opts, cur)
		if err != nil {
			return // every key stays "maybe": reads go to the store
		}
		s.filter.addRows(rows, nil)
		if done {
			s.filter.ready.Store(true)
			return
		}
		cur = next
	}
}

// filterReaderCacheMiB keeps fillFilter's connections small: each reads
// one page, in order.
const filterReaderCacheMiB = 2

// filterPage reads the page at cur of the store's file on a read-only
// connection opened for it (the write-ahead log lets it read beside the
// writer). Like Verify, it looks the file up under s.mu, then holds
// passiveMu while its connection is open, so a retirement of the file
// (which bumps fileGen, then takes passiveMu) waits for the page and
// never leaves a connection open on a file it removes. When a generation
// replaced the file, the walk goes on from the same cursor in the new
// one: its keys were all written through the store, which added them to
// the filter, so the walk only has to reach the end. An empty page that
// is not done means: look again.
func (s *Store) filterPage(ctx context.Context, o snapfile.ScanOptions, cur snapfile.Cursor) ([]rowbatch.Row, snapfile.Cursor, bool, error) {
	s.mu.Lock()
	closed := s.file == nil
	var path string
	if !closed {
		path = s.target().Path()
	}
	gen := s.fileGen.Load()
	s.mu.Unlock()
	if closed {
		return nil, cur, true, errClosed
	}
	s.passiveMu.Lock()
	defer s.passiveMu.Unlock()
	if s.fileGen.Load() != gen {
		return nil, cur, false, nil // retired since the look-up
	}
	f, err := snapfile.Open(ctx, path, snapfile.Options{ReadOnly: true, CacheMiB: filterReaderCacheMiB, LogChecked: true})
	if err != nil {
		return nil, cur, true, fmt.Errorf("fill key filter: %w", err)
	}
	defer f.Close()
	return f.ScanPage(ctx, o, cur)
}

// FilterStats reports how many reads the key filter answered without the
// store, and whether it covers the whole store yet.
func (s *Store) FilterStats() (skipped int64, ready bool) {
	return s.filter.skipped.Load(), s.filter.ready.Load()
}
