package snapfile

import (
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

// getManySQL is the lookup of one key's versions, as Get makes it: the
// last column tells the table (1 for recent), which wins a tie on epoch.
func getManySQL(f *File) string {
	crcCol := "crc"
	if f.legacy {
		crcCol = "0"
	}
	arm := func(table, src string) string {
		return `SELECT epoch, key_group, value, ` + crcCol + `, ` + src + `
			FROM ` + table + ` WHERE step_id = ?1 AND state_key = ?2 AND epoch < ?3`
	}
	q := arm("snaps", "0")
	if f.hasRecent {
		q += ` UNION ALL ` + arm("recent", "1")
	}
	// No ORDER BY: the newest version is picked here, and SQLite would
	// sort the one or two rows of each key in a temporary b-tree.
	return q
}

// getMany appends to p the newest row with epoch < before of each of the
// sorted, distinct keys of step, checking every version read.
func (b *bulkConn) getMany(ctx context.Context, p *page, f *File, step string, keys []string, before int64) (err error) {
	st, err := b.cached(getManySQL(f))
	if err != nil {
		return err
	}
	// The step stays bound at the arena's start for every key; each key is
	// copied after it and bound in turn (SQLITE_STATIC: SQLite reads the
	// arena in place while it steps).
	longest := 0
	for _, k := range keys {
		longest = max(longest, len(k))
	}
	if err := b.reserve(len(step) + longest); err != nil {
		return err
	}
	mem := unsafe.Slice((*byte)(cmem(b.arena)), b.size)
	copy(mem, step)
	keyAt := b.arena + uintptr(len(step))
	if rc := sqlite3.Xsqlite3_bind_text(b.tls, st, 1, b.arena, int32(len(step)), sqlite3.SQLITE_STATIC) |
		sqlite3.Xsqlite3_bind_int64(b.tls, st, 3, before); rc != sqlite3.SQLITE_OK {
		return b.errorf("bind get of", rc)
	}
	// One read transaction: every key is read from the same snapshot of
	// the file, and the WAL's read lock is taken once, not per key. One
	// key's statement is a transaction of its own already.
	if len(keys) > 1 {
		if err := b.exec("BEGIN"); err != nil {
			return err
		}
		defer func() {
			if end := b.exec("COMMIT"); end != nil && err == nil {
				err = end
			}
		}()
	}
	defer sqlite3.Xsqlite3_reset(b.tls, st)
	stepBytes := []byte(step)
	for i, key := range keys {
		if i%getManyCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		n := copy(mem[len(step):], key)
		if rc := sqlite3.Xsqlite3_bind_text(b.tls, st, 2, keyAt, int32(n), sqlite3.SQLITE_STATIC); rc != sqlite3.SQLITE_OK {
			return b.errorf("bind get of", rc)
		}
		if err := b.getOne(st, p, f, stepBytes, mem[len(step):len(step)+n]); err != nil {
			return err
		}
	}
	return nil
}

// getOne steps st (bound to one key) through the key's versions, checks
// each, and appends the newest to p, replacing an older one added before.
func (b *bulkConn) getOne(st uintptr, p *page, f *File, step, key []byte) error {
	defer sqlite3.Xsqlite3_reset(b.tls, st)
	added := false
	var bestEpoch, bestSrc int64
	for {
		switch rc := sqlite3.Xsqlite3_step(b.tls, st); rc {
		case sqlite3.SQLITE_ROW:
		case sqlite3.SQLITE_DONE:
			return nil
		default:
			return b.errorf(fmt.Sprintf("get %q of", key), rc)
		}
		epoch := sqlite3.Xsqlite3_column_int64(b.tls, st, 0)
		group := sqlite3.Xsqlite3_column_int64(b.tls, st, 1)
		deleted := sqlite3.Xsqlite3_column_type(b.tls, st, 2) == sqlite3.SQLITE_NULL
		var val []byte
		if !deleted {
			val = b.columnBytes(st, 2, true)
		}
		if err := f.checkRow(&b.crc, step, key, epoch, group, deleted, val, sqlite3.Xsqlite3_column_int64(b.tls, st, 3)); err != nil {
			return err
		}
		src := sqlite3.Xsqlite3_column_int64(b.tls, st, 4)
		if added && (epoch < bestEpoch || (epoch == bestEpoch && src <= bestSrc)) {
			continue
		}
		if added {
			p.dropLast()
		}
		p.add(key, epoch, val, deleted)
		added, bestEpoch, bestSrc = true, epoch, src
	}
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
