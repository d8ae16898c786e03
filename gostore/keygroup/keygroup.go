// Package keygroup maps state keys to key groups and key groups to workers.
//
// A key's group is crc32(IEEE) of its UTF-8 bytes modulo the flow's
// key-group count. Worker w of n owns the contiguous range of groups g with
// g*n/count == w. The Python package (millpond.keygroup) computes the same
// values with zlib.crc32, so live routing and state restore always agree.
package keygroup

import (
	"fmt"
	"hash/crc32"
	"unsafe"
)

// DefaultCount is the key-group count used when a flow does not choose one.
const DefaultCount = 256

// Of returns the key group of key among count groups.
func Of(key string, count int) int {
	// Viewing the string's bytes in place avoids a copy per key on the
	// snapshot path; crc32 only reads them.
	b := unsafe.Slice(unsafe.StringData(key), len(key))
	return int(crc32.ChecksumIEEE(b) % uint32(count))
}

// Owner returns the worker (of workerCount) that owns group.
func Owner(group, count, workerCount int) int {
	return group * workerCount / count
}

// Range is a half-open range [Lo, Hi) of key groups.
type Range struct {
	Lo, Hi int
}

// Contains reports whether group g is in the range.
func (r Range) Contains(g int) bool { return g >= r.Lo && g < r.Hi }

// OwnedBy returns the groups worker owns among workerCount workers.
func OwnedBy(worker, workerCount, count int) Range {
	// The smallest g with g*n/count >= w is ceil(w*count/n).
	lo := (worker*count + workerCount - 1) / workerCount
	hi := ((worker+1)*count + workerCount - 1) / workerCount
	return Range{Lo: lo, Hi: hi}
}

// Validate checks that a key-group count and a worker layout fit together.
func Validate(count, worker, workerCount int) error {
	switch {
	case count < 1:
		return fmt.Errorf("key-group count must be at least 1, got %d", count)
	case workerCount < 1:
		return fmt.Errorf("worker count must be at least 1, got %d", workerCount)
	case workerCount > count:
		return fmt.Errorf("worker count %d exceeds the key-group count %d; raise the key-group count", workerCount, count)
	case worker < 0 || worker >= workerCount:
		return fmt.Errorf("worker index %d out of range for %d workers", worker, workerCount)
	}
	return nil
}
