package snapfile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/millpond/millpond/gostore/rowbatch"
)

// rowsPerInsert is how many rows one INSERT statement carries: enough to
// amortize the statement cost, few enough to stay under SQLite's variable
// limit (rowParams variables a row).
const rowsPerInsert = 256

// rowParams is how many values a row binds: its five columns and its
// checksum.
const rowParams = 6

// Write stores rows in one transaction, sorted by (step, key, epoch) so the
// B-tree is filled in order. A row for an existing (step, key, epoch)
// replaces it; among duplicates in one batch the last one wins. The cost is
// proportional to len(rows), not to the rows already stored. The file's
// LastEpoch advances to the newest epoch written, in the same transaction.
func (f *File) Write(ctx context.Context, rows []rowbatch.Row) (int, error) {
	if len(rows) == 0 {
		return 0, nil
	}
	newest := f.meta.LastEpoch
	for i := range rows {
		newest = max(newest, rows[i].Epoch)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("write %d rows to %s: %w", len(rows), f.path, err)
	}
	if err := f.writable(); err != nil {
		return 0, fmt.Errorf("write %d rows: %w", len(rows), err)
	}
	n, err := f.write(ctx, rows, newest)
	return n, classify(f.path, "write", err)
}

func (f *File) write(ctx context.Context, rows []rowbatch.Row, newest int64) (int, error) {
	order := sortedOrder(rows)
	b, err := f.rawConn()
	if err != nil {
		return 0, fmt.Errorf("write %d rows to %s: %w", len(rows), f.path, err)
	}
	table := "snaps"
	if f.buffered() && f.fitsBuffer(rows) {
		if !f.hasRecent {
			if err := b.exec(recentTable); err != nil {
				return 0, fmt.Errorf("write %d rows: %w", len(rows), err)
			}
			f.hasRecent = true
		}
		table = "recent"
	} else {
		if f.recentRows > 0 {
			// A large batch goes straight to snaps. What the buffer holds
			// was written before it, so it goes first: a row in snaps is
			// never a newer write than one with the same key and epoch
			// in recent.
			if _, err := f.FoldRecent(ctx); err != nil {
				return 0, fmt.Errorf("write %d rows: %w", len(rows), err)
			}
		}
		// Rows written into an empty snaps need no index entries until
		// after the write (EnsureIndex); into a non-empty one, they do.
		if !f.opts.Segment && !f.hasIndex {
			empty, err := f.snapsEmpty(ctx)
			if err != nil {
				return 0, fmt.Errorf("write %d rows to %s: %w", len(rows), f.path, err)
			}
			if !empty {
				if err := f.EnsureIndex(ctx); err != nil {
					return 0, fmt.Errorf("write %d rows: %w", len(rows), err)
				}
			}
		}
	}
	var meta map[string]string
	if newest != f.meta.LastEpoch || f.metaDirty {
		m := f.meta
		m.LastEpoch = newest
		all := m.fieldsWithCRC()
		meta = map[string]string{"last_epoch": all["last_epoch"], "committed_epoch": all["committed_epoch"], metaCRCField: all[metaCRCField]}
	}
	if err := b.write(table, rows, order, f.meta.KeyGroupCount, meta); err != nil {
		return 0, fmt.Errorf("write %d rows: %w", len(rows), err)
	}
	f.meta.LastEpoch = newest
	f.metaDirty = false
	if table == "recent" {
		f.recentRows += int64(len(rows))
	}
	return len(rows), nil
}

// Buffering limits: a batch goes to the recent table while the table stays
// under recentMaxRows and the batch is under 1/32 of the store's bytes
// (with 4 KiB pages; a fraction as much smaller as the pages are larger).
// A page holds a few dozen rows, so a batch of a few percent of the rows
// already touches most of snaps' pages: buffering it would only write it
// twice. Below that, it saves nearly a page write per row.
const (
	recentMaxRows   = 1 << 17
	recentStoreFrac = 32
)

func (f *File) fitsBuffer(rows []rowbatch.Row) bool {
	if int64(len(rows))+f.recentRows > recentMaxRows {
		return false
	}
	var size int64
	for i := range rows {
		size += int64(len(rows[i].StepID) + len(rows[i].Key) + len(rows[i].Value))
	}
	var store int64
	for _, p := range []string{f.path, f.path + "-wal"} {
		if st, err := os.Stat(p); err == nil {
			store += st.Size()
		}
	}
	frac := int64(recentStoreFrac) * int64(max(f.pageSize, 4096)) / 4096
	return size*frac <= store
}

