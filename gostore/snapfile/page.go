package snapfile

import "encoding/binary"

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
