package snapfile

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// Unborn reports whether path is a file that Create was stopped in the
// middle of making (a killed process): it holds nothing, so it is neither a
// snapshot file nor damage. That is an empty file with an empty or no WAL
// beside it (killed before SQLite's first write, which goes into the file
// itself, not the WAL), or a SQLite database without a single table
// (killed before the schema's transaction committed). Any other file that
// Open refuses is not Unborn.
func Unborn(ctx context.Context, path string) (bool, error) {
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() {
		return false, nil
	}
	if st.Size() == 0 {
		wal, err := os.Stat(path + "-wal")
		return errors.Is(err, os.ErrNotExist) || (err == nil && wal.Size() == 0), nil
	}
	if checkHeader(path) != nil {
		return false, nil
	}
	db, err := openDB(path, Options{})
	if err != nil {
		return false, fmt.Errorf("look into %s: %w", path, err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master`).Scan(&n); err != nil {
		// Whatever SQLite cannot read is not known to be empty.
		return false, nil
	}
	return n == 0, nil
}
