package snapfile

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// bulkConn is a second connection to a snapshot file that writes row
// batches and reads scan pages through SQLite's C API (as modernc compiles
// it to Go) rather than through database/sql. On a million-row snapshot,
// database/sql spent more time converting, binding and copying values than
// SQLite spent inserting or reading them; here each value written is
// copied once into an arena SQLite reads in place, and each value read is
// copied once, from SQLite's page straight into the scan page.
//
// It is used by one goroutine at a time (File's contract), so SQLite's
// own mutexes are off.
type bulkConn struct {
	path  string
	tls   *libc.TLS
	db    uintptr
	arena uintptr // holds the bound text and blobs of one statement
	size  int
	scans map[string]uintptr // prepared statements by SQL text
	crc   [25]byte           // rowCRC's scratch
}

// openBulk opens the bulk connection with the same journal settings as the
// file's database/sql connection.
func openBulk(path string, o Options) (*bulkConn, error) {
	b := &bulkConn{path: path, tls: libc.NewTLS()}
	cpath, err := libc.CString(path)
	if err != nil {
		b.tls.Close()
		return nil, err
	}
	defer libc.Xfree(b.tls, cpath)
	pdb := libc.Xmalloc(b.tls, 8)
	if pdb == 0 {
		b.tls.Close()
		return nil, fmt.Errorf("open %s for writing: out of memory", path)
	}
	defer libc.Xfree(b.tls, pdb)
	flags := int32(sqlite3.SQLITE_OPEN_READWRITE | sqlite3.SQLITE_OPEN_NOMUTEX)
	if o.ReadOnly {
		flags = sqlite3.SQLITE_OPEN_READONLY | sqlite3.SQLITE_OPEN_NOMUTEX
	}
	rc := sqlite3.Xsqlite3_open_v2(b.tls, cpath, pdb, flags, 0)
	b.db = *(*uintptr)(cmem(pdb))
	if rc != sqlite3.SQLITE_OK {
		err := b.errorf("open for writing", rc)
		b.close()
		return nil, err
	}
	pragmas := fmt.Sprintf("PRAGMA busy_timeout=5000; PRAGMA cache_size=-%d; PRAGMA temp_store=MEMORY;", cacheMiB(o)*1024)
	if o.ReadOnly {
		// The file's own settings stand.
	} else if o.Segment {
		pragmas += "PRAGMA journal_mode=MEMORY; PRAGMA synchronous=OFF;"
	} else {
		pragmas += "PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0;"
	}
	if err := b.exec(pragmas); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// errorf describes a failed call with SQLite's message for the connection;
// the error keeps the result code (classify tells damage by it).
func (b *bulkConn) errorf(what string, rc int32) error {
	msg := ""
	if b.db != 0 {
		msg = libc.GoString(sqlite3.Xsqlite3_errmsg(b.tls, b.db))
		if ext := sqlite3.Xsqlite3_extended_errcode(b.tls, b.db); ext&0xff == rc&0xff {
			rc = ext
		}
	}
	return &sqliteError{rc: rc, msg: fmt.Sprintf("%s %s: sqlite error %d: %s", what, b.path, rc, msg)}
}

func (b *bulkConn) exec(sql string) error {
	csql, err := libc.CString(sql)
	if err != nil {
		return err
	}
	defer libc.Xfree(b.tls, csql)
	if rc := sqlite3.Xsqlite3_exec(b.tls, b.db, csql, 0, 0, 0); rc != sqlite3.SQLITE_OK {
		return b.errorf("exec", rc)
	}
	return nil
}

func (b *bulkConn) prepare(sql string) (uintptr, error) {
	csql, err := libc.CString(sql)
	if err != nil {
		return 0, err
	}
	defer libc.Xfree(b.tls, csql)
	pst := libc.Xmalloc(b.tls, 8)
	if pst == 0 {
		return 0, fmt.Errorf("prepare on %s: out of memory", b.path)
	}
	defer libc.Xfree(b.tls, pst)
	if rc := sqlite3.Xsqlite3_prepare_v2(b.tls, b.db, csql, -1, pst, 0); rc != sqlite3.SQLITE_OK {
		return 0, b.errorf("prepare", rc)
	}
	return *(*uintptr)(cmem(pst)), nil
}

// reserve makes the arena at least n bytes (and never empty, so an empty
// blob binds as a non-NULL pointer).
func (b *bulkConn) reserve(n int) error {
	n = max(n, 1)
	if n <= b.size {
		return nil
	}
	n = max(n, 2*b.size, 1<<20)
	if b.arena != 0 {
		libc.Xfree(b.tls, b.arena)
	}
	b.arena, b.size = libc.Xmalloc(b.tls, uint64(n)), 0
	if b.arena == 0 {
		return fmt.Errorf("write to %s: cannot allocate %d bytes", b.path, n)
	}
	b.size = n
	return nil
}

// write inserts rows into table in the given order in one transaction and,
// when meta is not nil, records the file's metadata (its last epoch moved)
// in the same transaction.
func (b *bulkConn) write(table string, rows []rowbatch.Row, order []int32, groups int, meta map[string]string) (err error) {
	full, err := b.cached(insertSQL(table, rowsPerInsert))
	if err != nil {
		return err
	}
	if err := b.exec("BEGIN IMMEDIATE"); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			b.exec("ROLLBACK")
		}
	}()
	for start := 0; start < len(order); start += rowsPerInsert {
		chunk := order[start:min(start+rowsPerInsert, len(order))]
		st := full
		if len(chunk) < rowsPerInsert {
			if st, err = b.prepare(insertSQL(table, len(chunk))); err != nil {
				return err
			}
		}
		err = b.bindAndStep(st, rows, chunk, groups)
		if st != full {
			sqlite3.Xsqlite3_finalize(b.tls, st)
		}
		if err != nil {
			return err
		}
	}
	for k, v := range meta {
		// The values are numbers and the names constants; nothing to quote.
		if _, err := strconv.ParseInt(v, 10, 64); err != nil {
			return fmt.Errorf("write metadata %s=%q to %s: not a number", k, v, b.path)
		}
		if err := b.exec(`UPDATE meta SET value = '` + v + `' WHERE name = '` + k + `'`); err != nil {
			return err
		}
	}
	return b.exec("COMMIT")
}

