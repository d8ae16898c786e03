package snapfile

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// Get returns the newest row for (step, key) with epoch < before (before <=
// 0: no bound). found is false when the key has no row; a deletion is
// returned as a row with Deleted set. Every version of the key is read and
// checked, not only the newest, so a version whose epoch was damaged into
// an older one is found rather than skipped; a row that fails its
// checksum is an error wrapping ErrDamaged.
//
// It is GetManyPacked's lookup for one key: the bulk connection's
// prepared statement through SQLite's C API, a few microseconds, where a
// database/sql query prepared per call cost some thirty (a resumed flow
// touching keys one at a time pays this per key).
//
// A row that damage hid from the lookup altogether (a key whose record
// header was flipped into a blob sorts elsewhere) is found by no lookup;
// the whole-file check (Verify) finds it, and a recovery run commits
// nothing on a resumed store before that check passed.
func (f *File) Get(ctx context.Context, step, key string, before int64) (row rowbatch.Row, found bool, err error) {
	if before <= 0 {
		before = math.MaxInt64
	}
	fail := func(err error) (rowbatch.Row, bool, error) {
		return rowbatch.Row{}, false, classify(f.path, fmt.Sprintf("get %s/%q", step, key), fmt.Errorf("get %s/%q from %s: %w", step, key, f.path, err))
	}
	b, err := f.rawConn()
	if err != nil {
		return fail(err)
	}
	var p page
	if err := b.getMany(ctx, &p, f, step, []string{key}, before); err != nil {
		return fail(err)
	}
	if len(p.starts) == 0 {
		return rowbatch.Row{}, false, nil
	}
	_, epoch, val, deleted := p.entry(0)
	row = rowbatch.Row{StepID: step, Key: key, Epoch: epoch, Deleted: deleted}
	if !deleted {
		// The page is this call's own buffer: the value may alias it.
		row.Value = val[:len(val):len(val)]
	}
	return row, true, nil
}

// checkRow compares a row read back with its stored checksum (files of
// LegacyFormatVersion have none) and with the key group its key hashes to.
func (f *File) checkRow(hdr *[25]byte, step, key []byte, epoch, group int64, deleted bool, val []byte, stored int64) error {
	if f.legacy {
		return nil
	}
	if got := rowCRC(hdr, step, key, epoch, group, deleted, val); int64(got) != stored {
		return damagedf(f.path, "step %q key %q epoch %d: row checksum mismatch (stored %#x, computed %#x)", step, key, epoch, stored, got)
	}
	return nil
}

// ScanOptions select what Scan returns.
type ScanOptions struct {
	// StepID limits the scan to one step; empty means every step.
	StepID string
	// Before bounds epochs (exclusive); <= 0 means no bound.
	Before int64
	// Groups limits the scan to keys in a key-group range; nil means all.
	Groups *keygroup.Range
	// IncludeDeleted returns deletion records that are a key's newest row
	// (merging segments needs them; restoring state does not).
	IncludeDeleted bool
	// ChunkRows is how many keys one page holds; 0 picks a default.
	ChunkRows int
}

// Cursor marks where a paged scan stopped. The zero Cursor starts at the
// beginning; a Cursor with After set continues after (StepID, Key).
type Cursor struct {
	StepID, Key string
	After       bool
}

// ScanPage returns the newest row per (step, key) matching o for the keys
// after cur, in (step, key) order, reading about o.ChunkRows rows, and the
// cursor to continue from. done is true when nothing follows. Each page is
// its own short query, so a paged scan holds no statement open between
// pages and other calls on the file can run in between.
func (f *File) ScanPage(ctx context.Context, o ScanOptions, cur Cursor) (rows []rowbatch.Row, next Cursor, done bool, err error) {
	p, step, next, done, err := f.scanPage(ctx, o, cur)
	if err != nil || p == nil {
		return nil, next, done, err
	}
	rows = make([]rowbatch.Row, 0, len(p.starts))
	for i := range p.starts {
		key, epoch, val, deleted := p.entry(i)
		if deleted && !o.IncludeDeleted {
			continue
		}
		if !deleted {
			val = append(make([]byte, 0, len(val)), val...)
		}
		rows = append(rows, rowbatch.Row{StepID: step, Key: string(key), Epoch: epoch, Value: val, Deleted: deleted})
	}
	return rows, next, done, nil
}

// ScanPagePacked is ScanPage returning the page in its packed form (see
// Page) without building a Row per key: the fast path for restores that
// hand the bytes straight to another language. Deletions are included
// only with o.IncludeDeleted.
func (f *File) ScanPagePacked(ctx context.Context, o ScanOptions, cur Cursor) (packed []byte, next Cursor, done bool, err error) {
	p, _, next, done, err := f.scanPage(ctx, o, cur)
	if err != nil || p == nil {
		return nil, next, done, err
	}
	return p.pack(o.IncludeDeleted), next, done, nil
}

func (f *File) scanPage(ctx context.Context, o ScanOptions, cur Cursor) (p *page, step string, next Cursor, done bool, err error) {
	step = o.StepID
	if step == "" {
		// Walk the steps one after another; each is paged by key.
		step, err = f.stepAtOrAfter(ctx, cur.StepID)
		if err != nil || step == "" {
			return nil, "", cur, true, err
		}
		if step != cur.StepID {
			cur = Cursor{StepID: step}
		}
	}
	p, lastKey, full, err := f.scanStepPage(ctx, o, step, cur)
	if err != nil {
		return nil, "", cur, false, err
	}
	if full {
		return p, step, Cursor{StepID: step, Key: lastKey, After: true}, false, nil
	}
	if o.StepID != "" {
		return p, step, Cursor{StepID: step, Key: lastKey, After: true}, true, nil
	}
	// This step is finished; the next page starts at the following step.
	nextStep, err := f.stepAtOrAfter(ctx, step+"\x00")
	if err != nil {
		return nil, "", cur, false, err
	}
	return p, step, Cursor{StepID: nextStep}, nextStep == "", nil
}

