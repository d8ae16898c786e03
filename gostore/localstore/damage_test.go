package localstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// flipSteps are the steps of the bit-flip store: two, so scans walk steps.
var flipSteps = []string{"flow.count", "flow.sum"}

// flipKey is the i-th key of the bit-flip store.
func flipKey(i int) string { return fmt.Sprintf("key-%05d", i) }

// flipValue is a key's value at an epoch, recognisable in the file.
func flipValue(i int, epoch int64) string { return fmt.Sprintf("value-%05d-at-%d", i, epoch) }

// buildFlipStore writes a store of a few thousand rows across epochs, with
// deletions, some folded into the main table and some left in the recent
// buffer, and closes it. It returns the store's directory.
func buildFlipStore(t testing.TB, keys int) string {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, cfg(dir), 0)
	require.NoError(t, err)
	write := func(epoch int64, rows []rowbatch.Row) {
		_, err := s.Write(ctx, rowbatch.NewBatch(epoch, rows, false))
		require.NoError(t, err)
	}
	var rows []rowbatch.Row
	for _, step := range flipSteps {
		for i := 0; i < keys; i++ {
			rows = append(rows, rowbatch.Row{StepID: step, Key: flipKey(i), Value: []byte(flipValue(i, 1))})
		}
	}
	write(1, rows) // a large batch: the main table
	for e := int64(2); e <= 4; e++ {
		// Small batches (the recent buffer) of updates and deletions.
		rows = nil
		for i := int(e); i < keys; i += 37 {
			r := rowbatch.Row{StepID: flipSteps[i%2], Key: flipKey(i), Value: []byte(flipValue(i, e))}
			if i%5 == 0 {
				r.Value, r.Deleted = nil, true
			}
			rows = append(rows, r)
		}
		write(e, rows)
		if e == 3 {
			// Some go to the main table, the rest stay in recent.
			s.mu.Lock()
			_, err := s.file.FoldRecent(ctx)
			s.mu.Unlock()
			require.NoError(t, err)
		}
	}
	s.NoteCommitted(3)
	require.NoError(t, s.Close())
	return dir
}

// storeView is everything a run reads from a store.
type storeView struct {
	meta snapfile.Meta
	gets map[string]string
	scan map[string]string
}

// readAll reads a store through every path a run uses (Get of every key,
// a full scan, the metadata) and verifies it; it stops at the first error.
func readAll(ctx context.Context, s *Store, keys int) (storeView, error) {
	v := storeView{meta: s.Meta(), gets: map[string]string{}, scan: map[string]string{}}
	for _, step := range flipSteps {
		for i := 0; i < keys; i++ {
			r, found, err := s.Get(ctx, step, flipKey(i))
			if err != nil {
				return v, err
			}
			k := step + "/" + flipKey(i)
			switch {
			case !found:
				v.gets[k] = "<none>"
			case r.Deleted:
				v.gets[k] = fmt.Sprintf("<deleted at %d>", r.Epoch)
			default:
				v.gets[k] = fmt.Sprintf("%s at %d", r.Value, r.Epoch)
			}
		}
	}
	var cur snapfile.Cursor
	for {
		page, next, done, err := s.ScanPage(ctx, snapfile.ScanOptions{IncludeDeleted: true, ChunkRows: 500}, cur)
		if err != nil {
			return v, err
		}
		for _, r := range page {
			v.scan[r.StepID+"/"+r.Key] = fmt.Sprintf("%s deleted=%v at %d", r.Value, r.Deleted, r.Epoch)
		}
		if done {
			break
		}
		cur = next
	}
	return v, s.Verify(ctx)
}

// flipTarget picks where seed flips a bit in file: anywhere, or aimed at
// a value, a key, an epoch, an interior b-tree page or the header.
func flipTarget(rng *rand.Rand, file []byte, kind int) (off int, bit uint) {
	bit = uint(rng.IntN(8))
	pageSize := int(binary.BigEndian.Uint16(file[16:18]))
	if pageSize == 1 {
		pageSize = 65536
	}
	find := func(needle string) int {
		// A random occurrence: start the search at a random offset.
		from := rng.IntN(len(file))
		if i := bytes.Index(file[from:], []byte(needle)); i >= 0 {
			return from + i
		}
		if i := bytes.Index(file, []byte(needle)); i >= 0 {
			return i
		}
		return rng.IntN(len(file))
	}
	switch kind {
	case 1: // inside a value
		return find("value-") + 6 + rng.IntN(10), bit
	case 2: // inside a key
		return find("key-") + rng.IntN(9), bit
	case 3: // the epoch right after a key in a row's record
		return find("key-") + 9, bit
	case 4: // an interior b-tree page (index b-trees: WITHOUT ROWID tables)
		var interior []int
		for p := 1; p*pageSize < len(file); p++ {
			if file[p*pageSize] == 0x02 || file[p*pageSize] == 0x05 {
				interior = append(interior, p*pageSize)
			}
		}
		if len(interior) == 0 {
			return rng.IntN(len(file)), bit
		}
		start := interior[rng.IntN(len(interior))]
		// Mostly the page header, cell pointers and child pointers.
		return start + rng.IntN(min(pageSize, 64)), bit
	case 5: // the 100-byte file header
		return rng.IntN(100), bit
	}
	return rng.IntN(len(file)), bit
}

