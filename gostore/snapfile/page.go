package snapfile

import (
	"encoding/binary"
	"errors"
)

// page accumulates the newest version of each key of a scan in one buffer,
// so a page of thousands of keys costs a few allocations rather than two
// per key. Entries are
//
//	uvarint(len) key | uvarint(epoch) | uvarint(tag) value
//
// with tag 0 for a deletion and len(value)+1 otherwise.
type page struct {
	buf    []byte
	starts []int
}

func (p *page) add(key []byte, epoch int64, val []byte, deleted bool) {
	p.starts = append(p.starts, len(p.buf))
	p.buf = binary.AppendUvarint(p.buf, uint64(len(key)))
	p.buf = append(p.buf, key...)
	p.buf = binary.AppendUvarint(p.buf, uint64(epoch))
	if deleted {
		p.buf = binary.AppendUvarint(p.buf, 0)
		return
	}
	p.buf = binary.AppendUvarint(p.buf, uint64(len(val))+1)
	p.buf = append(p.buf, val...)
}

func (p *page) dropLast() {
	n := len(p.starts) - 1
	p.buf = p.buf[:p.starts[n]]
	p.starts = p.starts[:n]
}

// key returns entry i's key, aliasing the buffer.
func (p *page) key(i int) []byte {
	b := p.buf[p.starts[i]:]
	n, w := binary.Uvarint(b)
	return b[w : w+int(n)]
}

// entry decodes entry i; key and val alias the buffer.
func (p *page) entry(i int) (key []byte, epoch int64, val []byte, deleted bool) {
	b := p.buf[p.starts[i]:]
	n, w := binary.Uvarint(b)
	key, b = b[w:w+int(n)], b[w+int(n):]
	e, w := binary.Uvarint(b)
	b = b[w:]
	tag, w := binary.Uvarint(b)
	if tag == 0 {
		return key, int64(e), nil, true
	}
	return key, int64(e), b[w : w+int(tag-1)], false
}

// pack returns uvarint(count) followed by the entries, leaving out
// deletions unless asked for.
func (p *page) pack(withDeleted bool) []byte {
	count := 0
	size := 0
	for i := range p.starts {
		end := len(p.buf)
		if i+1 < len(p.starts) {
			end = p.starts[i+1]
		}
		if !withDeleted {
			if _, _, _, del := p.entry(i); del {
				continue
			}
		}
		count++
		size += end - p.starts[i]
	}
	out := make([]byte, 0, size+binary.MaxVarintLen64)
	out = binary.AppendUvarint(out, uint64(count))
	if count == len(p.starts) {
		return append(out, p.buf...)
	}
	for i := range p.starts {
		end := len(p.buf)
		if i+1 < len(p.starts) {
			end = p.starts[i+1]
		}
		if _, _, _, del := p.entry(i); del {
			continue
		}
		out = append(out, p.buf[p.starts[i]:end]...)
	}
	return out
}

// PackedEntry is an entry for MergePacked: one key's newest row.
type PackedEntry struct {
	Key     string
	Epoch   int64
	Value   []byte
	Deleted bool
}

// MergePacked returns a packed page (GetManyPacked's format) of the
// entries of packed and of extra, in key order. extra must be sorted by
// key and share no key with packed. A malformed packed page is an error.
func MergePacked(packed []byte, extra []PackedEntry) ([]byte, error) {
	n, w := binary.Uvarint(packed)
	if w <= 0 {
		return nil, errMalformedPage
	}
	b := packed[w:]
	// Where each entry of packed starts and ends, and its key.
	type span struct {
		key        string
		start, end int
	}
	spans := make([]span, 0, n)
	off := w
	for range n {
		kl, kw := binary.Uvarint(b)
		if kw <= 0 || kl > uint64(len(b)-kw) {
			return nil, errMalformedPage
		}
		key := string(b[kw : kw+int(kl)])
		rest := b[kw+int(kl):]
		_, ew := binary.Uvarint(rest)
		if ew <= 0 {
			return nil, errMalformedPage
		}
		tag, tw := binary.Uvarint(rest[ew:])
		if tw <= 0 || (tag > 0 && tag-1 > uint64(len(rest)-ew-tw)) {
			return nil, errMalformedPage
		}
		size := kw + int(kl) + ew + tw
		if tag > 0 {
			size += int(tag - 1)
		}
		spans = append(spans, span{key, off, off + size})
		off += size
		b = b[size:]
	}
	if len(b) != 0 {
		return nil, errMalformedPage
	}
	p := &page{buf: make([]byte, 0, len(packed))}
	i := 0
	for _, e := range extra {
		for ; i < len(spans) && spans[i].key < e.Key; i++ {
			p.starts = append(p.starts, len(p.buf))
			p.buf = append(p.buf, packed[spans[i].start:spans[i].end]...)
		}
		p.add([]byte(e.Key), e.Epoch, e.Value, e.Deleted)
	}
	for ; i < len(spans); i++ {
		p.starts = append(p.starts, len(p.buf))
		p.buf = append(p.buf, packed[spans[i].start:spans[i].end]...)
	}
	return p.pack(true), nil
}

var errMalformedPage = errors.New("malformed packed page")