// IndexPending reports that snaps lacks its epoch index (a local store
// after its first write): EnsureIndex should run, in the background.
func (f *File) IndexPending() bool {
	return !f.opts.Segment && !f.hasIndex
}

// EnsureIndex builds snaps' epoch index if it is missing. GC and rollback
// call it first; a store's owner calls it in the background after the
// first write.
func (f *File) EnsureIndex(ctx context.Context) error {
	if !f.IndexPending() {
		return nil
	}
	if err := f.writable(); err != nil {
		return fmt.Errorf("index: %w", err)
	}
	// The index's sort goes through temporary files, not memory: with
	// temp_store=MEMORY (the file's setting, for its statements' small
	// journals) indexing a store of 1M rows raised the process's peak
	// memory by 142 MB and took 0.96 s; through files, by 52 MB (the
	// connection's page cache, mostly) in 0.54 s. Where SQLite finds no
	// temporary directory it can write (SQLITE_TMPDIR, TMPDIR, /var/tmp,
	// /tmp: a read-only root file system) or fills it, the sort goes
	// through memory after all.
	conn, err := f.db.Conn(ctx)
	if err != nil {
		return classify(f.path, "index", fmt.Errorf("index %s: %w", f.path, err))
	}
	defer conn.Close()
	for _, store := range []string{"FILE", "MEMORY"} {
		if _, err = conn.ExecContext(ctx, `PRAGMA temp_store=`+store); err != nil {
			break
		}
		if err = f.indexFault(store); err == nil {
			_, err = conn.ExecContext(ctx, epochIndex)
		}
		// A damaged file fails the same way in memory: no second sort.
		if err == nil || ctx.Err() != nil || errors.Is(classify(f.path, "index", err), ErrDamaged) {
			break
		}
	}
	// The connection stays in the pool: its other statements go on with
	// their journals in memory.
	if _, reset := conn.ExecContext(context.Background(), `PRAGMA temp_store=MEMORY`); err == nil && reset != nil {
		err = reset
	}
	if err != nil {
		return classify(f.path, "index", fmt.Errorf("index %s: %w", f.path, err))
	}
	f.hasIndex = true
	return nil
}

// indexFault is the error tests inject into an index build with the
// given temp_store setting (nil: none).
func (f *File) indexFault(store string) error {
	if f.indexFaults == nil {
		return nil
	}
	return f.indexFaults(store)
}

