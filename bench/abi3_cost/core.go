// Package main is the Go half of the abi3 cost experiment: two trivial
// exported functions called from abi3bench.c the way pybindings calls the
// Go core (plain C values in, an int out, the GIL released around the call).
package main

/*
#cgo LDFLAGS: -Wl,--unresolved-symbols=ignore-all
#include <stddef.h>
*/
import "C"

import "unsafe"

var sink uint64

// bench_call stands for a handle call such as store_get: it looks at its
// arguments and returns an int.
//
//export bench_call
func bench_call(h C.ulonglong, step *C.char, sl C.size_t, key *C.char, kl C.size_t) C.longlong {
	k := unsafe.Slice((*byte)(unsafe.Pointer(key)), int(kl))
	n := uint64(h) + uint64(sl) + uint64(kl)
	if len(k) > 0 {
		n += uint64(k[0])
	}
	return C.longlong(n)
}

// bench_take stands for store_write: it reads the packed buffer once (so the
// buffer is really handed over) and returns its length.
//
//export bench_take
func bench_take(buf *C.char, n C.size_t) C.longlong {
	b := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	var x uint64
	for i := 0; i < len(b); i += 4096 {
		x += uint64(b[i])
	}
	sink += x
	return C.longlong(n)
}

func main() {}
