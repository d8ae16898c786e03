// Package snapfile is the snapshot file: a SQLite file holding rows
// (step_id, state_key, epoch, value-or-deletion) plus metadata that names the
// flow and layout it belongs to.
//
// The same format and code serve a worker's retained local store and the
// immutable segments shipped to the durable store; only Meta.Kind and the
// durability settings differ.
package snapfile

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/millpond/millpond/gostore/keygroup"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// ErrNotSnapshotFile is wrapped when a file is not a readable snapshot file
// (not SQLite, or missing the schema). A file whose bytes were damaged is
// reported with ErrDamaged instead, when that can be told.
var ErrNotSnapshotFile = errors.New("not a millpond snapshot file")

// The tables of every snapshot file. Build writes these statements into
// the schema of the files it makes, as SQLite keeps them.
const (
	metaTableSQL  = `CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID`
	snapsTableSQL = `CREATE TABLE snaps (
	step_id   TEXT    NOT NULL,
	state_key TEXT    NOT NULL,
	epoch     INTEGER NOT NULL,
	key_group INTEGER NOT NULL,
	value     BLOB,   -- NULL records a deletion
	crc       INTEGER NOT NULL, -- rowCRC of the other columns
	PRIMARY KEY (step_id, state_key, epoch)
) WITHOUT ROWID`
	schema = metaTableSQL + ";\n" + snapsTableSQL + ";\n"
)

// recentTable is a local store's write buffer: the same rows as snaps,
// written there when a batch is small next to the store. A small batch
// scattered over a large snaps B-tree dirties about one page per row; in
// a table of its own it fills a few pages in order, so an epoch that
// changed 1% of the keys costs what changed rather than that many pages.
// The buffer is folded into snaps in the background. A row in recent is
// always a newer write than a row with the same primary key in snaps, and
// readers merge the two tables.
const recentTable = `
CREATE TABLE IF NOT EXISTS recent (
	step_id   TEXT    NOT NULL,
	state_key TEXT    NOT NULL,
	epoch     INTEGER NOT NULL,
	key_group INTEGER NOT NULL,
	value     BLOB,
	crc       INTEGER NOT NULL,
	PRIMARY KEY (step_id, state_key, epoch)
) WITHOUT ROWID;
`

// epochIndex serves rollback and garbage collection of a local store:
// epochs only grow, so it is appended to, and it makes both cost what
// changed rather than the whole state. Segments are written once and
// never rolled back or collected, so they go without it. A local store's
// first write, into an empty table, goes in without it (maintaining it
// cost a quarter of that write) and the index is built afterwards, in the
// background: see EnsureIndex.
const epochIndex = `CREATE INDEX IF NOT EXISTS snaps_by_epoch ON snaps (epoch);`

// Options tune how a file is opened.
type Options struct {
	// Segment files are written once and sealed; they skip the WAL and
	// fsync only when sealed. Local stores use WAL so that a killed process
	// keeps every committed batch.
	Segment bool
	// CacheMiB is SQLite's page cache size per connection; 0 picks the
	// default for the file's kind (storeCacheMiB, segmentCacheMiB).
	CacheMiB int
	// ReadOnly opens an existing file without writing to it (Verify on a
	// connection of its own beside the writer). Writes fail.
	ReadOnly bool
	// LargePages creates a segment with large pages (LargePageSize): for
	// one known to hold many rows, which it then writes and reads faster
	// (a 100k-row segment wrote 20-30% faster than with small pages).
	LargePages bool
	// LogChecked skips the check of the write-ahead log (checkWAL): for a
	// second connection to a file this process holds open already, whose
	// first open checked the log. The key filter's fill opens the store
	// once a page, and would otherwise read the whole log each time.
	LogChecked bool
	// BuildPageLimit makes a Builder refuse, with ErrTooLarge, a file of
	// this many pages or more; 0 (what callers other than tests give) is
	// SQLite's own bound, the lock-byte page at 1 GiB. Tests set it to
	// take the paths that serve files past that bound.
	BuildPageLimit int
}

// LargePageSize is the page size of segments created with LargePages; it
// pays off from about LargePageRows rows. It is LocalPageSize: the segment
// of a whole-state epoch may become a local store (a copy of it does,
// see localstore's generations), which then keeps its pages.
const (
	LargePageSize = LocalPageSize
	LargePageRows = 8192
)

