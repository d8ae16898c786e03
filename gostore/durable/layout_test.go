package durable

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRecordNumberTakesOnlyRecords(t *testing.T) {
	tests := []struct {
		key  string
		dir  string
		want int64
		ok   bool
	}{
		{"wc/commits/0000000012.json", commitsDir, 12, true},
		{"wc/executions/000003.json", executionsDir, 3, true},
		{"wc/commits/0000000012.json.tmp", commitsDir, 0, false},
		{"wc/commits/.0000000012.json", commitsDir, 0, false},
		{"wc/commits/0000000012-x.json", commitsDir, 0, false},
		{"wc/commits/.json", commitsDir, 0, false},
		{"wc/commits/0000000012", commitsDir, 0, false},
		{"wc/segments/000001/w0000-e0000000001-s000000.sqlite", commitsDir, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			got, ok := recordNumber(tt.key, tt.dir)
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}
