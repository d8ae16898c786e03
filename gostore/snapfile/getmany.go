package snapfile

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"unsafe"

	sqlite3 "modernc.org/sqlite/lib"
)

// getManyCheckEvery is how many keys GetManyPacked looks up between checks
// of its context.
const getManyCheckEvery = 1024

// GetManyPacked looks up many keys of one step at once: for each key, the
// row Get(ctx, step, key, before) would return, packed in the page format
// of ScanPagePacked (uvarint count, then per key uvarint(len) key,
// uvarint(epoch), uvarint(tag) value, tag 0 for a deletion).
//
// Entries come in key order (bytewise, as SQLite compares them), each key
// once however often it was asked for. A key whose newest row is a
// deletion is included as a deletion; a key without a row is left out.
// As in Get, every version of a key is read and checked against its
// checksum (not in legacy files, which have none), the recent table's row
// wins a tie on epoch over the snaps row, and a row that fails its
// checksum, or SQLite finding the file malformed, is an error wrapping
// ErrDamaged.
//
// The lookups go through the bulk connection's prepared statement, in key
// order (neighbouring keys share B-tree pages) and in one read
// transaction, rather than one database/sql query per key: a few
// microseconds a key rather than some forty.
func (f *File) GetManyPacked(ctx context.Context, step string, keys []string, before int64) ([]byte, error) {
	return f.getManyPacked(ctx, f.rawConn, step, keys, before)
}

// GetManyPackedConcurrent is GetManyPacked on a connection of its own, so
// that it may run while another goroutine uses the file's other methods,
// writes included: in a write-ahead-logged file readers do not wait for
// the writer, and each call reads one snapshot of the file that holds
// every transaction committed before it began. A reader of keys that a
// write in progress may hold must wait for that write itself. Calls are
// serialized among themselves; Close must not run concurrently with one.
// Segment files (no write-ahead log) refuse it.
func (f *File) GetManyPackedConcurrent(ctx context.Context, step string, keys []string, before int64) ([]byte, error) {
	if f.opts.Segment {
		return nil, fmt.Errorf("get %d keys of %s from %s: concurrent reads need a write-ahead-logged file, not a segment", len(keys), step, f.path)
	}
	f.readMu.Lock()
	defer f.readMu.Unlock()
	return f.getManyPacked(ctx, f.readerConn, step, keys, before)
}

// readerConn returns GetManyPackedConcurrent's connection, opening it on
// first use. f.readMu is held.
func (f *File) readerConn() (*bulkConn, error) {
	if f.reader == nil {
		b, err := openBulk(f.path, f.opts)
		if err != nil {
			return nil, err
		}
		if err := b.exec("PRAGMA query_only=1"); err != nil {
			b.close()
			return nil, err
		}
		f.reader = b
	}
	return f.reader, nil
}

func (f *File) getManyPacked(ctx context.Context, conn func() (*bulkConn, error), step string, keys []string, before int64) ([]byte, error) {
	if before <= 0 {
		before = math.MaxInt64
	}
	p := &page{}
	if len(keys) == 0 {
		return p.pack(true), nil
	}
	sorted := keys
	if !sortedDistinct(keys) {
		sorted = slices.Compact(slices.Sorted(slices.Values(keys)))
	}
	b, err := conn()
	if err != nil {
		return nil, fmt.Errorf("get %d keys of %s from %s: %w", len(sorted), step, f.path, err)
	}
	if err := b.getMany(ctx, p, f, step, sorted, before); err != nil {
		return nil, classify(f.path, fmt.Sprintf("get %d keys of %s", len(sorted), step),
			fmt.Errorf("get %d keys of %s from %s: %w", len(sorted), step, f.path, err))
	}
	return p.pack(true), nil
}

// getManySQL reads one table's rows of a step from a key on, up to a last
// key, in key order (the primary key's), versions of a key oldest first.
// A run of wanted keys that are neighbours in the table is read by
// stepping this one statement; a wanted key far from the one before is
// sought by binding ?2 to it again.
func getManySQL(f *File, table string) string {
	crcCol := "crc"
	if f.legacy {
		crcCol = "0"
	}
	return `SELECT state_key, epoch, key_group, value, ` + crcCol + ` FROM ` + table + `
		WHERE step_id = ?1 AND state_key >= ?2 AND state_key <= ?4 AND epoch < ?3
		ORDER BY state_key, epoch`
}

