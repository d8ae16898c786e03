package localstore

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// The committed epoch a store saw reaches its metadata without a write of
// its own: carried by the next write, or written at Close.
func TestCommittedEpochSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		after func(s *Store) // what follows NoteCommitted(4)
	}{
		{"close only", func(s *Store) {}},
		{"next write", func(s *Store) {
			_, err := s.Write(ctx, rowbatch.NewBatch(5, []rowbatch.Row{put("a", "5")}, false))
			require.NoError(t, err)
		}},
		{"gc", func(s *Store) {
			_, err := s.GC(ctx, 4)
			require.NoError(t, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := Open(ctx, cfg(dir), 0)
			require.NoError(t, err)
			for e := int64(1); e <= 4; e++ {
				_, err := s.Write(ctx, rowbatch.NewBatch(e, []rowbatch.Row{put("a", "x")}, false))
				require.NoError(t, err)
			}
			s.NoteCommitted(4)
			assert.Equal(t, int64(4), s.Meta().CommittedEpoch)
			tc.after(s)
			require.NoError(t, s.Close())

			m, err := Inspect(ctx, dir, "wc", 0)
			require.NoError(t, err)
			assert.Equal(t, int64(4), m.CommittedEpoch)
			s, err = Open(ctx, cfg(dir), 0)
			require.NoError(t, err)
			defer s.Close()
			assert.Equal(t, int64(4), s.Meta().CommittedEpoch)
		})
	}
}

// A rebuild is of a committed epoch: MarkRebuilt records it.
func TestMarkRebuiltSetsTheCommittedEpoch(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	_, err = s.Restore(ctx, []rowbatch.Row{{StepID: "wc.count", Key: "a", Epoch: 6, Value: []byte("1")}})
	require.NoError(t, err)
	require.NoError(t, s.MarkRebuilt(ctx, 7))
	require.NoError(t, s.Close())
	m, err := Inspect(ctx, dir, "wc", 0)
	require.NoError(t, err)
	assert.Equal(t, int64(7), m.CommittedEpoch)
}

// Files and directories holding state are the owner's only, whatever
// the umask allows beyond that, and never wider than it allows.
func TestStateIsOwnerOnly(t *testing.T) {
	ctx := context.Background()
	for _, umask := range []int{0o022, 0o077} {
		t.Run(fs.FileMode(umask).String(), func(t *testing.T) {
			old := syscall.Umask(umask)
			defer syscall.Umask(old)
			dir := filepath.Join(t.TempDir(), "state")
			s, err := Open(ctx, cfg(dir), 0)
			require.NoError(t, err)
			_, err = s.Write(ctx, rowbatch.NewBatch(1, []rowbatch.Row{put("a", "1")}, false))
			require.NoError(t, err)
			seg := segmentOf(t, 2, []rowbatch.Row{put("a", "2")}, 0)
			staged, err := s.StageGeneration(seg, 0)
			require.NoError(t, err)
			wdir := WorkerDir(dir, "wc", 0)
			require.NoError(t, markDamaged(wdir, "test"))
			for _, p := range []string{filepath.Join(wdir, FileName), filepath.Join(wdir, FileName+"-wal"),
				filepath.Join(wdir, FileName+"-shm"), filepath.Join(wdir, "LOCK"), staged.Path, filepath.Join(wdir, DamagedFileName)} {
				st, err := os.Stat(p)
				require.NoError(t, err, p)
				assert.Equal(t, fs.FileMode(0o600), st.Mode().Perm(), p)
			}
			for _, p := range []string{dir, filepath.Join(dir, "wc"), wdir} {
				st, err := os.Stat(p)
				require.NoError(t, err)
				assert.Equal(t, fs.FileMode(0o700), st.Mode().Perm(), p)
			}
			require.NoError(t, s.Close())
		})
	}
}

