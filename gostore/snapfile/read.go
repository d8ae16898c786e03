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
	// AllVersions returns every row instead of only the newest per key.
	AllVersions bool
	// ChunkRows is how many rows each callback gets; 0 picks a default.
	ChunkRows int
}

// Scan calls fn with chunks of the newest row per (step, key) matching o,
// in (step, key) order. fn may keep the rows it is given. Memory use is
// bounded by the chunk size, however large the file.
func (f *File) Scan(ctx context.Context, o ScanOptions, fn func([]rowbatch.Row) error) error {
	before := o.Before
	if before <= 0 {
		before = math.MaxInt64
	}
	chunk := o.ChunkRows
	if chunk <= 0 {
		chunk = 4096
	}
	q := `SELECT step_id, state_key, epoch, value, value IS NULL FROM snaps WHERE epoch < ?`
	args := []any{before}
	if o.StepID != "" {
		q += ` AND step_id = ?`
		args = append(args, o.StepID)
	}
	if o.Groups != nil {
		q += ` AND key_group >= ? AND key_group < ?`
		args = append(args, o.Groups.Lo, o.Groups.Hi)
	}
	q += ` ORDER BY step_id, state_key, epoch`
	rows, err := f.db.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("scan %s: %w", f.path, err)
	}
	defer rows.Close()

	out := make([]rowbatch.Row, 0, chunk)
	var pending rowbatch.Row
	havePending := false
	emit := func(r rowbatch.Row) error {
		if r.Deleted && !o.IncludeDeleted {
			return nil
		}
		out = append(out, r)
		if len(out) == chunk {
			if err := fn(out); err != nil {
				return err
			}
			out = make([]rowbatch.Row, 0, chunk)
		}
		return nil
	}
	// Rows of one key arrive oldest first; the newest is the last before the
	// key changes.
	var step, key string
	var epoch int64
	var isNull bool
	var val []byte
	for rows.Next() {
		val = nil
		if err := rows.Scan(&step, &key, &epoch, &val, &isNull); err != nil {
			return fmt.Errorf("scan %s: %w", f.path, err)
		}
		if !isNull && val == nil {
			val = []byte{}
		}
		r := rowbatch.Row{StepID: step, Key: key, Epoch: epoch, Value: val, Deleted: isNull}
		if o.AllVersions {
			if err := emit(r); err != nil {
				return err
			}
			continue
		}
		if havePending && (pending.StepID != step || pending.Key != key) {
			if err := emit(pending); err != nil {
				return err
			}
		}
		pending, havePending = r, true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("scan %s: %w", f.path, err)
	}
	if havePending {
		if err := emit(pending); err != nil {
			return err
		}
	}
	if len(out) > 0 {
		return fn(out)
	}
	return nil
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