// getMany appends to p the newest row with epoch < before of each of the
// sorted, distinct keys of step, checking every version read. The recent
// table's rows, if it has any, are read the same way and win a tie on
// epoch.
func (b *bulkConn) getMany(ctx context.Context, p *page, f *File, step string, keys []string, before int64) (err error) {
	// One read transaction: every key is read from the same snapshot of
	// the file, and the WAL's read lock is taken once, not per key.
	if err := b.exec("BEGIN"); err != nil {
		return err
	}
	defer func() {
		if end := b.exec("COMMIT"); end != nil && err == nil {
			err = end
		}
	}()
	if err := b.walkMany(ctx, p, f, "snaps", step, keys, before); err != nil {
		return err
	}
	if !f.hasRecent {
		return nil
	}
	var recent page
	if err := b.walkMany(ctx, &recent, f, "recent", step, keys, before); err != nil || len(recent.starts) == 0 {
		return err
	}
	*p = mergeNewest(p, &recent)
	return nil
}

// How walkMany moves between wanted keys: it steps over up to
// getManyReseekAfter rows no key wants before it seeks the next wanted key
// instead (a seek costs a few steps); once it had to seek, it looks the
// next getManyProbeEvery keys up one by one and then tries stepping again.
const (
	getManyReseekAfter = 8
	getManyProbeEvery  = 16
)