// LocalPageSize is the page size of files that are not segments (local
// stores). A row whose record passes about a quarter of a page (the
// table's rows are keys of an index b-tree: WITHOUT ROWID) spills to an
// overflow page of its own. With 4 KiB pages that was every state of
// about 1 KB and up: a 1-KB state took a 4 KiB page and half, and wrote
// at half the speed. 16 KiB pages keep states up to about 4 KB in the
// b-tree. A file keeps the page size it was created with.
const LocalPageSize = 16384

// File is an open snapshot file. Its methods are safe for use by one
// goroutine at a time; callers serialize access.
type File struct {
	db   *sql.DB
	bulk *bulkConn // opened by the first write or scan
	path string
	meta Meta
	opts Options
	// hasRecent tells that the file has the recent table (local stores);
	// recentRows counts its rows.
	hasRecent  bool
	recentRows int64
	// hasIndex tells that snaps has its epoch index (local stores only).
	hasIndex bool
	// legacy tells that the file is of LegacyFormatVersion: rows without
	// checksums, read but never written.
	legacy bool
	// gcChunk is how many keys GC lists at a time (0: the package's
	// gcChunk); tests make it small to cross chunk boundaries.
	gcChunk int
	// foldChunk is how many rows a statement of FoldRecent moves (0: the
	// package's foldChunkRows); tests make it small to cross chunk
	// boundaries.
	foldChunk int
	// indexFaults, when set, fails EnsureIndex's build with the error it
	// returns for a temp_store setting (tests: no temporary directory).
	indexFaults func(store string) error
	// metaDirty tells that meta holds a change (NoteCommitted) not yet
	// written: the next Write carries it, or FlushMeta or Close.
	metaDirty bool
	// reader is the connection of GetManyPackedConcurrent, opened on its
	// first call; readMu serializes those calls.
	readMu sync.Mutex
	reader *bulkConn
	// pageSize is SQLite's page size of a local store's file (fitsBuffer).
	pageSize int
}

// Default page cache sizes, per connection. A file has two connections
// (database/sql and the bulk one), a local store a reader too, and a run
// has a local store and a segment per worker at any time, so these are
// paid several times over; and SQLite's page cache, allocated through
// modernc's allocator, takes up to twice its nominal size in memory. With
// 64 MiB for every connection, a worker holding 5M keys under a 100k
// live-key limit peaked at 911 MB, 586 MB of it SQLite's; with these
// sizes, at about 500 MB (bench/live_limit.py, docs/benchmarks.md), and
// neither the flow's throughput nor a snapshot's write slowed.
const (
	// storeCacheMiB serves a local store, whose writes land all over a
	// B-tree that may be far larger than any cache: the cache holds its
	// upper levels and the leaves of a batch, and the OS page cache
	// serves the rest. Its reader (GetManyPackedConcurrent) and a check
	// (Verify) get as much: point reads need the upper levels.
	storeCacheMiB = 16
	// segmentCacheMiB serves a segment or compacted object: written once,
	// each batch in key order (a compacted object appended to page by
	// page), and read by scans in key order.
	segmentCacheMiB = 4
)

// cacheMiB is the page cache size each connection to the file gets.
func cacheMiB(o Options) int {
	switch {
	case o.CacheMiB != 0:
		return o.CacheMiB
	case o.Segment:
		return segmentCacheMiB
	default:
		return storeCacheMiB
	}
}

// uriPath is path as the name part of an SQLite URI ("file:" + name): the
// characters a URI gives a meaning to ('?' starts its query, '#' its
// fragment, '%' an escape) are escaped, so that a directory named "a#b"
// opens the same file on a URI connection as on one opened by name.
func uriPath(path string) string {
	return uriEscaper.Replace(path)
}

var uriEscaper = strings.NewReplacer("%", "%25", "?", "%3F", "#", "%23")

