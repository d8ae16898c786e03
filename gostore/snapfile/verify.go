package snapfile

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	sqlite3 "modernc.org/sqlite/lib"
)

// verifyCheckEvery is how many rows Verify reads between checks of its
// context.
const verifyCheckEvery = 4096

// Verify checks the whole file: SQLite's quick_check (every page used
// once, cells in order within their pages, so a lost or duplicated
// subtree shows), the metadata's checksum, and every row of both tables,
// each against its checksum and in strictly increasing primary-key order.
// Any problem is an error wrapping ErrDamaged. Files of
// LegacyFormatVersion get every check but the row checksums.
//
// Each check is a read transaction of its own. To check a file that is
// being written, open it a second time with Options.ReadOnly and verify
// that: in WAL mode its reads run beside the writer's.
func (f *File) Verify(ctx context.Context) error {
	if err := f.quickCheck(ctx); err != nil {
		return classify(f.path, "verify", err)
	}
	if _, _, err := f.readMeta(ctx); err != nil {
		if err = classify(f.path, "verify", err); err != nil {
			return err
		}
	}
	tables := []string{"snaps"}
	if f.hasRecent {
		tables = append(tables, "recent")
	}
	b, err := f.rawConn()
	if err != nil {
		return classify(f.path, "verify", fmt.Errorf("verify %s: %w", f.path, err))
	}
	for _, t := range tables {
		if err := b.verifyTable(ctx, f, t); err != nil {
			return classify(f.path, "verify", err)
		}
	}
	return nil
}

// quickCheck runs PRAGMA quick_check and turns what it reports into a
// DamageError naming the first problems.
func (f *File) quickCheck(ctx context.Context) error {
	rows, err := f.db.QueryContext(ctx, `PRAGMA quick_check`)
	if err != nil {
		return fmt.Errorf("verify %s: quick_check: %w", f.path, err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var msg string
		if err := rows.Scan(&msg); err != nil {
			return fmt.Errorf("verify %s: quick_check: %w", f.path, err)
		}
		if msg != "ok" && len(problems) < 5 {
			problems = append(problems, msg)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("verify %s: quick_check: %w", f.path, err)
	}
	if len(problems) > 0 {
		return damagedf(f.path, "quick_check: %s", strings.Join(problems, "; "))
	}
	return nil
}

// verifyTypes are the types of verifyTable's columns (-2: not checked).
var verifyTypes = []int32{typeText, typeText, typeInt, typeInt, -2, typeBlobNil, typeInt}

// verifyTable reads every row of table in primary-key order and checks
// each against its checksum and its predecessor.
func (b *bulkConn) verifyTable(ctx context.Context, f *File, table string) error {
	crcCol := "crc"
	if f.legacy {
		crcCol = "0"
	}
	st, err := b.prepare(`SELECT step_id, state_key, epoch, key_group, value IS NULL, value, ` + crcCol + ` FROM ` + table + ` ORDER BY step_id, state_key, epoch`)
	if err != nil {
		return err
	}
	defer sqlite3.Xsqlite3_finalize(b.tls, st)
	var prevStep, prevKey []byte
	var prevEpoch int64
	for n := 0; ; n++ {
		if n%verifyCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("verify %s: %w", f.path, err)
			}
		}
		switch rc := sqlite3.Xsqlite3_step(b.tls, st); rc {
		case sqlite3.SQLITE_ROW:
		case sqlite3.SQLITE_DONE:
			return nil
		default:
			return b.errorf("verify", rc)
		}
		if err := b.checkTypes(st, verifyTypes); err != nil {
			return err
		}
		step := b.columnBytes(st, 0, false)
		key := b.columnBytes(st, 1, false)
		epoch := sqlite3.Xsqlite3_column_int64(b.tls, st, 2)
		deleted := sqlite3.Xsqlite3_column_int64(b.tls, st, 4) != 0
		var val []byte
		if !deleted {
			val = b.columnBytes(st, 5, true)
		}
		if err := f.checkRow(&b.crc, step, key, epoch, sqlite3.Xsqlite3_column_int64(b.tls, st, 3), deleted, val,
			sqlite3.Xsqlite3_column_int64(b.tls, st, 6)); err != nil {
			return err
		}
		if n > 0 {
			c := bytes.Compare(step, prevStep)
			if c == 0 {
				c = bytes.Compare(key, prevKey)
			}
			if c < 0 || (c == 0 && epoch <= prevEpoch) {
				return damagedf(f.path, "table %s: step %q key %q epoch %d read after step %q key %q epoch %d (rows out of order)",
					table, step, key, epoch, prevStep, prevKey, prevEpoch)
			}
		}
		prevStep = append(prevStep[:0], step...)
		prevKey = append(prevKey[:0], key...)
		prevEpoch = epoch
	}
}
