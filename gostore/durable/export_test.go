package durable

import "context"

// CompactAt runs a compaction at epoch c now, for tests.
func CompactAt(ctx context.Context, r *Run, c int64) error { return r.compact(ctx, c) }
