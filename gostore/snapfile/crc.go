package snapfile

import (
	"encoding/binary"
	"hash/crc32"
	"slices"
	"strconv"
	"unsafe"
)

// castagnoli is CRC-32C, which amd64 and arm64 compute in hardware: a row
// checksum costs far less than the SQLite work around it.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// rowCRC is the checksum a row carries: CRC-32C over its epoch, key group,
// deletion flag and the lengths of its step id and key (fixed-width, so no
// two rows encode alike), then the step id, key and value. It covers every
// column, so a flipped bit anywhere in a row's cell shows, whichever column
// it hit.
//
// hdr is scratch space for the fixed-width part: the caller's, because a
// local array would escape to the heap (crc32.Update keeps no reference,
// but the compiler cannot tell) and cost an allocation per row.
func rowCRC(hdr *[25]byte, step, key []byte, epoch, group int64, deleted bool, value []byte) uint32 {
	binary.LittleEndian.PutUint64(hdr[0:], uint64(epoch))
	binary.LittleEndian.PutUint64(hdr[8:], uint64(group))
	binary.LittleEndian.PutUint32(hdr[16:], uint32(len(step)))
	binary.LittleEndian.PutUint32(hdr[20:], uint32(len(key)))
	hdr[24] = 0
	if deleted {
		hdr[24] = 1
	}
	c := crc32.Update(0, castagnoli, hdr[:])
	c = crc32.Update(c, castagnoli, step)
	c = crc32.Update(c, castagnoli, key)
	if !deleted {
		c = crc32.Update(c, castagnoli, value)
	}
	return c
}

// strBytes views s as bytes without copying, for checksumming only.
func strBytes(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// metaCRCField names the metadata entry holding the checksum of the others.
const metaCRCField = "meta_crc"

// metaCRC is the checksum of metadata fields (all but metaCRCField), in
// name order, each name and value NUL-terminated: a flipped bit in any
// name or value, or a lost entry, changes it.
func metaCRC(fields map[string]string) string {
	names := make([]string, 0, len(fields))
	for k := range fields {
		if k != metaCRCField {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	var c uint32
	for _, k := range names {
		c = crc32.Update(c, castagnoli, append(append([]byte(k), 0), append([]byte(fields[k]), 0)...))
	}
	return strconv.FormatUint(uint64(c), 10)
}