// stepAtOrAfter returns the smallest step id >= from, or "" if none.
func (f *File) stepAtOrAfter(ctx context.Context, from string) (string, error) {
	var step sql.NullString
	q := `SELECT min(step_id) FROM snaps WHERE step_id >= ?1`
	if f.hasRecent {
		q = `SELECT min(s) FROM (SELECT min(step_id) AS s FROM snaps WHERE step_id >= ?1
			UNION ALL SELECT min(step_id) FROM recent WHERE step_id >= ?1)`
	}
	if err := f.db.QueryRowContext(ctx, q, from).Scan(&step); err != nil {
		return "", classify(f.path, "scan", fmt.Errorf("scan %s: %w", f.path, err))
	}
	// A damaged b-tree can answer with a smaller step id, and the walks
	// over steps would then never end.
	if step.Valid && step.String < from {
		return "", damagedf(f.path, "damaged index: step %q returned for step ids >= %q", step.String, from)
	}
	// Step ids are written as UTF-8, and this read checks no row's
	// checksum: a flipped bit in one would otherwise reach the caller as
	// a step id that cannot be decoded, not as damage.
	if step.Valid && !utf8.ValidString(step.String) {
		return "", damagedf(f.path, "step id %q is not UTF-8", step.String)
	}
	return step.String, nil
}

// scanStepPage reads up to a page of rows of one step after key after and
// keeps the newest row per key. full reports that the page limit was hit:
// the rows of the last key read may continue in the next page, so that key
// is left for it.
func (f *File) scanStepPage(ctx context.Context, o ScanOptions, step string, cur Cursor) (p *page, lastKey string, full bool, err error) {
	after := cur.Key
	before := o.Before
	if before <= 0 {
		before = math.MaxInt64
	}
	limit := o.ChunkRows
	if limit <= 0 {
		limit = 4096
	}
	b, err := f.rawConn()
	if err != nil {
		return nil, after, false, fmt.Errorf("scan %s: %w", f.path, err)
	}
	p = &page{}
	read, err := b.scanStep(p, f, step, after, !cur.After, before, o.Groups, limit)
	if err != nil {
		return nil, after, false, classify(f.path, "scan", err)
	}
	// The rows read, not the keys kept, tell whether the page was cut short.
	full = read == limit
	if full && len(p.starts) > 1 {
		p.dropLast() // its newer versions may be on the next page
	} else if full {
		// One key with a page worth of versions: ask for its newest directly.
		key := string(p.key(0))
		r, found, err := f.Get(ctx, step, key, before)
		if err != nil {
			return nil, after, false, err
		}
		p.dropLast()
		if found {
			p.add([]byte(key), r.Epoch, r.Value, r.Deleted)
		}
	}
	if n := len(p.starts); n > 0 {
		lastKey = string(p.key(n - 1))
	} else {
		lastKey = after
	}
	// A full page must move the cursor forward; on a damaged b-tree it
	// might not, and the scan would then read the same page forever.
	if full && (lastKey < after || (lastKey == after && cur.After)) {
		return nil, after, false, damagedf(f.path, "damaged index: step %q key %q read after %q", step, lastKey, after)
	}
	return p, lastKey, full, nil
}

// Scan calls fn with pages of the newest row per (step, key) matching o, in
// (step, key) order, until the end or an error. fn may keep the rows.
// Memory use is bounded by the page size, however large the file.
func (f *File) Scan(ctx context.Context, o ScanOptions, fn func([]rowbatch.Row) error) error {
	var cur Cursor
	for {
		rows, next, done, err := f.ScanPage(ctx, o, cur)
		if err != nil {
			return err
		}
		if len(rows) > 0 {
			if err := fn(rows); err != nil {
				return err
			}
		}
		if done {
			return nil
		}
		cur = next
	}
}

// Steps lists the step ids that have rows, sorted. Each step costs one
// primary-key seek, not a walk over its rows.
func (f *File) Steps(ctx context.Context) ([]string, error) {
	var steps []string
	for from := ""; ; {
		step, err := f.stepAtOrAfter(ctx, from)
		if err != nil {
			return nil, fmt.Errorf("list steps: %w", err)
		}
		if step == "" { // none left (step ids are never empty)
			return steps, nil
		}
		steps = append(steps, step)
		from = step + "\x00"
	}
}

// Stats summarizes a file's contents.
type Stats struct {
	Rows       int64
	Deletions  int64
	ValueBytes int64
	MinEpoch   int64
	MaxEpoch   int64
}

// Stats counts the rows in the file.
func (f *File) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	var minE, maxE sql.NullInt64
	from := `snaps`
	if f.hasRecent {
		from = `(SELECT epoch, value FROM snaps UNION ALL SELECT epoch, value FROM recent)`
	}
	err := f.db.QueryRowContext(ctx, `SELECT count(*), count(*) - count(value), coalesce(sum(length(value)), 0),
		min(epoch), max(epoch) FROM `+from).Scan(&s.Rows, &s.Deletions, &s.ValueBytes, &minE, &maxE)
	if err != nil {
		return Stats{}, classify(f.path, "stats", fmt.Errorf("stats of %s: %w", f.path, err))
	}
	s.MinEpoch, s.MaxEpoch = minE.Int64, maxE.Int64
	return s, nil
}
