package durable

import (
	"context"
	"fmt"

	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// objectRows walks the newest row per key of one downloaded object, in
// (step, key) order, a page at a time.
type objectRows struct {
	name string // the object's key, for errors
	f    *snapfile.File
	opts snapfile.ScanOptions
	page []rowbatch.Row
	i    int
	cur  snapfile.Cursor
	done bool
}

// head returns the row the walk is at, reading the next page when the
// current one is used up; ok is false at the end.
func (o *objectRows) head(ctx context.Context) (row *rowbatch.Row, ok bool, err error) {
	for o.i >= len(o.page) {
		if o.done {
			return nil, false, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		page, next, done, err := o.f.ScanPage(ctx, o.opts, o.cur)
		if err != nil {
			return nil, false, fmt.Errorf("read %s: %w", o.name, err)
		}
		o.page, o.i, o.cur, o.done = page, 0, next, done
	}
	return &o.page[o.i], true, nil
}

// keyBefore orders rows by (step, key), the order objects are scanned in
// (SQLite compares text bytewise, as Go compares strings).
func keyBefore(a, b *rowbatch.Row) bool {
	if a.StepID != b.StepID {
		return a.StepID < b.StepID
	}
	return a.Key < b.Key
}

// mergeNewest merges the objects' rows into the newest row per key, in
// (step, key) order, and hands them to emit in chunks of at most chunk
// rows; objs are in commit order, oldest first. Keys whose newest row is a
// deletion are left out: the rows go into an empty store, where there is
// nothing for a deletion to hide.
// Every row is written once, where applying the objects one after
// another wrote each version of a key and then collected the older ones.
// The objects are few (compaction keeps them so), so the smallest head is
// found by looking at each.
func mergeNewest(ctx context.Context, objs []*objectRows, chunk int, emit func([]rowbatch.Row) error) error {
	out := make([]rowbatch.Row, 0, chunk)
	heads := make([]*rowbatch.Row, len(objs))
	for {
		var least *rowbatch.Row
		for i, o := range objs {
			h, ok, err := o.head(ctx)
			if err != nil {
				return err
			}
			heads[i] = nil
			if !ok {
				continue
			}
			heads[i] = h
			if least == nil || keyBefore(h, least) {
				least = h
			}
		}
		if least == nil {
			break
		}
		// Of equal epochs the later object wins: in immediate mode one
		// epoch spans several segments, each newer than the one before.
		step, key := least.StepID, least.Key
		var newest rowbatch.Row
		found := false
		for i, h := range heads {
			if h != nil && h.StepID == step && h.Key == key {
				if !found || h.Epoch >= newest.Epoch {
					newest, found = *h, true
				}
				objs[i].i++
			}
		}
		if newest.Deleted {
			continue
		}
		out = append(out, newest)
		if len(out) == chunk {
			if err := emit(out); err != nil {
				return err
			}
			out = make([]rowbatch.Row, 0, chunk)
		}
	}
	if len(out) > 0 {
		return emit(out)
	}
	return nil
}