func dsn(path string, o Options) string {
	path = uriPath(path)
	if o.ReadOnly {
		// Nothing that would write: journal mode and vacuum settings
		// are the file's already.
		return fmt.Sprintf("file:%s?mode=ro&_pragma=busy_timeout(5000)&_pragma=cache_size(-%d)&_pragma=temp_store(MEMORY)",
			path, cacheMiB(o)*1024)
	}
	q := []string{
		"_pragma=busy_timeout(5000)",
		fmt.Sprintf("_pragma=cache_size(-%d)", cacheMiB(o)*1024),
		"_pragma=temp_store(MEMORY)",
	}
	if o.Segment {
		// Small pages keep a segment of a quiet epoch small: SQLite needs
		// a few pages even for one row.
		size := 1024
		if o.LargePages {
			size = LargePageSize
		}
		q = append([]string{fmt.Sprintf("_pragma=page_size(%d)", size)}, q...)
		q = append(q, "_pragma=journal_mode(MEMORY)", "_pragma=synchronous(OFF)")
	} else {
		// Incremental auto-vacuum (it takes effect when the file is
		// created) lets Reclaim hand pages freed by GC back to the disk.
		q = append([]string{"_pragma=auto_vacuum(INCREMENTAL)"}, q...)
		q = append(q, "_pragma=journal_mode(WAL)", "_pragma=synchronous(NORMAL)", "_pragma=wal_autocheckpoint(0)")
	}
	return "file:" + path + "?" + strings.Join(q, "&")
}

func openDB(path string, o Options) (*sql.DB, error) {
	db, err := sql.Open("sqlite", dsn(path, o))
	if err != nil {
		return nil, err
	}
	// One connection: SQLite serializes writers anyway, and a single
	// connection keeps the page cache warm and transactions simple.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	return db, nil
}

// Create makes a new snapshot file at path with meta. It fails if the file
// exists. The file is readable by its owner only (0600, narrowed by the
// umask), and so are its journals: SQLite gives them the file's mode.
func Create(ctx context.Context, path string, meta Meta, o Options) (*File, error) {
	if err := keygroup.Validate(meta.KeyGroupCount, meta.WorkerIndex, meta.WorkerCount); err != nil {
		return nil, fmt.Errorf("create snapshot file %s: %w", path, err)
	}
	if o.ReadOnly {
		return nil, fmt.Errorf("create snapshot file %s: cannot create read-only", path)
	}
	// Created here rather than by SQLite, which would use 0644: state is
	// nobody else's business. An empty file is an empty database to it.
	fh, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create snapshot file %s: already exists", path)
	}
	if err != nil {
		return nil, fmt.Errorf("create snapshot file %s: %w", path, err)
	}
	if err := fh.Close(); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("create snapshot file %s: %w", path, err)
	}
	if !o.Segment {
		if err := setPageSize(ctx, path, LocalPageSize); err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("create snapshot file %s: %w", path, err)
		}
	}
	db, err := openDB(path, o)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("create snapshot file %s: %w", path, err)
	}
	f := &File{db: db, path: path, meta: meta, opts: o}
	if !o.Segment {
		f.pageSize = LocalPageSize // set above; segments never buffer
	}
	if err := f.init(ctx); err != nil {
		db.Close()
		os.Remove(path)
		return nil, fmt.Errorf("create snapshot file %s: %w", path, err)
	}
	return f, nil
}

// setPageSize gives the empty database at path pages of size bytes, with
// incremental auto-vacuum. The driver applies a DSN's pragmas in an order
// of its own, and journal_mode(WAL) writes the header, which fixes the
// page size, before page_size is applied; so both are set first, on a
// connection of their own, and VACUUM writes them into the header.
func setPageSize(ctx context.Context, path string, size int) error {
	db, err := sql.Open("sqlite", "file:"+uriPath(path))
	if err != nil {
		return err
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	for _, q := range []string{fmt.Sprintf("PRAGMA page_size = %d", size), "PRAGMA auto_vacuum = INCREMENTAL", "VACUUM"} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("set page size %d: %s: %w", size, q, err)
		}
	}
	return nil
}