// A single flipped bit anywhere in a closed store either changes nothing
// a run reads or is reported as damage: never wrong data without an
// error. Damage found leaves the marker, and the next open refuses the
// store until it is removed.
func TestBitFlipIsNeverReadAsData(t *testing.T) {
	keys, seeds := 1000, 240
	if !testing.Short() {
		seeds = 600
	}
	if raceDetector {
		keys, seeds = 300, 12
	}
	if n, err := strconv.Atoi(os.Getenv("MILLPOND_FLIP_SEEDS")); err == nil {
		seeds = n // MILLPOND_FLIP_SEEDS=5000 for a long run
	}
	ctx := context.Background()
	src := buildFlipStore(t, keys)
	wsrc := WorkerDir(src, "wc", 0)
	good, err := os.ReadFile(filepath.Join(wsrc, FileName))
	require.NoError(t, err)
	s, err := Open(ctx, cfg(src), 0)
	require.NoError(t, err)
	want, err := readAll(ctx, s, keys)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.Equal(t, int64(3), want.meta.CommittedEpoch)

	var mu sync.Mutex
	outcomes := map[string]int{}
	seedCh := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seed := range seedCh {
				outcome := flipOne(t, ctx, good, seed, keys, want)
				mu.Lock()
				outcomes[outcome]++
				mu.Unlock()
			}
		}()
	}
	for seed := 0; seed < seeds; seed++ {
		seedCh <- seed
	}
	close(seedCh)
	wg.Wait()
	t.Logf("outcomes over %d seeds: %v", seeds, outcomes)
	assert.Positive(t, outcomes["damaged"], "no flip was detected at all")
}

// flipOne flips seed's bit in a copy of the store and reads it back; it
// returns "same" or "damaged".
func flipOne(t *testing.T, ctx context.Context, good []byte, seed, keys int, want storeView) string {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	buf := append([]byte(nil), good...)
	off, bit := flipTarget(rng, buf, seed%6)
	buf[off] ^= 1 << bit
	where := fmt.Sprintf("seed %d: bit %d of byte %d (page %d)", seed, bit, off, off/int(max(1, binary.BigEndian.Uint16(good[16:18]))))
	dir, err := os.MkdirTemp(t.TempDir(), "flip")
	if err != nil {
		t.Error(err)
		return "error"
	}
	wdir := WorkerDir(dir, "wc", 0)
	if err := os.MkdirAll(wdir, 0o700); err != nil {
		t.Error(err)
		return "error"
	}
	if err := os.WriteFile(filepath.Join(wdir, FileName), buf, 0o600); err != nil {
		t.Error(err)
		return "error"
	}
	var got storeView
	s, err := Open(ctx, cfg(dir), 0)
	if err == nil {
		got, err = readAll(ctx, s, keys)
		if cerr := s.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		if !errors.Is(err, ErrDamaged) {
			t.Errorf("%s: error not marked as damage: %v", where, err)
			return "error"
		}
		if _, marked := Damaged(dir, "wc", 0); !marked {
			t.Errorf("%s: damage found (%v) but no marker left", where, err)
		}
		if s, err := Open(ctx, cfg(dir), 0); err == nil {
			s.Close()
			t.Errorf("%s: a store marked damaged opened again", where)
		} else if !errors.Is(err, ErrDamaged) {
			t.Errorf("%s: reopening a marked store: %v", where, err)
		}
		return "damaged"
	}
	// No error: what was read must be exactly what was written. Execution
	// is rewritten by every open; nothing else may change.
	got.meta.Execution = want.meta.Execution
	if d := diffViews(want, got); d != "" {
		t.Errorf("%s: read wrong data without an error: %s", where, d)
		return "wrong"
	}
	return "same"
}

// diffViews names the first few differences between two views.
func diffViews(want, got storeView) string {
	var out []string
	if want.meta != got.meta {
		out = append(out, fmt.Sprintf("meta %+v, want %+v", got.meta, want.meta))
	}
	for name, m := range map[string][2]map[string]string{"get": {want.gets, got.gets}, "scan": {want.scan, got.scan}} {
		w, g := m[0], m[1]
		for k, v := range w {
			if g[k] != v && len(out) < 8 {
				out = append(out, fmt.Sprintf("%s %s = %q, want %q", name, k, g[k], v))
			}
		}
		for k, v := range g {
			if _, ok := w[k]; !ok && len(out) < 8 {
				out = append(out, fmt.Sprintf("%s %s = %q, not written", name, k, v))
			}
		}
	}
	return strings.Join(out, "; ")
}

func TestDamageReasonLeavesOutTheAdviceToTheNextRun(t *testing.T) {
	// A full resume gives the damage as its reason; the run giving it is
	// the one rebuilding the store, so "the next run rebuilds it" would be
	// wrong there.
	de := &damageError{path: "w/store.sqlite", detail: "frame 4 is damaged", err: ErrDamaged}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"the store's damage error", de, "local store damaged: w/store.sqlite: frame 4 is damaged"},
		{"wrapped with context", fmt.Errorf("open local store: %w", de), "local store damaged: w/store.sqlite: frame 4 is damaged"},
		{"a file's damage", &snapfile.DamageError{Path: "f.sqlite", Detail: "quick_check: x"}, "local store damaged: snapshot file damaged: f.sqlite: quick_check: x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, DamageReason(tt.err))
		})
	}
}