// A local store written before rows had checksums is refused as a layout
// change (the recovery layer rebuilds it); damage is refused as damage,
// marked, and Remove clears the mark.
func TestOldAndDamagedStoresAreRefused(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := stored(t, dir)
	require.NoError(t, s.Close())
	path := filepath.Join(WorkerDir(dir, "wc", 0), FileName)

	// Turn the store into what an older version wrote: no crc column.
	legacy(t, path)
	_, err := Inspect(ctx, dir, "wc", 0)
	require.ErrorIs(t, err, ErrLayoutChanged)
	assert.Contains(t, err.Error(), "written by an older version without row checksums and will be rebuilt")
	_, err = Open(ctx, cfg(dir), 0)
	require.ErrorIs(t, err, ErrLayoutChanged)

	require.NoError(t, Remove(dir, "wc", 0))
	s = stored(t, dir)
	require.NoError(t, s.Close())
	corruptValue(t, path, "1")
	s, err = Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	_, _, err = s.Get(ctx, "wc.count", "b")
	require.ErrorIs(t, err, ErrDamaged)
	require.ErrorIs(t, err, snapfile.ErrDamaged)
	assert.Regexp(t, `^local store damaged: .*store\.sqlite: .*key "b".*checksum mismatch.*; the next run rebuilds it from the backup$`, err.Error())
	reason, ok := Damaged(dir, "wc", 0)
	require.True(t, ok)
	assert.Contains(t, reason, "checksum mismatch")
	require.ErrorIs(t, s.Verify(ctx), ErrDamaged)
	require.NoError(t, s.Close())
	_, err = Inspect(ctx, dir, "wc", 0)
	require.ErrorIs(t, err, ErrDamaged)
	_, err = Open(ctx, cfg(dir), 0)
	require.ErrorIs(t, err, ErrDamaged)

	require.NoError(t, Remove(dir, "wc", 0))
	_, ok = Damaged(dir, "wc", 0)
	assert.False(t, ok)
	s, err = Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	require.NoError(t, s.Verify(ctx))
	require.NoError(t, s.Close())
}

// legacy rewrites a store as the previous format: the same rows without
// the crc column and metadata checksum.
func legacy(t *testing.T, path string) {
	t.Helper()
	db := openRaw(t, path)
	defer db.Close()
	for _, q := range []string{
		`CREATE TABLE snaps2 (step_id TEXT NOT NULL, state_key TEXT NOT NULL, epoch INTEGER NOT NULL, key_group INTEGER NOT NULL, value BLOB, PRIMARY KEY (step_id, state_key, epoch)) WITHOUT ROWID`,
		`INSERT INTO snaps2 SELECT step_id, state_key, epoch, key_group, value FROM snaps UNION ALL SELECT step_id, state_key, epoch, key_group, value FROM recent`,
		`DROP TABLE snaps`, `DROP TABLE IF EXISTS recent`, `ALTER TABLE snaps2 RENAME TO snaps`,
		`DELETE FROM meta WHERE name IN ('meta_crc', 'committed_epoch')`,
		`UPDATE meta SET value = 'millpond-snapshot-1' WHERE name = 'format'`,
	} {
		_, err := db.Exec(q)
		require.NoError(t, err, q)
	}
}

// corruptValue changes a stored value behind SQLite's back, keeping the
// file well formed: only the row checksum can tell.
func corruptValue(t *testing.T, path, value string) {
	t.Helper()
	db := openRaw(t, path)
	defer db.Close()
	for _, tbl := range []string{"snaps", "recent"} {
		_, err := db.Exec(`UPDATE `+tbl+` SET value = X'00' WHERE value = ?`, []byte(value))
		require.NoError(t, err)
	}
}

// Verify runs beside writes and reads and finds nothing on a good store;
// a generation replacing the file meanwhile makes it start over.
func TestVerifyRunsBesideWrites(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, cfg(t.TempDir()), 0)
	require.NoError(t, err)
	defer s.Close()
	var rows []rowbatch.Row
	for i := 0; i < 20000; i++ {
		rows = append(rows, put(flipKey(i), "v"))
	}
	_, err = s.Write(ctx, rowbatch.NewBatch(1, rows, false))
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 5; i++ {
			errs <- s.Verify(ctx)
		}
	}()
	for e := int64(2); e < 40; e++ {
		b := rowbatch.NewBatch(e, []rowbatch.Row{put(flipKey(int(e)), "w")}, e%10 == 0)
		require.NoError(t, s.WriteAsync(b, nil))
		s.NoteCommitted(e - 1)
		_, _, err := s.Get(ctx, "wc.count", flipKey(1))
		require.NoError(t, err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !errors.Is(err, ErrDamaged) {
			// Starting over too often is allowed to fail, not to be damage.
			assert.Contains(t, err.Error(), "was replaced")
			continue
		}
		assert.NoError(t, err)
	}
	require.NoError(t, s.Flush())
	require.NoError(t, s.Verify(ctx))
}