func (f *File) init(ctx context.Context) error {
	if f.opts.Segment && f.opts.LargePages {
		// A large segment may become a local store generation (a copy of
		// it does): with incremental auto-vacuum, that store can hand the
		// pages its GC frees back to the disk. Set here, after the page
		// size: the driver applies DSN pragmas in its own order, and
		// auto_vacuum first fixes the default page size.
		if _, err := f.db.ExecContext(ctx, `PRAGMA auto_vacuum = INCREMENTAL`); err != nil {
			return err
		}
	}
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, schema); err != nil {
		return err
	}
	if f.buffered() {
		if _, err := tx.ExecContext(ctx, recentTable); err != nil {
			return err
		}
		f.hasRecent = true
	}
	for k, v := range f.meta.fieldsWithCRC() {
		if _, err := tx.ExecContext(ctx, `INSERT INTO meta (name, value) VALUES (?, ?)`, k, v); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Open opens an existing snapshot file and reads its metadata. A file that
// is not SQLite, lacks the schema or has unknown metadata is refused with an
// error wrapping ErrNotSnapshotFile; one that SQLite finds malformed, whose
// metadata does not match its checksum, or whose write-ahead log SQLite
// would cut short (checkWAL), with an error wrapping ErrDamaged.
func Open(ctx context.Context, path string, o Options) (*File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("open snapshot file %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("open snapshot file %s: %w: not a regular file", path, ErrNotSnapshotFile)
	}
	if err := checkHeader(path); err != nil {
		return nil, fmt.Errorf("open snapshot file %s: %w: %v", path, ErrNotSnapshotFile, err)
	}
	// Read-only opens may run beside a writer, whose log is still
	// growing: they check only against the log's index.
	if !o.LogChecked {
		if err := checkWAL(path, o.ReadOnly); err != nil {
			return nil, err
		}
	}
	db, err := openDB(path, o)
	if err != nil {
		return nil, fmt.Errorf("open snapshot file %s: %w", path, err)
	}
	f := &File{db: db, path: path, opts: o}
	refuse := func(err error) (*File, error) {
		db.Close()
		if err = classify(path, "open", err); errors.Is(err, ErrDamaged) {
			return nil, err
		}
		return nil, fmt.Errorf("open snapshot file %s: %w: %v", path, ErrNotSnapshotFile, err)
	}
	meta, legacy, err := f.readMeta(ctx)
	if err != nil {
		return refuse(err)
	}
	f.meta, f.legacy = meta, legacy
	if err := f.findRecent(ctx); err != nil {
		return refuse(err)
	}
	// A store keeps the page size it was made with (older ones 4 KiB).
	if err := f.db.QueryRowContext(ctx, `PRAGMA page_size`).Scan(&f.pageSize); err != nil {
		return refuse(err)
	}
	if err := f.checkColumns(ctx); err != nil {
		return refuse(err)
	}
	return f, nil
}

// checkColumns makes sure a file of FormatVersion has the crc column its
// metadata promises: a damaged schema must not pass for rows without
// checksums, nor fail later as a mere SQL error.
func (f *File) checkColumns(ctx context.Context) error {
	if f.legacy {
		return nil
	}
	tables := []string{"snaps"}
	if f.hasRecent {
		tables = append(tables, "recent")
	}
	for _, t := range tables {
		rows, err := f.db.QueryContext(ctx, `SELECT step_id, state_key, epoch, key_group, value, crc FROM `+t+` LIMIT 0`)
		if err != nil {
			if err = classify(f.path, "open", err); errors.Is(err, ErrDamaged) {
				return err
			}
			return damagedf(f.path, "table %s does not have the columns of format %s: %v", t, FormatVersion, err)
		}
		rows.Close()
	}
	return nil
}

// RowChecksums reports whether the file's rows carry checksums: false for
// a file of LegacyFormatVersion, which is read as it is and never written.
func (f *File) RowChecksums() bool { return !f.legacy }

// buffered tells whether small writes go through the recent table: local
// stores only; segments are written once, in one batch.
func (f *File) buffered() bool {
	return !f.opts.Segment && f.meta.Kind == KindLocal
}

// findRecent notes whether the file has a recent table and how many rows
// it holds. Local stores made before the table existed get it at their
// first buffered write, so opening never writes.
func (f *File) findRecent(ctx context.Context) error {
	var idx int
	if err := f.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'snaps_by_epoch'`).Scan(&idx); err != nil {
		return err
	}
	f.hasIndex = idx > 0
	var n int
	if err := f.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'recent'`).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	f.hasRecent = true
	return f.db.QueryRowContext(ctx, `SELECT count(*) FROM recent`).Scan(&f.recentRows)
}

// checkHeader refuses files that are not SQLite before the driver sees
// them, so a stray file is reported as what it is.
func checkHeader(path string) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	hdr := make([]byte, 16)
	n, _ := fh.Read(hdr)
	if n < 16 || string(hdr) != "SQLite format 3\x00" {
		return errors.New("no SQLite header")
	}
	return nil
}