// walkMany appends to p the newest row with epoch < before of each of the
// sorted, distinct keys found in table, checking every version read.
//
// It reads the table in key order from the first key, as one range up to
// the last: keys next to each other in the table (a batch of a flow that
// reads its keys in order) cost a step each, not a seek each. Where rows
// no key wants lie between two wanted keys, it steps over a few and then
// seeks; keys scattered over a large table are then looked up one at a
// time, the range cut to the key itself so that SQLite ends it without
// handing back the next row, as cheap as separate lookups, with a probe
// for neighbours every getManyProbeEvery keys.
func (b *bulkConn) walkMany(ctx context.Context, p *page, f *File, table, step string, keys []string, before int64) error {
	st, err := b.cached(getManySQL(f, table))
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_reset(b.tls, st)
	// The arena holds the step, the last key and the key sought; SQLite
	// reads them in place while it steps (SQLITE_STATIC).
	last := keys[len(keys)-1]
	longest := 0
	for _, k := range keys {
		longest = max(longest, len(k))
	}
	if err := b.reserve(len(step) + len(last) + longest); err != nil {
		return err
	}
	mem := unsafe.Slice((*byte)(cmem(b.arena)), b.size)
	copy(mem, step)
	copy(mem[len(step):], last)
	lastAt, seekAt := b.arena+uintptr(len(step)), len(step)+len(last)
	if rc := sqlite3.Xsqlite3_bind_text(b.tls, st, 1, b.arena, int32(len(step)), sqlite3.SQLITE_STATIC) |
		sqlite3.Xsqlite3_bind_int64(b.tls, st, 3, before); rc != sqlite3.SQLITE_OK {
		return b.errorf("bind get of", rc)
	}
	one := false    // the statement reads keys[i] alone (?4 = ?2)
	pointsLeft := 0 // lookups of one key before the next probe
	budget := getManyReseekAfter
	floor := "" // the key the statement was started at
	// seek starts the statement at key: a range to the last key, or the
	// key alone while keys are scattered.
	seek := func(key string) error {
		sqlite3.Xsqlite3_reset(b.tls, st)
		floor = key
		n := copy(mem[seekAt:], key)
		at := b.arena + uintptr(seekAt)
		one = pointsLeft > 0
		upTo, upToLen := lastAt, len(last)
		if one {
			pointsLeft--
			upTo, upToLen = at, n
		}
		if rc := sqlite3.Xsqlite3_bind_text(b.tls, st, 2, at, int32(n), sqlite3.SQLITE_STATIC) |
			sqlite3.Xsqlite3_bind_text(b.tls, st, 4, upTo, int32(upToLen), sqlite3.SQLITE_STATIC); rc != sqlite3.SQLITE_OK {
			return b.errorf("bind get of", rc)
		}
		return nil
	}
	if err := seek(keys[0]); err != nil {
		return err
	}
	stepBytes := []byte(step)
	i := 0         // the wanted key rows are compared with
	found := false // keys[i] has a row in p (its newest so far)
	skipped := 0   // rows stepped over since the last wanted one
	sought := true // no row read since the last seek
	for rows := 0; i < len(keys); rows++ {
		if rows%getManyCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		rc := sqlite3.Xsqlite3_step(b.tls, st)
		if rc == sqlite3.SQLITE_DONE {
			if !one {
				return nil // no row up to the last key
			}
			if i++; i == len(keys) {
				return nil
			}
			found = false
			if err := seek(keys[i]); err != nil {
				return err
			}
			skipped, sought = 0, true
			continue
		}
		if rc != sqlite3.SQLITE_ROW {
			return b.errorf(fmt.Sprintf("get %q of", keys[i]), rc)
		}
		key := b.columnBytes(st, 0, false)
		if string(key) < floor {
			// SQLite hands back rows from the key sought on, trusting the
			// b-tree's order: a row below it is a key damaged out of its
			// place, which every seek to that key would land on again.
			return damagedf(f.path, "step %q: key %q read after a seek to %q: keys out of order", step, key, floor)
		}
		// Past keys[i]: its versions are all read; move on to the first
		// wanted key at or after this row's.
		for i < len(keys) && string(key) > keys[i] {
			i++
			found = false
		}
		if i == len(keys) {
			return nil
		}
		if string(key) != keys[i] {
			// A row no key wants, before keys[i] (only a range reads one).
			sought = false
			if skipped++; skipped > budget {
				budget, pointsLeft = 0, getManyProbeEvery
				if err := seek(keys[i]); err != nil {
					return err
				}
				skipped, sought = 0, true
			}
			continue
		}
		if !found && !sought && skipped == 0 {
			// The row after the last wanted key's is wanted too:
			// neighbours, worth stepping over a gap for.
			budget = getManyReseekAfter
		}
		skipped, sought = 0, false
		epoch := sqlite3.Xsqlite3_column_int64(b.tls, st, 1)
		group := sqlite3.Xsqlite3_column_int64(b.tls, st, 2)
		deleted := sqlite3.Xsqlite3_column_type(b.tls, st, 3) == sqlite3.SQLITE_NULL
		var val []byte
		if !deleted {
			val = b.columnBytes(st, 3, true)
		}
		if err := f.checkRow(&b.crc, stepBytes, key, epoch, group, deleted, val, sqlite3.Xsqlite3_column_int64(b.tls, st, 4)); err != nil {
			return err
		}
		// Versions come oldest first: each replaces the one before.
		if found {
			p.dropLast()
		}
		p.add(key, epoch, val, deleted)
		found = true
	}
	return nil
}

// mergeNewest merges two pages of sorted, distinct keys into one: a key in
// both takes the newer row, recent's on a tie.
func mergeNewest(snaps, recent *page) page {
	var out page
	i, j := 0, 0
	for i < len(snaps.starts) || j < len(recent.starts) {
		var from *page
		var at int
		switch {
		case j == len(recent.starts):
			from, at = snaps, i
			i++
		case i == len(snaps.starts):
			from, at = recent, j
			j++
		default:
			ks, kr := snaps.key(i), recent.key(j)
			switch c := bytes.Compare(ks, kr); {
			case c < 0:
				from, at = snaps, i
				i++
			case c > 0:
				from, at = recent, j
				j++
			default:
				_, es, _, _ := snaps.entry(i)
				_, er, _, _ := recent.entry(j)
				from, at = recent, j
				if es > er {
					from, at = snaps, i
				}
				i++
				j++
			}
		}
		key, epoch, val, deleted := from.entry(at)
		out.add(key, epoch, val, deleted)
	}
	return out
}

// sortedDistinct reports whether keys are in strictly increasing order
// (a caller that sorted them already spares the copy and the sort).
func sortedDistinct(keys []string) bool {
	for i := 1; i < len(keys); i++ {
		if keys[i-1] >= keys[i] {
			return false
		}
	}
	return true
}