func (f *File) snapsEmpty(ctx context.Context) (bool, error) {
	var n int
	err := f.db.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT 1 FROM snaps LIMIT 1)`).Scan(&n)
	return n == 0, err
}

// RecentRows is about how many rows wait in the recent table (an upper
// bound: a row written twice counts twice) until FoldRecent.
func (f *File) RecentRows() int64 { return f.recentRows }

// FoldRecent moves every row of the recent table into snaps, in one
// transaction, and returns how many moved. Done in the background after
// small writes, it takes their page writes off the writer's path.
func (f *File) FoldRecent(ctx context.Context) (int64, error) {
	if !f.hasRecent || f.recentRows == 0 {
		return 0, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("fold %s: %w", f.path, err)
	}
	if err := f.writable(); err != nil {
		return 0, fmt.Errorf("fold: %w", err)
	}
	b, err := f.rawConn()
	if err != nil {
		return 0, classify(f.path, "fold", fmt.Errorf("fold %s: %w", f.path, err))
	}
	chunk := f.foldChunk
	if chunk <= 0 {
		chunk = foldChunkRows
	}
	n, err := b.fold(chunk)
	if err != nil {
		return 0, classify(f.path, "fold", fmt.Errorf("fold: %w", err))
	}
	f.recentRows = 0
	return n, nil
}

// SortedOrder returns the indexes of rows in (step id, key, epoch) order,
// rows of one key in the order they come; see sortedOrder.
func SortedOrder(rows []rowbatch.Row) []int32 { return sortedOrder(rows) }

// sortedOrder returns the indexes of rows in (step, key, epoch) order, ties
// in arrival order so that the last of duplicate rows is written last and
// wins. Sorting indexes rather than the rows moves 4 bytes per swap instead
// of a whole row.
func sortedOrder(rows []rowbatch.Row) []int32 {
	entries := sortedEntries(rows)
	order := make([]int32, len(entries))
	for i, e := range entries {
		order[i] = e.idx
	}
	return order
}

// sortedEntries is sortedOrder's sort, returning the sorted entries
// themselves: two rows can have equal keys only where their entries'
// step and key words are equal, which spares a caller looking for
// duplicates a comparison of keys that lie scattered through the batch.
func sortedEntries(rows []rowbatch.Row) []sortEntry {
	// Rows from Python alias one large buffer in arrival order, so
	// comparing their keys directly misses the cache on nearly every
	// comparison. Sorting compact entries that carry the step's rank and
	// 16 bytes of the key keeps the sort in cache; whole keys are compared
	// only when those tie. The 16 bytes are the ones after the prefix
	// every key of the batch shares: keys such as "user:000000123" would
	// otherwise tie on their first 16 bytes and every comparison would
	// read both keys (2.2 us a row to build a segment of 100k such keys,
	// half of it comparing).
	entries := make([]sortEntry, len(rows))
	ranks := stepRanks(rows)
	skip := sharedPrefix(rows)
	var step string
	var rank int32
	for i := range rows {
		r := &rows[i]
		if i == 0 || r.StepID != step {
			step, rank = r.StepID, ranks[r.StepID]
		}
		entries[i] = sortEntry{hi: prefixWord(r.Key, skip), lo: prefixWord(r.Key, skip+8), step: rank, idx: int32(i)}
	}
	cmpEntries := func(a, b sortEntry) int {
		if c := cmp.Compare(a.step, b.step); c != 0 {
			return c
		}
		if c := cmp.Compare(a.hi, b.hi); c != 0 {
			return c
		}
		if c := cmp.Compare(a.lo, b.lo); c != 0 {
			return c
		}
		ra, rb := &rows[a.idx], &rows[b.idx]
		if len(ra.Key) > skip+16 || len(rb.Key) > skip+16 || len(ra.Key) != len(rb.Key) {
			if c := strings.Compare(ra.Key, rb.Key); c != 0 {
				return c
			}
		}
		if ra.Epoch != rb.Epoch {
			return cmp.Compare(ra.Epoch, rb.Epoch)
		}
		return cmp.Compare(a.idx, b.idx)
	}
	if len(entries) < parallelSortRows {
		slices.SortFunc(entries, cmpEntries)
	} else {
		entries = parallelSort(entries, cmpEntries)
	}
	return entries
}

// samePrefix reports whether a and b have the same step and the same
// 16 bytes of key where sortedEntries looked: only such rows can be equal.
func (a sortEntry) samePrefix(b sortEntry) bool {
	return a.step == b.step && a.hi == b.hi && a.lo == b.lo
}

// sortEntry is what sortedOrder sorts: the row's step rank and 16 bytes
// of its key, from the end of the prefix every key of the batch shares, as
// big-endian words (zero padded), so comparing the words orders keys as
// strings.Compare does up to that length.
type sortEntry struct {
	hi, lo uint64
	step   int32
	idx    int32
}

// sharedPrefix is the length of the prefix every key of rows has.
func sharedPrefix(rows []rowbatch.Row) int {
	if len(rows) == 0 {
		return 0
	}
	first := rows[0].Key
	n := len(first)
	for i := 1; i < len(rows) && n > 0; i++ {
		k := rows[i].Key
		n = min(n, len(k))
		j := 0
		for j < n && k[j] == first[j] {
			j++
		}
		n = j
	}
	return n
}

func prefixWord(key string, from int) uint64 {
	var w uint64
	for i := from; i < from+8; i++ {
		w <<= 8
		if i < len(key) {
			w |= uint64(key[i])
		}
	}
	return w
}

// stepRanks numbers the distinct step ids of rows in sorted order.
func stepRanks(rows []rowbatch.Row) map[string]int32 {
	ranks := map[string]int32{}
	var last string
	for i := range rows {
		// Batches group a step's rows together, so checking the previous
		// step id first skips nearly every map lookup.
		if s := rows[i].StepID; i == 0 || s != last {
			ranks[s] = 0
			last = s
		}
	}
	steps := make([]string, 0, len(ranks))
	for s := range ranks {
		steps = append(steps, s)
	}
	slices.Sort(steps)
	for i, s := range steps {
		ranks[s] = int32(i)
	}
	return ranks
}

// parallelSort sorts the two halves of s on two cores and merges them.
func parallelSort(s []sortEntry, cmpFn func(a, b sortEntry) int) []sortEntry {
	mid := len(s) / 2
	left, right := s[:mid], s[mid:]
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		slices.SortFunc(left, cmpFn)
	}()
	slices.SortFunc(right, cmpFn)
	wg.Wait()
	merged := make([]sortEntry, 0, len(s))
	i, j := 0, 0
	for i < len(left) && j < len(right) {
		if cmpFn(left[i], right[j]) <= 0 {
			merged = append(merged, left[i])
			i++
		} else {
			merged = append(merged, right[j])
			j++
		}
	}
	merged = append(merged, left[i:]...)
	return append(merged, right[j:]...)
}

// parallelSortRows is the batch size from which sorting uses two cores.
const parallelSortRows = 1 << 16

func insertSQL(table string, n int) string {
	var b strings.Builder
	b.WriteString(`INSERT OR REPLACE INTO ` + table + ` (step_id, state_key, epoch, key_group, value, crc) VALUES `)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?)")
	}
	return b.String()
}

// DeleteFrom removes every row with epoch >= epoch: the rollback of epochs
// that never committed. It returns how many rows went.
func (f *File) DeleteFrom(ctx context.Context, epoch int64) (int64, error) {
	n, err := f.deleteFrom(ctx, epoch)
	return n, classify(f.path, fmt.Sprintf("roll back to before epoch %d", epoch), err)
}

func (f *File) deleteFrom(ctx context.Context, epoch int64) (int64, error) {
	if err := f.writable(); err != nil {
		return 0, fmt.Errorf("roll back to before epoch %d: %w", epoch, err)
	}
	if err := f.EnsureIndex(ctx); err != nil {
		return 0, fmt.Errorf("roll back %s to before epoch %d: %w", f.path, epoch, err)
	}
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("roll back %s to before epoch %d: %w", f.path, epoch, err)
	}
	defer tx.Rollback()
	var n int64
	tables := []string{"snaps"}
	if f.hasRecent {
		tables = append(tables, "recent")
	}
	for _, t := range tables {
		res, err := tx.ExecContext(ctx, `DELETE FROM `+t+` WHERE epoch >= ?`, epoch)
		if err != nil {
			return 0, fmt.Errorf("roll back %s to before epoch %d: %w", f.path, epoch, err)
		}
		k, _ := res.RowsAffected()
		n += k
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("roll back %s to before epoch %d: %w", f.path, epoch, err)
	}
	return n, nil
}

// DropDeletions removes every deletion record, for a file that holds a
// whole state (nothing older for a deletion to hide) and is about to
// become a local store. It returns how many went.
func (f *File) DropDeletions(ctx context.Context) (int64, error) {
	if err := f.writable(); err != nil {
		return 0, fmt.Errorf("drop deletions: %w", err)
	}
	res, err := f.db.ExecContext(ctx, `DELETE FROM snaps WHERE value IS NULL`)
	if err != nil {
		return 0, classify(f.path, "drop deletions", fmt.Errorf("drop deletions from %s: %w", f.path, err))
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// GC removes rows that can never be read again once epoch committed is
// durable: every row superseded by a newer row at or before committed, and
// deletion records at or before committed (nothing older is left for them
// to hide). Only rows written after epoch since are examined as possible
// supersessors, so a GC after each commit costs what changed.
func (f *File) GC(ctx context.Context, since, committed int64) (int64, error) {
	if committed <= since {
		return 0, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("gc %s: %w", f.path, err)
	}
	if err := f.writable(); err != nil {
		return 0, fmt.Errorf("gc: %w", err)
	}
	// Supersessors may wait in the recent table: GC works on snaps, and
	// finds what was written through the epoch index.
	if _, err := f.FoldRecent(ctx); err != nil {
		return 0, fmt.Errorf("gc: %w", err)
	}
	if err := f.EnsureIndex(ctx); err != nil {
		return 0, fmt.Errorf("gc: %w", err)
	}
	b, err := f.rawConn()
	if err != nil {
		return 0, classify(f.path, "gc", fmt.Errorf("gc %s: %w", f.path, err))
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("gc %s: %w", f.path, err)
	}
	chunk := f.gcChunk
	if chunk <= 0 {
		chunk = gcChunk
	}
	n, err := b.gc(ctx, since, committed, chunk)
	if err != nil {
		return 0, classify(f.path, "gc", fmt.Errorf("gc: %w", err))
	}
	return n, nil
}

// reclaimFraction is the share of free pages past which Reclaim shrinks
// the file.
const reclaimFraction = 8

// Reclaim gives the disk back the pages GC and folding freed, once they are
// more than 1/8 of the file: SQLite keeps freed pages for reuse, so a
// store that once held more versions than now would otherwise keep their
// size for good. With all, every free page goes, whatever their share
// (closing a store: what it leaves on disk is its data). It returns how
// many pages went. Files created before incremental auto-vacuum was turned
// on keep their pages.
func (f *File) Reclaim(ctx context.Context, all bool) (int64, error) {
	if f.opts.Segment || f.writable() != nil {
		return 0, nil
	}
	n, err := f.reclaim(ctx, all)
	return n, classify(f.path, "reclaim", err)
}

func (f *File) reclaim(ctx context.Context, all bool) (int64, error) {
	var pages, free int64
	if err := f.db.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
		return 0, fmt.Errorf("reclaim %s: %w", f.path, err)
	}
	if err := f.db.QueryRowContext(ctx, `PRAGMA freelist_count`).Scan(&free); err != nil {
		return 0, fmt.Errorf("reclaim %s: %w", f.path, err)
	}
	if free == 0 || (!all && free*reclaimFraction < pages) {
		return 0, nil
	}
	// incremental_vacuum returns no row per page; run it to the end.
	rows, err := f.db.QueryContext(ctx, fmt.Sprintf(`PRAGMA incremental_vacuum(%d)`, free))
	if err != nil {
		return 0, fmt.Errorf("reclaim %s: %w", f.path, err)
	}
	for rows.Next() {
	}
	if err := rows.Close(); err != nil {
		return 0, fmt.Errorf("reclaim %s: %w", f.path, err)
	}
	var left int64
	if err := f.db.QueryRowContext(ctx, `PRAGMA freelist_count`).Scan(&left); err != nil {
		return 0, fmt.Errorf("reclaim %s: %w", f.path, err)
	}
	return free - left, nil
}

// minCheckpointBytes is the WAL size below which a local store is never
// checkpointed. Automatic checkpoints are off because they run inside a
// commit and doubled the cost of small writes; the owner checkpoints
// in the background when NeedsCheckpoint says so.
const minCheckpointBytes = 512 << 10

// NeedsCheckpoint reports whether the WAL has grown past half the file
// (and minCheckpointBytes). Checkpointing then bounds a local store's disk
// use to about 1.5 times its data. The WAL's real size is what counts: a row
// rewritten in place dirties a whole page, so row bytes say little.
func (f *File) NeedsCheckpoint() bool {
	return f.walExcess() >= 1
}

// CheckpointOverdue reports whether the WAL has grown to twice the size at
// which NeedsCheckpoint asks for a checkpoint: the background checkpoint
// is falling behind the writes, and the writer should checkpoint itself.
func (f *File) CheckpointOverdue() bool {
	return f.walExcess() >= 2
}

// walExcess is the WAL's size as a multiple of its checkpoint threshold:
// half the file, and at least minCheckpointBytes.
func (f *File) walExcess() float64 {
	if f.opts.Segment {
		return 0
	}
	wal, err := os.Stat(f.path + "-wal")
	if err != nil {
		return 0
	}
	threshold := int64(minCheckpointBytes)
	if db, err := os.Stat(f.path); err == nil {
		threshold = max(threshold, db.Size()/2)
	}
	return float64(wal.Size()) / float64(threshold)
}

// Checkpoint folds the WAL back into the file and truncates it.
func (f *File) Checkpoint(ctx context.Context) error {
	if _, err := f.db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		return classify(f.path, "checkpoint", fmt.Errorf("checkpoint %s: %w", f.path, err))
	}
	return nil
}

// CheckpointPassive copies the WAL's frames into the file over a
// connection of its own, so it runs while the file is being written (and
// may be called without serializing with the other methods). A Checkpoint
// afterwards only has the frames written meanwhile left to copy.
func (f *File) CheckpointPassive(ctx context.Context) error {
	db, err := openDB(f.path, f.opts)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", f.path, err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`); err != nil {
		return classify(f.path, "checkpoint", fmt.Errorf("checkpoint %s: %w", f.path, err))
	}
	return nil
}

// RowsAfter counts, up to limit, the rows written after epoch since: what
// a GC from since would examine. Without the epoch index (a local store
// whose first write has not been indexed yet) counting would read the
// whole table, so it reports limit instead.
func (f *File) RowsAfter(ctx context.Context, since, limit int64) (int64, error) {
	if f.IndexPending() {
		return limit, nil
	}
	var n int64
	err := f.db.QueryRowContext(ctx,
		`SELECT count(*) FROM (SELECT 1 FROM snaps WHERE epoch > ? LIMIT ?)`, since, limit).Scan(&n)
	if err != nil {
		return 0, classify(f.path, "count rows", fmt.Errorf("count rows of %s after epoch %d: %w", f.path, since, err))
	}
	return min(n+f.recentRows, limit), nil
}