// openRaw opens a store's file with plain SQL, behind the store's back.
func openRaw(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	require.NoError(t, err)
	db.SetMaxOpenConns(1)
	return db
}

// A store is made under a temporary name and renamed into place once its
// schema has committed: what a run killed while making it leaves (the
// temporary file, empty or without a schema) is removed by the next open,
// which then makes the store; journals left beside a store removed by hand
// are not applied to the new one. An empty store.sqlite itself is still
// refused as damaged: nothing of ours leaves one.
func TestAStoreHalfMadeByAKilledRunIsMadeAgain(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// leave makes what the killed run left in wdir.
		leave func(t *testing.T, wdir string)
		// existing tells that a good store with row "a" is there too.
		existing bool
	}{
		{name: "empty temporary file", leave: func(t *testing.T, wdir string) {
			require.NoError(t, os.WriteFile(filepath.Join(wdir, creatingFileName), nil, 0o600))
		}},
		{name: "temporary file without a schema", leave: func(t *testing.T, wdir string) {
			db := openRaw(t, filepath.Join(wdir, creatingFileName))
			_, err := db.Exec(`PRAGMA journal_mode=WAL`)
			require.NoError(t, err)
			require.NoError(t, db.Close())
		}},
		{name: "temporary file beside a good store", existing: true, leave: func(t *testing.T, wdir string) {
			require.NoError(t, os.WriteFile(filepath.Join(wdir, creatingFileName), []byte("half"), 0o600))
			require.NoError(t, os.WriteFile(filepath.Join(wdir, creatingFileName+"-wal"), []byte("half"), 0o600))
		}},
		{name: "journals of a store removed by hand", leave: func(t *testing.T, wdir string) {
			require.NoError(t, os.WriteFile(filepath.Join(wdir, FileName+"-wal"), []byte("stale frames"), 0o600))
			require.NoError(t, os.WriteFile(filepath.Join(wdir, FileName+"-shm"), []byte("stale"), 0o600))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			wdir := WorkerDir(dir, "wc", 0)
			if tc.existing {
				require.NoError(t, stored(t, dir).Close())
			}
			require.NoError(t, os.MkdirAll(wdir, 0o700))
			tc.leave(t, wdir)
			s, err := Open(ctx, cfg(dir), 0)
			require.NoError(t, err)
			_, err = s.Write(ctx, rowbatch.NewBatch(9, []rowbatch.Row{put("z", "1")}, false))
			require.NoError(t, err)
			require.NoError(t, s.Close())
			_, err = os.Stat(filepath.Join(wdir, creatingFileName))
			require.ErrorIs(t, err, os.ErrNotExist, "the half-made store is still there")
			_, ok := Damaged(dir, "wc", 0)
			assert.False(t, ok)
			m, err := Inspect(ctx, dir, "wc", 0)
			require.NoError(t, err)
			assert.Equal(t, int64(9), m.LastEpoch)
			s, err = Open(ctx, cfg(dir), 0)
			require.NoError(t, err)
			defer s.Close()
			_, found, err := s.Get(ctx, "wc.count", "a")
			require.NoError(t, err)
			assert.Equal(t, tc.existing, found, "row a of the existing store")
		})
	}

	// An empty store.sqlite is not something a kill leaves: damage.
	dir := t.TempDir()
	wdir := WorkerDir(dir, "wc", 0)
	require.NoError(t, os.MkdirAll(wdir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(wdir, FileName), nil, 0o600))
	_, err := Open(ctx, cfg(dir), 0)
	require.ErrorIs(t, err, ErrDamaged)
}

// Processes sharing a local state directory inspect every worker's store
// at start while its owner may be removing and re-making it: inspecting
// never creates or damages the owner's file.
func TestInspectingAStoreItsOwnerRemakesNeverDamagesIt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rounds := 150
	if raceDetector {
		rounds = 30
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			InspectOther(ctx, dir, "wc", 0)
		}
	}()
	for i := range rounds {
		require.NoError(t, Remove(dir, "wc", 0))
		s, err := Open(ctx, cfg(dir), 0)
		require.NoError(t, err, "round %d", i)
		_, err = s.Write(ctx, rowbatch.NewBatch(1, []rowbatch.Row{put("k", "v")}, false))
		require.NoError(t, err)
		require.NoError(t, s.Close())
	}
	close(stop)
	<-done
	_, bad := Damaged(dir, "wc", 0)
	assert.False(t, bad)
}