// bindAndStep binds the rows of chunk to st's parameters (six per row, the
// last the row's checksum) and executes it.
func (b *bulkConn) bindAndStep(st uintptr, rows []rowbatch.Row, chunk []int32, groups int) error {
	need := 0
	for _, i := range chunk {
		r := &rows[i]
		need += len(r.StepID) + len(r.Key) + len(r.Value)
	}
	arena, err := b.arenaFor(st, need)
	if err != nil {
		return err
	}
	for j, i := range chunk {
		r := &rows[i]
		p := int32(j*rowParams + 1)
		group := int64(keygroup.Of(r.Key, groups))
		sum := rowCRC(&b.crc, strBytes(r.StepID), strBytes(r.Key), r.Epoch, group, r.Deleted, r.Value)
		rc := arena.text(p, r.StepID) | arena.text(p+1, r.Key) |
			sqlite3.Xsqlite3_bind_int64(b.tls, st, p+2, r.Epoch) |
			sqlite3.Xsqlite3_bind_int64(b.tls, st, p+3, group) |
			sqlite3.Xsqlite3_bind_int64(b.tls, st, p+5, int64(sum))
		if r.Deleted {
			rc |= sqlite3.Xsqlite3_bind_null(b.tls, st, p+4)
		} else {
			rc |= arena.blob(p+4, r.Value)
		}
		if rc != sqlite3.SQLITE_OK {
			return b.errorf("bind row", rc)
		}
	}
	rc := sqlite3.Xsqlite3_step(b.tls, st)
	sqlite3.Xsqlite3_reset(b.tls, st)
	if rc != sqlite3.SQLITE_DONE {
		return b.errorf(fmt.Sprintf("insert %d rows into", len(chunk)), rc)
	}
	return nil
}

