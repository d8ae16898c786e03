package snapfile

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// Build writes a new large segment (Options{Segment, LargePages}) at path
// holding meta and rows, and opens it: the file Create and Write would
// leave, made without SQLite (see Builder). Among rows with the same
// (step, key, epoch) the last one wins, as in Write.
func Build(ctx context.Context, path string, meta Meta, o Options, rows []rowbatch.Row) (*File, error) {
	bl, err := NewBuilder(path, meta, o)
	if err != nil {
		return nil, err
	}
	sorted := sortedEntries(rows)
	for i, e := range sorted {
		if i+1 < len(sorted) && e.samePrefix(sorted[i+1]) && rowCompare(&rows[e.idx], &rows[sorted[i+1].idx]) == 0 {
			continue // the last of equal keys wins, as INSERT OR REPLACE
		}
		if i%8192 == 0 {
			if err := ctx.Err(); err != nil {
				bl.Abort()
				return nil, fmt.Errorf("build snapshot file %s: %w", path, err)
			}
		}
		// In the sort's order, each once: the order check Add makes on
		// rows from elsewhere (two key comparisons a row, among rows
		// scattered through the batch) is not needed.
		if err := bl.put(&rows[e.idx]); err != nil {
			bl.Abort()
			return nil, fmt.Errorf("build snapshot file %s: %w", path, err)
		}
	}
	return bl.Finish(ctx)
}

// Builder writes a new large segment or compacted object (Options{Segment,
// LargePages}) from rows given in key order, and opens it: the file Create
// and Write would leave, made without SQLite. A whole-state epoch's
// segment holds a row per key and is written every epoch, and a compacted
// object holds the whole state; through INSERTs a row cost 2.0-2.1 us in
// SQLite's B-tree code (as modernc compiles it), most of a recovery run's
// background CPU. Here each row is checksummed, encoded as an SQLite
// record and laid into B-tree pages bottom-up, left to right, each page
// filled, at a few hundred nanoseconds a row; SQLite reads the result as
// its own (the tests hold it to PRAGMA integrity_check and to the rows
// SQLite's own writes store), and later writes to the file go through
// SQLite as before.
//
// The file is SQLite's format 4 with the pages and incremental auto-vacuum
// (pointer-map pages) of a large segment, so that a local store that
// adopts a copy of it as a generation can still give freed pages back.
// A file that would reach SQLite's lock-byte page at 1 GiB is refused with
// ErrTooLarge (Create and Write serve those). Any error leaves nothing at
// path.
type Builder struct {
	path  string
	meta  Meta
	opts  Options
	fh    *os.File
	b     *builder
	snaps *btree
	// last is the row added last (has is false before the first): the
	// next must come after it.
	last    rowbatch.Row
	has     bool
	payload []byte
}

// NewBuilder creates the file at path (it must not exist) for rows added
// with Add and completed by Finish.
func NewBuilder(path string, meta Meta, o Options) (*Builder, error) {
	if !o.Segment || !o.LargePages || o.ReadOnly {
		return nil, fmt.Errorf("build snapshot file %s: only large segments are built", path)
	}
	if err := keygroup.Validate(meta.KeyGroupCount, meta.WorkerIndex, meta.WorkerCount); err != nil {
		return nil, fmt.Errorf("build snapshot file %s: %w", path, err)
	}
	fh, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("build snapshot file %s: already exists", path)
	}
	if err != nil {
		return nil, fmt.Errorf("build snapshot file %s: %w", path, err)
	}
	b := newBuilder(fh, LargePageSize)
	if o.BuildPageLimit > 0 {
		b.pending = min(b.pending, uint32(o.BuildPageLimit))
	}
	return &Builder{path: path, meta: meta, opts: o, fh: fh, b: b, snaps: &btree{b: b}}, nil
}

// Add appends rows, which must follow each other, and the rows added
// before, in (step, key, epoch) order: a row out of that order fails the
// build (it would make a B-tree SQLite cannot search).
func (bl *Builder) Add(ctx context.Context, rows []rowbatch.Row) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("build snapshot file %s: %w", bl.path, err)
	}
	for i := range rows {
		if err := bl.add(&rows[i]); err != nil {
			return fmt.Errorf("build snapshot file %s: %w", bl.path, err)
		}
	}
	return nil
}

