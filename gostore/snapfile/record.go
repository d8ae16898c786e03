package snapfile

import "github.com/millpond/millpond/gostore/rowbatch"

// SQLite's record format, for Build: a header (its own length, then a
// serial type per column) and the columns' bodies. SQLite's varints are
// big-endian, seven bits a byte, the ninth byte whole.

// appendVarint appends v as an SQLite varint.
func appendVarint(dst []byte, v uint64) []byte {
	if v <= 0x7f {
		return append(dst, byte(v))
	}
	if v > 0x00ffffffffffffff {
		var buf [9]byte
		buf[8] = byte(v)
		v >>= 8
		for i := 7; i >= 0; i-- {
			buf[i] = byte(v&0x7f) | 0x80
			v >>= 7
		}
		return append(dst, buf[:]...)
	}
	var buf [9]byte
	n := 0
	for {
		buf[n] = byte(v&0x7f) | 0x80
		n++
		v >>= 7
		if v == 0 {
			break
		}
	}
	buf[0] &= 0x7f
	for i := n - 1; i >= 0; i-- {
		dst = append(dst, buf[i])
	}
	return dst
}

// varintLen is how many bytes appendVarint writes for v.
func varintLen(v uint64) int {
	if v > 0x00ffffffffffffff {
		return 9
	}
	n := 1
	for v > 0x7f {
		v >>= 7
		n++
	}
	return n
}

// intType is the serial type SQLite gives integer v (format 4: 0 and 1
// have types of their own, with no body) and the length of its body.
func intType(v int64) (uint64, int) {
	u := uint64(v)
	if v < 0 {
		u = ^u
	}
	switch {
	case u <= 127:
		if v == 0 || v == 1 {
			return 8 + uint64(v), 0
		}
		return 1, 1
	case u <= 32767:
		return 2, 2
	case u <= 8388607:
		return 3, 3
	case u <= 2147483647:
		return 4, 4
	case u <= 0x00007fffffffffff:
		return 5, 6
	}
	return 6, 8
}

// appendInt appends the n-byte big-endian body of v.
func appendInt(dst []byte, v int64, n int) []byte {
	for i := n - 1; i >= 0; i-- {
		dst = append(dst, byte(uint64(v)>>(8*i)))
	}
	return dst
}

// appendHeader appends a record header for the serial types.
func appendHeader(dst []byte, types ...uint64) []byte {
	n := 0
	for _, t := range types {
		n += varintLen(t)
	}
	size := n + 1
	for varintLen(uint64(size))+n != size {
		size = n + varintLen(uint64(size))
	}
	dst = appendVarint(dst, uint64(size))
	for _, t := range types {
		dst = appendVarint(dst, t)
	}
	return dst
}

func textType(s string) uint64 { return 13 + 2*uint64(len(s)) }

// appendSnapRecord appends row r's record in the snaps table's column
// order (the primary key's columns come first, as a WITHOUT ROWID table
// stores them): step_id, state_key, epoch, key_group, value, crc.
func appendSnapRecord(dst []byte, r *rowbatch.Row, group, crc int64) []byte {
	et, en := intType(r.Epoch)
	gt, gn := intType(group)
	ct, cn := intType(crc)
	vt := uint64(0) // NULL: a deletion
	if !r.Deleted {
		vt = 12 + 2*uint64(len(r.Value))
	}
	dst = appendHeader(dst, textType(r.StepID), textType(r.Key), et, gt, vt, ct)
	dst = append(dst, r.StepID...)
	dst = append(dst, r.Key...)
	dst = appendInt(dst, r.Epoch, en)
	dst = appendInt(dst, group, gn)
	if !r.Deleted {
		dst = append(dst, r.Value...)
	}
	return appendInt(dst, crc, cn)
}

// appendTextRecord appends a record of text columns.
func appendTextRecord(dst []byte, cols ...string) []byte {
	types := make([]uint64, len(cols))
	for i, c := range cols {
		types[i] = textType(c)
	}
	dst = appendHeader(dst, types...)
	for _, c := range cols {
		dst = append(dst, c...)
	}
	return dst
}

// appendSchemaRecord appends a row of sqlite_schema for table name:
// (type, name, tbl_name, rootpage, sql).
func appendSchemaRecord(dst []byte, name string, root uint32, sql string) []byte {
	rt, rn := intType(int64(root))
	dst = appendHeader(dst, textType("table"), textType(name), textType(name), rt, textType(sql))
	dst = append(dst, "table"...)
	dst = append(dst, name...)
	dst = append(dst, name...)
	dst = appendInt(dst, int64(root), rn)
	return append(dst, sql...)
}