func (f *File) readMeta(ctx context.Context) (Meta, bool, error) {
	rows, err := f.db.QueryContext(ctx, `SELECT name, value FROM meta`)
	if err != nil {
		return Meta{}, false, err
	}
	defer rows.Close()
	fields := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return Meta{}, false, err
		}
		fields[k] = v
	}
	if err := rows.Err(); err != nil {
		return Meta{}, false, err
	}
	// Touch the rows table so a file with metadata but no data table fails
	// here rather than at first use.
	var n int
	if err := f.db.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT 1 FROM snaps LIMIT 1)`).Scan(&n); err != nil {
		return Meta{}, false, err
	}
	m, legacy, err := metaFromFields(fields)
	if errors.Is(err, errBadMetaCRC) {
		return Meta{}, false, damagedf(f.path, "metadata: %v", err)
	}
	return m, legacy, err
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Meta returns the file's metadata.
func (f *File) Meta() Meta { return f.meta }

// UpdateMeta rewrites the metadata (for example a new execution number or
// a segment's epoch range).
func (f *File) UpdateMeta(ctx context.Context, meta Meta) error {
	if err := f.writable(); err != nil {
		return fmt.Errorf("update metadata: %w", err)
	}
	fail := func(err error) error {
		return classify(f.path, "update metadata", fmt.Errorf("update metadata of %s: %w", f.path, err))
	}
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback()
	for k, v := range meta.fieldsWithCRC() {
		if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)`, k, v); err != nil {
			return fail(err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	f.meta = meta
	f.metaDirty = false
	return nil
}

// NoteCommitted raises the metadata's CommittedEpoch to epoch without
// writing anything: a transaction per committed epoch would sit on the
// caller's path. The next Write carries it in its own transaction;
// FlushMeta or Close write it when no Write comes.
func (f *File) NoteCommitted(epoch int64) {
	if epoch > f.meta.CommittedEpoch && f.writable() == nil {
		f.meta.CommittedEpoch = epoch
		f.metaDirty = true
	}
}

// FlushMeta writes a metadata change NoteCommitted left in memory, if any.
func (f *File) FlushMeta(ctx context.Context) error {
	if !f.metaDirty {
		return nil
	}
	return f.UpdateMeta(ctx, f.meta)
}

// writable refuses writes to a file that must not get any: one opened
// read-only, or one of LegacyFormatVersion (rows written there would lack
// the checksums every reader of the current format expects).
func (f *File) writable() error {
	switch {
	case f.opts.ReadOnly:
		return fmt.Errorf("%s is open read-only", f.path)
	case f.legacy:
		return fmt.Errorf("%s was written by an older version without row checksums (format %s) and is read-only", f.path, LegacyFormatVersion)
	}
	return nil
}

// Close closes the file. For a local store, the WAL is checkpointed so the
// file on disk is complete by itself.
func (f *File) Close() error {
	ferr := f.FlushMeta(context.Background())
	if err := f.closeReader(); err != nil {
		f.closeBulk()
		f.db.Close()
		return err
	}
	if err := f.closeBulk(); err != nil {
		f.db.Close()
		return err
	}
	if !f.opts.Segment && !f.opts.ReadOnly {
		// Best effort: a failed checkpoint leaves a valid WAL behind.
		f.db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	}
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("close snapshot file %s: %w", f.path, err)
	}
	return ferr
}

// Seal finishes a segment: it closes the file and fsyncs it, so the bytes
// handed to an upload are the bytes on disk.
func (f *File) Seal() error {
	if err := f.closeBulk(); err != nil {
		f.db.Close()
		return fmt.Errorf("seal segment %s: %w", f.path, err)
	}
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("seal segment %s: %w", f.path, err)
	}
	fh, err := os.OpenFile(f.path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("seal segment %s: %w", f.path, err)
	}
	defer fh.Close()
	if err := fh.Sync(); err != nil {
		return fmt.Errorf("seal segment %s: fsync: %w", f.path, err)
	}
	return nil
}

// rawConn returns the bulk connection, opening it on first use.
func (f *File) rawConn() (*bulkConn, error) {
	if f.bulk == nil {
		b, err := openBulk(f.path, f.opts)
		if err != nil {
			return nil, err
		}
		f.bulk = b
	}
	return f.bulk, nil
}

// closeReader closes GetManyPackedConcurrent's connection if one is open.
func (f *File) closeReader() error {
	f.readMu.Lock()
	defer f.readMu.Unlock()
	if f.reader == nil {
		return nil
	}
	err := f.reader.close()
	f.reader = nil
	return err
}

// closeBulk closes the bulk-write connection if one is open.
func (f *File) closeBulk() error {
	if f.bulk == nil {
		return nil
	}
	err := f.bulk.close()
	f.bulk = nil
	return err
}
