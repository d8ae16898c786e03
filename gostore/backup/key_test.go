package backup

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestValidateKey(t *testing.T) {
	tests := []struct {
		key     string
		wantErr string
	}{
		{"a", ""},
		{"flow/exec-1/seg.sqlite", ""},
		{"a.b/..c/d..", ""},
		{"", "empty"},
		{"/a", "leading /"},
		{"a/", "empty segment"},
		{"a//b", "empty segment"},
		{"..", `".." segment`},
		{"a/../b", `".." segment`},
		{".", `"." segment`},
		{"a/./b", `"." segment`},
		{"a\\b", "backslash"},
		{"a\x00b", "NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			err := ValidateKey(tt.key)
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestValidatePrefix(t *testing.T) {
	tests := []struct {
		prefix string
		ok     bool
	}{
		{"", true},
		{"a", true},
		{"a/", true},
		{"a/b", true},
		{"a/seg-", true},
		{"a/.", true},
		{"/a", false},
		{"a//", false},
		{"../a", false},
		{"a/..", false},
		{"a\\", false},
	}
	for _, tt := range tests {
		t.Run(tt.prefix, func(t *testing.T) {
			assert.Equal(t, tt.ok, ValidatePrefix(tt.prefix) == nil)
		})
	}
}
