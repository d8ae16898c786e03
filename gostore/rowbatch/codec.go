package rowbatch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// Magic starts every packed batch; it versions the format.
const Magic = "MPB1"

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed row batch")

// Encode packs rows (their epochs are not part of the batch; the epoch is
// given once per call) into the wire form Decode reads:
//
//	"MPB1" uvarint(count) { uvarint(len) step | uvarint(len) key | uvarint(tag) value }*
//
// where tag is 0 for a deletion and len(value)+1 otherwise.
func Encode(rows []Row) []byte {
	size := len(Magic) + binary.MaxVarintLen64
	for i := range rows {
		size += 3*binary.MaxVarintLen64 + len(rows[i].StepID) + len(rows[i].Key) + len(rows[i].Value)
	}
	buf := make([]byte, 0, size)
	buf = append(buf, Magic...)
	buf = binary.AppendUvarint(buf, uint64(len(rows)))
	for i := range rows {
		r := &rows[i]
		buf = binary.AppendUvarint(buf, uint64(len(r.StepID)))
		buf = append(buf, r.StepID...)
		buf = binary.AppendUvarint(buf, uint64(len(r.Key)))
		buf = append(buf, r.Key...)
		if r.Deleted {
			buf = binary.AppendUvarint(buf, 0)
			continue
		}
		buf = binary.AppendUvarint(buf, uint64(len(r.Value))+1)
		buf = append(buf, r.Value...)
	}
	return buf
}

// Decode unpacks a batch produced by Encode (or by the C packer in the
// extension), stamping every row with epoch. The returned rows alias buf:
// strings and values point into it, so buf must not change afterwards.
func Decode(buf []byte, epoch int64) ([]Row, error) {
	d := decoder{buf: buf}
	if len(buf) < len(Magic) || string(buf[:len(Magic)]) != Magic {
		return nil, fmt.Errorf("%w: missing %q header", ErrMalformed, Magic)
	}
	d.pos = len(Magic)
	count, err := d.uvarint("row count", "")
	if err != nil {
		return nil, err
	}
	// Each row takes at least three bytes, which bounds a lying count before
	// anything is allocated for it.
	if count > uint64(len(buf)-d.pos)/3 {
		return nil, fmt.Errorf("%w: row count %d exceeds what %d bytes can hold", ErrMalformed, count, len(buf))
	}
	rows := make([]Row, count)
	for i := range rows {
		r := &rows[i]
		r.Epoch = epoch
		step, err := d.bytes("step id", i)
		if err != nil {
			return nil, err
		}
		if len(step) == 0 {
			return nil, fmt.Errorf("%w: row %d has an empty step id", ErrMalformed, i)
		}
		key, err := d.bytes("key", i)
		if err != nil {
			return nil, err
		}
		r.StepID, r.Key = aliasString(step), aliasString(key)
		tag, err := d.uvarint("value tag", "")
		if err != nil {
			return nil, err
		}
		if tag == 0 {
			r.Deleted = true
			continue
		}
		val, err := d.take(tag-1, "value", i)
		if err != nil {
			return nil, err
		}
		r.Value = val
	}
	if d.pos != len(buf) {
		return nil, fmt.Errorf("%w: %d trailing bytes after %d rows", ErrMalformed, len(buf)-d.pos, count)
	}
	return rows, nil
}

type decoder struct {
	buf []byte
	pos int
}

// uvarint reads a varint, named what+suffix in an error (two parts, so
// that a caller never builds the name for the many reads that succeed).
func (d *decoder) uvarint(what, suffix string) (uint64, error) {
	v, n := binary.Uvarint(d.buf[d.pos:])
	if n <= 0 {
		return 0, fmt.Errorf("%w: bad %s%s varint at byte %d", ErrMalformed, what, suffix, d.pos)
	}
	d.pos += n
	return v, nil
}

func (d *decoder) take(n uint64, what string, row int) ([]byte, error) {
	if n > uint64(len(d.buf)-d.pos) {
		return nil, fmt.Errorf("%w: row %d %s of %d bytes overruns the batch at byte %d", ErrMalformed, row, what, n, d.pos)
	}
	b := d.buf[d.pos : d.pos+int(n) : d.pos+int(n)]
	d.pos += int(n)
	return b, nil
}

func (d *decoder) bytes(what string, row int) ([]byte, error) {
	n, err := d.uvarint(what, " length")
	if err != nil {
		return nil, err
	}
	return d.take(n, what, row)
}

// aliasString views b as a string without copying. Safe because Decode's
// contract forbids changing buf after the call.
func aliasString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