func (bl *Builder) add(r *rowbatch.Row) error {
	if bl.has && rowCompare(&bl.last, r) >= 0 {
		return fmt.Errorf("row %q/%q@%d added after %q/%q@%d: rows must be in key order, each once",
			r.StepID, r.Key, r.Epoch, bl.last.StepID, bl.last.Key, bl.last.Epoch)
	}
	return bl.put(r)
}

// put lays out r, which follows the row before in key order.
func (bl *Builder) put(r *rowbatch.Row) error {
	b := bl.b
	group := int64(keygroup.Of(r.Key, bl.meta.KeyGroupCount))
	sum := rowCRC(&b.crc, strBytes(r.StepID), strBytes(r.Key), r.Epoch, group, r.Deleted, r.Value)
	bl.payload = appendSnapRecord(bl.payload[:0], r, group, int64(sum))
	c, err := b.indexCell(bl.payload)
	if err != nil {
		return err
	}
	if err := bl.snaps.add(0, c); err != nil {
		return err
	}
	bl.meta.LastEpoch = max(bl.meta.LastEpoch, r.Epoch)
	bl.last, bl.has = rowbatch.Row{StepID: r.StepID, Key: r.Key, Epoch: r.Epoch}, true
	return nil
}

// Finish completes the file and opens it (LastEpoch in its metadata
// advanced to the newest row's epoch, as Write does).
func (bl *Builder) Finish(ctx context.Context) (*File, error) {
	err := bl.b.finish(bl.snaps, bl.meta)
	if cerr := bl.fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(bl.path)
		return nil, fmt.Errorf("build snapshot file %s: %w", bl.path, err)
	}
	f, err := Open(ctx, bl.path, bl.opts)
	if err != nil {
		os.Remove(bl.path)
		return nil, fmt.Errorf("build snapshot file %s: %w", bl.path, err)
	}
	return f, nil
}

// Abort stops the build and removes the file.
func (bl *Builder) Abort() {
	bl.fh.Close()
	os.Remove(bl.path)
}

// rowCompare orders rows as the snaps table does: by step, key (bytes,
// as SQLite's BINARY collation compares text) and epoch.
func rowCompare(a, c *rowbatch.Row) int {
	if x := strings.Compare(a.StepID, c.StepID); x != 0 {
		return x
	}
	if x := strings.Compare(a.Key, c.Key); x != 0 {
		return x
	}
	return cmp.Compare(a.Epoch, c.Epoch)
}

// ErrTooLarge is wrapped by Build, and by a Builder's Add or Finish, for
// rows that would make a file of 1 GiB or more.
var ErrTooLarge = errors.New("too large to build without SQLite")

// The pages a built file reserves: the schema, the first pointer-map page
// and the two tables' roots. In auto-vacuum mode root pages come first,
// as SQLite keeps them.
const (
	schemaPage  = 1
	metaRoot    = 3
	snapsRoot   = 4
	firstFree   = 5
	fileHdrSize = 100
)

// SQLite's B-tree page types and pointer-map entry types.
const (
	pageIndexInterior = 0x02
	pageIndexLeaf     = 0x0a
	pageTableLeaf     = 0x0d

	ptrRoot      = 1
	ptrOverflow1 = 3
	ptrOverflow2 = 4
	ptrBtree     = 5
)

// builder lays pages out in page-number order: each page is written once,
// when it is complete (a B-tree page) or allocated (an overflow page), and
// the reserved pages and pointer maps, whose contents are known last, are
// written in place at the end.
type builder struct {
	fh   *os.File
	w    *bufio.Writer
	size int    // page size (all of it usable: no reserved bytes)
	next uint32 // the next page number to hand out
	// written counts the pages the buffered writer has been given.
	written uint32
	// ptr[p] is page p's pointer-map entry (type, parent); ptr[p][0] == 0
	// for pages without one.
	ptr  [][2]uint32
	page []byte // scratch for one page
	// maxLocal and minLocal bound the payload an index cell keeps on its
	// page (SQLite's BtShared.maxLocal and minLocal for index pages).
	maxLocal, minLocal int
	// the lock-byte page (SQLite's PENDING_BYTE page), never used
	pending uint32
	arena   []byte // where cells are cut from (alloc)
	// reserved holds the roots' pages until the end.
	reserved map[uint32][]byte
	crc      [25]byte
}