// scanStep appends to p the rows of step with key after (or at, when
// inclusive) and epoch < before, optionally within a key-group range, in
// key and epoch order, keeping only the newest version of each key; it
// reads at most limit rows and returns how many it read. Every row read is
// checked against its checksum (f.checkRow) and must come after the one
// before it in (key, epoch, table) order: a b-tree whose child pointer was
// damaged into another page returns rows twice or out of order.
func (b *bulkConn) scanStep(p *page, f *File, step, after string, inclusive bool, before int64, groups *keygroup.Range, limit int) (int, error) {
	crcCol := "crc"
	if f.legacy {
		crcCol = "0"
	}
	arm := func(table, src string) string {
		// No upper bound on the step: a row whose step id was damaged
		// into another type (a flipped bit in a record header turns text
		// into a blob, which sorts after all text) would end a bounded
		// range early and hide every row after it. Unbounded, the scan
		// reads that row, and stops at the first row of another step.
		q := `SELECT state_key, epoch, value IS NULL, value, ` + src + `, key_group, ` + crcCol + `, step_id FROM ` + table + ` WHERE (step_id, state_key) `
		if inclusive {
			q += `>= (?1, ?2)`
		} else {
			q += `> (?1, ?2)`
		}
		q += ` AND epoch < ?3`
		if groups != nil {
			q += ` AND key_group >= ?5 AND key_group < ?6`
		}
		return q
	}
	q := arm("snaps", "0")
	if f.hasRecent {
		// SQLite merges the two ordered arms; for one (key, epoch) in both
		// tables the recent row comes last and wins, being the newer write.
		q += ` UNION ALL ` + arm("recent", "1")
	}
	q += ` ORDER BY 8, 1, 2, 5 LIMIT ?4`
	st, err := b.cached(q)
	if err != nil {
		return 0, err
	}
	defer sqlite3.Xsqlite3_reset(b.tls, st)
	rc, err := b.bindStepKey(st, step, after)
	if err != nil {
		return 0, err
	}
	rc |= sqlite3.Xsqlite3_bind_int64(b.tls, st, 3, before) |
		sqlite3.Xsqlite3_bind_int64(b.tls, st, 4, int64(limit))
	if groups != nil {
		rc |= sqlite3.Xsqlite3_bind_int64(b.tls, st, 5, int64(groups.Lo)) |
			sqlite3.Xsqlite3_bind_int64(b.tls, st, 6, int64(groups.Hi))
	}
	if rc != sqlite3.SQLITE_OK {
		return 0, b.errorf("bind scan of", rc)
	}
	stepBytes := []byte(step)
	// The previous row read is always p's last entry: rows come in order,
	// and each replaces its key's older version.
	var prevKey []byte
	prevEpoch, prevSrc, havePrev := int64(0), int64(0), false
	read := 0
	for {
		switch rc := sqlite3.Xsqlite3_step(b.tls, st); rc {
		case sqlite3.SQLITE_ROW:
		case sqlite3.SQLITE_DONE:
			return read, nil
		default:
			return read, b.errorf("scan", rc)
		}
		if err := b.checkTypes(st, scanTypes); err != nil {
			return read, err
		}
		if string(b.columnBytes(st, 7, false)) != step {
			return read, nil // the next step's rows: this one is done
		}
		read++
		key := b.columnBytes(st, 0, false)
		epoch := sqlite3.Xsqlite3_column_int64(b.tls, st, 1)
		deleted := sqlite3.Xsqlite3_column_int64(b.tls, st, 2) != 0
		src := sqlite3.Xsqlite3_column_int64(b.tls, st, 4)
		var val []byte
		if !deleted {
			val = b.columnBytes(st, 3, true)
		}
		if err := f.checkRow(&b.crc, stepBytes, key, epoch, sqlite3.Xsqlite3_column_int64(b.tls, st, 5), deleted, val,
			sqlite3.Xsqlite3_column_int64(b.tls, st, 6)); err != nil {
			return read, err
		}
		sameKey := havePrev && string(prevKey) == string(key)
		if havePrev {
			c := bytes.Compare(key, prevKey)
			if c < 0 || (c == 0 && (epoch < prevEpoch || (epoch == prevEpoch && src <= prevSrc))) {
				return read, damagedf(b.path, "step %q key %q epoch %d read after key %q epoch %d (rows out of order)", step, key, epoch, prevKey, prevEpoch)
			}
		}
		// Versions of one key are adjacent, oldest first: each replaces
		// the previous, so only the newest stays.
		if sameKey {
			p.dropLast()
		}
		p.add(key, epoch, val, deleted)
		prevKey = p.key(len(p.starts) - 1)
		prevEpoch, prevSrc, havePrev = epoch, src, true
	}
}

