package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"

	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/snapfile"
)

// scanner streams the newest live row of every key of one step, a page at
// a time. A goroutine reads ahead one page while Python turns the previous
// page into objects, so restore time is the slower of the two sides rather
// than their sum.
type scanner struct {
	pages  chan scanPage
	cancel context.CancelFunc
}

type scanPage struct {
	packed []byte
	err    error
}

func newScanner(s *localstore.Store, step string, chunk int) *scanner {
	ctx, cancel := context.WithCancel(callCtx())
	sc := &scanner{pages: make(chan scanPage, 2), cancel: cancel}
	go func() {
		defer close(sc.pages)
		opts := snapfile.ScanOptions{StepID: step, ChunkRows: chunk}
		var cur snapfile.Cursor
		for {
			packed, next, done, err := s.ScanPagePacked(ctx, opts, cur)
			page := scanPage{packed: packed, err: err}
			// An empty page packs to the single byte of its zero count.
			if err != nil || len(packed) > 1 {
				select {
				case sc.pages <- page:
				case <-ctx.Done():
					return
				}
			}
			if err != nil || done {
				return
			}
			cur = next
		}
	}()
	return sc
}

//export mp_scan_open
func mp_scan_open(h C.uintptr_t, step *C.char, chunk C.int, out *C.uintptr_t, errKind *C.int, errMsg **C.char) C.int {
	sh, err := lookup[*storeHandle](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	*out = C.uintptr_t(newHandle(newScanner(sh.store, C.GoString(step), int(chunk))))
	return 0
}

// mp_scan_next returns the next page (malloc'd, snapfile's packed page
// format: uvarint count, then per key uvarint(len) key, uvarint epoch,
// uvarint tag, value), or *out == NULL at the end.
//
//export mp_scan_next
func mp_scan_next(h C.uintptr_t, out **C.char, outLen *C.size_t, errKind *C.int, errMsg **C.char) C.int {
	sc, err := lookup[*scanner](uintptr(h))
	if err != nil {
		return setErr(err, errKind, errMsg)
	}
	page, ok := <-sc.pages
	if !ok {
		*out, *outLen = nil, 0
		return 0
	}
	if page.err != nil {
		return setErr(page.err, errKind, errMsg)
	}
	*out, *outLen = (*C.char)(C.CBytes(page.packed)), C.size_t(len(page.packed))
	return 0
}

//export mp_scan_close
func mp_scan_close(h C.uintptr_t) {
	sc, err := lookup[*scanner](uintptr(h))
	if err != nil {
		return
	}
	sc.cancel()
	for range sc.pages { // let the reader goroutine finish
	}
	deleteHandle(uintptr(h))
}