func newBuilder(fh *os.File, size int) *builder {
	return &builder{
		fh: fh, w: bufio.NewWriterSize(fh, 1<<20), size: size, next: firstFree, written: 0,
		page:     make([]byte, size),
		maxLocal: (size-12)*64/255 - 23,
		minLocal: (size-12)*32/255 - 23,
		pending:  uint32(0x40000000/size) + 1,
		reserved: map[uint32][]byte{},
	}
}

// ptrmapPage is the pointer-map page that holds p's entry (SQLite's
// ptrmapPageno); p is a pointer-map page itself when the two are equal.
func (b *builder) ptrmapPage(p uint32) uint32 {
	per := uint32(b.size/5) + 1
	return (p-2)/per*per + 2
}

// allocPage hands out the next page number, skipping pointer-map pages
// (the writer fills their places with zeros for now).
func (b *builder) allocPage() (uint32, error) {
	for {
		p := b.next
		if p >= b.pending {
			return 0, ErrTooLarge
		}
		b.next++
		if b.ptrmapPage(p) != p {
			return p, nil
		}
	}
}

// alloc returns n bytes for a cell from a chunk shared by many: one
// allocation a row was a sixth of Build's time (the allocator and the
// collector's scans).
func (b *builder) alloc(n int) []byte {
	if len(b.arena) < n {
		b.arena = make([]byte, max(n, 256<<10))
	}
	s := b.arena[:n:n]
	b.arena = b.arena[n:]
	return s
}

// setPtr records page p's pointer-map entry.
func (b *builder) setPtr(p uint32, kind byte, parent uint32) {
	for uint32(len(b.ptr)) <= p {
		b.ptr = append(b.ptr, make([][2]uint32, max(len(b.ptr), 64))...)
	}
	b.ptr[p] = [2]uint32{uint32(kind), parent}
}

// put writes page p, which must be the lowest page not yet written once
// the pages before it (reserved ones and pointer maps: zeros for now) are.
func (b *builder) put(p uint32, data []byte) error {
	if err := b.pad(p - 1); err != nil {
		return err
	}
	if b.written+1 != p {
		return fmt.Errorf("page %d written out of order (after %d)", p, b.written)
	}
	if _, err := b.w.Write(data); err != nil {
		return err
	}
	b.written++
	return nil
}

// pad writes zero pages up to page n (those written in place later).
func (b *builder) pad(n uint32) error {
	var zero []byte
	for b.written < n {
		if zero == nil {
			zero = make([]byte, b.size)
		}
		if _, err := b.w.Write(zero); err != nil {
			return err
		}
		b.written++
	}
	return nil
}

// putAt writes page p in place (a reserved page or a pointer map), after
// the sequential pages are flushed.
func (b *builder) putAt(p uint32, data []byte) error {
	_, err := b.fh.WriteAt(data, int64(p-1)*int64(b.size))
	return err
}

// cell is an index cell under construction: its bytes from the payload
// size on (an interior cell puts the left child's page number before
// them), and its first overflow page (0: none), whose pointer-map entry
// names the page the cell lands on.
type cell struct {
	body  []byte
	child uint32
	ovfl  uint32
}

// level is the page under construction at one height of the B-tree (0:
// the leaves).
type level struct {
	cells []cell
	used  int // bytes the cells and their pointers take
}

func (l *level) bytes(interior bool) int {
	if interior {
		return l.used + 4*len(l.cells)
	}
	return l.used
}

// btree builds an index B-tree from cells fed in key order, into pages
// written as they fill; finish puts the root on root.
type btree struct {
	b      *builder
	levels []*level
}

func (t *btree) add(h int, c cell) error {
	if h == len(t.levels) {
		t.levels = append(t.levels, &level{})
	}
	l := t.levels[h]
	interior := h > 0
	hdr := 8
	if interior {
		hdr = 12
	}
	need := len(c.body) + 2
	if interior {
		need += 4
	}
	if len(l.cells) > 1 && hdr+l.bytes(interior)+need > t.b.size {
		// The page is full. Its last cell goes up as the divider between
		// it and the next page, which starts with c: no page is left
		// empty, and keys stay in order (the page's keys, the divider,
		// then the next page's).
		last := l.cells[len(l.cells)-1]
		l.cells = l.cells[:len(l.cells)-1]
		l.used -= len(last.body) + 2
		p, err := t.b.allocPage()
		if err != nil {
			return err
		}
		if err := t.b.writeIndexPage(p, l.cells, interior, last.child); err != nil {
			return err
		}
		l.cells, l.used = l.cells[:0], 0
		if err := t.add(h+1, cell{body: last.body, child: p, ovfl: last.ovfl}); err != nil {
			return err
		}
	}
	l.cells = append(l.cells, c)
	l.used += len(c.body) + 2
	return nil
}