// Column types a row must come back with: a flipped bit in a record's
// header can change a column's type while its bytes, and so its checksum,
// stay the same; SQLite then sorts and compares it as another value.
const (
	typeText    = sqlite3.SQLITE_TEXT
	typeInt     = sqlite3.SQLITE_INTEGER
	typeBlob    = sqlite3.SQLITE_BLOB
	typeNull    = sqlite3.SQLITE_NULL
	typeBlobNil = -1 // a blob, or NULL for a deletion
)

// scanTypes are the types of scanStep's columns (-2: not checked).
var scanTypes = []int32{typeText, typeInt, -2, typeBlobNil, -2, typeInt, typeInt, typeText}

// checkTypes checks the current row's column types against want.
func (b *bulkConn) checkTypes(st uintptr, want []int32) error {
	for i, w := range want {
		got := sqlite3.Xsqlite3_column_type(b.tls, st, int32(i))
		switch {
		case w == -2, got == w, w == typeBlobNil && (got == typeBlob || got == typeNull):
		default:
			return damagedf(b.path, "column %d of a row has type %d, not %d (damaged record header)", i, got, w)
		}
	}
	return nil
}

// foldChunkRows is how many of the recent table's rows one statement of a
// fold moves. Inside a transaction SQLite keeps a statement journal of
// every page a statement changes, so that the statement alone can be
// undone, and it keeps that journal in memory (temp_store=MEMORY): one
// statement moving a large recent table into a large snaps held a copy of
// every page of snaps it touched, about 400 MB at the peak of a run with a
// live-key limit (bench/live_limit.py, uniform keys). A statement per
// chunk holds the pages of one chunk at most, and the fold is faster for
// it (BenchmarkFoldRecent: 3.5 against 4.2 us a row).
const foldChunkRows = 256

// fold moves the recent table's rows into snaps in one transaction (in
// key order, so snaps is walked once), chunk rows a statement, and returns
// how many moved.
func (b *bulkConn) fold(chunk int) (moved int64, err error) {
	if err := b.exec("BEGIN IMMEDIATE"); err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			b.exec("ROLLBACK")
		}
	}()
	bounds, err := b.foldBounds(chunk)
	if err != nil {
		return 0, err
	}
	// Chunk i is the rows after bounds[i-1] up to bounds[i]; the last one
	// has no upper bound.
	var lo *gcKey
	for i := 0; i <= len(bounds); i++ {
		var hi *gcKey
		if i < len(bounds) {
			hi = &bounds[i]
		}
		n, err := b.foldChunk(lo, hi)
		if err != nil {
			return 0, err
		}
		moved += n
		lo = hi
	}
	if err := b.exec(`DELETE FROM recent`); err != nil {
		return 0, err
	}
	return moved, b.exec("COMMIT")
}

// foldBounds returns the primary key of every chunk-th row of the recent
// table, in key order, leaving out the last row's.
func (b *bulkConn) foldBounds(chunk int) ([]gcKey, error) {
	st, err := b.cached(`SELECT step_id, state_key, epoch FROM recent ORDER BY step_id, state_key, epoch`)
	if err != nil {
		return nil, err
	}
	defer sqlite3.Xsqlite3_reset(b.tls, st)
	var bounds []gcKey
	for n := 1; ; n++ {
		switch rc := sqlite3.Xsqlite3_step(b.tls, st); rc {
		case sqlite3.SQLITE_ROW:
		case sqlite3.SQLITE_DONE:
			if len(bounds) > 0 && (n-1)%chunk == 0 {
				bounds = bounds[:len(bounds)-1] // the last row: no chunk follows it
			}
			return bounds, nil
		default:
			return nil, b.errorf("list rows to fold", rc)
		}
		if n%chunk == 0 {
			bounds = append(bounds, gcKey{
				step:  string(b.columnBytes(st, 0, false)),
				key:   string(b.columnBytes(st, 1, false)),
				epoch: sqlite3.Xsqlite3_column_int64(b.tls, st, 2),
			})
		}
	}
}

