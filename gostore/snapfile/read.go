package snapfile

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"

	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// Get returns the newest row for (step, key) with epoch < before (before <=
// 0: no bound). found is false when the key has no row; a deletion is
// returned as a row with Deleted set.
func (f *File) Get(ctx context.Context, step, key string, before int64) (row rowbatch.Row, found bool, err error) {
	if before <= 0 {
		before = math.MaxInt64
	}
	var val []byte
	var isNull bool
	err = f.db.QueryRowContext(ctx,
		`SELECT epoch, value, value IS NULL FROM snaps WHERE step_id = ? AND state_key = ? AND epoch < ?
		 ORDER BY epoch DESC LIMIT 1`, step, key, before).Scan(&row.Epoch, &val, &isNull)
	if errors.Is(err, sql.ErrNoRows) {
		return rowbatch.Row{}, false, nil
	}
	if err != nil {
		return rowbatch.Row{}, false, fmt.Errorf("get %s/%q from %s: %w", step, key, f.path, err)
	}
	row.StepID, row.Key = step, key
	row.Deleted = isNull
	if !isNull && val == nil {
		val = []byte{}
	}
	row.Value = val
	return row, true, nil
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

// Cursor marks where a paged scan stopped: the last (step, key) returned.
// The zero Cursor starts at the beginning.
type Cursor struct {
	StepID, Key string
}

// ScanPage returns up to o.ChunkRows keys after cur, with the newest row per
// (step, key) matching o, in (step, key) order, and the cursor to continue
// from. done is true when nothing follows. Each page is its own query, so a
// paged scan holds no statement open between pages and other calls on the
// file can run in between.
func (f *File) ScanPage(ctx context.Context, o ScanOptions, cur Cursor) (rows []rowbatch.Row, next Cursor, done bool, err error) {
	before := o.Before
	if before <= 0 {
		before = math.MaxInt64
	}
	limit := o.ChunkRows
	if limit <= 0 {
		limit = 4096
	}
	// With a single max() aggregate, SQLite takes the bare columns from the
	// row holding the maximum: the newest row of each key.
	q := `SELECT step_id, state_key, max(epoch), value, value IS NULL FROM snaps
		WHERE (step_id, state_key) > (?, ?) AND epoch < ?`
	args := []any{cur.StepID, cur.Key, before}
	if o.StepID != "" {
		q += ` AND step_id = ?`
		args = append(args, o.StepID)
	}
	if o.Groups != nil {
		q += ` AND key_group >= ? AND key_group < ?`
		args = append(args, o.Groups.Lo, o.Groups.Hi)
	}
	q += ` GROUP BY step_id, state_key ORDER BY step_id, state_key LIMIT ?`
	args = append(args, limit)
	res, err := f.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, cur, false, fmt.Errorf("scan %s: %w", f.path, err)
	}
	defer res.Close()
	rows = make([]rowbatch.Row, 0, min(limit, 4096))
	seen := 0
	for res.Next() {
		var r rowbatch.Row
		var val []byte
		if err := res.Scan(&r.StepID, &r.Key, &r.Epoch, &val, &r.Deleted); err != nil {
			return nil, cur, false, fmt.Errorf("scan %s: %w", f.path, err)
		}
		seen++
		cur = Cursor{StepID: r.StepID, Key: r.Key}
		if r.Deleted {
			if !o.IncludeDeleted {
				continue
			}
		} else if val == nil {
			val = []byte{}
		}
		r.Value = val
		rows = append(rows, r)
	}
	if err := res.Err(); err != nil {
		return nil, cur, false, fmt.Errorf("scan %s: %w", f.path, err)
	}
	return rows, cur, seen < limit, nil
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

// Steps lists the step ids that have rows, sorted.
func (f *File) Steps(ctx context.Context) ([]string, error) {
	rows, err := f.db.QueryContext(ctx, `SELECT DISTINCT step_id FROM snaps ORDER BY step_id`)
	if err != nil {
		return nil, fmt.Errorf("list steps of %s: %w", f.path, err)
	}
	defer rows.Close()
	var steps []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, fmt.Errorf("list steps of %s: %w", f.path, err)
		}
		steps = append(steps, s)
	}
	return steps, rows.Err()
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
	err := f.db.QueryRowContext(ctx, `SELECT count(*), count(*) - count(value), coalesce(sum(length(value)), 0),
		min(epoch), max(epoch) FROM snaps`).Scan(&s.Rows, &s.Deletions, &s.ValueBytes, &minE, &maxE)
	if err != nil {
		return Stats{}, fmt.Errorf("stats of %s: %w", f.path, err)
	}
	s.MinEpoch, s.MaxEpoch = minE.Int64, maxE.Int64
	return s, nil
}