// finish writes the pages still open, bottom up, each the right-most
// child of the one above, and the top one on root.
func (t *btree) finish(root uint32) error {
	if len(t.levels) == 0 {
		t.levels = append(t.levels, &level{})
	}
	var right uint32
	for h, l := range t.levels {
		p := root
		if h < len(t.levels)-1 {
			var err error
			if p, err = t.b.allocPage(); err != nil {
				return err
			}
		}
		if err := t.b.writeIndexPage(p, l.cells, h > 0, right); err != nil {
			return err
		}
		right = p
	}
	return nil
}

// writeIndexPage lays cells out on page p (an interior page gets right as
// its right-most child) and records the pointer-map entries of what p
// points to. The root (p reserved) is written in place later.
func (b *builder) writeIndexPage(p uint32, cells []cell, interior bool, right uint32) error {
	pg := b.page
	clear(pg)
	hdr := 8
	pg[0] = pageIndexLeaf
	if interior {
		hdr = 12
		pg[0] = pageIndexInterior
		binary.BigEndian.PutUint32(pg[8:], right)
		b.setPtr(right, ptrBtree, p)
	}
	binary.BigEndian.PutUint16(pg[3:], uint16(len(cells)))
	top := b.size
	for i, c := range cells {
		n := len(c.body)
		if interior {
			n += 4
		}
		top -= n
		if interior {
			binary.BigEndian.PutUint32(pg[top:], c.child)
			copy(pg[top+4:], c.body)
			b.setPtr(c.child, ptrBtree, p)
		} else {
			copy(pg[top:], c.body)
		}
		if c.ovfl != 0 {
			b.setPtr(c.ovfl, ptrOverflow1, p)
		}
		binary.BigEndian.PutUint16(pg[hdr+2*i:], uint16(top))
	}
	if top < hdr+2*len(cells) {
		return fmt.Errorf("page %d overfilled (%d cells)", p, len(cells))
	}
	// (65536 would be written as 0; pages here are smaller)
	binary.BigEndian.PutUint16(pg[5:], uint16(top))
	if p == metaRoot || p == snapsRoot {
		// A root is written in place at the end; its pointer-map entry
		// says it is one. Any other page's entry names its parent, which
		// is written after it and records it then.
		b.setPtr(p, ptrRoot, 0)
		b.reserved[p] = append([]byte(nil), pg...)
		return nil
	}
	return b.put(p, pg)
}

// indexCell encodes payload as an index cell (leaf form; an interior one
// adds the child in front), writing what does not fit on the page to a
// chain of overflow pages.
func (b *builder) indexCell(payload []byte) (cell, error) {
	local := len(payload)
	if local > b.maxLocal {
		surplus := b.minLocal + (len(payload)-b.minLocal)%(b.size-4)
		local = b.minLocal
		if surplus <= b.maxLocal {
			local = surplus
		}
	}
	n := varintLen(uint64(len(payload))) + local
	if local < len(payload) {
		n += 4
	}
	body := b.alloc(n)[:0]
	body = appendVarint(body, uint64(len(payload)))
	body = append(body, payload[:local]...)
	if local == len(payload) {
		return cell{body: body}, nil
	}
	first, err := b.allocPage()
	if err != nil {
		return cell{}, err
	}
	body = binary.BigEndian.AppendUint32(body, first)
	rest, p := payload[local:], first
	for len(rest) > 0 {
		n := min(len(rest), b.size-4)
		var next uint32
		if len(rest) > n {
			if next, err = b.allocPage(); err != nil {
				return cell{}, err
			}
			b.setPtr(next, ptrOverflow2, p)
		}
		pg := b.page
		clear(pg)
		binary.BigEndian.PutUint32(pg, next)
		copy(pg[4:], rest[:n])
		if err := b.put(p, pg); err != nil {
			return cell{}, err
		}
		rest, p = rest[n:], next
	}
	return cell{body: body, ovfl: first}, nil
}