// foldChunk moves the rows of the recent table after lo up to hi (either
// nil: no bound) into snaps and returns how many moved. Rows move with
// their checksums: a row damaged in recent stays detectably damaged in
// snaps.
func (b *bulkConn) foldChunk(lo, hi *gcKey) (int64, error) {
	// Row-value bounds make SQLite seek the primary key to the chunk's
	// start rather than scan from the table's.
	var where []string
	if lo != nil {
		where = append(where, `(step_id, state_key, epoch) > (?1, ?2, ?3)`)
	}
	if hi != nil {
		where = append(where, `(step_id, state_key, epoch) <= (?4, ?5, ?6)`)
	}
	q := `INSERT OR REPLACE INTO snaps (step_id, state_key, epoch, key_group, value, crc)
		SELECT step_id, state_key, epoch, key_group, value, crc FROM recent`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	st, err := b.cached(q + ` ORDER BY step_id, state_key, epoch`)
	if err != nil {
		return 0, err
	}
	defer sqlite3.Xsqlite3_reset(b.tls, st)
	if err := b.bindBounds(st, lo, hi); err != nil {
		return 0, err
	}
	if rc := sqlite3.Xsqlite3_step(b.tls, st); rc != sqlite3.SQLITE_DONE {
		return 0, b.errorf("fold recent rows into snaps of", rc)
	}
	return sqlite3.Xsqlite3_changes64(b.tls, b.db), nil
}

// bindBounds copies the bounds' step and key into the arena and binds lo
// to st's parameters 1-3 and hi to 4-6 (either nil: not bound).
func (b *bulkConn) bindBounds(st uintptr, lo, hi *gcKey) error {
	size := 0
	for _, k := range []*gcKey{lo, hi} {
		if k != nil {
			size += len(k.step) + len(k.key)
		}
	}
	arena, err := b.arenaFor(st, size)
	if err != nil {
		return err
	}
	var rc int32
	for i, k := range []*gcKey{lo, hi} {
		if k == nil {
			continue
		}
		first := int32(3*i + 1)
		rc |= arena.text(first, k.step) | arena.text(first+1, k.key) | sqlite3.Xsqlite3_bind_int64(b.tls, st, first+2, k.epoch)
	}
	if rc != sqlite3.SQLITE_OK {
		return b.errorf("bind fold bounds of", rc)
	}
	return nil
}

// gc removes, in one transaction, every row superseded by a newer row
// at or before committed among the keys written in (since, committed],
// and the deletion records written then (each is its key's newest row or
// superseded). Keys come from the epoch index, chunk at a time; each
// key's older versions go in one range delete, in key order within a
// chunk, so the B-tree is walked once per chunk. A cancelled ctx rolls the
// round back (checked every gcCheckEvery keys), so the end of a run does
// not wait for it.
func (b *bulkConn) gc(ctx context.Context, since, committed int64, chunk int) (removed int64, err error) {
	if err := b.exec("BEGIN IMMEDIATE"); err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			b.exec("ROLLBACK")
		}
	}()
	// A key's newest row goes too when it is a deletion (nothing older is
	// left for it to hide): in the same seek, where a second statement over
	// the epoch range cost one more lookup per row written.
	// The keys come from the epoch index, which no checksum covers and
	// quick_check does not compare with the table: a damaged entry could
	// name another key at an epoch past its newest row, and collecting
	// "older" versions of it would delete that key's state. So a key's
	// versions go only when the row the index names is in the table.
	del, err := b.cached(`DELETE FROM snaps WHERE step_id = ?1 AND state_key = ?2 AND (epoch < ?3 OR (epoch = ?3 AND value IS NULL))
		AND EXISTS (SELECT 1 FROM snaps WHERE step_id = ?1 AND state_key = ?2 AND epoch = ?3)`)
	if err != nil {
		return 0, err
	}
	// A key written in several epochs of the range may be collected once
	// per epoch, in epoch order: each time, what goes is superseded at or
	// before committed, and the last time leaves what one pass for its
	// newest row would. The deletes never reach index entries past the
	// chunk's last: they remove rows of older epochs, or the listed row.
	after := gcKey{epoch: since + 1}
	keys := make([]gcKey, 0, chunk)
	for done, first := 0, true; ; first = false {
		if keys, err = b.writtenKeys(keys[:0], after, first, committed, chunk); err != nil {
			return removed, err
		}
		if len(keys) == 0 {
			return removed, b.exec("COMMIT")
		}
		after = keys[len(keys)-1]
		slices.SortFunc(keys, gcKey.compare)
		for i := 0; i < len(keys); done++ {
			if done%gcCheckEvery == 0 {
				if err := ctx.Err(); err != nil {
					return 0, err
				}
			}
			// A key's rows are adjacent, oldest first: the last is the
			// newest of the chunk, and every older version goes.
			j := i + 1
			for j < len(keys) && keys[j].step == keys[i].step && keys[j].key == keys[i].key {
				j++
			}
			newest := &keys[j-1]
			n, err := b.stepKeyed(del, newest.step, newest.key, newest.epoch)
			if err != nil {
				return removed, err
			}
			removed += n
			i = j
		}
	}
}

