package keygroup

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOfMatchesPythonZlibCrc32(t *testing.T) {
	// Values computed with Python: zlib.crc32(key.encode()) % 256.
	cases := []struct {
		key  string
		want int
	}{
		{"", 0},
		{"a", 0xe8b7be43 % 256},
		{"hello", 0x3610a686 % 256},
		{"ключ", 26},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Of(c.key, 256), c.key)
	}
}

func TestOwnedByPartitionsAllGroups(t *testing.T) {
	for _, count := range []int{1, 7, 128, 256} {
		for n := 1; n <= count && n <= 9; n++ {
			seen := make([]int, count)
			for w := 0; w < n; w++ {
				r := OwnedBy(w, n, count)
				for g := r.Lo; g < r.Hi; g++ {
					seen[g]++
					require.Equal(t, w, Owner(g, count, n), "count=%d n=%d g=%d", count, n, g)
				}
			}
			for g, s := range seen {
				require.Equal(t, 1, s, "count=%d n=%d group %d owned %d times", count, n, g, s)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name                   string
		count, worker, workers int
		wantErr                string
	}{
		{"ok", 256, 0, 1, ""},
		{"zero groups", 0, 0, 1, "key-group count"},
		{"too many workers", 4, 0, 5, "exceeds the key-group count"},
		{"bad index", 4, 2, 2, "out of range"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Validate(c.count, c.worker, c.workers)
			if c.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, c.wantErr)
		})
	}
}