// finish writes the rest of the file once snaps has every row: the
// open pages of its B-tree, the metadata's, then the pages whose contents
// were known last.
func (b *builder) finish(snaps *btree, meta Meta) error {
	if err := snaps.finish(snapsRoot); err != nil {
		return err
	}
	metaTree := &btree{b: b}
	for _, kv := range sortedFields(meta.fieldsWithCRC()) {
		c, err := b.indexCell(appendTextRecord(nil, kv[0], kv[1]))
		if err != nil {
			return err
		}
		if err := metaTree.add(0, c); err != nil {
			return err
		}
	}
	if err := metaTree.finish(metaRoot); err != nil {
		return err
	}
	last := max(b.next-1, snapsRoot)
	if err := b.pad(last); err != nil {
		return err
	}
	if err := b.w.Flush(); err != nil {
		return err
	}
	for _, p := range []uint32{metaRoot, snapsRoot} {
		if err := b.putAt(p, b.reserved[p]); err != nil {
			return err
		}
	}
	if err := b.writePtrmaps(last); err != nil {
		return err
	}
	return b.putAt(schemaPage, b.schemaPage(last))
}

// sortedFields returns fields as (name, value) pairs in name order, the
// meta table's key order.
func sortedFields(fields map[string]string) [][2]string {
	out := make([][2]string, 0, len(fields))
	for k, v := range fields {
		out = append(out, [2]string{k, v})
	}
	slices.SortFunc(out, func(a, c [2]string) int { return strings.Compare(a[0], c[0]) })
	return out
}

// writePtrmaps writes every pointer-map page up to page last.
func (b *builder) writePtrmaps(last uint32) error {
	per := uint32(b.size / 5)
	pg := make([]byte, b.size)
	for m := uint32(2); m <= last; m += per + 1 {
		clear(pg)
		for q := m + 1; q <= min(last, m+per); q++ {
			if int(q) >= len(b.ptr) || b.ptr[q][0] == 0 {
				return fmt.Errorf("page %d has no pointer-map entry", q)
			}
			o := 5 * (q - m - 1)
			pg[o] = byte(b.ptr[q][0])
			binary.BigEndian.PutUint32(pg[o+1:], b.ptr[q][1])
		}
		if err := b.putAt(m, pg); err != nil {
			return err
		}
	}
	return nil
}

// schemaPage is page 1: the file header, then sqlite_schema's one leaf
// with the two tables.
func (b *builder) schemaPage(last uint32) []byte {
	pg := make([]byte, b.size)
	copy(pg, "SQLite format 3\x00")
	binary.BigEndian.PutUint16(pg[16:], uint16(b.size))
	pg[18], pg[19] = 1, 1                  // rollback journal (a local store switches to WAL)
	pg[21], pg[22], pg[23] = 64, 32, 32    // payload fractions, fixed by the format
	binary.BigEndian.PutUint32(pg[24:], 1) // change counter
	binary.BigEndian.PutUint32(pg[28:], last)
	binary.BigEndian.PutUint32(pg[40:], 1)         // schema cookie
	binary.BigEndian.PutUint32(pg[44:], 4)         // schema format
	binary.BigEndian.PutUint32(pg[52:], snapsRoot) // largest root page: auto-vacuum on
	binary.BigEndian.PutUint32(pg[56:], 1)         // UTF-8
	binary.BigEndian.PutUint32(pg[64:], 1)         // incremental vacuum
	binary.BigEndian.PutUint32(pg[92:], 1)         // the change counter the page count is valid for
	binary.BigEndian.PutUint32(pg[96:], sqlite3.SQLITE_VERSION_NUMBER)
	tables := []struct {
		name string
		root uint32
		sql  string
	}{{"meta", metaRoot, metaTableSQL}, {"snaps", snapsRoot, snapsTableSQL}}
	h := fileHdrSize
	pg[h] = pageTableLeaf
	binary.BigEndian.PutUint16(pg[h+3:], uint16(len(tables)))
	top := b.size
	for i, t := range tables {
		rec := appendSchemaRecord(nil, t.name, t.root, t.sql)
		c := appendVarint(nil, uint64(len(rec)))
		c = appendVarint(c, uint64(i+1)) // rowid
		c = append(c, rec...)
		top -= len(c)
		copy(pg[top:], c)
		binary.BigEndian.PutUint16(pg[h+8+2*i:], uint16(top))
	}
	binary.BigEndian.PutUint16(pg[h+5:], uint16(top))
	return pg
}