// gcCheckEvery is how many keys GC collects between checks of its context.
const gcCheckEvery = 1024

// gcChunk is how many keys GC lists at a time. An epoch can have written
// every key of a large state (a live-key limit writes each evicted key):
// listing them all at once held 100 MB for 500k keys.
const gcChunk = 16384

// gcKey is a row GC lists: the primary key without the value.
type gcKey struct {
	step, key string
	epoch     int64
}

// compare orders keys as the table does: by step, key and epoch.
func (k gcKey) compare(o gcKey) int {
	if c := strings.Compare(k.step, o.step); c != 0 {
		return c
	}
	if c := strings.Compare(k.key, o.key); c != 0 {
		return c
	}
	return cmp.Compare(k.epoch, o.epoch)
}

// writtenKeys appends to keys up to chunk (step, key, epoch) of the rows
// written at or before committed that come after `after` in the epoch
// index's order (epoch, step, key); with first set, from `after` on (the
// first chunk: epoch since+1 with an empty step and key, which sorts before
// every row of the epoch). Each step's name is allocated once.
func (b *bulkConn) writtenKeys(keys []gcKey, after gcKey, first bool, committed int64, chunk int) ([]gcKey, error) {
	// Only a row-value bound makes SQLite seek the index to the chunk's
	// start; with a plain lower bound on epoch too, it scans from there.
	op := ">"
	if first {
		op = ">="
	}
	st, err := b.cached(`SELECT step_id, state_key, epoch FROM snaps
		WHERE epoch <= ?4 AND (epoch, step_id, state_key) ` + op + ` (?3, ?1, ?2)
		ORDER BY epoch, step_id, state_key LIMIT ?5`)
	if err != nil {
		return nil, err
	}
	defer sqlite3.Xsqlite3_reset(b.tls, st)
	rc, err := b.bindStepKey(st, after.step, after.key)
	if err != nil {
		return nil, err
	}
	rc |= sqlite3.Xsqlite3_bind_int64(b.tls, st, 3, after.epoch)
	rc |= sqlite3.Xsqlite3_bind_int64(b.tls, st, 4, committed)
	rc |= sqlite3.Xsqlite3_bind_int64(b.tls, st, 5, int64(chunk))
	if rc != sqlite3.SQLITE_OK {
		return nil, b.errorf("bind gc scan of", rc)
	}
	var step string
	for {
		switch rc := sqlite3.Xsqlite3_step(b.tls, st); rc {
		case sqlite3.SQLITE_ROW:
		case sqlite3.SQLITE_DONE:
			return keys, nil
		default:
			return nil, b.errorf("gc scan", rc)
		}
		if bs := b.columnBytes(st, 0, false); string(bs) != step {
			step = string(bs)
		}
		keys = append(keys, gcKey{
			step:  step,
			key:   string(b.columnBytes(st, 1, false)),
			epoch: sqlite3.Xsqlite3_column_int64(b.tls, st, 2),
		})
	}
}

// stepKeyed binds (step, key, epoch) to st's three parameters, runs it
// and returns how many rows it changed.
func (b *bulkConn) stepKeyed(st uintptr, step, key string, epoch int64) (int64, error) {
	rc, err := b.bindStepKey(st, step, key)
	if err != nil {
		return 0, err
	}
	rc |= sqlite3.Xsqlite3_bind_int64(b.tls, st, 3, epoch)
	if rc != sqlite3.SQLITE_OK {
		return 0, b.errorf("bind", rc)
	}
	rc = sqlite3.Xsqlite3_step(b.tls, st)
	sqlite3.Xsqlite3_reset(b.tls, st)
	if rc != sqlite3.SQLITE_DONE {
		return 0, b.errorf("delete superseded rows of "+step+"/"+key+" in", rc)
	}
	return sqlite3.Xsqlite3_changes64(b.tls, b.db), nil
}

// bindStepKey copies step and key into the arena and binds them to st's
// parameters 1 and 2; it returns SQLite's result codes or-ed together.
func (b *bulkConn) bindStepKey(st uintptr, step, key string) (int32, error) {
	arena, err := b.arenaFor(st, len(step)+len(key))
	if err != nil {
		return 0, err
	}
	return arena.text(1, step) | arena.text(2, key), nil
}

// arenaBinder copies values one after another into a bulk connection's
// arena and binds each to a statement's parameter where it lies
// (SQLITE_STATIC: SQLite reads the arena in place, so nothing may reserve
// it again until the statement has stepped).
type arenaBinder struct {
	b   *bulkConn
	st  uintptr
	mem []byte
	off int
}

// arenaFor reserves n bytes of the arena for values bound to st.
func (b *bulkConn) arenaFor(st uintptr, n int) (arenaBinder, error) {
	if err := b.reserve(n); err != nil {
		return arenaBinder{}, err
	}
	return arenaBinder{b: b, st: st, mem: unsafe.Slice((*byte)(cmem(b.arena)), b.size)}, nil
}

// text binds s to parameter param; it returns SQLite's result code.
func (a *arenaBinder) text(param int32, s string) int32 {
	n := copy(a.mem[a.off:], s)
	rc := sqlite3.Xsqlite3_bind_text(a.b.tls, a.st, param, a.b.arena+uintptr(a.off), int32(n), sqlite3.SQLITE_STATIC)
	a.off += n
	return rc
}

// blob binds v to parameter param as a blob (never NULL: an empty v binds
// the arena's non-NULL pointer); it returns SQLite's result code.
func (a *arenaBinder) blob(param int32, v []byte) int32 {
	n := copy(a.mem[a.off:], v)
	rc := sqlite3.Xsqlite3_bind_blob(a.b.tls, a.st, param, a.b.arena+uintptr(a.off), int32(n), sqlite3.SQLITE_STATIC)
	a.off += n
	return rc
}

// cached returns the prepared statement for q, preparing it once.
func (b *bulkConn) cached(q string) (uintptr, error) {
	if st, ok := b.scans[q]; ok {
		return st, nil
	}
	st, err := b.prepare(q)
	if err != nil {
		return 0, err
	}
	if b.scans == nil {
		b.scans = map[string]uintptr{}
	}
	b.scans[q] = st
	return st, nil
}

// columnBytes views column i of the current row in SQLite's memory; the
// view is valid until the statement steps again.
func (b *bulkConn) columnBytes(st uintptr, i int32, blob bool) []byte {
	var ptr uintptr
	if blob {
		ptr = sqlite3.Xsqlite3_column_blob(b.tls, st, i)
	} else {
		ptr = sqlite3.Xsqlite3_column_text(b.tls, st, i)
	}
	n := sqlite3.Xsqlite3_column_bytes(b.tls, st, i)
	if ptr == 0 || n == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(cmem(ptr)), int(n))
}

// close releases the statements, the arena and the connection.
func (b *bulkConn) close() error {
	for q, st := range b.scans {
		sqlite3.Xsqlite3_finalize(b.tls, st)
		delete(b.scans, q)
	}
	if b.arena != 0 {
		libc.Xfree(b.tls, b.arena)
		b.arena, b.size = 0, 0
	}
	var err error
	if b.db != 0 {
		if rc := sqlite3.Xsqlite3_close_v2(b.tls, b.db); rc != sqlite3.SQLITE_OK {
			err = b.errorf("close", rc)
		}
		b.db = 0
	}
	b.tls.Close()
	return err
}

// cmem turns an address of memory that libc allocated (outside the Go
// heap, so the collector neither moves nor frees it) into a pointer.
// Reinterpreting the variable's bits, rather than converting the uintptr,
// is the form vet accepts for an address that did not come from Go.
func cmem(p uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}
